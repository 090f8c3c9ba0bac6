import Strata

/// One row's coalesced change in an upload.
public struct RowChange: Sendable, Codable, Hashable {
    /// What the server is asked to do with the row.
    public enum Kind: String, Sendable, Codable {
        /// A row new to the server.
        case insert
        /// Changed fields of a row the server has.
        case update
        /// A row to delete on the server.
        case delete
    }

    /// The row's table.
    public var table: String
    /// The row's primary key (the client's, until the server replaces it).
    public var key: RowKey
    /// Whether the row is to be inserted, updated or deleted.
    public var kind: Kind
    /// Insert: every field that holds a value. Update: the new value of each changed field.
    /// Delete: nothing.
    public var values: [String: Value]
    /// Update: the original (server) value of each changed field, for the server to check.
    /// Delete: every field's original value. Insert: nothing.
    public var originals: [String: Value]

    /// A change of one row; see ``values`` and ``originals`` for what each kind carries.
    public init(table: String, key: RowKey, kind: Kind, values: [String: Value] = [:], originals: [String: Value] = [:]) {
        self.table = table
        self.key = key
        self.kind = kind
        self.values = values
        self.originals = originals
    }

    private enum CodingKeys: String, CodingKey { case table, key, kind, values, originals }

    public init(from decoder: any Decoder) throws {
        try decoder.rejectUnknownFields(["table", "key", "kind", "values", "originals"])
        let c = try decoder.container(keyedBy: CodingKeys.self)
        table = try c.decode(String.self, forKey: .table)
        key = try c.decode(RowKey.self, forKey: .key)
        kind = try c.decode(Kind.self, forKey: .kind)
        values = try c.decodeIfPresent([String: Value].self, forKey: .values) ?? [:]
        originals = try c.decodeIfPresent([String: Value].self, forKey: .originals) ?? [:]
    }
}

/// One apply-changes payload. Its ``id`` is stable: a retried upload carries the same id and
/// the same changes, so the server can recognise a repeat.
public struct Batch: Sendable, Codable, Hashable {
    /// `clientID` and `number`, as `"<clientID>-<number>"`.
    public var id: String
    /// The client id of the store that made the batch.
    public var clientID: String
    /// Counts up from 1 per client.
    public var number: UInt64
    /// The changes, parents before children for inserts and updates, children before parents
    /// for deletes.
    public var changes: [RowChange]

    private enum CodingKeys: String, CodingKey { case id, clientID, number, changes }

    /// A batch; ``SyncClient/nextBatch(maxRows:maxBytes:)`` makes them.
    public init(id: String, clientID: String, number: UInt64, changes: [RowChange]) {
        self.id = id
        self.clientID = clientID
        self.number = number
        self.changes = changes
    }

    /// Why a batch numbered 0 is refused (the schema's minimum is 1); the wire codec says the same.
    static let numberMessage = "a batch number counts from 1"

    /// Decodes a batch strictly: unknown fields and a batch number of 0 are refused.
    public init(from decoder: any Decoder) throws {
        try decoder.rejectUnknownFields(["id", "clientID", "number", "changes"])
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(String.self, forKey: .id)
        clientID = try c.decode(String.self, forKey: .clientID)
        number = try c.decode(UInt64.self, forKey: .number)
        guard number >= 1 else { throw DecodingError.dataCorruptedError(forKey: .number, in: c, debugDescription: Self.numberMessage) }
        changes = try c.decode([RowChange].self, forKey: .changes)
    }
}

/// A child table's field that refers to a parent table's (single-field) primary key.
///
/// Declared associations order uploads (parents inserted before children, children deleted before
/// parents) and let a server-assigned key replace a client-generated one everywhere it is used.
public struct Association: Sendable, Hashable, Codable {
    /// The table whose rows refer to the parent.
    public var child: String
    /// The field of the child table that holds the parent's key.
    public var field: String
    /// The table referred to.
    public var parent: String

    /// A reference from `child.field` to the primary key of `parent`.
    public init(child: String, field: String, parent: String) {
        self.child = child
        self.field = field
        self.parent = parent
    }
}

/// The server's answer to a batch, row by row.
public struct BatchAck: Sendable, Codable, Hashable {
    /// The ``Batch/id`` of the batch this acknowledges.
    public var batchID: String
    /// One result for every change of the batch.
    public var results: [RowResult]

    /// An acknowledgement of the batch `batchID`.
    public init(batchID: String, results: [RowResult]) {
        self.batchID = batchID
        self.results = results
    }

    private enum CodingKeys: String, CodingKey { case batchID, results }

    public init(from decoder: any Decoder) throws {
        try decoder.rejectUnknownFields(["batchID", "results"])
        let c = try decoder.container(keyedBy: CodingKeys.self)
        batchID = try c.decode(String.self, forKey: .batchID)
        results = try c.decode([RowResult].self, forKey: .results)
    }
}

/// The server's answer for one row.
public struct RowResult: Sendable, Codable, Hashable {
    /// Whether the server applied the row.
    public enum Status: String, Sendable, Codable {
        /// Applied. The server may return values it assigned and a key replacing the client's.
        case ok
        /// The server's row changed since the client's originals: pull, merge, then upload again.
        case conflict
        /// Refused; ``error`` says why and what to do.
        case error
    }

    /// The row's table.
    public var table: String
    /// The row's primary key, as the batch sent it.
    public var key: RowKey
    /// Whether the row was applied, in conflict, or refused.
    public var status: Status
    /// With `ok`: fields the server set itself (timestamps, computed values). With an update
    /// error and the `rollback` action: the server's current values.
    public var serverValues: [String: Value]?
    /// With `ok` for an insert: the server's key, replacing the client-generated one.
    public var newKey: RowKey?
    /// Why the row was refused, and what to do; set when ``status`` is ``Status/error``.
    public var error: RowError?

    /// A result for one row of a batch.
    public init(table: String, key: RowKey, status: Status, serverValues: [String: Value]? = nil, newKey: RowKey? = nil, error: RowError? = nil) {
        self.table = table
        self.key = key
        self.status = status
        self.serverValues = serverValues
        self.newKey = newKey
        self.error = error
    }

    /// An `ok` result: the row was applied.
    public static func ok(_ table: String, _ key: RowKey, serverValues: [String: Value]? = nil, newKey: RowKey? = nil) -> RowResult {
        RowResult(table: table, key: key, status: .ok, serverValues: serverValues, newKey: newKey)
    }

    private enum CodingKeys: String, CodingKey { case table, key, status, serverValues, newKey, error }

    public init(from decoder: any Decoder) throws {
        try decoder.rejectUnknownFields(["table", "key", "status", "serverValues", "newKey", "error"])
        let c = try decoder.container(keyedBy: CodingKeys.self)
        table = try c.decode(String.self, forKey: .table)
        key = try c.decode(RowKey.self, forKey: .key)
        status = try c.decode(Status.self, forKey: .status)
        serverValues = try c.decodeIfPresent([String: Value].self, forKey: .serverValues)
        newKey = try c.decodeIfPresent(RowKey.self, forKey: .newKey)
        error = try c.decodeIfPresent(RowError.self, forKey: .error)
        if status == .error && error == nil {
            throw DecodingError.keyNotFound(CodingKeys.error, .init(codingPath: c.codingPath, debugDescription: "a refused row needs an error"))
        }
    }
}

/// Why the server refused a row, and what the client should do.
public struct RowError: Sendable, Codable, Hashable {
    /// What the client does with a refused row.
    public enum Action: String, Sendable, Codable {
        /// Creates only: remove the row locally.
        case drop
        /// Creates only: keep it as an insert and send it again in a later batch.
        case recreate
        /// Updates and deletes: send it again in a later batch.
        case retry
        /// Updates only: return the row to the server's values (``RowResult/serverValues`` if
        /// given, else its originals).
        case rollback
        /// Keep the row as it is but leave it out of uploads until the app retries or
        /// discards it (``SyncClient/rejectedRows()``).
        case setAside
    }

    /// Why the server refused the row, for logs and for the app.
    public var reason: String
    /// What the client does with the row.
    public var action: Action

    /// A refusal with its reason and action.
    public init(reason: String, action: Action) {
        self.reason = reason
        self.action = action
    }

    private enum CodingKeys: String, CodingKey { case reason, action }

    public init(from decoder: any Decoder) throws {
        try decoder.rejectUnknownFields(["reason", "action"])
        let c = try decoder.container(keyedBy: CodingKeys.self)
        reason = try c.decode(String.self, forKey: .reason)
        action = try c.decode(Action.self, forKey: .action)
    }
}

/// A row the server refused and the client set aside.
public struct RejectedRow: Sendable, Codable, Hashable {
    /// The row's table.
    public var table: String
    /// The row's primary key.
    public var key: RowKey
    /// The change the server refused.
    public var kind: RowChange.Kind
    /// Why the server refused it.
    public var reason: String
    /// The batch that carried it.
    public var batchID: String
}

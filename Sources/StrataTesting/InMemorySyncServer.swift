import Foundation
import Strata
import StrataSync
import Synchronization

/// A small in-process sync server, for tests and examples: it keeps tables of rows,
/// serves deltas since an anchor, and applies batches by `strata-server`'s own rules
/// (`ServerRules`: optimistic concurrency, refusals by the tables, children of missing
/// parents, server-assigned keys). It answers a batch
/// id it has seen before with the same acknowledgement, so a retried upload is never applied twice;
/// the same id with other changes is refused with `BatchRefused` (`idReused`), as `strata-server`
/// refuses it.
///
/// It can also ask for a client reset, as a real server does: ``forget(client:)`` forgets a
/// client (reached through ``client(_:)``), and ``expireChanges(through:)`` drops old changes so
/// that an anchor before them is too old. Both make `pull`/`push` throw `ResetRequired`; a full
/// pull (`since: nil`, a snapshot of every row) is always answered.
public final class InMemorySyncServer: SyncTransport {
    /// A row of any table, as a set element.
    private struct RowID: Hashable {
        let table: String
        let key: RowKey
    }
    struct State {
        var rows: [String: [RowKey: [String: Value]]] = [:]
        /// The field names a deleted property-bag row's tombstone keeps (see
        /// `ServerRules.Write.tombstoneNames`), as strata-server keeps them: the rules read them.
        var tombstones: [String: [RowKey: [String]]] = [:]
        /// Every field name each table's rows have held, each once by its bytes (two names that
        /// Swift's `==` calls equal are two names, as in a client's store).
        var fieldNames: [String: [String]] = [:]
        var log: [(version: Int, table: String, key: RowKey)] = []
        var version = 0
        /// Every batch applied, by id: its client, its number, its payload as `WireFormat`
        /// encodes it (equal batches are equal bytes) and its acknowledgement.
        var batches: [String: (clientID: String, number: UInt64, payload: Data, ack: BatchAck)] = [:]
        var applied: [String] = []
        /// Changes up to this version were dropped: an anchor before it cannot be served.
        var expiredThrough = 0
        var forgotten: Set<String> = []
        /// The last key drawn for a table whose keys the server assigns.
        var lastKey: Int64 = 0
    }
    private let state = Locked(State())
    /// The key fields of each table, by table name (`["id"]` when not listed).
    public let keyFields: [String: [String]]
    /// References between tables: a child in a batch that names a parent the same batch gave a
    /// new key (through ``decide`` or a server-assigned key) is stored with the new key; a child
    /// (not a delete) of a table in ``tables`` naming a parent this server does not have is
    /// answered `error` with `setAside`, as `strata-server` does.
    public let associations: [Association]
    /// Lets a test refuse changes or assign keys and values: return a result to use instead of
    /// the server's own. An `ok` is applied under its `newKey` with its `serverValues`; one the
    /// rules cannot apply (stale originals, a taken key) is answered as the rules answer it.
    public let decide: (@Sendable (RowChange) -> RowResult?)?
    /// The tables whose rows are checked as `strata-server` checks them (`RowRule` and the rest of
    /// `ServerRules`): a change that breaks the rules is answered `error` with `setAside` and the
    /// reason. Rows of other tables are taken as they come.
    public let tables: [String: TableSchema]
    /// The rules every batch is decided by: the same as `strata-server`'s.
    private let rules: ServerRules

    /// An empty server; `keyFields` names each table's key fields, `associations` the references
    /// that follow a key the server assigns, `decide` lets a test answer rows itself, and
    /// `tables` are checked by `ServerRules` (their key fields are taken from them).
    public convenience init(
        keyFields: [String: [String]] = [:], associations: [Association] = [], tables: [TableSchema] = [],
        decide: (@Sendable (RowChange) -> RowResult?)? = nil
    ) {
        let declared = tables.map { t in
            TablesFile.Table(
                name: t.name, mode: t.mode, primaryKey: t.primaryKey,
                fields: t.fields.map { TablesFile.Field(name: $0.name, type: $0.type, nullable: $0.isNullable, default: $0.defaultValue) })
        }
        self.init(keyFields: keyFields, associations: associations, declared: declared, decide: decide, unknownTable: nil)
    }

    /// A server that keeps the tables of a tables file, as `strata-server` started with that file
    /// does: a change to a table the file does not list is refused, and a table with
    /// `serverAssignedKey` gets keys 1, 2, 3, … (as a new database's sequence draws them).
    public convenience init(tablesFile: TablesFile, decide: (@Sendable (RowChange) -> RowResult?)? = nil) {
        self.init(associations: tablesFile.associations, declared: tablesFile.tables, decide: decide, unknownTable: .refused)
    }

    /// `unknownTable` `nil`: rows of tables not declared are taken, with `keyFields`.
    private init(
        keyFields: [String: [String]] = [:], associations: [Association], declared: [TablesFile.Table],
        decide: (@Sendable (RowChange) -> RowResult?)?, unknownTable: ServerRules.UnknownTable?
    ) {
        var keyFields = keyFields
        for t in declared { keyFields[t.name] = t.primaryKey }
        self.keyFields = keyFields
        self.associations = associations
        self.tables = Dictionary(declared.map { ($0.name, $0.schema) }) { $1 }
        self.decide = decide
        self.rules = ServerRules(tables: declared, associations: associations, unknownTable: unknownTable ?? .taken(keyFields: keyFields))
    }

    /// The server's rows of `table` (key fields left out).
    public func rows(_ table: String) -> [RowKey: [String: Value]] { state.withLock { $0.rows[table] ?? [:] } }

    /// Ids of the batches applied, in order (a repeat is not applied again, so not listed again).
    public var appliedBatches: [String] { state.withLock { $0.applied } }

    /// Changes the server's data directly, as another client or a back office would.
    public func write(_ table: String, key: RowKey, _ fields: [String: Value]?) {
        state.withLock { s in
            if let fields {
                s.rows[table, default: [:]][key] = fields.filter { !$0.value.isNull }
                s.note(fields.keys, of: table)
            } else {
                s.rows[table]?[key] = nil
            }
            s.tombstones[table]?[key] = nil
            s.version += 1
            s.log.append((s.version, table, key))
        }
    }

    /// Forgets a client: its next incremental pull or push through ``client(_:)`` throws
    /// `ResetRequired` with reason `unknownClient`, until it pulls a full snapshot.
    public func forget(client id: String) {
        state.withLock { _ = $0.forgotten.insert(id) }
    }

    /// Drops the changes up to and including `version` (every change so far when `nil`), as a
    /// server that keeps changes for a limited time: a pull from an older anchor throws
    /// `ResetRequired` with reason `anchorExpired`.
    public func expireChanges(through version: Int? = nil) {
        state.withLock { s in
            let v = min(version ?? s.version, s.version)
            s.expiredThrough = max(s.expiredThrough, v)
            s.log.removeAll { $0.version <= s.expiredThrough }
        }
    }

    /// This server as one client sees it: the same data, but the client can be forgotten.
    public func client(_ id: String) -> Client { Client(server: self, id: id) }

    /// A transport to an ``InMemorySyncServer`` for one client id (see ``InMemorySyncServer/forget(client:)``).
    public struct Client: SyncTransport {
        /// The server this transport talks to.
        public let server: InMemorySyncServer
        /// The client id it pulls and pushes as.
        public let id: String

        public func pull(since anchor: String?) async throws -> ServerDelta {
            try server.state.withLock { s in
                if anchor == nil {
                    s.forgotten.remove(id)
                } else if s.forgotten.contains(id) {
                    throw ResetRequired(.unknownClient, message: "client '\(id)' is not known here")
                }
            }
            return try await server.pull(since: anchor)
        }

        public func push(_ batch: Batch) async throws -> BatchAck {
            if server.state.withLock({ $0.forgotten.contains(id) }) {
                throw ResetRequired(.unknownClient, message: "client '\(id)' is not known here")
            }
            return try await server.push(batch)
        }
    }

    /// The changes since `anchor`; for `nil`, a snapshot (`ServerDelta.Mode.snapshot`) of every
    /// row of every table.
    ///
    /// - Throws: `ResetRequired` (`anchorExpired`) for an anchor older than the changes kept,
    ///   (`unknownClient`) for one ahead of every version this server handed out; `StrataError`
    ///   `malformedInput` for one that is not a version.
    public func pull(since anchor: String?) async throws -> ServerDelta {
        try state.withLock { s in
            guard let anchor else {
                var tables: [TableDelta] = []
                for table in Set(s.rows.keys).union(s.fieldNames.keys).sorted() {
                    var delta = TableDelta(table)
                    for (key, row) in (s.rows[table] ?? [:]).sorted(by: { $0.key.description < $1.key.description }) {
                        delta.upserts.append(ServerRow(full(table, key, row, s), version: "\(s.version)"))
                    }
                    tables.append(delta)
                }
                return ServerDelta(anchor: "\(s.version)", mode: .snapshot, tables: tables)
            }
            // As strata-server: an anchor that is not a version is malformed (its 400), one ahead
            // of every version handed out names data this server does not have (its 410).
            guard let since = Int(anchor), since >= 0 else {
                throw StrataError(.malformedInput, "the anchor '\(anchor)' is not one this server hands out")
            }
            if since > s.version {
                throw ResetRequired(.unknownClient, message: "the anchor \(since) is ahead of this server (at \(s.version))")
            }
            if since < s.expiredThrough {
                throw ResetRequired(.anchorExpired, message: "changes up to \(s.expiredThrough) are no longer kept; the anchor is \(anchor)")
            }
            var latest: [String: [RowKey]] = [:]
            var seen = Set<RowID>()
            for change in s.log.reversed() where change.version > since && seen.insert(RowID(table: change.table, key: change.key)).inserted {
                latest[change.table, default: []].append(change.key)
            }
            var tables: [TableDelta] = []
            for (table, keys) in latest.sorted(by: { $0.key < $1.key }) {
                var delta = TableDelta(table)
                for key in keys.reversed() {
                    if let row = s.rows[table]?[key] {
                        delta.upserts.append(ServerRow(full(table, key, row, s), version: "\(s.version)"))
                    } else {
                        delta.deletes.append(key)
                    }
                }
                tables.append(delta)
            }
            return ServerDelta(since: anchor, anchor: "\(s.version)", tables: tables)
        }
    }

    /// A complete row: fields without a value are listed as null (but not a name the row holds
    /// in another Unicode form: a `[String: Value]` has room for one of the two).
    private func full(_ table: String, _ key: RowKey, _ row: [String: Value], _ s: State) -> [String: Value] {
        var full: [String: Value] = [:]
        for f in s.fieldNames[table] ?? [] {
            if let v = row[exactly: f] { full[f] = v } else if row[f] == nil { full[f] = .null }
        }
        for (i, k) in (keyFields[table] ?? ["id"]).enumerated() { full[k] = key.values[i] }
        return full
    }

    /// Applies a batch and returns its acknowledgement; a batch id seen before gets the same
    /// acknowledgement and is not applied again.
    ///
    /// - Throws: `BatchRefused` (`idReused`, with this client's highest batch number) when the
    ///   id was seen before with other changes: answering with that batch's acknowledgement would
    ///   settle rows this server never saw.
    public func push(_ batch: Batch) async throws -> BatchAck {
        let payload = try WireFormat.encode(batch)
        return try state.withLock { s in
            if let stored = s.batches[batch.id] {
                guard stored.payload == payload else {
                    let highest = s.batches.values.filter { $0.clientID == batch.clientID }.map(\.number).max()
                    throw BatchRefused(.idReused, message: "batch \(batch.id) was applied before with other changes", highestBatchNumber: highest)
                }
                return stored.ack
            }
            // The rules strata-server decides by (`ServerRules`), over this server's rows.
            let prepared = rules.prepare(batch.changes)
            var stored: [ServerRules.RowID: ServerRules.StoredRow] = [:]
            for id in prepared.rows {
                if let row = s.rows[id.table]?[id.key] {
                    stored[id] = ServerRules.StoredRow(fields: row)
                } else if let names = s.tombstones[id.table]?[id.key] {
                    stored[id] = ServerRules.StoredRow(fields: Dictionary(names.map { ($0, Value.null) }) { first, _ in first }, deleted: true)
                }
            }
            let liveParents = Set(prepared.parents.filter { s.rows[$0.table]?[$0.key] != nil })
            // Drawn as PostgreSQL's sequence draws them for strata-server: 1, 2, 3, …
            let keys = (0..<prepared.keysToDraw).map { _ in
                s.lastKey += 1
                return Value.int(s.lastKey)
            }
            let outcome = rules.decide(prepared, stored: stored, liveParents: liveParents, drawnKeys: keys, custom: decide)
            for w in outcome.writes {
                s.rows[w.id.table, default: [:]][w.id.key] = w.fields
                s.tombstones[w.id.table, default: [:]][w.id.key] = w.fields == nil && !w.tombstoneNames.isEmpty ? w.tombstoneNames : nil
                let keyNames = ExactNames(keyFields[exactly: w.id.table] ?? ["id"])
                // A field a change cleared is a field the table has held: pulls list it as null.
                s.note(prepared.changes[w.result].values.keys.filter { !keyNames.contains($0) }, of: w.id.table)
                s.note(Array((w.fields ?? [:]).keys), of: w.id.table)
                s.version += 1
                s.log.append((s.version, w.id.table, w.id.key))
            }
            let results = outcome.results
            let ack = BatchAck(batchID: batch.id, results: results)
            s.batches[batch.id] = (batch.clientID, batch.number, payload, ack)
            s.applied.append(batch.id)
            return ack
        }
    }
}

extension InMemorySyncServer.State {
    /// Adds field names of `table` not seen yet, compared by their bytes.
    mutating func note(_ names: some Sequence<String>, of table: String) {
        for name in names where !(fieldNames[table]?.contains { $0.sameBytes(name) } ?? false) {
            fieldNames[table, default: []].append(name)
        }
    }
}

import Foundation
import Strata

/// The changes a server sends since an anchor: per table, rows upserted and keys deleted.
///
/// ```swift
/// let delta = ServerDelta(since: "v41", anchor: "v42", tables: [
///     TableDelta("tasks", upserts: [ServerRow(["id": 7, "title": "Buy oat milk"])], deletes: [8]),
/// ])
/// let report = try sync.merge(delta)
/// ```
public struct ServerDelta: Sendable, Codable, Hashable {
    /// Whether the delta lists changes, or the whole of each table it names.
    public enum Mode: String, Sendable, Codable {
        /// Only the rows listed changed; every other row is as before.
        case incremental
        /// A full snapshot of each table listed: a local row absent from it was deleted on the
        /// server (a pending local insert is kept: the server has never seen it).
        case snapshot
    }

    /// The anchor the delta continues from; `nil` skips the check (a first sync, a snapshot).
    public var since: String?
    /// The anchor to store once the delta is merged; the next pull asks from here.
    public var anchor: String
    /// Whether the delta lists changes or holds whole tables.
    public var mode: Mode
    /// The changes, per table.
    public var tables: [TableDelta]

    /// A delta from anchor `since` to anchor `anchor`.
    public init(since: String? = nil, anchor: String, mode: Mode = .incremental, tables: [TableDelta]) {
        self.since = since
        self.anchor = anchor
        self.mode = mode
        self.tables = tables
    }

    private enum CodingKeys: String, CodingKey { case since, anchor, mode, tables }

    public init(from decoder: any Decoder) throws {
        try decoder.rejectUnknownFields(["since", "anchor", "mode", "tables"])
        let c = try decoder.container(keyedBy: CodingKeys.self)
        since = try c.decodeIfPresent(String.self, forKey: .since)
        anchor = try c.decode(String.self, forKey: .anchor)
        mode = try c.decodeIfPresent(Mode.self, forKey: .mode) ?? .incremental
        tables = try c.decode([TableDelta].self, forKey: .tables)
    }
}

/// The changes of one table in a ``ServerDelta``.
public struct TableDelta: Sendable, Codable, Hashable {
    /// The table's name.
    public var table: String
    /// Rows created or changed on the server. A row lists its key fields and the fields it sets;
    /// fields it does not list are unchanged on the server.
    public var upserts: [ServerRow]
    /// Keys of rows deleted on the server.
    public var deletes: [RowKey]

    /// The changes of `table`.
    public init(_ table: String, upserts: [ServerRow] = [], deletes: [RowKey] = []) {
        self.table = table
        self.upserts = upserts
        self.deletes = deletes
    }

    private enum CodingKeys: String, CodingKey { case table, upserts, deletes }

    public init(from decoder: any Decoder) throws {
        try decoder.rejectUnknownFields(["table", "upserts", "deletes"])
        let c = try decoder.container(keyedBy: CodingKeys.self)
        table = try c.decode(String.self, forKey: .table)
        upserts = try c.decodeIfPresent([ServerRow].self, forKey: .upserts) ?? []
        deletes = try c.decodeIfPresent([RowKey].self, forKey: .deletes) ?? []
    }
}

/// One row as the server sends it.
public struct ServerRow: Sendable, Codable, Hashable {
    /// The key fields and the fields the server sets. A field left out is unchanged on the
    /// server; to clear a field, list it with `null`.
    public var fields: [String: Value]
    /// The server's version of the row, if it has one (kept in the audit record).
    public var version: String?
    /// When the row last changed on the server; the last-writer-wins policy compares it with the
    /// time of the last local edit.
    public var timestamp: Date?

    /// A row as the server sends it: its key fields and the fields it sets.
    public init(_ fields: [String: Value], version: String? = nil, timestamp: Date? = nil) {
        self.fields = fields
        self.version = version
        self.timestamp = timestamp
    }

    private enum CodingKeys: String, CodingKey { case fields, version, timestamp }

    public init(from decoder: any Decoder) throws {
        try decoder.rejectUnknownFields(["fields", "version", "timestamp"])
        let c = try decoder.container(keyedBy: CodingKeys.self)
        fields = try c.decode([String: Value].self, forKey: .fields)
        version = try c.decodeIfPresent(String.self, forKey: .version)
        timestamp = try c.decodeIfPresent(Double.self, forKey: .timestamp).map(Date.init(timeIntervalSince1970:))
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(fields, forKey: .fields)
        try c.encodeIfPresent(version, forKey: .version)
        try c.encodeIfPresent(timestamp?.timeIntervalSince1970, forKey: .timestamp)
    }
}

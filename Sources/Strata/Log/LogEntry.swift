import Foundation
import LMDB

/// One entry of the operation log, decoded.
///
/// An operation records what a row *is* after it: for every field it touched, the new current
/// value and the original (server-confirmed) value, plus the row's new pending state.
public struct LogEntry: Sendable, Hashable {
    /// What kind of edit produced the operation.
    public enum Kind: UInt8, Sendable, Codable, CustomStringConvertible {
        /// A row inserted by the app.
        case insert = 1
        /// Fields of a row changed by the app.
        case update = 2
        /// A row deleted by the app (a pending delete, or the removal of a local insert).
        case delete = 3
        /// One field returned to its original (``Transaction/revert(_:key:field:)-(_,RowKey,_)``).
        case revertField = 4
        /// A row returned to its originals (``Transaction/revert(_:key:)-(_,RowKey)``).
        case revertRow = 5
        /// A row returned to its originals by reverting its whole table (``Transaction/revertAll(_:)``).
        case revertTable = 6
        /// The server accepted the row: its current values became its originals (``Transaction/acknowledge(_:key:)-(_,RowKey)``).
        case acknowledge = 7
        /// A row created or changed by a server delta (merge).
        case serverChange = 8
        /// A row deleted by a server delta (merge).
        case serverDelete = 9
        /// The app resolved a conflict.
        case resolve = 10
        /// A client reset replaced the row with the server's.
        case reset = 11
        /// The server refused an upload of the row and the client dropped or rolled it back.
        case uploadRejected = 12
        /// A briefcase import set the row.
        case imported = 13
        /// A schema change (a field added with a default, or dropped) set the row.
        case schemaChange = 14

        public var description: String {
            switch self {
            case .insert: "insert"
            case .update: "update"
            case .delete: "delete"
            case .revertField: "revert field"
            case .revertRow: "revert row"
            case .revertTable: "revert table"
            case .acknowledge: "acknowledge"
            case .serverChange: "server change"
            case .serverDelete: "server delete"
            case .resolve: "resolve"
            case .reset: "reset"
            case .uploadRejected: "upload rejected"
            case .imported: "imported"
            case .schemaChange: "schema change"
            }
        }
    }

    /// Where an operation was made.
    public enum Origin: UInt8, Sendable, Codable {
        /// An edit made on this device.
        case local = 0
        /// A change applied from the server.
        case server = 1
    }

    /// One field as the operation left it.
    public struct FieldChange: Sendable, Hashable {
        /// The field's name.
        public let field: String
        /// The value the server last confirmed (equal to ``current`` when the field is unchanged).
        public let original: Value
        /// The value the app sees after the operation.
        public let current: Value
        /// Whether the field is in conflict after the operation (``Row/conflictingFields``);
        /// `original` is then the server's value.
        public var isInConflict: Bool = false
        /// Whether the field differs from its original after the operation.
        public var isChanged: Bool { original != current }
    }

    /// The log sequence number: dense, increasing, the operation's position in the log.
    public let lsn: UInt64
    /// The transaction the operation belongs to; all operations of one `write` share it. Ids
    /// increase with the log; from log format 4 on, a transaction's id is the LSN of its first
    /// operation (before, a counter).
    public let transactionID: UInt64
    /// When the transaction began.
    public let timestamp: Date
    /// Whether the operation was made on this device or applied from the server.
    public let origin: Origin
    /// What kind of edit produced it.
    public let kind: Kind
    /// The table of the row.
    public let table: String
    /// The row's primary key.
    public let key: RowKey
    /// The catalog version the operation was written under.
    public let schemaVersion: UInt64
    /// The fields the operation set, in field order.
    public let changes: [FieldChange]
    /// Whether the row no longer exists after the operation.
    public let removesRow: Bool
    /// Whether the row is a local insert not yet acknowledged, after the operation.
    public let isPendingInsert: Bool
    /// Whether the row is a local delete not yet acknowledged, after the operation.
    public let isPendingDelete: Bool
    /// Whether the row holds an unresolved conflict after the operation.
    public let isConflicted: Bool
    /// Bytes recorded with the operation by the code that wrote it (the sync layer's audit of a
    /// merge decision); empty for local edits.
    public let annotation: [UInt8]

    /// Decodes the operation stored at `lsn`, after checking its checksum (see
    /// ``RecordChecksum``; `rules` say where the log must carry one). `transaction`
    /// gives the header of the operation's transaction, the record's own when it carries one
    /// (``ReadableTransaction/transactionHeader(of:at:log:rules:cache:)``, which also
    /// remembers a carried header for the operations after it).
    init(
        lsn: UInt64, record: UnsafeRawBufferPointer, catalog: Catalog, rules: ChecksumRules,
        transaction: (OperationHeader) throws(StrataError) -> TransactionHeader
    ) throws(StrataError) {
        try RecordChecksum.check(record, lsn: lsn, rules: rules)
        let h = try OperationHeader(record)
        let txn = try transaction(h)
        guard let kind = Kind(rawValue: h.kind) else { throw StrataError(.corruptRecord, "operation \(lsn) has unknown kind \(h.kind)") }
        guard let origin = Origin(rawValue: h.origin) else { throw StrataError(.corruptRecord, "operation \(lsn) has unknown origin \(h.origin)") }
        let t = try catalog.table(id: h.tableID(in: record))
        var changes: [FieldChange] = []
        var r = ByteReader(record, offset: h.entriesStart)
        while let e = try r.nextEntry() {
            let current = try Value(decoding: UnsafeRawBufferPointer(rebasing: record[e.current]))
            let original = e.isDirty ? try Value(decoding: UnsafeRawBufferPointer(rebasing: record[e.original])) : current
            changes.append(FieldChange(field: t.fieldName(e.id), original: original, current: current, isInConflict: e.isConflict))
        }
        self.lsn = lsn
        self.transactionID = txn.id
        self.timestamp = Date(timeIntervalSince1970: Double(txn.timestampMicros) / 1_000_000)
        self.origin = origin
        self.kind = kind
        self.table = t.name
        self.key = try t.decodeKey(UnsafeRawBufferPointer(rebasing: record[h.target]))
        self.schemaVersion = h.schemaVersion(in: txn)
        self.changes = changes
        self.removesRow = h.flagsAfter.contains(.gone)
        self.isPendingInsert = h.flagsAfter.contains(.inserted)
        self.isPendingDelete = h.flagsAfter.contains(.deleted)
        self.isConflicted = h.flagsAfter.contains(.conflicted)
        self.annotation = Array(record[h.annotation])
    }
}

extension ReadableTransaction {
    /// The header of the transaction of the operation `header`, stored at `lsn` in `log`: the
    /// one the record carries, or else the one the first operation of its transaction still in
    /// the log carries (``RecordFormat``). `cache` keeps the last header found, so a scan in LSN
    /// order reads the first operation of each transaction once.
    ///
    /// - Complexity: O(1) when the record or `cache` holds the header, else O(log n).
    func transactionHeader(
        of header: OperationHeader, at lsn: UInt64, log: Database, rules: ChecksumRules, cache: inout TransactionHeader?
    ) throws(StrataError) -> TransactionHeader {
        if let carried = try header.carriedTransaction(at: lsn) {
            cache = carried
            return carried
        }
        let id = try header.transactionID(at: lsn)
        if let cache, cache.id == id { return cache }
        let found: TransactionHeader? = try scan(log) { c in
            guard let e = try c.seek(atLeast: Swift.withUnsafeBytes(of: id.bigEndian) { Array($0) }) else { return nil }
            let first = try Counter.lsn(key: e.key)
            guard first < lsn else { return nil }
            // Checked: its time and schema version are read for other operations.
            try RecordChecksum.check(e.value, lsn: first, rules: rules)
            guard let t = try OperationHeader(e.value).carriedTransaction(at: first), t.id == id else { return nil }
            return t
        }
        guard let found else {
            throw StrataError(.corruptRecord, "operation \(lsn) belongs to transaction \(id), but the first operation of that transaction in the log does not carry the transaction's header")
        }
        cache = found
        return found
    }
}

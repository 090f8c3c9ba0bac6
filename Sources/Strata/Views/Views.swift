import LMDB

/// The named databases of a store, and the maintenance of the views kept from the log.
///
/// | database | key | value |
/// |---|---|---|
/// | `log` | LSN, 8 bytes big-endian | operation record |
/// | `rows` | table id (4 bytes BE) + row key | row state record |
/// | `pending` | table id + row key | LSN that made the row pending (8 bytes BE) |
/// | `history` | table id + row key + LSN (8 bytes BE) | empty |
/// | `meta` | ASCII name | store metadata (format, catalog, counters, client id) |
struct Views: Sendable {
    let log: Database
    let rows: Database
    let pending: Database
    let history: Database
    let meta: Database

    static let names = (log: "log", rows: "rows", pending: "pending", history: "history", meta: "meta")

    static func open(_ txn: LMDB.WriteTransaction) throws(LMDBError) -> Views {
        Views(
            log: try txn.openDatabase(names.log),
            rows: try txn.openDatabase(names.rows),
            pending: try txn.openDatabase(names.pending),
            history: try txn.openDatabase(names.history),
            meta: try txn.openDatabase(names.meta)
        )
    }

    /// The databases derived from the log, which ``Store/rebuild()`` drops and refills.
    var derived: [Database] { [rows, pending, history] }

    /// Folds one operation into `rows`, `pending` and `history`.
    ///
    /// `old` is the row's current state (or `nil`); it is read completely before the first write,
    /// since a write may invalidate memory lent by LMDB. `scratch` and `historyKey` are reusable
    /// buffers.
    ///
    /// - Complexity: O(log n) per database touched, plus the size of the row.
    func apply(
        operation op: UnsafeRawBufferPointer, header: OperationHeader, lsn: UInt64, old: UnsafeRawBufferPointer?,
        in txn: LMDB.WriteTransaction, scratch: inout ByteWriter, historyKey: inout ByteWriter
    ) throws(StrataError) {
        let wasPending = try old.map { (o) throws(StrataError) in try RowFold.isPending(o) } ?? false
        let isPending = try RowFold.apply(old: old, op: op, header: header, lsn: lsn, into: &scratch)
        let target = UnsafeRawBufferPointer(rebasing: op[header.target])
        try lmdb { () throws(LMDBError) in
            if isPending == nil {
                try txn.delete(target, in: rows)
            } else {
                try scratch.withUnsafeBytes { (b) throws(LMDBError) in try txn.put(target, b, in: rows) }
            }
            if isPending == true, !wasPending {
                var lsnBE = lsn.bigEndian
                try withUnsafeBytes(of: &lsnBE) { (b) throws(LMDBError) in try txn.put(target, b, in: pending) }
            } else if isPending != true, wasPending {
                try txn.delete(target, in: pending)
            }
            historyKey.reset()
            historyKey.append(target)
            historyKey.appendBigEndian(lsn)
            try historyKey.withUnsafeBytes { (k) throws(LMDBError) in
                try txn.put(k, UnsafeRawBufferPointer(start: nil, count: 0), in: history)
            }
        }
    }
}

/// Meta keys.
enum MetaKey {
    static let format = "format"
    static let catalog = "catalog"
    static let catalogVersion = "catalogVersion"
    static let lastTxn = "lastTxn"
    static let clientID = "clientID"
}

extension ReadableTransaction {
    func meta(_ key: String, in views: Views) throws(StrataError) -> UnsafeRawBufferPointer? {
        try lmdb { () throws(LMDBError) in try get(Array(key.utf8), in: views.meta) }
    }

    func metaUInt64(_ key: String, in views: Views) throws(StrataError) -> UInt64? {
        guard let b = try meta(key, in: views) else { return nil }
        var r = ByteReader(b)
        return try r.bigEndian64()
    }

    /// The LSN of the last operation in the log, 0 when the log is empty.
    func lastLSN(in views: Views) throws(StrataError) -> UInt64 {
        try scan(views.log) { c in
            guard let last = try c.last() else { return 0 }
            var r = ByteReader(last.key)
            return try r.bigEndian64()
        }
    }
}

extension LMDB.WriteTransaction {
    func setMeta(_ key: String, _ value: [UInt8], in views: Views) throws(StrataError) {
        try lmdb { () throws(LMDBError) in try put(Array(key.utf8), value, in: views.meta) }
    }

    func setMeta(_ key: String, _ value: UInt64, in views: Views) throws(StrataError) {
        var w = ByteWriter(capacity: 8)
        w.appendBigEndian(value)
        try setMeta(key, w.bytes, in: views)
    }
}

extension ReadableTransaction {
    /// Runs a cursor-based body, wrapping errors as ``StrataError``.
    func scan<R>(_ db: Database, _ body: (inout Cursor) throws -> R) throws(StrataError) -> R {
        do {
            return try withCursor(db, body)
        } catch let e as StrataError {
            throw e
        } catch let e as LMDBError {
            throw .storage(e)
        } catch {
            throw StrataError(.storage, "\(error)")
        }
    }
}

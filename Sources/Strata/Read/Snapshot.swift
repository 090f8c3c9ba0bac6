import LMDB

/// A consistent, read-only view of the store, lent by ``Store/read(_:)-glxe`` (or by
/// ``Transaction/snapshot``, where it also sees the transaction's own edits).
///
/// Everything it returns is a copy that may outlive it; the snapshot itself never leaves its
/// closure. A snapshot kept after its closure returned throws ``StrataError`` `invalidOperation`
/// from every method and property: LMDB's transaction under it has ended.
public struct Snapshot {
    /// LMDB's snapshot with the overlay that belongs with it; reached through ``txn``.
    private let reader: ViewReader
    let databases: StoreDatabases
    /// The catalog as of this snapshot; reached through ``catalog``.
    private let lentCatalog: Catalog
    /// Ends when the closure that lent the snapshot returns.
    private let lease: Lease

    init(txn: ViewReader, databases: StoreDatabases, catalog: Catalog, lease: Lease) {
        self.reader = txn
        self.databases = databases
        self.lentCatalog = catalog
        self.lease = lease
    }

    // Every method reaches the store through these two accessors, so this is the one place
    // that refuses a snapshot kept past its closure (the LMDB transaction is freed by then).

    /// LMDB's snapshot with the overlay; throws once the lending closure has returned.
    var txn: ViewReader {
        @inline(__always) get throws(StrataError) {
            try lease.check()
            return reader
        }
    }

    /// The catalog as of this snapshot; throws once the lending closure has returned.
    var catalog: Catalog {
        @inline(__always) get throws(StrataError) {
            try lease.check()
            return lentCatalog
        }
    }

    /// The tables of the store, in creation order.
    ///
    /// - Throws: ``StrataError`` `invalidOperation` when the snapshot outlived its closure.
    public var tables: [TableSchema] {
        get throws(StrataError) { try catalog.tables.values.sorted { $0.id < $1.id }.map(\.schema) }
    }

    /// The schema of `table`, as declared.
    public func schema(_ table: String) throws(StrataError) -> TableSchema {
        try catalog.table(named: table).schema
    }

    /// Every field name `table` knows: the declared fields, and for a property bag every field
    /// name its rows have used so far.
    public func fieldNames(_ table: String) throws(StrataError) -> [String] {
        try catalog.table(named: table).fieldNames
    }

    /// The LSN of the last committed operation, 0 for an empty log.
    public var lastLSN: UInt64 {
        get throws(StrataError) { try txn.lastLSN(in: databases) }
    }

    // MARK: Rows

    /// The row with `key`, or `nil`. Rows deleted locally (pending deletes) are returned only
    /// with `includingDeleted`.
    ///
    /// - Complexity: O(log n).
    public func row(_ table: String, key: RowKey, includingDeleted: Bool = false) throws(StrataError) -> Row? {
        let t = try catalog.table(named: table)
        let txn = try self.txn
        var k = ByteWriter(capacity: 32)
        try t.encodeKey(key, into: &k)
        return try k.withUnsafeBytes { (kb) throws(StrataError) -> Row? in
            guard let record = try lmdb({ () throws(LMDBError) in try txn.get(kb, in: databases.rows) }) else { return nil }
            let row = try Row(table: t, rowsKey: kb, record: record)
            return row.status == .deleted && !includingDeleted ? nil : row
        }
    }

    /// Calls `body` with every row of `table` in key order; return `false` from `body` to stop.
    ///
    /// - Complexity: O(n) for n rows of the table.
    public func forEachRow(_ table: String, includingDeleted: Bool = false, _ body: (Row) throws -> Bool) throws {
        let t = try catalog.table(named: table)
        try scanTable(t, in: databases.rows) { k, v in
            let row = try Row(table: t, rowsKey: k, record: v)
            if row.status == .deleted && !includingDeleted { return true }
            return try body(row)
        }
    }

    /// Every row of `table` in key order.
    ///
    /// - Complexity: O(n) for n rows of the table.
    public func rows(_ table: String, includingDeleted: Bool = false) throws(StrataError) -> [Row] {
        return try strataErrors {
            var rows: [Row] = []
            try forEachRow(table, includingDeleted: includingDeleted) { rows.append($0); return true }
            return rows
        }
    }

    /// The number of rows of `table` (pending deletes not counted unless `includingDeleted`).
    ///
    /// - Complexity: O(n).
    public func count(_ table: String, includingDeleted: Bool = false) throws(StrataError) -> Int {
        return try strataErrors {
            let t = try catalog.table(named: table)
            var n = 0
            try scanTable(t, in: databases.rows) { _, v in
                let deleted = try RowHeader(v).flags.contains(.deleted)
                if includingDeleted || !deleted { n += 1 }
                return true
            }
            return n
        }
    }

    /// The rows with changes not yet acknowledged by the server (inserted, updated, deleted or
    /// conflicted), of one table or of all, in table and key order.
    ///
    /// - Complexity: O(p log n) for p pending rows: a range scan of the `pending` view.
    public func pendingRows(_ table: String? = nil) throws(StrataError) -> [Row] {
        return try strataErrors {
            let (txn, catalog) = (try self.txn, try self.catalog)
            let tables = try table.map { [try catalog.table(named: $0)] } ?? catalog.tables.values.sorted { $0.id < $1.id }
            var rows: [Row] = []
            for t in tables {
                try scanTable(t, in: databases.pending) { k, _ in
                    guard let record = try lmdb({ () throws(LMDBError) in try txn.get(k, in: databases.rows) }) else {
                        throw StrataError(.corruptRecord, "the pending view names \(catalog.describe(rowsKey: k)), which has no row")
                    }
                    rows.append(try Row(table: t, rowsKey: k, record: record))
                    return true
                }
            }
            return rows
        }
    }

    /// Calls `body(key, value)` for every entry of `db` whose key starts with the table's id.
    func scanTable(_ t: TableInfo, in db: Database, _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool) throws {
        var prefix = ByteWriter(capacity: 4)
        prefix.appendBigEndian(t.id)
        try txn.scan(db) { c in
            var e = try c.seek(atLeast: prefix.bytes)
            while let entry = e, entry.key.starts(with: prefix.bytes) {
                guard try body(entry.key, entry.value) else { return }
                e = try c.next()
            }
        }
    }

    // MARK: The log

    /// Calls `body` with each operation from LSN `from` through `through`, in order; return
    /// `false` to stop. After compaction the log starts after ``horizon``.
    ///
    /// - Complexity: O(k) for k operations visited, plus O(log n) to find the first.
    public func forEachOperation(from: UInt64 = 1, through: UInt64 = .max, _ body: (LogEntry) throws -> Bool) throws {
        let rules = try txn.checksumRules(in: databases)
        let (lmdbTxn, log) = (try self.txn.txn, databases.log)
        var cache: TransactionHeader? = nil
        try lmdbTxn.scan(log) { c in
            var e = try c.seek(atLeast: Swift.withUnsafeBytes(of: from.bigEndian) { Array($0) })
            while let entry = e {
                let lsn = try Counter.lsn(key: entry.key)
                if lsn > through { return }
                let op = try LogEntry(lsn: lsn, record: entry.value, catalog: catalog, rules: rules) { (h) throws(StrataError) in
                    try lmdbTxn.transactionHeader(of: h, at: lsn, log: log, rules: rules, cache: &cache)
                }
                guard try body(op) else { return }
                e = try c.next()
            }
        }
    }

    /// The operations from LSN `from` through `through`, in order.
    public func operations(from: UInt64 = 1, through: UInt64 = .max) throws(StrataError) -> [LogEntry] {
        return try strataErrors {
            var ops: [LogEntry] = []
            try forEachOperation(from: from, through: through) { ops.append($0); return true }
            return ops
        }
    }

    /// Every operation that touched the row `key` of `table`, oldest first — including those
    /// before a removal, so the history of a row that no longer exists stays readable. After
    /// compaction, the operations after the horizon (``horizon``).
    ///
    /// - Complexity: O(h log m) for h operations on the row: the operations of a row form a chain
    ///   through the log, followed from the row's last one.
    public func history(_ table: String, key: RowKey) throws(StrataError) -> [LogEntry] {
        return try strataErrors {
            let t = try catalog.table(named: table)
            var k = ByteWriter(capacity: 40)
            try t.encodeKey(key, into: &k)
            var entries: [LogEntry] = []
            let rules = try txn.checksumRules(in: databases)
            let lmdbTxn = try txn.txn
            var cache: TransactionHeader? = nil
            try txn.forEachInChain(of: k.bytes, databases: databases) { lsn, record in
                entries.append(try LogEntry(lsn: lsn, record: record, catalog: catalog, rules: rules) { (h) throws(StrataError) in
                    try lmdbTxn.transactionHeader(of: h, at: lsn, log: databases.log, rules: rules, cache: &cache)
                })
            }
            return entries.reversed()
        }
    }
}

@available(*, unavailable, message: "snapshots never leave their closure")
extension Snapshot: Sendable {}

extension ViewReader {
    /// The LSN of the operation that removed the row at `target`, 0 when it was never removed.
    func goneLSN(_ target: [UInt8], databases: StoreDatabases) throws(StrataError) -> UInt64 {
        guard let b = try lmdb({ () throws(LMDBError) in try get(target, in: databases.gone) }) else { return 0 }
        return try Counter.decode(b, database: StoreDatabases.names.gone, key: "a removed row's LSN")
    }

    /// Calls `body` with each operation on the row at `target` still in the log, newest first,
    /// following the chain of `prevLSN`s from the row's last operation (or from the one that
    /// removed it) down to the compaction horizon.
    func forEachInChain(of target: [UInt8], databases: StoreDatabases, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws {
        var lsn: UInt64
        if let row = try lmdb({ () throws(LMDBError) in try get(target, in: databases.rows) }) {
            lsn = try RowHeader(row).lastLSN
        } else {
            lsn = try goneLSN(target, databases: databases)
        }
        // Operations up to the horizon were folded into `base`; the chain continues there.
        let horizon = try horizon(in: databases)
        let rules = try checksumRules(in: databases)
        while lsn > horizon {
            var key = lsn.bigEndian
            let found = try lmdb { () throws(LMDBError) in try Swift.withUnsafeBytes(of: &key) { (k) throws(LMDBError) in try get(k, in: databases.log) } }
            guard let record = found else {
                throw StrataError(.corruptRecord, "the history of a row names LSN \(lsn), which is not in the log")
            }
            // Checked before its previous LSN is followed: a damaged one would lead astray.
            try RecordChecksum.check(record, lsn: lsn, rules: rules)
            let header = try OperationHeader(record)
            guard header.prevLSN < lsn else {
                throw StrataError(.corruptRecord, "operation \(lsn) names a later operation (\(header.prevLSN)) as its predecessor")
            }
            try body(lsn, record)
            lsn = header.prevLSN
        }
    }

    /// The row at `target` as the fold of its chain: its state in `base` (if compaction left
    /// one), then its operations in the log up to LSN `through`, oldest first. `nil` when the row
    /// did not exist then; also whether it was pending.
    func foldChain(of target: [UInt8], databases: StoreDatabases, through: UInt64 = .max) throws -> (state: [UInt8]?, pending: Bool) {
        var chain: [(lsn: UInt64, record: [UInt8])] = []
        try forEachInChain(of: target, databases: databases) { lsn, record in
            if lsn <= through { chain.append((lsn, Array(record))) }
        }
        let base = try lmdb { () throws(LMDBError) in try get(target, in: databases.base).map(Array.init) }
        return try RowFold.fold(from: base, chain.reversed())
    }
}

import LMDB

// Streaming variants of the listings in `Snapshot.swift`: each calls its closure with one item
// at a time, so a caller that prints or forwards them holds one at a time too (the `strata`
// command's listings use them to keep memory flat in the length of the output).

extension Snapshot {
    /// Calls `body` with each pending row (see ``pendingRows(_:)``) of `table`, or of every
    /// table, in table and key order; return `false` from `body` to stop.
    ///
    /// - Complexity: O(p log n) for p pending rows; memory O(1) in p.
    public func forEachPendingRow(_ table: String? = nil, _ body: (Row) throws -> Bool) throws {
        let (txn, catalog) = (try self.txn, try self.catalog)
        let tables = try table.map { [try catalog.table(named: $0)] } ?? catalog.tables.values.sorted { $0.id < $1.id }
        var going = true
        for t in tables where going {
            try scanTable(t, in: databases.pending) { k, _ in
                guard let record = try lmdb({ () throws(LMDBError) in try txn.get(k, in: databases.rows) }) else {
                    throw StrataError(.corruptRecord, "the pending view names \(catalog.describe(rowsKey: k)), which has no row")
                }
                going = try body(try Row(table: t, rowsKey: k, record: record))
                return going
            }
        }
    }

    /// Calls `body` with every operation on the row `key` of `table`, oldest first (see
    /// ``history(_:key:)-(_,RowKey)``); return `false` from `body` to stop.
    ///
    /// The operations of a row form a chain through the log that is followed from the newest;
    /// to hand them out oldest first, this keeps their LSNs (8 bytes each), not the operations.
    ///
    /// - Complexity: O(h log m) for h operations on the row; memory O(h) LSNs.
    public func forEachInHistory(_ table: String, key: RowKey, _ body: (LogEntry) throws -> Bool) throws {
        let t = try catalog.table(named: table)
        var k = ByteWriter(capacity: 40)
        try t.encodeKey(key, into: &k)
        let txn = try self.txn
        var lsns: [UInt64] = []
        let rules = try txn.checksumRules(in: databases)
        try txn.forEachInChain(of: k.bytes, databases: databases) { lsn, _ in lsns.append(lsn) }
        var cache: TransactionHeader? = nil
        for lsn in lsns.reversed() {
            var keyBE = lsn.bigEndian
            let found = try lmdb { () throws(LMDBError) in try Swift.withUnsafeBytes(of: &keyBE) { (kb) throws(LMDBError) in try txn.get(kb, in: databases.log) } }
            guard let record = found else {
                throw StrataError(.corruptRecord, "the history of a row names LSN \(lsn), which is not in the log")
            }
            let op = try LogEntry(lsn: lsn, record: record, catalog: catalog, rules: rules) { (h) throws(StrataError) in
                try txn.txn.transactionHeader(of: h, at: lsn, log: databases.log, rules: rules, cache: &cache)
            }
            guard try body(op) else { return }
        }
    }
}

import LMDB

extension Snapshot {
    /// The row as it was right after LSN `lsn` (`nil` if it did not exist then, or — without
    /// `includingDeleted` — was deleted locally).
    ///
    /// Found by folding the row's own operations (its chain through the log) up to `lsn`; for a
    /// whole table as of an LSN, see ``Store/replay(into:through:)``.
    ///
    /// - Complexity: O(h log m) for the h operations on the row.
    public func row(_ table: String, key: RowKey, asOf lsn: UInt64, includingDeleted: Bool = false) throws -> Row? {
        let t = try catalog.table(named: table)
        var k = ByteWriter(capacity: 32)
        try t.encodeKey(key, into: &k)
        var chain: [(UInt64, [UInt8])] = []
        try txn.forEachInChain(of: k.bytes, views: views) { l, record in
            if l <= lsn { chain.append((l, Array(record))) }
        }
        let state = try RowFold.fold(chain.reversed().map { (lsn: $0.0, record: $0.1) }).state
        guard let state else { return nil }
        let row = try withBytes(state) { (record) throws(StrataError) in
            try k.withUnsafeBytes { (kb) throws(StrataError) in try Row(table: t, rowsKey: kb, record: record) }
        }
        return row.status == .deleted && !includingDeleted ? nil : row
    }
}

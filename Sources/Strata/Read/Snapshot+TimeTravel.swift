import LMDB

extension Snapshot {
    /// The row as it was right after LSN `lsn` (`nil` if it did not exist then, or — without
    /// `includingDeleted` — was deleted locally).
    ///
    /// Found by folding the row's own operations (its chain through the log) up to `lsn`, from
    /// its base state when the store was compacted; for a whole table as of an LSN, see
    /// ``Store/replay(into:through:progress:)``.
    ///
    /// - Throws: ``StrataError`` `compacted` when `lsn` is before the compaction horizon
    ///   (``Snapshot/horizon``).
    ///
    /// - Complexity: O(h log m) for the h operations on the row.
    public func row(_ table: String, key: RowKey, asOf lsn: UInt64, includingDeleted: Bool = false) throws(StrataError) -> Row? {
        return try strataErrors {
            let t = try catalog.table(named: table)
            var k = ByteWriter(capacity: 32)
            try t.encodeKey(key, into: &k)
            let horizon = try txn.horizon(in: databases)
            guard lsn >= horizon else {
                throw StrataError(.compacted, "LSN \(lsn) is before the compaction horizon (\(horizon)): the operations up to it were folded into the base snapshot")
            }
            let state = try txn.foldChain(of: k.bytes, databases: databases, through: lsn).state
            guard let state else { return nil }
            let row = try withBytes(state) { (record) throws(StrataError) in
                try k.withUnsafeBytes { (kb) throws(StrataError) in try Row(table: t, rowsKey: kb, record: record) }
            }
            return row.status == .deleted && !includingDeleted ? nil : row
        }
    }
}

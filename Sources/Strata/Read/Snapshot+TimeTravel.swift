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
        var state: [UInt8]? = nil
        var out = ByteWriter(capacity: 256)
        for (l, op) in chain.reversed() {
            let result = try withBytes(op) { (o) throws(StrataError) -> Bool? in
                let header = try OperationHeader(o)
                guard let s = state else { return try RowFold.apply(old: nil, op: o, header: header, lsn: l, into: &out) }
                return try withBytes(s) { (old) throws(StrataError) in try RowFold.apply(old: old, op: o, header: header, lsn: l, into: &out) }
            }
            state = result == nil ? nil : out.bytes
        }
        guard let state else { return nil }
        let row = try withBytes(state) { (record) throws(StrataError) in
            try k.withUnsafeBytes { (kb) throws(StrataError) in try Row(table: t, rowsKey: kb, record: record) }
        }
        return row.status == .deleted && !includingDeleted ? nil : row
    }
}

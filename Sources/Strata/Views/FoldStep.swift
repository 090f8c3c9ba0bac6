/// One operation folded into its row: the rule every fold of the log follows — the write path
/// (``StoreDatabases/apply(operation:header:lsn:old:table:in:scratch:checkingUniqueness:)``), another
/// process folding the log's tail, the bulk fold of rebuild, verify and replay (`BulkFold`), and
/// compaction's fold into the base snapshot. Each applies the result to its own storage.
struct FoldStep {
    /// What becomes of a row's `gone` or `pending` entry.
    enum Change: Equatable {
        case keep
        /// The entry is set to this LSN.
        case set(UInt64)
        case clear
    }

    /// `nil`: the row is gone; otherwise whether it is pending. The new state is in `scratch`.
    let isPending: Bool?
    /// The `gone` entry: set when the row is removed, cleared when a removed key comes back.
    let gone: Change
    /// The `pending` entry: the LSN that made the row pending, kept while it stays pending.
    let pending: Change

    /// Folds `op` (at `lsn`) into the row state `old` (`nil`: no row), writing the new state into
    /// `scratch`. `wasPending` is whether the row had a `pending` entry.
    ///
    /// - Throws: ``StrataError/Code-swift.struct/corruptRecord`` when the operation does not
    ///   follow the row's last one (a broken chain), or its record is damaged.
    static func fold(
        old: StoredRow?, wasPending: Bool, op: UnsafeRawBufferPointer, header: OperationHeader, lsn: UInt64,
        into scratch: inout ByteWriter
    ) throws(StrataError) -> FoldStep {
        if let old {
            let last = old.header.lastLSN
            guard header.prevLSN == last else {
                throw StrataError(.corruptRecord, "operation \(lsn) follows LSN \(header.prevLSN), but its row was last changed at LSN \(last)")
            }
        }
        let isPending = try RowFold.apply(old: old, op: op, header: header, lsn: lsn, into: &scratch)
        let gone: Change = isPending == nil ? .set(lsn) : (old == nil && header.prevLSN != 0 ? .clear : .keep)
        let pending: Change = isPending == true && !wasPending ? .set(lsn) : (isPending != true && wasPending ? .clear : .keep)
        return FoldStep(isPending: isPending, gone: gone, pending: pending)
    }
}

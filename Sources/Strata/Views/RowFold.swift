import LMDB

/// Applies an operation to a row state. Used by the write path and by rebuild alike, so a
/// rebuilt view is the live view, byte for byte.
enum RowFold {
    /// Writes the row state that results from applying `op` (at `lsn`) to `old` into `out`.
    ///
    /// Returns `nil` when the row is gone, otherwise whether the row is pending (inserted,
    /// deleted, conflicted, or with at least one dirty field).
    ///
    /// - Complexity: O(number of fields of the row and of the operation).
    static func apply(
        old: StoredRow?, op: UnsafeRawBufferPointer, header: OperationHeader, lsn: UInt64,
        into out: inout ByteWriter
    ) throws(StrataError) -> Bool? {
        if header.flagsAfter.contains(.gone) {
            out.reset()
            return nil
        }
        // The row's flags and last LSN, made on the stack and put in place of the writer's
        // bytes by one call: emptying the writer and the appends cost about 150 instructions.
        var head: (UInt64, UInt64) = (0, 0)
        let headCount = withUnsafeMutableBytes(of: &head) { b in
            b[0] = header.flagsAfter.rawValue
            return ByteWriter.writeVarint(lsn, to: b, at: 1)
        }
        withUnsafeBytes(of: &head) { out.replaceAll(with: UnsafeRawBufferPointer(rebasing: $0[0..<headCount])) }

        var dirty = 0
        var a = ByteReader(op, offset: header.entriesStart)
        var b = old?.entries ?? ByteReader(UnsafeRawBufferPointer(start: nil, count: 0))
        var x = try a.nextEntry()
        var y = try b.nextEntry()
        var lastID = -1
        // Entries that lie next to each other in their source are copied in one append (most
        // of a row's entries are the old row's, unchanged): `run` is the stretch of `source`
        // (the operation's bytes, or the old row's) not yet copied into `out`.
        let oldBytes = old?.bytes ?? UnsafeRawBufferPointer(start: nil, count: 0)
        var source = op
        var run = 0..<0
        func take(_ entry: Range<Int>, of bytes: UnsafeRawBufferPointer) {
            if bytes.baseAddress == source.baseAddress && run.upperBound == entry.lowerBound {
                run = run.lowerBound..<entry.upperBound
                return
            }
            if !run.isEmpty { out.append(UnsafeRawBufferPointer(rebasing: source[run])) }
            (source, run) = (bytes, entry)
        }
        // Merge the two id-ordered entry lists; the operation's entry wins on equal ids.
        while x != nil || y != nil {
            if let e = x, y == nil || e.id <= y!.id {
                guard e.id > lastID else { throw a.corrupt("operation fields out of order") }
                lastID = e.id
                if let f = y, f.id == e.id { y = try b.nextEntry() }
                // A clean null entry removes the field (a conflict entry stays: it marks the field).
                let isNull = !e.isDirty && !e.isConflict && op[e.current.lowerBound] == ValueTag.null
                if !isNull {
                    take(e.whole, of: op)
                    if e.isDirty { dirty += 1 }
                }
                x = try a.nextEntry()
            } else if let f = y {
                take(f.whole, of: oldBytes)
                if f.isDirty { dirty += 1 }
                y = try b.nextEntry()
            }
        }
        if !run.isEmpty { out.append(UnsafeRawBufferPointer(rebasing: source[run])) }
        let flags = header.flagsAfter
        return dirty > 0 || !flags.intersection([.inserted, .deleted, .conflicted]).isEmpty
    }

    /// Folds a row's operations, oldest first, onto `base` (a row state, or `nil` for no row):
    /// the row state after the last one (`nil` when the row is gone) and whether it is pending.
    static func fold(from base: [UInt8]? = nil, _ chain: [(lsn: UInt64, record: [UInt8])]) throws(StrataError) -> (state: [UInt8]?, pending: Bool) {
        var state = base
        var pending = try base.map { (b) throws(StrataError) in try withBytes(b) { (r) throws(StrataError) in try StoredRow(r).isPending } } ?? false
        var out = ByteWriter(capacity: 256)
        for (lsn, op) in chain {
            let result = try withBytes(op) { (o) throws(StrataError) -> Bool? in
                let header = try OperationHeader(o)
                guard let s = state else { return try apply(old: nil, op: o, header: header, lsn: lsn, into: &out) }
                return try withBytes(s) { (old) throws(StrataError) in try apply(old: try StoredRow(old), op: o, header: header, lsn: lsn, into: &out) }
            }
            state = result == nil ? nil : out.bytes
            pending = result == true
        }
        return (state, pending)
    }
}

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

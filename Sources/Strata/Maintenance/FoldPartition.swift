import Dispatch
import Foundation
import LMDB
import StrataLibc

/// The rows of one partition of a ``BulkFold``: each row's state and its `gone` and `pending`
/// entries, in an open-addressing hash table keyed by the row's `rows` key.
///
/// `@unchecked Sendable`: a partition is used by one thread at a time — its worker while a batch
/// is folded, the thread that runs the fold between batches — and every handoff goes through
/// ``FoldWorkers``' semaphores, which order the accesses.
final class FoldPartition: @unchecked Sendable {
    /// One row: its `rows` key (in `keys`), its state, and its `gone` and `pending` entries.
    struct Slot {
        var keyStart: Int
        var keyCount: Int
        var hash: UInt64
        var tableID: UInt32
        /// The row state record; empty when there is no row.
        var state: [UInt8]
        /// The `gone` entry (LSN of the operation that removed the row), 0 for none.
        var gone: UInt64
        /// The `pending` entry (LSN that made the row pending), 0 for none. LSNs start at 1.
        var pendingSince: UInt64
    }

    // The fold reads and writes these several times per operation. Their accesses are not
    // checked for exclusivity at run time (a check cost about 5% of a rebuild): one thread at a
    // time uses a partition (above), and no access to one of them overlaps another.
    @exclusivity(unchecked) private(set) var slots: [Slot] = []
    /// Open addressing over `slots`: slot index, or -1 for an empty bucket.
    @exclusivity(unchecked) private var buckets = [Int32](repeating: -1, count: 1 << 10)
    @exclusivity(unchecked) private var keys: [UInt8] = []
    /// The bytes held by row states, with each array's header and allocation overhead.
    private var stateBytes = 0
    @exclusivity(unchecked) private var scratch = ByteWriter(capacity: 512)
    /// The slots in key order, set by ``sort()`` before a flush.
    private(set) var order: [Int] = []

    /// What the partition holds: the states, and the tables' allocated capacity (which grows by
    /// doubling, so it can be twice what is used).
    var memory: Int {
        stateBytes + slots.capacity * MemoryLayout<Slot>.stride + keys.capacity + buckets.count * MemoryLayout<Int32>.stride
            + order.capacity * MemoryLayout<Int>.stride
    }
    /// Per state array: its header and malloc's bookkeeping.
    private static let arrayOverhead = 48

    // MARK: The table

    /// The slot of `target` (whose ``BulkFold/hash(_:)`` is `h`), and whether it was created.
    func slot(for target: UnsafeRawBufferPointer, hash h: UInt64) -> (slot: Int, created: Bool) {
        let mask = buckets.count - 1
        var b = Int(truncatingIfNeeded: h) & mask
        while true {
            let s = Int(buckets[b])
            if s < 0 { break }
            if slots[s].hash == h, slots[s].keyCount == target.count, keyEquals(s, target) { return (s, false) }
            b = (b + 1) & mask
        }
        let s = slots.count
        let tableID = target.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        slots.append(Slot(keyStart: keys.count, keyCount: target.count, hash: h, tableID: tableID, state: [], gone: 0, pendingSince: 0))
        keys.append(contentsOf: target)
        buckets[b] = Int32(s)
        if slots.count * 2 > buckets.count { grow() }
        return (s, true)
    }

    private func keyEquals(_ s: Int, _ target: UnsafeRawBufferPointer) -> Bool {
        keys.withUnsafeBytes { k in memcmp(k.baseAddress! + slots[s].keyStart, target.baseAddress!, target.count) == 0 }
    }

    private func grow() {
        buckets = [Int32](repeating: -1, count: buckets.count * 2)
        let mask = buckets.count - 1
        for s in slots.indices {
            var b = Int(truncatingIfNeeded: slots[s].hash) & mask
            while buckets[b] >= 0 { b = (b + 1) & mask }
            buckets[b] = Int32(s)
        }
    }

    /// Calls `body` with the `rows` key of slot `s`.
    func withKey<R, E: Error>(_ s: Int, _ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        let (start, count) = (slots[s].keyStart, slots[s].keyCount)
        return try withBytes(keys) { (k) throws(E) -> R in
            try body(UnsafeRawBufferPointer(rebasing: k[start..<start + count]))
        }
    }

    /// Bytewise order (LMDB's: a prefix first) of slot `s` here and slot `t` of `other`.
    func precedes(_ s: Int, _ other: FoldPartition, _ t: Int) -> Bool {
        withKey(s) { a in other.withKey(t) { b in compareBytes(a, b) < 0 } }
    }

    func setGone(_ s: Int, _ lsn: UInt64) { slots[s].gone = lsn }
    func setPending(_ s: Int, _ lsn: UInt64) { slots[s].pendingSince = lsn }

    func replaceState(_ s: Int, with bytes: UnsafeRawBufferPointer) {
        let before = slots[s].state.capacity
        slots[s].state.removeAll(keepingCapacity: true)
        slots[s].state.append(contentsOf: bytes)
        stateBytes += slots[s].state.capacity - before + (before == 0 && !bytes.isEmpty ? Self.arrayOverhead : 0)
    }

    // MARK: Folding

    /// Takes a row state of the base snapshot as slot `s`'s starting point.
    func base(_ s: Int, state: UnsafeRawBufferPointer) throws(StrataError) {
        let row = try StoredRow(state)
        let pending = try row.isPending ? row.header.lastLSN : 0
        replaceState(s, with: state)
        slots[s].pendingSince = pending
    }

    /// Folds the operation `op` (whose header is `header`) at `lsn` into slot `s`, by the one
    /// fold rule, ``FoldStep``.
    func apply(_ s: Int, operation op: UnsafeRawBufferPointer, header: OperationHeader, lsn: UInt64) throws(StrataError) {
        let hadRow = !slots[s].state.isEmpty
        let wasPending = slots[s].pendingSince != 0
        let step = try withBytes(slots[s].state) { (old) throws(StrataError) in
            try FoldStep.fold(old: hadRow ? try StoredRow(old) : nil, wasPending: wasPending, op: op, header: header, lsn: lsn, into: &scratch)
        }
        if step.isPending == nil {
            replaceState(s, with: UnsafeRawBufferPointer(start: nil, count: 0))
        } else {
            let state = scratch.bytes
            withBytes(state) { replaceState(s, with: $0) }
        }
        switch step.gone {
        case .keep: break
        case .clear: slots[s].gone = 0
        case .set(let lsn): slots[s].gone = lsn
        }
        switch step.pending {
        case .keep: break
        case .clear: slots[s].pendingSince = 0
        case .set(let lsn): slots[s].pendingSince = lsn
        }
    }

    // MARK: Flushing

    /// Sets ``order`` to the slots in key order (LMDB's order: bytewise, shorter first on a
    /// common prefix).
    func sort() {
        // Sorting by the first 16 bytes as two integers settles nearly every comparison without
        // touching the key bytes (a table id and an encoded integer key fit in 13).
        struct Item { var a: UInt64; var b: UInt64; var slot: Int }
        var items: [Item] = []
        items.reserveCapacity(slots.count)
        keys.withUnsafeBytes { k in
            for (i, s) in slots.enumerated() {
                var a: UInt64 = 0
                var b: UInt64 = 0
                for j in 0..<16 {
                    let byte = j < s.keyCount ? UInt64(k[s.keyStart + j]) : 0
                    if j < 8 { a = a << 8 | byte } else { b = b << 8 | byte }
                }
                items.append(Item(a: a, b: b, slot: i))
            }
            items.sort { x, y in
                if x.a != y.a { return x.a < y.a }
                if x.b != y.b { return x.b < y.b }
                let sx = slots[x.slot]
                let sy = slots[y.slot]
                let n = min(sx.keyCount, sy.keyCount)
                let c = memcmp(k.baseAddress! + sx.keyStart, k.baseAddress! + sy.keyStart, n)
                return c != 0 ? c < 0 : sx.keyCount < sy.keyCount
            }
        }
        order = items.map(\.slot)
    }

    /// Forgets every row. Keeps the tables' capacity (the next pass is likely as large) unless
    /// they take more than `keepingUpTo` bytes.
    func removeAll(keepingUpTo limit: Int) {
        slots.removeAll(keepingCapacity: true)
        keys.removeAll(keepingCapacity: true)
        order.removeAll(keepingCapacity: true)
        for b in buckets.indices { buckets[b] = -1 }
        stateBytes = 0
        if memory > limit {
            slots = []
            keys = []
            order = []
            buckets = [Int32](repeating: -1, count: 1 << 10)
        }
    }
}

/// Records routed to one partition: operations of the log and rows of the base snapshot, copied
/// out of the reader's transaction (LMDB lends its memory to one thread).
///
/// `@unchecked Sendable` for the same reason as ``FoldPartition``.
final class FoldBatch: @unchecked Sendable {
    struct Entry {
        /// The record (an operation, or a base row's key followed by its state) in `bytes`.
        var start: Int
        var count: Int
        /// The row's `rows` key, from `start`.
        var targetStart: Int
        var targetCount: Int
        /// Whether this is a base snapshot row rather than an operation.
        var isBase: Bool
        var lsn: UInt64
        /// Position in the fold (base rows, then the log): the first error in this order wins.
        var sequence: Int
        var hash: UInt64
        var slot: Int
    }

    var bytes: [UInt8] = []
    var entries: [Entry] = []
    /// Entries whose slot is known (all of them unless one failed).
    var resolved = 0
    /// Slots created for this batch, to be read back from the target.
    var created: [Int] = []
    /// The first failure, at its position in the fold.
    var failure: (sequence: Int, error: StrataError)?

    var memory: Int { bytes.capacity + entries.capacity * MemoryLayout<Entry>.stride + created.capacity * MemoryLayout<Int>.stride }

    /// Appends `record`, followed by `tail` (a base row's state after its key).
    func append(_ record: UnsafeRawBufferPointer, _ tail: UnsafeRawBufferPointer, target: Range<Int>, isBase: Bool, lsn: UInt64, sequence: Int, hash: UInt64) {
        let start = bytes.count
        bytes.append(contentsOf: record)
        bytes.append(contentsOf: tail)
        entries.append(Entry(start: start, count: record.count + tail.count,  targetStart: start + target.lowerBound, targetCount: target.count, isBase: isBase, lsn: lsn, sequence: sequence, hash: hash, slot: -1))
    }

    func removeAll() {
        bytes.removeAll(keepingCapacity: true)
        entries.removeAll(keepingCapacity: true)
        created.removeAll(keepingCapacity: true)
        resolved = 0
        failure = nil
    }

    /// Finds (or creates) each entry's slot in `p`; with `collecting`, lists the slots created.
    func resolve(in p: FoldPartition, collecting: Bool) {
        bytes.withUnsafeBytes { b in
            for i in entries.indices {
                let e = entries[i]
                let (s, isNew) = p.slot(for: UnsafeRawBufferPointer(rebasing: b[e.targetStart..<e.targetStart + e.targetCount]), hash: e.hash)
                entries[i].slot = s
                if isNew, collecting { created.append(s) }
            }
        }
        resolved = entries.count
    }

    /// Folds the resolved entries into `p`, in order, stopping at the first failure.
    func fold(into p: FoldPartition) {
        bytes.withUnsafeBytes { b in
            for e in entries[..<resolved] {
                let record = UnsafeRawBufferPointer(rebasing: b[e.start..<e.start + e.count])
                do throws(StrataError) {
                    if e.isBase {
                        try p.base(e.slot, state: UnsafeRawBufferPointer(rebasing: record[e.targetCount...]))
                    } else {
                        try p.apply(e.slot, operation: record, header: try OperationHeader(record), lsn: e.lsn)
                    }
                } catch {
                    failure = (e.sequence, error)
                    return
                }
            }
        }
    }
}

/// Threads that each run one part of a job, for ``BulkFold``: the thread that posts a job waits
/// for all of them before it touches what the job uses.
final class FoldWorkers {
    /// `@unchecked Sendable`: `job` and `stop` are written only while every worker waits on its
    /// `start` semaphore, and read by a worker after that semaphore is signalled, which orders
    /// the write before the read.
    private final class Shared: @unchecked Sendable {
        let start: [DispatchSemaphore]
        let done = DispatchSemaphore(value: 0)
        var job: (@Sendable (Int) -> Void)?
        var stop = false
        init(_ count: Int) { start = (0..<count).map { _ in DispatchSemaphore(value: 0) } }
    }

    let count: Int
    private let shared: Shared
    private var busy = false

    init(count: Int) {
        self.count = count
        let shared = Shared(count)
        self.shared = shared
        for i in 0..<count {
            let thread = Thread {
                while true {
                    shared.start[i].wait()
                    if shared.stop { return }
                    shared.job?(i)
                    shared.done.signal()
                }
            }
            thread.name = "strata-fold-\(i)"
            thread.start()
        }
    }

    /// Runs `job(i)` on worker `i`, for every worker; returns at once.
    func post(_ job: @escaping @Sendable (Int) -> Void) {
        precondition(!busy, "FoldWorkers: a job was posted before the last one was waited for")
        shared.job = job
        busy = true
        for s in shared.start { s.signal() }
    }

    /// Waits until every worker has finished the posted job (returns at once when none is).
    func wait() {
        guard busy else { return }
        for _ in 0..<count { shared.done.wait() }
        busy = false
        shared.job = nil
    }

    deinit {
        wait()
        shared.stop = true
        for s in shared.start { s.signal() }
    }
}

import LMDB
import StrataLibc

/// Folds a base snapshot and a whole log into the views of a write transaction, through memory.
///
/// Rebuild, verify and replay fold every operation of a store. Folding them one by one into the
/// B-trees (as the write path does for a single edit) reads and rewrites a random page per
/// operation. This fold keeps each row's state in a hash table while the operations stream by,
/// and writes every row once, in key order, when it flushes: into empty databases that is a
/// sequential `MDB_APPEND`.
///
/// Per operation it does exactly what ``StoreDatabases/apply(operation:header:lsn:old:table:in:scratch:)``
/// does — the same ``FoldStep`` — so its result is the live views, byte for byte. Indexes and
/// named views are a function of a row's final state, and are written at the flush from the
/// state the target held before it.
///
/// **On several cores.** With more than one worker, rows are partitioned by the hash of their
/// key: the calling thread reads the log once and routes each record, in batches, to its
/// partition's worker, which folds it while the next batch is read. A row's operations all go
/// to one worker, in log order, so each partition folds exactly as the sequential fold would.
/// LMDB has one writer: at a flush, the workers sort their rows and the calling thread merges
/// the sorted partitions into the write transaction, so the target receives the same entries in
/// the same order. The first failure, in log order, is the one reported.
///
/// Memory is bounded by `budget` (the partitions' tables and the batches in flight): when they
/// take more, every row is flushed into the target and forgotten, and a row met again later is
/// read back from the target (by the calling thread, between batches: the workers never touch
/// LMDB).
struct BulkFold {
    private let databases: StoreDatabases
    private let catalog: Catalog
    /// The transaction the fold writes into: the one it was given, or, when it commits a scratch
    /// store in steps, the current step's.
    private var txn: LMDB.WriteTransaction
    /// The same transaction for the index and view code, which writes through a ``ViewWriter``;
    /// without an overlay, it writes straight into LMDB.
    private var writer: ViewWriter
    /// With a scratch store: its environment, which the fold commits in steps of about
    /// `stepBytes` (see ``commitsInSteps(_:)``).
    private var environment: Environment?
    private let budget: Int
    /// Whether the target's derived databases hold rows (they do after a flush): rows are then
    /// read back on a miss and replaced at the flush, instead of appended.
    private var targetMayHoldRows = false

    private let partitions: [FoldPartition]
    /// `nil`: one partition, folded on the calling thread as records arrive.
    private let workers: FoldWorkers?
    /// The batches being filled by the reader, one per partition.
    private var filling: [FoldBatch]
    /// The batches the workers are folding (or last folded), one per partition.
    private var inFlight: [FoldBatch]
    private var batchedBytes = 0
    /// A batch is handed to the workers when it holds this many bytes: large enough that the
    /// handoff is rare, small against the budget.
    private let batchLimit: Int
    private var sequence = 0
    private var cachedTable: TableInfo?

    private var memory: Int {
        partitions.reduce(0) { $0 + $1.memory } + filling.reduce(0) { $0 + $1.memory } + inFlight.reduce(0) { $0 + $1.memory }
    }

    /// `rows`, `pending`, `gone`, `index` and `view` of `databases` in `txn` must be empty (a new
    /// store, or one `rebuild` has just cleared). `workers` is the number of threads that fold
    /// (1: the calling thread alone).
    init(databases: StoreDatabases, catalog: Catalog, into txn: LMDB.WriteTransaction, budget: Int, workers: Int = 1) {
        self.databases = databases
        self.catalog = catalog
        self.txn = txn
        self.writer = ViewWriter(txn, databases, overlay: nil)
        self.budget = budget
        let count = max(1, workers)
        partitions = (0..<count).map { _ in FoldPartition() }
        self.workers = count > 1 ? FoldWorkers(count: count) : nil
        filling = count > 1 ? (0..<count).map { _ in FoldBatch() } : []
        inFlight = count > 1 ? (0..<count).map { _ in FoldBatch() } : []
        batchLimit = max(1, min(2 << 20, budget / 16))
    }

    /// The bytes of rows a flush writes per transaction when the fold commits in steps: LMDB
    /// keeps a transaction's dirty pages in memory (up to 512 MiB before it spills), so this
    /// bounds them, to a 32nd of the budget (8 MiB by default).
    private var stepBytes: Int { Self.stepBytes(budget: budget) }

    /// The bytes one transaction of a scratch store holds when it is written in steps, for a
    /// fold memory budget of `budget` (``StoreOptions/foldMemoryLimit``).
    static func stepBytes(budget: Int) -> Int { max(1, min(32 << 20, budget / 32)) }

    /// Makes every flush commit the target in transactions of about `stepBytes` each, in
    /// `environment` (whose write transaction `txn` was; it must be committed, and no longer
    /// used, before the first flush). For a scratch store, which nobody reads until the fold
    /// ends; `rebuild()` in place stays one transaction.
    mutating func commitsInSteps(_ environment: Environment) {
        self.environment = environment
    }

    // MARK: Folding

    /// Takes a row state of the base snapshot as the row's starting point.
    mutating func base(_ target: UnsafeRawBufferPointer, state: UnsafeRawBufferPointer) throws(StrataError) {
        guard target.count >= 4 else { try fail(StrataError(.corruptRecord, "a base snapshot key of \(target.count) bytes")) }
        let h = BulkFold.hash(target)
        if workers == nil {
            let s = try slot(for: target, hash: h)
            try partitions[0].base(s, state: state)
            try flushIfOverBudget()
            return
        }
        // The batch holds the key, then the state.
        try route(target, state, target: 0..<target.count, isBase: true, lsn: 0, hash: h)
    }

    /// Folds the operation at `lsn` into its row.
    mutating func apply(operation op: UnsafeRawBufferPointer, lsn: UInt64) throws(StrataError) {
        let header: OperationHeader
        do throws(StrataError) { header = try OperationHeader(op) } catch { try fail(error) }
        let target = UnsafeRawBufferPointer(rebasing: op[header.target])
        let h = BulkFold.hash(target)
        if workers == nil {
            let s = try slot(for: target, hash: h)
            try partitions[0].apply(s, operation: op, header: header, lsn: lsn)
            try flushIfOverBudget()
            return
        }
        try route(op, UnsafeRawBufferPointer(start: nil, count: 0), target: header.target, isBase: false, lsn: lsn, hash: h)
    }

    /// Writes every row still in memory into the target. Call once after the last operation.
    mutating func finish() throws(StrataError) {
        try settle()
        try flush()
    }

    /// Folds every record received so far, and throws the first failure among them. A caller
    /// that fails after handing records to the fold settles it first, so that a failure earlier
    /// in the log is the one reported.
    mutating func settle() throws(StrataError) {
        guard workers != nil else { return }
        try dispatch()
        try waitForWorkers()
    }

    /// Throws `error` once every record before it is folded, unless one of those failed.
    private mutating func fail(_ error: StrataError) throws(StrataError) -> Never {
        try settle()
        throw error
    }

    /// The slot of `target` in the single partition, read back from the target when created
    /// after a flush.
    private mutating func slot(for target: UnsafeRawBufferPointer, hash h: UInt64) throws(StrataError) -> Int {
        let (s, created) = partitions[0].slot(for: target, hash: h)
        if created, targetMayHoldRows { try readBack(partitions[0], s) }
        return s
    }

    // MARK: Partitions and batches

    private mutating func route(_ record: UnsafeRawBufferPointer, _ tail: UnsafeRawBufferPointer, target: Range<Int>, isBase: Bool, lsn: UInt64, hash h: UInt64) throws(StrataError) {
        // The high bits pick the partition: the low ones pick the bucket inside it.
        let p = Int(((h >> 32) &* UInt64(partitions.count)) >> 32)
        filling[p].append(record, tail, target: target, isBase: isBase, lsn: lsn, sequence: sequence, hash: h)
        sequence += 1
        batchedBytes += record.count + tail.count
        if batchedBytes >= batchLimit { try dispatch() }
    }

    /// Hands the filled batches to the workers, once they are done with the previous ones (and
    /// the fold has flushed, if it is over its budget).
    private mutating func dispatch() throws(StrataError) {
        guard let workers, batchedBytes > 0 else { return }
        try waitForWorkers()
        if memory > budget { try flush() }
        swap(&filling, &inFlight)
        for b in filling { b.removeAll() }
        batchedBytes = 0
        let partitions = partitions
        let batches = inFlight
        if targetMayHoldRows {
            // Rows not in memory may be in the target: find them, read them back here (the
            // workers never touch LMDB), then fold.
            workers.post { i in batches[i].resolve(in: partitions[i], collecting: true) }
            workers.wait()
            func readBacks(from r: some ReadableTransaction) throws(StrataError) {
                for (p, b) in zip(partitions, batches) {
                    for s in b.created { try readBack(p, s, from: r) }
                }
            }
            if let environment {
                // One read transaction for the batch's rows, not one per row.
                try strataErrors { try environment.read { r in try readBacks(from: r) } }
            } else {
                try readBacks(from: txn)
            }
            workers.post { i in batches[i].fold(into: partitions[i]) }
        } else {
            workers.post { i in
                batches[i].resolve(in: partitions[i], collecting: false)
                batches[i].fold(into: partitions[i])
            }
        }
    }

    /// Waits for the workers, then throws the first failure, in log order, of their batches.
    private mutating func waitForWorkers() throws(StrataError) {
        guard let workers else { return }
        workers.wait()
        if let first = inFlight.compactMap(\.failure).min(by: { $0.sequence < $1.sequence }) {
            throw first.error
        }
    }

    /// Loads a row the target already holds (written by an earlier flush).
    private func readBack(_ p: FoldPartition, _ s: Int) throws(StrataError) {
        if let environment {
            // The flushes were committed: read them in a read transaction of the scratch store.
            try strataErrors { try environment.read { r in try readBack(p, s, from: r) } }
        } else {
            try readBack(p, s, from: txn)
        }
    }

    private func readBack(_ p: FoldPartition, _ s: Int, from txn: some ReadableTransaction) throws(StrataError) {
        try p.withKey(s) { (target) throws(StrataError) in
            if let state = try lmdb({ () throws(LMDBError) in try txn.get(target, in: databases.rows) }) {
                p.replaceState(s, with: state)
            }
            if let g = try lmdb({ () throws(LMDBError) in try txn.get(target, in: databases.gone) }) { p.setGone(s, try Self.lsn(g)) }
            if let v = try lmdb({ () throws(LMDBError) in try txn.get(target, in: databases.pending) }) { p.setPending(s, try Self.lsn(v)) }
        }
    }

    // MARK: Flushing

    private mutating func flushIfOverBudget() throws(StrataError) {
        if memory > budget { try flush() }
    }

    /// Writes every row in memory into the target, in key order, and forgets them.
    private mutating func flush() throws(StrataError) {
        if let workers {
            let partitions = partitions
            workers.post { i in partitions[i].sort() }
            workers.wait()
        } else {
            partitions[0].sort()
        }
        // Merge the partitions' sorted rows: a key is in one partition only.
        var next = [Int](repeating: 0, count: partitions.count)
        var old = ByteWriter(capacity: 512)
        func writeRows(upTo limit: Int) throws(StrataError) -> Bool {
            var written = 0
            while written < limit {
                var best = -1
                for p in partitions.indices where next[p] < partitions[p].order.count {
                    if best < 0 || partitions[p].precedes(partitions[p].order[next[p]], partitions[best], partitions[best].order[next[best]]) { best = p }
                }
                if best < 0 { return false }
                let s = partitions[best].order[next[best]]
                try write(partitions[best], s, old: &old)
                written += partitions[best].slots[s].keyCount + partitions[best].slots[s].state.count
                next[best] += 1
            }
            return true
        }
        if let environment {
            var more = true
            while more {
                // Environment.write runs its closure again when the map had to grow: each
                // attempt starts from the same row.
                let start = next
                more = try strataErrors {
                    try environment.write { t in
                        next = start
                        txn = t
                        writer = ViewWriter(t, databases, overlay: nil)
                        return try writeRows(upTo: stepBytes)
                    }
                }
            }
        } else {
            _ = try writeRows(upTo: .max)
        }
        for p in partitions { p.removeAll(keepingUpTo: budget / 2 / partitions.count) }
        targetMayHoldRows = true
    }

    /// Writes slot `s` of `p` into the target.
    private mutating func write(_ p: FoldPartition, _ s: Int, old: inout ByteWriter) throws(StrataError) {
        let append = !targetMayHoldRows
        let slot = p.slots[s]
        let table = try self.table(slot.tableID)
        // Locals, not `self`: a closure that used `self` copied the whole fold (retaining and
        // releasing everything in it) once per row written.
        let (databases, txn, writer) = (self.databases, self.txn, self.writer)
        try p.withKey(s) { (k) throws(StrataError) in
            // The state the target held before this flush, for the index and view entries.
            var hadOld = false
            if !append {
                old.reset()
                if let o = try lmdb({ () throws(LMDBError) in try txn.get(k, in: databases.rows) }) {
                    old.append(o)
                    hadOld = true
                }
            }
            if !table.indexes.isEmpty || !table.views.isEmpty {
                try old.withUnsafeBytes { (o) throws(StrataError) in
                    try withBytes(slot.state) { (n) throws(StrataError) in
                        let before = hadOld ? o : nil
                        let after = slot.state.isEmpty ? nil : n
                        // The log passed the unique checks when it was written; checking here,
                        // with rows written in key order instead of log order, could see a
                        // value still held by a row flushed later.
                        try databases.updateIndexesAndViews(table, target: k, old: before, new: after, in: writer, checkingUniqueness: false)
                    }
                }
            }
            try lmdb { () throws(LMDBError) in
                let flags: PutFlags = append ? .append : []
                if !slot.state.isEmpty {
                    try withBytes(slot.state) { (v) throws(LMDBError) in try txn.put(k, v, in: databases.rows, flags: flags) }
                } else if !append {
                    try txn.delete(k, in: databases.rows)
                }
                try Self.put(slot.gone, k, in: databases.gone, flags: flags, txn)
                try Self.put(slot.pendingSince, k, in: databases.pending, flags: flags, txn)
            }
        }
    }

    /// Puts an LSN entry, or deletes the key's entry when `lsn` is 0.
    private static func put(_ lsn: UInt64, _ key: UnsafeRawBufferPointer, in db: Database, flags: PutFlags, _ txn: LMDB.WriteTransaction) throws(LMDBError) {
        if lsn != 0 {
            var v = lsn.bigEndian
            try Swift.withUnsafeBytes(of: &v) { (b) throws(LMDBError) in try txn.put(key, b, in: db, flags: flags) }
        } else if !flags.contains(.append) {
            try txn.delete(key, in: db)
        }
    }

    private mutating func table(_ id: UInt32) throws(StrataError) -> TableInfo {
        if let t = cachedTable, t.id == id { return t }
        let t = try catalog.table(id: id)
        cachedTable = t
        return t
    }

    // MARK: Helpers

    /// A 64-bit hash of a key, eight bytes at a time.
    @inline(__always)
    static func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        var h: UInt64 = 0x9E37_79B9_7F4A_7C15 ^ UInt64(bytes.count)
        var i = 0
        while i + 8 <= bytes.count {
            h = (h ^ bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self)) &* 0xFF51_AFD7_ED55_8CCD
            h ^= h >> 32
            i += 8
        }
        var tail: UInt64 = 0
        while i < bytes.count {
            tail = tail << 8 | UInt64(bytes[i])
            i += 1
        }
        h = (h ^ tail) &* 0xC4CE_B9FE_1A85_EC53
        return h ^ (h >> 29)
    }

    /// An LSN entry of `gone` or `pending`.
    private static func lsn(_ b: UnsafeRawBufferPointer) throws(StrataError) -> UInt64 {
        try Counter.decode(b, database: "gone or pending", key: "a row's LSN")
    }
}

import Glibc
import LMDB

/// Folds a base snapshot and a whole log into the views of a write transaction, through memory.
///
/// Rebuild, verify and replay fold every operation of a store. Folding them one by one into the
/// B-trees (as the write path does for a single edit) reads and rewrites a random page per
/// operation. This fold keeps each row's state in a hash table while the operations stream by,
/// and writes every row once, in key order, when it flushes: into empty databases that is a
/// sequential `MDB_APPEND`.
///
/// Per operation it does exactly what ``Views/apply(operation:header:lsn:old:table:in:scratch:)``
/// does — the same ``RowFold``, the same chain check, the same `pending` and `gone` rules — so
/// its result is the live views, byte for byte. Indexes and named views are a function of a
/// row's final state, and are written at the flush from the state the target held before it.
///
/// Memory is bounded by `budget`: when the table's rows take more, they are flushed into the
/// target and forgotten, and a row met again later is read back from the target.
struct BulkFold {
    /// One row: its `rows` key (in `keys`), its state, and its `gone` and `pending` entries.
    private struct Slot {
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

    private let views: Views
    private let catalog: Catalog
    private let txn: LMDB.WriteTransaction
    /// The same transaction for the index and view code, which writes through a ``ViewWriter``;
    /// without an overlay, it writes straight into LMDB.
    private let writer: ViewWriter
    private let budget: Int
    /// Whether the target's derived databases hold rows (they do after a flush): rows are then
    /// read back on a miss and replaced at the flush, instead of appended.
    private var targetMayHoldRows = false

    private var slots: [Slot] = []
    /// Open addressing over `slots`: slot index, or -1 for an empty bucket.
    private var buckets: [Int32]
    private var keys: [UInt8] = []
    /// The bytes held by row states, with each array's header and allocation overhead.
    private var stateBytes = 0
    /// What the fold holds: the states, and the tables' allocated capacity (which grows by
    /// doubling, so it can be twice what is used).
    private var memory: Int {
        stateBytes + slots.capacity * MemoryLayout<Slot>.stride + keys.capacity + buckets.count * MemoryLayout<Int32>.stride
    }
    /// Per state array: its header and malloc's bookkeeping.
    private static let arrayOverhead = 48
    private var scratch = ByteWriter(capacity: 512)
    private var cachedTable: TableInfo?

    /// `rows`, `pending`, `gone`, `index` and `view` of `views` in `txn` must be empty (a new
    /// store, or one `rebuild` has just cleared).
    init(views: Views, catalog: Catalog, into txn: LMDB.WriteTransaction, budget: Int) {
        self.views = views
        self.catalog = catalog
        self.txn = txn
        self.writer = ViewWriter(txn, views, overlay: nil)
        self.budget = budget
        buckets = [Int32](repeating: -1, count: 1 << 10)
    }

    // MARK: Folding

    /// Takes a row state of the base snapshot as the row's starting point.
    mutating func base(_ target: UnsafeRawBufferPointer, state: UnsafeRawBufferPointer) throws(StrataError) {
        guard target.count >= 4 else { throw StrataError(.corruptRecord, "a base snapshot key of \(target.count) bytes") }
        let s = try slot(for: target)
        let pending = try RowFold.isPending(state) ? try RowHeader(state).lastLSN : 0
        replaceState(s, with: state)
        slots[s].pendingSince = pending
        try flushIfOverBudget()
    }

    /// Folds the operation at `lsn` into its row.
    mutating func apply(operation op: UnsafeRawBufferPointer, lsn: UInt64) throws(StrataError) {
        let header = try OperationHeader(op)
        let target = UnsafeRawBufferPointer(rebasing: op[header.target])
        let s = try slot(for: target)
        let hadRow = !slots[s].state.isEmpty
        let wasPending = slots[s].pendingSince != 0
        let step = try withBytes(slots[s].state) { (old) throws(StrataError) in
            try FoldStep.fold(old: hadRow ? old : nil, wasPending: wasPending, op: op, header: header, lsn: lsn, into: &scratch)
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
        try flushIfOverBudget()
    }

    /// Writes every row still in memory into the target. Call once after the last operation.
    mutating func finish() throws(StrataError) {
        try flush()
    }

    // MARK: The table

    private mutating func replaceState(_ s: Int, with bytes: UnsafeRawBufferPointer) {
        let before = slots[s].state.capacity
        slots[s].state.removeAll(keepingCapacity: true)
        slots[s].state.append(contentsOf: bytes)
        stateBytes += slots[s].state.capacity - before + (before == 0 && !bytes.isEmpty ? Self.arrayOverhead : 0)
    }

    /// The slot of `target`, created (and read back from the target when it may hold the row)
    /// when absent.
    private mutating func slot(for target: UnsafeRawBufferPointer) throws(StrataError) -> Int {
        let h = BulkFold.hash(target)
        let mask = buckets.count - 1
        var b = Int(truncatingIfNeeded: h) & mask
        while true {
            let s = Int(buckets[b])
            if s < 0 { break }
            if slots[s].hash == h, slots[s].keyCount == target.count, keyEquals(s, target) { return s }
            b = (b + 1) & mask
        }
        let s = slots.count
        let tableID = target.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        slots.append(Slot(keyStart: keys.count, keyCount: target.count, hash: h, tableID: tableID, state: [], gone: 0, pendingSince: 0))
        keys.append(contentsOf: target)
        buckets[b] = Int32(s)
        if targetMayHoldRows { try readBack(s, target) }
        if slots.count * 2 > buckets.count { grow() }
        return s
    }

    private func keyEquals(_ s: Int, _ target: UnsafeRawBufferPointer) -> Bool {
        keys.withUnsafeBytes { k in memcmp(k.baseAddress! + slots[s].keyStart, target.baseAddress!, target.count) == 0 }
    }

    /// Loads a row the target already holds (written by an earlier flush).
    private mutating func readBack(_ s: Int, _ target: UnsafeRawBufferPointer) throws(StrataError) {
        if let state = try lmdb({ () throws(LMDBError) in try txn.get(target, in: views.rows) }) {
            replaceState(s, with: state)
        }
        if let g = try lmdb({ () throws(LMDBError) in try txn.get(target, in: views.gone) }) { slots[s].gone = try Self.lsn(g) }
        if let p = try lmdb({ () throws(LMDBError) in try txn.get(target, in: views.pending) }) { slots[s].pendingSince = try Self.lsn(p) }
    }

    private mutating func grow() {
        buckets = [Int32](repeating: -1, count: buckets.count * 2)
        let mask = buckets.count - 1
        for s in slots.indices {
            var b = Int(truncatingIfNeeded: slots[s].hash) & mask
            while buckets[b] >= 0 { b = (b + 1) & mask }
            buckets[b] = Int32(s)
        }
    }

    // MARK: Flushing

    private mutating func flushIfOverBudget() throws(StrataError) {
        if memory > budget { try flush() }
    }

    private mutating func flush() throws(StrataError) {
        let order = sortedSlots()
        let append = !targetMayHoldRows
        var old = ByteWriter(capacity: 512)
        var key = ByteWriter(capacity: 64)
        for s in order {
            key.reset()
            key.bytes.append(contentsOf: keys[slots[s].keyStart..<slots[s].keyStart + slots[s].keyCount])
            let slot = slots[s]
            try key.withUnsafeBytes { (k) throws(StrataError) in
                // The state the target held before this flush, for the index and view entries.
                var hadOld = false
                if !append {
                    old.reset()
                    if let o = try lmdb({ () throws(LMDBError) in try txn.get(k, in: views.rows) }) {
                        old.append(o)
                        hadOld = true
                    }
                }
                let table = try self.table(slot.tableID)
                if !table.indexes.isEmpty || !table.views.isEmpty {
                    try old.withUnsafeBytes { (o) throws(StrataError) in
                        try withBytes(slot.state) { (n) throws(StrataError) in
                            let before = hadOld ? o : nil
                            let after = slot.state.isEmpty ? nil : n
                            // The log passed the unique checks when it was written; checking here,
                            // with rows written in key order instead of log order, could see a
                            // value still held by a row flushed later.
                            try views.updateIndexes(table, target: k, old: before, new: after, in: writer, checkingUniqueness: false)
                            try views.updateViews(table, target: k, old: before, new: after, in: writer)
                        }
                    }
                }
                try lmdb { () throws(LMDBError) in
                    let flags: PutFlags = append ? .append : []
                    if !slot.state.isEmpty {
                        try withBytes(slot.state) { (v) throws(LMDBError) in try txn.put(k, v, in: views.rows, flags: flags) }
                    } else if !append {
                        try txn.delete(k, in: views.rows)
                    }
                    try put(slot.gone, k, in: views.gone, flags: flags)
                    try put(slot.pendingSince, k, in: views.pending, flags: flags)
                }
            }
        }
        // Keeps the tables' capacity (the next pass is likely as large) but frees the states.
        slots.removeAll(keepingCapacity: true)
        keys.removeAll(keepingCapacity: true)
        for b in buckets.indices { buckets[b] = -1 }
        stateBytes = 0
        if memory > budget / 2 {
            slots = []
            keys = []
            buckets = [Int32](repeating: -1, count: 1 << 10)
        }
        targetMayHoldRows = true
    }

    /// Puts an LSN entry, or deletes the key's entry when `lsn` is 0.
    private func put(_ lsn: UInt64, _ key: UnsafeRawBufferPointer, in db: Database, flags: PutFlags) throws(LMDBError) {
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

    /// The slots in key order (LMDB's order: bytewise, shorter first on a common prefix).
    private func sortedSlots() -> [Int] {
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
        return items.map(\.slot)
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

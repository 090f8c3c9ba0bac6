import Foundation

// The overlay: view entries written since the last checkpoint, kept in memory on top of the
// views in LMDB (docs/write-behind-views.md). A commit appends only to the log; the
// view changes it implies land here, and a checkpoint writes them into LMDB in key order.
//
// Snapshot isolation comes from immutability: every commit publishes a new `OverlayVersion`,
// and a reader keeps the version that matches its LMDB snapshot for as long as it reads. The
// trees are copy-on-write B-trees, so a commit copies only the nodes it touches (and only once
// per commit: a node the writer already copied is uniquely referenced and changed in place).

/// The memory of an overlay's entries, from one checkpoint to the next: keys and values are
/// copied into large chunks and never moved or freed while any version of that stretch lives.
/// A value replaced by a later commit stays until then; the overlay's budget counts it.
///
/// Nodes therefore hold plain ``EntryRef``s, which cost no reference counting to copy, and a
/// commit's copy of a node is a memory copy.
final class EntryArena: @unchecked Sendable {
    // @unchecked: `chunks` and the bump pointer change only under `lock`; the bytes handed out
    // are written once, before the reference to them is published, and never again.
    private let lock = NSLock()
    private var chunks: [UnsafeMutableRawPointer] = []
    private var next: UnsafeMutableRawPointer? = nil
    private var left = 0
    private var stored = 0
    static let chunkSize = 1 << 20

    init() {}

    deinit { for c in chunks { c.deallocate() } }

    /// Copies `key` and `value` (`nil`: a tombstone) into the arena.
    func store(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer?) -> EntryRef {
        let size = key.count + (value?.count ?? 0)
        lock.lock()
        defer { lock.unlock() }
        stored += size
        if size > Self.chunkSize / 4 {
            // A large entry gets a chunk of its own; the current chunk stays in use.
            let chunk = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 16)
            chunks.append(chunk)
            return Self.copy(key, value, to: chunk)
        }
        if size > left {
            let chunk = UnsafeMutableRawPointer.allocate(byteCount: Self.chunkSize, alignment: 16)
            chunks.append(chunk)
            next = chunk
            left = Self.chunkSize
        }
        let base = next!
        next = base + size
        left -= size
        return Self.copy(key, value, to: base)
    }

    /// Every byte stored since the arena began, also those of entries no version holds: a
    /// write that failed or rolled back, a tail two readers folded at once and only one
    /// published. A version's `bytes` counts only what it holds, so the budget checks this too.
    var storedBytes: Int {
        lock.lock()
        defer { lock.unlock() }
        return stored
    }

    private static func copy(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer?, to base: UnsafeMutableRawPointer) -> EntryRef {
        if let k = key.baseAddress, key.count > 0 { base.copyMemory(from: k, byteCount: key.count) }
        if let value, let v = value.baseAddress, value.count > 0 { (base + key.count).copyMemory(from: v, byteCount: value.count) }
        return EntryRef(base: UnsafeRawPointer(base), key: Int32(key.count), value: value.map { Int32($0.count) } ?? -1)
    }
}

/// An overlay entry's key and value bytes (or a tombstone), in an ``EntryArena``.
struct EntryRef {
    let base: UnsafeRawPointer
    let keyCount: Int32
    /// -1: a tombstone.
    let valueCount: Int32
    /// The key's first sixteen bytes (see ``KeyPrefix``), kept beside the pointer: a search
    /// decides its comparisons on them without reading the key from the arena, where every
    /// entry it visits is a likely cache miss. Sixteen, not eight: a `rows` key is a 4-byte table
    /// id then the encoded key, so the first eight bytes of most keys of a table are the same.
    let prefix: KeyPrefix

    init(base: UnsafeRawPointer, key: Int32, value: Int32) {
        self.base = base
        self.keyCount = key
        self.valueCount = value
        self.prefix = KeyPrefix(UnsafeRawBufferPointer(start: base, count: Int(key)))
    }

    /// How this entry's key compares with `key`, whose prefix is `prefix`: LMDB's order.
    @inline(__always)
    func compare(_ key: UnsafeRawBufferPointer, prefix: KeyPrefix) -> Int {
        if self.prefix.high != prefix.high { return self.prefix.high < prefix.high ? -1 : 1 }
        if self.prefix.low != prefix.low { return self.prefix.low < prefix.low ? -1 : 1 }
        // Both keys within the prefix and equal in it: the shorter is a prefix of the longer.
        if keyCount <= 16 && key.count <= 16 { return Int(keyCount) == key.count ? 0 : Int(keyCount) < key.count ? -1 : 1 }
        return compareBytes(self.key, key)
    }

    @inline(__always)
    var key: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: Int(keyCount)) }

    /// `nil` for a tombstone.
    @inline(__always)
    var value: UnsafeRawBufferPointer? {
        valueCount < 0 ? nil : UnsafeRawBufferPointer(start: base + Int(keyCount), count: Int(valueCount))
    }
}

/// A node of an ``OverlayTree``. A leaf holds entries; an inner node holds children, with
/// `refs[i]` the smallest key under `children[i]`.
final class OverlayNode {
    // Unchecked: every search reads these on each level, and a dynamic exclusivity check per
    // read cost about 5% of an edit. A node is changed only by the writer that holds it
    // uniquely (`OverlayTree.set` copies shared nodes first), so no access can overlap a write.
    @exclusivity(unchecked) var refs: [EntryRef]
    @exclusivity(unchecked) var children: [OverlayNode]

    init(refs: [EntryRef] = [], children: [OverlayNode] = []) {
        self.refs = refs
        self.children = children
    }

    var isLeaf: Bool { children.isEmpty }

    func copy() -> OverlayNode { OverlayNode(refs: refs, children: children) }
}

/// An ordered map from key bytes to value bytes or a tombstone, in LMDB's key order, with value
/// semantics: a copy shares every node, and a mutation copies the path it changes.
struct OverlayTree {
    private(set) var root = OverlayNode()
    /// Keys held, tombstones included.
    private(set) var count = 0

    /// Entries per node before it splits. A commit copies every node it changes that an earlier
    /// version still shares: a leaf copy is a memory copy, an inner node's retains its children.
    /// Large nodes pay: the per-node costs (allocation, the retains of an inner node's copy, one
    /// more level of cache misses per search) outweigh copying more bytes per leaf. Measured with
    /// `profile build` (1M edits at B = 1000): 48 entries 7.45 s, 96 7.05, 192 6.8, 256 6.7,
    /// 768 6.3. Beyond 256 the gain is small while a lone commit's leaf copy keeps growing.
    static let maxEntries = 256

    /// The entry for `key`: `.some(nil)` is a tombstone, `nil` means the overlay does not know
    /// the key (the view in LMDB decides). The bytes live as long as the version's arena.
    ///
    /// - Complexity: O(log n).
    func find(_ key: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer?? {
        // Walked without a retain and release per level: `self` holds the root, and every
        // node below it is held by its parent for as long as this version is unchanged.
        // The key's prefix is worked out once, not at every level.
        let prefix = KeyPrefix(key)
        var node = Unmanaged.passUnretained(root)
        while let child = node._withUnsafeGuaranteedRef({ n in
            n.isLeaf ? nil : Unmanaged.passUnretained(n.children[Self.childIndex(n.refs, key, prefix)])
        }) {
            node = child
        }
        return node._withUnsafeGuaranteedRef { n in
            let i = Self.lowerBound(n.refs, key, prefix)
            guard i < n.refs.count, n.refs[i].compare(key, prefix: prefix) == 0 else { return nil }
            return .some(n.refs[i].value)
        }
    }

    /// Sets `key` to `value` (`nil`: a tombstone). Returns the entry it replaced, if any.
    ///
    /// - Complexity: O(log n), plus a copy of each node on the path still shared with another
    ///   version.
    @discardableResult
    mutating func set(_ entry: EntryRef) -> EntryRef? {
        if !isKnownUniquelyReferenced(&root) { root = root.copy() }
        var replaced: EntryRef? = nil
        if let split = Self.insert(root, entry, &replaced) {
            root = OverlayNode(refs: [root.refs[0], split.refs[0]], children: [root, split])
        }
        if replaced == nil { count += 1 }
        return replaced
    }

    /// Inserts into `node`, which the caller made uniquely referenced. Returns the new right
    /// sibling when the node split.
    private static func insert(_ node: OverlayNode, _ entry: EntryRef, _ replaced: inout EntryRef?) -> OverlayNode? {
        let key = entry.key
        if node.isLeaf {
            let i = lowerBound(node.refs, key, entry.prefix)
            if i < node.refs.count, node.refs[i].compare(key, prefix: entry.prefix) == 0 {
                replaced = node.refs[i]
                node.refs[i] = entry
                return nil
            }
            node.refs.insert(entry, at: i)
            return node.refs.count > maxEntries ? split(node) : nil
        }
        let c = childIndex(node.refs, key, entry.prefix)
        if !isKnownUniquelyReferenced(&node.children[c]) { node.children[c] = node.children[c].copy() }
        let child = node.children[c]
        let sibling = insert(child, entry, &replaced)
        // A key below every other lands in the first child; its smallest key is now `key`.
        if c == 0 { node.refs[0] = child.refs[0] }
        guard let sibling else { return nil }
        node.refs.insert(sibling.refs[0], at: c + 1)
        node.children.insert(sibling, at: c + 1)
        return node.refs.count > maxEntries ? split(node) : nil
    }

    /// Moves the upper half of `node` into a new right sibling.
    private static func split(_ node: OverlayNode) -> OverlayNode {
        let half = node.refs.count / 2
        let right = OverlayNode(refs: Array(node.refs[half...]), children: node.isLeaf ? [] : Array(node.children[half...]))
        node.refs.removeSubrange(half...)
        if !node.isLeaf { node.children.removeSubrange(half...) }
        return right
    }

    /// The first index whose key is at least `key`.
    @inline(__always)
    static func lowerBound(_ refs: [EntryRef], _ key: UnsafeRawBufferPointer) -> Int {
        lowerBound(refs, key, KeyPrefix(key))
    }

    /// ``lowerBound(_:_:)`` for a key whose prefix the caller has.
    @inline(__always)
    static func lowerBound(_ refs: [EntryRef], _ key: UnsafeRawBufferPointer, _ prefix: KeyPrefix) -> Int {
        var lo = 0
        var hi = refs.count
        while lo < hi {
            let mid = (lo + hi) >> 1
            if refs[mid].compare(key, prefix: prefix) < 0 { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    /// The child of an inner node whose range holds `key`: the last whose smallest key is at most
    /// `key`, or the first.
    @inline(__always)
    static func childIndex(_ refs: [EntryRef], _ key: UnsafeRawBufferPointer) -> Int {
        childIndex(refs, key, KeyPrefix(key))
    }

    /// ``childIndex(_:_:)`` for a key whose prefix the caller has.
    @inline(__always)
    static func childIndex(_ refs: [EntryRef], _ key: UnsafeRawBufferPointer, _ prefix: KeyPrefix) -> Int {
        var lo = 0
        var hi = refs.count
        while lo < hi {
            let mid = (lo + hi) >> 1
            if refs[mid].compare(key, prefix: prefix) <= 0 { lo = mid + 1 } else { hi = mid }
        }
        return max(lo - 1, 0)
    }
}

/// A forward cursor over an ``OverlayTree``. It holds the nodes it walks, so the bytes it lends
/// stay valid while it lives, whatever happens to the tree it came from.
struct OverlayCursor {
    private let root: OverlayNode
    /// The nodes from the root to the current leaf, with the index taken in each.
    private var path: [(node: OverlayNode, index: Int)] = []

    init(_ tree: OverlayTree) {
        root = tree.root
        path.reserveCapacity(6)
    }

    mutating func first() -> EntryRef? {
        path.removeAll(keepingCapacity: true)
        return descendLeftmost(root)
    }

    mutating func seek(atLeast key: UnsafeRawBufferPointer) -> EntryRef? {
        path.removeAll(keepingCapacity: true)
        var node = root
        while !node.isLeaf {
            let c = OverlayTree.childIndex(node.refs, key)
            path.append((node, c))
            node = node.children[c]
        }
        let i = OverlayTree.lowerBound(node.refs, key)
        path.append((node, i))
        return i < node.refs.count ? item() : nextLeaf()
    }

    mutating func next() -> EntryRef? {
        guard !path.isEmpty else { return nil }
        path[path.count - 1].index += 1
        return path[path.count - 1].index < path[path.count - 1].node.refs.count ? item() : nextLeaf()
    }

    private func item() -> EntryRef {
        let (leaf, i) = path[path.count - 1]
        return leaf.refs[i]
    }

    private mutating func descendLeftmost(_ start: OverlayNode) -> EntryRef? {
        var node = start
        while !node.isLeaf {
            path.append((node, 0))
            node = node.children[0]
        }
        path.append((node, 0))
        return node.refs.isEmpty ? nil : item()
    }

    /// Moves to the first entry of the next leaf (leaves are never empty, but for an empty root).
    private mutating func nextLeaf() -> EntryRef? {
        path.removeLast()
        while let top = path.last {
            let c = top.index + 1
            if c < top.node.children.count {
                path[path.count - 1].index = c
                return descendLeftmost(top.node.children[c])
            }
            path.removeLast()
        }
        return nil
    }
}

/// The overlay as of one commit: per derived database (``StoreDatabases/derived`` order), the entries
/// written since the views in LMDB were last checkpointed. Immutable once published.
struct OverlayVersion {
    var trees: [OverlayTree]
    /// The LSN the checkpointed views reflected when the first entry was written (`viewsLSN`):
    /// the entries are the changes of the operations after it.
    var base: UInt64
    /// The last operation folded in.
    var lsn: UInt64
    /// The bytes the entries hold, with a per-entry allowance for the tree's own memory.
    var bytes: Int
    /// The LMDB transaction whose committed state this version completes (`mdb_txn_id`); a
    /// snapshot of that transaction needs no further check. 0: unknown.
    var lmdbTxnID: Int
    /// Where the entries' bytes live.
    var arena: EntryArena

    static let derivedCount = 5
    /// Per-entry memory beyond the key and value bytes: its slots in the node arrays and the
    /// nodes' slack.
    static let entryOverhead = 64

    static func empty(at lsn: UInt64, lmdbTxnID: Int = 0) -> OverlayVersion {
        OverlayVersion(trees: Array(repeating: OverlayTree(), count: derivedCount), base: lsn, lsn: lsn, bytes: 0, lmdbTxnID: lmdbTxnID, arena: EntryArena())
    }

    var isEmpty: Bool { trees.allSatisfy { $0.count == 0 } }
}

/// The overlay one transaction reads and (when writing) changes. Readers get a buffer holding
/// the published version; a writer gets one holding its working copy, published at commit.
final class OverlayBuffer {
    // Unchecked: every overlay read and write of an edit goes through here. A buffer belongs to
    // one thread: a writer's to the thread running the write, one folding a log tail to its
    // caller; a reader's is never changed once made.
    @exclusivity(unchecked) var version: OverlayVersion

    init(_ version: OverlayVersion) { self.version = version }

    @inline(__always)
    func find(_ key: UnsafeRawBufferPointer, slot: Int) -> UnsafeRawBufferPointer?? {
        version.trees[slot].count == 0 ? nil : version.trees[slot].find(key)
    }

    /// Sets `key` to `value` (`nil`: a tombstone). Bytes lent earlier stay valid: the arena
    /// keeps what an entry replaced.
    func set(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer?, slot: Int) {
        let entry = version.arena.store(key, value)
        let added = version.trees[slot].set(entry) == nil
        version.bytes += key.count + (value?.count ?? 0) + (added ? OverlayVersion.entryOverhead : 0)
    }
}

/// A key's first sixteen bytes as two big-endian numbers, zero-padded when the key is shorter.
/// Two keys whose prefixes differ compare as their prefixes do in LMDB's order (a key that ends
/// inside the prefix reads as zeros there: below any byte the longer key has there, or equal to
/// a zero byte, and then a later byte decides); equal prefixes need the lengths, or the keys.
struct KeyPrefix {
    let high: UInt64
    let low: UInt64

    @inline(__always)
    init(_ key: UnsafeRawBufferPointer) {
        if key.count >= 16 {
            high = UInt64(bigEndian: key.loadUnaligned(as: UInt64.self))
            low = UInt64(bigEndian: key.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
            return
        }
        // One copy into zeroed words, not a loop over the bytes: most `rows` keys (a table id
        // and an int key, 13 bytes) are shorter than the prefix, and a search computes the
        // prefix of its key at every level (the loop was about 4% of a merged server row).
        var words: (UInt64, UInt64) = (0, 0)
        if let base = key.baseAddress {
            withUnsafeMutableBytes(of: &words) { $0.baseAddress!.copyMemory(from: base, byteCount: key.count) }
        }
        (high, low) = (UInt64(bigEndian: words.0), UInt64(bigEndian: words.1))
    }
}


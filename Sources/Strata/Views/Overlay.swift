import Foundation

// The overlay: view entries written since the last checkpoint, kept in memory on top of the
// views in LMDB (`DESIGN.md`, "Views are write-behind"). A commit appends only to the log; the
// view changes it implies land here, and a checkpoint writes them into LMDB in key order.
//
// Snapshot isolation comes from immutability: every commit publishes a new `OverlayVersion`,
// and a reader keeps the version that matches its LMDB snapshot for as long as it reads. The
// trees are copy-on-write B-trees, so a commit copies only the nodes it touches (and only once
// per commit: a node the writer already copied is uniquely referenced and changed in place).

/// Bytes at a stable address for the life of the object: a key or value of the overlay. Cursors
/// and `get` lend these bytes as `UnsafeRawBufferPointer`s, as LMDB lends its pages.
final class Blob: ManagedBuffer<Int, UInt8> {
    static func make(_ bytes: UnsafeRawBufferPointer) -> Blob {
        let blob = unsafeDowncast(Blob.create(minimumCapacity: bytes.count) { _ in bytes.count }, to: Blob.self)
        if let source = bytes.baseAddress, bytes.count > 0 {
            blob.withUnsafeMutablePointerToElements { UnsafeMutableRawPointer($0).copyMemory(from: source, byteCount: bytes.count) }
        }
        return blob
    }

    @inline(__always)
    var bytes: UnsafeRawBufferPointer {
        withUnsafeMutablePointerToElements { UnsafeRawBufferPointer(start: $0, count: header) }
    }
}

/// A node of an ``OverlayTree``. A leaf holds keys and values (`nil`: a tombstone, the key was
/// deleted); an inner node holds children, with `keys[i]` the smallest key under `children[i]`.
final class OverlayNode {
    var keys: [Blob]
    var values: [Blob?]
    var children: [OverlayNode]

    init(keys: [Blob] = [], values: [Blob?] = [], children: [OverlayNode] = []) {
        self.keys = keys
        self.values = values
        self.children = children
    }

    var isLeaf: Bool { children.isEmpty }

    func copy() -> OverlayNode { OverlayNode(keys: keys, values: values, children: children) }
}

/// An ordered map from key bytes to value bytes or a tombstone, in LMDB's key order, with value
/// semantics: a copy shares every node, and a mutation copies the path it changes.
struct OverlayTree {
    private(set) var root = OverlayNode()
    /// Keys held, tombstones included.
    private(set) var count = 0

    /// Entries per node before it splits: small enough that copying a node is cheap, large enough
    /// that the tree stays three or four levels deep at a million entries.
    static let maxEntries = 64

    /// The entry for `key`: `.some(nil)` is a tombstone, `nil` means the overlay does not know
    /// the key (the view in LMDB decides).
    ///
    /// - Complexity: O(log n).
    func find(_ key: UnsafeRawBufferPointer) -> Blob?? {
        var node = root
        while !node.isLeaf { node = node.children[Self.childIndex(node.keys, key)] }
        let i = Self.lowerBound(node.keys, key)
        guard i < node.keys.count, compareBytes(node.keys[i].bytes, key) == 0 else { return nil }
        return .some(node.values[i])
    }

    /// Sets `key` to `value` (`nil`: a tombstone). Returns the entry it replaced, as ``find(_:)``.
    ///
    /// - Complexity: O(log n), plus a copy of each node on the path still shared with another
    ///   version.
    @discardableResult
    mutating func set(_ key: UnsafeRawBufferPointer, _ value: Blob?) -> Blob?? {
        if !isKnownUniquelyReferenced(&root) { root = root.copy() }
        var replaced: Blob?? = nil
        if let split = Self.insert(root, key, value, &replaced) {
            root = OverlayNode(keys: [root.keys[0], split.keys[0]], children: [root, split])
        }
        if replaced == nil { count += 1 }
        return replaced
    }

    /// Inserts into `node`, which the caller made uniquely referenced. Returns the new right
    /// sibling when the node split.
    private static func insert(_ node: OverlayNode, _ key: UnsafeRawBufferPointer, _ value: Blob?, _ replaced: inout Blob??) -> OverlayNode? {
        if node.isLeaf {
            let i = lowerBound(node.keys, key)
            if i < node.keys.count, compareBytes(node.keys[i].bytes, key) == 0 {
                replaced = .some(node.values[i])
                node.values[i] = value
                return nil
            }
            node.keys.insert(Blob.make(key), at: i)
            node.values.insert(value, at: i)
            guard node.keys.count > maxEntries else { return nil }
            let half = node.keys.count / 2
            let right = OverlayNode(keys: Array(node.keys[half...]), values: Array(node.values[half...]))
            node.keys.removeSubrange(half...)
            node.values.removeSubrange(half...)
            return right
        }
        let c = childIndex(node.keys, key)
        if !isKnownUniquelyReferenced(&node.children[c]) { node.children[c] = node.children[c].copy() }
        let child = node.children[c]
        let split = insert(child, key, value, &replaced)
        // A key below every other lands in the first child; its smallest key is now `key`.
        if c == 0 { node.keys[0] = child.keys[0] }
        guard let split else { return nil }
        node.keys.insert(split.keys[0], at: c + 1)
        node.children.insert(split, at: c + 1)
        guard node.children.count > maxEntries else { return nil }
        let half = node.children.count / 2
        let right = OverlayNode(keys: Array(node.keys[half...]), children: Array(node.children[half...]))
        node.keys.removeSubrange(half...)
        node.children.removeSubrange(half...)
        return right
    }

    /// The first index whose key is at least `key`.
    @inline(__always)
    static func lowerBound(_ keys: [Blob], _ key: UnsafeRawBufferPointer) -> Int {
        var lo = 0
        var hi = keys.count
        while lo < hi {
            let mid = (lo + hi) >> 1
            if compareBytes(keys[mid].bytes, key) < 0 { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    /// The child of an inner node whose range holds `key`: the last whose smallest key is at most
    /// `key`, or the first.
    @inline(__always)
    static func childIndex(_ keys: [Blob], _ key: UnsafeRawBufferPointer) -> Int {
        var lo = 0
        var hi = keys.count
        while lo < hi {
            let mid = (lo + hi) >> 1
            if compareBytes(keys[mid].bytes, key) <= 0 { lo = mid + 1 } else { hi = mid }
        }
        return max(lo - 1, 0)
    }
}

/// A forward cursor over an ``OverlayTree``. It holds the nodes it walks, so the bytes it lends
/// stay valid while it lives, whatever happens to the tree it came from.
struct OverlayCursor {
    typealias Item = (key: UnsafeRawBufferPointer, value: Blob?)

    private let root: OverlayNode
    /// The nodes from the root to the current leaf, with the index taken in each.
    private var path: [(node: OverlayNode, index: Int)] = []

    init(_ tree: OverlayTree) {
        root = tree.root
        path.reserveCapacity(6)
    }

    mutating func first() -> Item? {
        path.removeAll(keepingCapacity: true)
        return descendLeftmost(root)
    }

    mutating func seek(atLeast key: UnsafeRawBufferPointer) -> Item? {
        path.removeAll(keepingCapacity: true)
        var node = root
        while !node.isLeaf {
            let c = OverlayTree.childIndex(node.keys, key)
            path.append((node, c))
            node = node.children[c]
        }
        let i = OverlayTree.lowerBound(node.keys, key)
        path.append((node, i))
        return i < node.keys.count ? item() : nextLeaf()
    }

    mutating func next() -> Item? {
        guard !path.isEmpty else { return nil }
        path[path.count - 1].index += 1
        return path[path.count - 1].index < path[path.count - 1].node.keys.count ? item() : nextLeaf()
    }

    private func item() -> Item {
        let (leaf, i) = path[path.count - 1]
        return (leaf.keys[i].bytes, leaf.values[i])
    }

    private mutating func descendLeftmost(_ start: OverlayNode) -> Item? {
        var node = start
        while !node.isLeaf {
            path.append((node, 0))
            node = node.children[0]
        }
        path.append((node, 0))
        return node.keys.isEmpty ? nil : item()
    }

    /// Moves to the first entry of the next leaf (leaves are never empty, but for an empty root).
    private mutating func nextLeaf() -> Item? {
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

/// The overlay as of one commit: per derived database (``Views/derived`` order), the entries
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

    static let derivedCount = 5
    /// Per-entry memory beyond the key and value bytes: two blob headers, slots in the node
    /// arrays, and the nodes' slack.
    static let entryOverhead = 96

    static func empty(at lsn: UInt64, lmdbTxnID: Int = 0) -> OverlayVersion {
        OverlayVersion(trees: Array(repeating: OverlayTree(), count: derivedCount), base: lsn, lsn: lsn, bytes: 0, lmdbTxnID: lmdbTxnID)
    }

    var isEmpty: Bool { trees.allSatisfy { $0.count == 0 } }
}

/// The overlay one transaction reads and (when writing) changes. Readers get a buffer holding
/// the published version; a writer gets one holding its working copy, published at commit.
final class OverlayBuffer {
    var version: OverlayVersion
    /// Values replaced in this buffer, kept alive until it goes: bytes lent by ``get`` stay valid
    /// for the whole transaction, as long as the caller does not outlive it.
    private var replaced: [Blob] = []

    init(_ version: OverlayVersion) { self.version = version }

    @inline(__always)
    func find(_ key: UnsafeRawBufferPointer, slot: Int) -> Blob?? {
        version.trees[slot].count == 0 ? nil : version.trees[slot].find(key)
    }

    func set(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer?, slot: Int) {
        let blob = value.map(Blob.make)
        let old = version.trees[slot].set(key, blob)
        let newBytes = blob?.header ?? 0
        switch old {
        case nil:
            version.bytes += key.count + newBytes + OverlayVersion.entryOverhead
        case let .some(previous):
            version.bytes += newBytes - (previous?.header ?? 0)
            if let previous { replaced.append(previous) }
        }
    }
}

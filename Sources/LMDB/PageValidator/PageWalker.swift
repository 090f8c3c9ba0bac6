/// The walk behind ``PageValidator``: down the B-trees of one snapshot, reading every page it
/// reaches from the file's bytes, never trusting a number before it is range-checked.
///
/// Each page is entered once (a bitset of pages in use), so a loop or a shared page is a finding,
/// not a hang; descent stops at LMDB's own limit of 32 levels. A page that fails a check is
/// reported and not descended into. Nothing is allocated per page: findings, and one record per
/// named database, are the only allocations after the bitsets.
struct PageWalker {
    let file: FileBytes
    let pageSize: Int
    /// Whole pages in the file.
    let filePages: UInt64
    /// The used meta page's last page in use (`mm_last_pg`), at most the file's last page: the
    /// last page a tree may use.
    let lastPage: UInt64
    /// `mm_last_pg` as recorded: the last page the free list may name. Free pages past the end
    /// of the file are legitimate (LMDB does not write a page it freed before writing it).
    let recordedLastPage: UInt64
    let scope: PageValidator.Scope
    let maxFindings: Int
    let pageBudget: Int
    let deadline: ContinuousClock.Instant?

    /// Pages entered as part of a tree (overflow runs whole).
    private(set) var inUse: PageBits
    /// Pages the free list names, below ``filePages``.
    private(set) var free: PageBits
    /// Pages the free list names, those beyond the file included.
    private(set) var freeCount = 0
    private(set) var findings: [PageFinding] = []
    private(set) var findingsOmitted = 0
    private(set) var databases: [PageReport.Database] = []
    private(set) var stopped = false
    private var pagesEntered = 0

    init(file: FileBytes, pageSize: Int, lastPage: UInt64, options: PageValidator.Options, start: ContinuousClock.Instant) {
        self.file = file
        self.pageSize = pageSize
        filePages = UInt64(file.count / pageSize)
        recordedLastPage = lastPage
        self.lastPage = min(lastPage, filePages &- 1)
        scope = options.scope
        maxFindings = max(0, options.maxFindings)
        pageBudget = options.pageBudget ?? Int.max
        deadline = options.timeBudget.map { start + $0 }
        let bits = min(self.lastPage &+ 1, filePages)
        inUse = PageBits(count: bits)
        free = PageBits(count: bits)
    }

    // MARK: Findings

    mutating func report(_ kind: PageFinding.Kind, _ database: String?, page: UInt64?, _ message: String) {
        if findings.count < maxFindings {
            findings.append(PageFinding(kind: kind, database: database, page: page, message: message))
        } else {
            findingsOmitted += 1
        }
    }

    private mutating func report(_ kind: PageFinding.Kind, _ tree: inout Tree, page: UInt64?, _ message: String) {
        tree.damaged = true
        report(kind, tree.name, page: page, message)
    }

    // MARK: Trees

    /// What the walk of one tree needs to know and tallies.
    struct Tree {
        enum Role { case free, main, named, duplicates }
        let name: String
        let role: Role
        let record: DatabaseRecord
        let order: KeyOrder
        /// The key size of its LEAF2 leaves: a DUPFIXED sub-database's `md_pad`.
        let leaf2KeySize: Int?
        var branchPages: UInt64 = 0
        var leafPages: UInt64 = 0
        var overflowPages: UInt64 = 0
        var entries: UInt64 = 0
        /// Pages read, its sub-databases' included.
        var pagesWalked = 0
        var damaged = false
        var depthReported = false

        var depth: Int { Int(record.depth) }
        /// Whether its leaves may hold duplicates. Never in a sub-database: a damaged record
        /// saying so could otherwise nest sub-databases one page deep each, as deep as the file
        /// has pages, and the walk's recursion with them.
        var isDupSort: Bool { role != .duplicates && record.flags & PageLayout.dupSort != 0 }
    }

    /// Walks the tree `record` roots and checks its tallies against the record; returns the
    /// pages it read.
    @discardableResult
    mutating func walk(_ record: DatabaseRecord, name: String, role: Tree.Role) -> Int {
        // Listed before the walk, so that the main database comes before the named ones in it.
        let index = databases.count
        databases.append(PageReport.Database(
            name: name, flags: record.flags, root: record.root == PageLayout.invalidPage ? nil : record.root,
            depth: Int(record.depth), entries: record.entries, pagesWalked: 0))
        var tree = Tree(name: name, role: role, record: record, order: KeyOrder.keys(record.flags), leaf2KeySize: nil)
        walk(&tree)
        databases[index].pagesWalked = tree.pagesWalked
        return tree.pagesWalked
    }

    /// As ``walk(_:name:role:)``, for a DUPSORT key's sub-database, whose duplicates are
    /// ordered by its parent's flags (the sub-database's record carries INTEGERKEY for
    /// INTEGERDUP, not REVERSEDUP: mdb_cursor_put; LMDB compares them with the parent's `md_dcmp`).
    private mutating func walkDuplicates(_ record: DatabaseRecord, of parent: Tree) -> (pages: Int, entries: UInt64) {
        let leaf2: Int? = record.flags & PageLayout.dupFixed != 0 ? Int(record.pad) : nil
        var tree = Tree(
            name: parent.name + " (duplicates)", role: .duplicates, record: record,
            order: KeyOrder.duplicates(parent.record.flags), leaf2KeySize: leaf2)
        walk(&tree)
        return (tree.pagesWalked, tree.entries)
    }

    private mutating func walk(_ tree: inout Tree) {
        let r = tree.record
        if r.root == PageLayout.invalidPage {
            if r.depth != 0 || r.branchPages != 0 || r.leafPages != 0 || r.overflowPages != 0 || r.entries != 0 {
                report(.counts, &tree, page: nil, "an empty tree (no root) records depth \(r.depth), \(r.branchPages)/\(r.leafPages)/\(r.overflowPages) branch/leaf/overflow pages and \(r.entries) entries")
            }
            return
        }
        if r.depth == 0 || r.depth > PageLayout.maxDepth {
            report(.depth, &tree, page: r.root, "the record gives depth \(r.depth) (1 to \(PageLayout.maxDepth) for a tree with a root)")
        }
        if let size = tree.leaf2KeySize, size == 0 || size > PageLayout.maxKeySize {
            report(.node, &tree, page: nil, "a DUPFIXED sub-database records duplicates of \(size) bytes")
            return
        }
        visit(r.root, level: 0, lower: nil, upper: nil, &tree)
        guard scope == .full, !stopped, !tree.damaged else { return }
        if tree.branchPages != r.branchPages || tree.leafPages != r.leafPages || tree.overflowPages != r.overflowPages {
            report(.counts, &tree, page: r.root, "the tree has \(tree.branchPages)/\(tree.leafPages)/\(tree.overflowPages) branch/leaf/overflow pages, its record says \(r.branchPages)/\(r.leafPages)/\(r.overflowPages)")
        }
        if tree.entries != r.entries {
            report(.counts, &tree, page: r.root, "the tree holds \(tree.entries) entries, its record says \(r.entries)")
        }
    }

    // MARK: Pages

    /// Checks that `page` may be read as a page of `tree` and marks it in use; returns its offset.
    private mutating func enter(_ page: UInt64, _ tree: inout Tree, what: String) -> Int? {
        if stopped { return nil }
        guard page >= 2, page <= lastPage, page < filePages else {
            let why = page < 2 ? "a meta page" : page >= filePages ? "past the end of the file (\(filePages) pages)" : "past the last page in use (\(lastPage))"
            report(.pageOutOfRange, &tree, page: page, "\(what) is \(why)")
            return nil
        }
        if inUse.insert(page) {
            report(.pageReachedTwice, &tree, page: page, "\(what) was reached before (a loop, or a page two trees share)")
            return nil
        }
        if free.contains(page) {
            report(.pageReachedTwice, &tree, page: page, "\(what) is on the free list")
            return nil
        }
        pagesEntered &+= 1
        tree.pagesWalked &+= 1
        if pagesEntered > pageBudget {
            stopped = true
            return nil
        }
        // The clock is read at the first page and every 1024th after it.
        if let deadline, pagesEntered & 1023 == 1, ContinuousClock.now >= deadline {
            stopped = true
            return nil
        }
        let base = Int(page) * pageSize
        let stored = file.u64(base)
        guard stored == page else {
            report(.pageNumber, &tree, page: page, "\(what) says it is page \(stored)")
            return nil
        }
        return base
    }

    /// A node of a branch or leaf page (or sub-page), its header and key inside the page.
    private struct Node {
        /// The node's offset in the file.
        var offset: Int
        var flags: UInt16
        /// `mn_lo | mn_hi << 16`: a leaf node's data size.
        var dataSize: Int
        var key: KeyRef
        /// A branch node's child: `mn_lo | mn_hi << 16 | mn_flags << 32`.
        var child: UInt64 { UInt64(dataSize) | UInt64(flags) << 32 }
        var dataOffset: Int { key.offset + key.count }
    }

    /// Node `index` of the page at `base` that is `limit` bytes long with free space up to
    /// `upper`, or `nil` when its offset or header and key do not lie in the node area.
    @inline(__always)
    private func node(_ index: Int, base: Int, limit: Int, upper: Int) -> Node? {
        let at = Int(file.u16(base + PageLayout.headerSize + 2 * index))
        guard at >= upper, at + PageLayout.nodeHeaderSize <= limit else { return nil }
        let o = base + at
        let keySize = Int(file.u16(o + 6))
        guard at + PageLayout.nodeHeaderSize + keySize <= limit else { return nil }
        let size = Int(file.u16(o)) | Int(file.u16(o + 2)) << 16
        return Node(offset: o, flags: file.u16(o + 4), dataSize: size, key: KeyRef(offset: o + PageLayout.nodeHeaderSize, count: keySize))
    }

    /// Checks the free-space bounds of the page (or sub-page) at `base`, `limit` bytes long;
    /// returns its number of nodes and `mp_upper`.
    private func bounds(base: Int, limit: Int) -> (count: Int, upper: Int)? {
        let lower = Int(file.u16(base + 12)), upper = Int(file.u16(base + 14))
        guard lower >= PageLayout.headerSize, lower <= upper, upper <= limit, (lower - PageLayout.headerSize) & 1 == 0 else { return nil }
        return ((lower - PageLayout.headerSize) / 2, upper)
    }

    private mutating func visit(_ page: UInt64, level: Int, lower: KeyRef?, upper: KeyRef?, _ tree: inout Tree) {
        guard level < PageLayout.maxDepth else {
            report(.depth, &tree, page: page, "the tree goes deeper than \(PageLayout.maxDepth) levels (a loop?)")
            return
        }
        guard let base = enter(page, &tree, what: level == 0 ? "the root" : "a child page") else { return }
        let flags = file.u16(base + 10) & ~(PageLayout.dirty | PageLayout.keep)
        let leafFlags = tree.leaf2KeySize == nil ? PageLayout.leaf : PageLayout.leaf | PageLayout.leaf2
        guard flags == PageLayout.branch || flags == leafFlags else {
            let expected = tree.leaf2KeySize == nil ? "branch or leaf" : "branch or LEAF2 leaf"
            report(.pageKind, &tree, page: page, "flags 0x\(String(flags, radix: 16)) where a \(expected) page was expected")
            return
        }
        guard let (count, free) = bounds(base: base, limit: pageSize) else {
            report(.pageBounds, &tree, page: page, "lower \(file.u16(base + 12)), upper \(file.u16(base + 14)) for a \(pageSize)-byte page")
            return
        }
        if flags == PageLayout.branch {
            tree.branchPages &+= 1
            branch(page, base: base, count: count, upper: free, level: level, lower: lower, upperKey: upper, &tree)
        } else {
            tree.leafPages &+= 1
            if level != tree.depth - 1, !tree.depthReported {
                tree.depthReported = true
                report(.depth, &tree, page: page, "a leaf at depth \(level + 1) of a tree of depth \(tree.depth)")
            }
            guard count > 0 else {
                report(.pageBounds, &tree, page: page, "a leaf page without entries")
                return
            }
            if let keySize = tree.leaf2KeySize {
                leaf2(page, base: base, limit: pageSize, count: count, keySize: keySize, lower: lower, upper: upper, damage: .pageBounds, &tree)
            } else {
                leaf(page, base: base, count: count, upper: free, lower: lower, upperKey: upper, &tree)
            }
        }
    }

    private mutating func branch(_ page: UInt64, base: Int, count: Int, upper: Int, level: Int, lower: KeyRef?, upperKey: KeyRef?, _ tree: inout Tree) {
        // mdb_page_search_root asserts NUMKEYS > 1 outside the free list (ITS#8336).
        guard count >= (tree.role == .free ? 1 : 2) else {
            report(.pageBounds, &tree, page: page, "a branch page with \(count) child")
            return
        }
        if level >= tree.depth - 1, !tree.depthReported {
            tree.depthReported = true
            report(.depth, &tree, page: page, "a branch page at depth \(level + 1) of a tree of depth \(tree.depth)")
        }
        // First every node and key, so that no child is read under a page that is damaged.
        var used = 0
        var previous: KeyRef?
        for i in 0..<count {
            guard let n = node(i, base: base, limit: pageSize, upper: upper) else {
                report(.nodeBounds, &tree, page: page, "node \(i) lies outside the page's node area")
                return
            }
            guard n.key.count <= PageLayout.maxKeySize else {
                report(.node, &tree, page: page, "node \(i) has a \(n.key.count)-byte key")
                return
            }
            used += (PageLayout.nodeHeaderSize + n.key.count + 1) & ~1
            // The first node's key is not a separator (mdb_node_search starts at the second).
            guard i > 0 else { continue }
            if !inOrder(n.key, after: previous, lower: lower, upper: upperKey, tree.order) {
                report(.keyOrder, &tree, page: page, "separator \(i) is out of order or outside the range the page above gives")
                return
            }
            previous = n.key
        }
        guard used == pageSize - upper else {
            report(.nodeBounds, &tree, page: page, "its nodes take \(used) bytes, its free-space bound says \(pageSize - upper)")
            return
        }
        for i in 0..<count {
            guard let n = node(i, base: base, limit: pageSize, upper: upper) else { return }
            let next = i + 1 < count ? node(i + 1, base: base, limit: pageSize, upper: upper)?.key : upperKey
            if scope == .full || i == 0 || i == count - 1 {
                visit(n.child, level: level + 1, lower: i == 0 ? lower : n.key, upper: next, &tree)
            }
            if stopped { return }
        }
    }

    /// Whether `key` sorts after `previous` (when there is one) and within `lower ..< upper`.
    @inline(__always)
    private func inOrder(_ key: KeyRef, after previous: KeyRef?, lower: KeyRef?, upper: KeyRef?, _ order: KeyOrder) -> Bool {
        if let previous {
            if order.compare(previous, key, in: file) >= 0 { return false }
        } else if let lower, order.compare(key, lower, in: file) < 0 {
            return false
        }
        if let upper, order.compare(key, upper, in: file) >= 0 { return false }
        return true
    }

    private mutating func leaf(_ page: UInt64, base: Int, count: Int, upper: Int, lower: KeyRef?, upperKey: KeyRef?, _ tree: inout Tree) {
        var used = 0
        var previous: KeyRef?
        let pageEnd = base + pageSize
        for i in 0..<count {
            guard let n = node(i, base: base, limit: pageSize, upper: upper) else {
                report(.nodeBounds, &tree, page: page, "node \(i) lies outside the page's node area")
                return
            }
            guard n.key.count <= PageLayout.maxKeySize, n.key.count > 0 || tree.role == .duplicates || tree.role == .main else {
                report(.node, &tree, page: page, "node \(i) has a \(n.key.count)-byte key")
                return
            }
            if !inOrder(n.key, after: previous, lower: lower, upper: upperKey, tree.order) {
                report(.keyOrder, &tree, page: page, "key \(i) is out of order or outside the range the page above gives")
                return
            }
            previous = n.key
            let f = n.flags
            let big = f & PageLayout.bigData != 0
            let inPage = big ? 8 : n.dataSize
            guard f & ~(PageLayout.bigData | PageLayout.subData | PageLayout.dupData) == 0,
                  !big || f == PageLayout.bigData,
                  n.dataOffset + inPage <= pageEnd
            else {
                report(.node, &tree, page: page, "node \(i): flags 0x\(String(f, radix: 16)), \(n.dataSize) bytes of data in the page")
                return
            }
            used += (PageLayout.nodeHeaderSize + n.key.count + inPage + 1) & ~1
            if big {
                guard tree.role != .duplicates else {
                    report(.node, &tree, page: page, "node \(i): a duplicate on overflow pages")
                    return
                }
                let first = file.u64(n.dataOffset)
                guard let data = overflow(first, size: n.dataSize, &tree) else { return }
                tree.entries &+= 1
                if tree.role == .free { freeList(page, data: data, size: n.dataSize, &tree) }
                continue
            }
            switch f {
            case 0:
                tree.entries &+= 1
                if tree.role == .free { freeList(page, data: n.dataOffset, size: n.dataSize, &tree) }
            case PageLayout.subData where tree.role == .main:
                guard n.dataSize == PageLayout.databaseRecordSize else {
                    report(.node, &tree, page: page, "named database \(i)'s record is \(n.dataSize) bytes, not \(PageLayout.databaseRecordSize)")
                    return
                }
                tree.entries &+= 1
                let name = String(decoding: UnsafeRawBufferPointer(start: file.base.map { $0 + n.key.offset }, count: n.key.count), as: UTF8.self)
                walk(file.databaseRecord(at: n.dataOffset), name: name, role: .named)
            case PageLayout.dupData | PageLayout.subData where tree.isDupSort:
                guard n.dataSize == PageLayout.databaseRecordSize else {
                    report(.node, &tree, page: page, "node \(i)'s sub-database record is \(n.dataSize) bytes, not \(PageLayout.databaseRecordSize)")
                    return
                }
                let sub = walkDuplicates(file.databaseRecord(at: n.dataOffset), of: tree)
                tree.pagesWalked &+= sub.pages
                tree.entries &+= scope == .full ? sub.entries : file.databaseRecord(at: n.dataOffset).entries
            case PageLayout.dupData where tree.isDupSort:
                guard let entries = subPage(page, node: i, at: n.dataOffset, size: n.dataSize, &tree) else { return }
                tree.entries &+= UInt64(entries)
            default:
                report(.node, &tree, page: page, "node \(i) has flags 0x\(String(f, radix: 16)), which a \(tree.isDupSort ? "DUPSORT" : "plain") database's \(tree.role == .main ? "main " : "")leaf cannot have")
                return
            }
            if stopped { return }
        }
        if used != pageSize - upper {
            report(.nodeBounds, &tree, page: page, "its nodes take \(used) bytes, its free-space bound says \(pageSize - upper)")
        }
    }

    /// A LEAF2 page or sub-page (DUPFIXED): `count` keys of `keySize` bytes after the header.
    private mutating func leaf2(_ page: UInt64, base: Int, limit: Int, count: Int, keySize: Int, lower: KeyRef?, upper: KeyRef?, damage: PageFinding.Kind, _ tree: inout Tree) {
        guard keySize > 0, keySize <= PageLayout.maxKeySize, count <= (limit - PageLayout.headerSize) / keySize else {
            report(damage, &tree, page: page, "\(count) duplicates of \(keySize) bytes in \(limit) bytes")
            return
        }
        var previous: KeyRef?
        for i in 0..<count {
            let key = KeyRef(offset: base + PageLayout.headerSize + i * keySize, count: keySize)
            if !inOrder(key, after: previous, lower: lower, upper: upper, tree.order) {
                report(.keyOrder, &tree, page: page, "duplicate \(i) is out of order or outside the range the page above gives")
                return
            }
            previous = key
        }
        tree.entries &+= UInt64(count)
    }

    /// The sub-page (duplicates kept in their node) of node `index` on `page`: `size` bytes at
    /// `offset`. Returns its number of duplicates, `nil` when it is damaged.
    private mutating func subPage(_ page: UInt64, node index: Int, at offset: Int, size: Int, _ tree: inout Tree) -> Int? {
        let fixed = tree.record.flags & PageLayout.dupFixed != 0
        let flags = file.u16(offset + 10) & ~(PageLayout.dirty | PageLayout.keep)
        let expected = PageLayout.leaf | PageLayout.subPage | (fixed ? PageLayout.leaf2 : 0)
        guard size >= PageLayout.headerSize, flags == expected else {
            report(.subPage, &tree, page: page, "node \(index): \(size) bytes with flags 0x\(String(flags, radix: 16)) where a sub-page was expected")
            return nil
        }
        guard let (count, upper) = bounds(base: offset, limit: size), count > 0 else {
            report(.subPage, &tree, page: page, "node \(index): a sub-page with lower \(file.u16(offset + 12)), upper \(file.u16(offset + 14)) in \(size) bytes")
            return nil
        }
        var dups = Tree(name: tree.name, role: .duplicates, record: tree.record, order: KeyOrder.duplicates(tree.record.flags), leaf2KeySize: nil)
        defer { if dups.damaged { tree.damaged = true } }
        if fixed {
            // A sub-page's duplicate size is its own `mp_pad`.
            leaf2(page, base: offset, limit: size, count: count, keySize: Int(file.u16(offset + 8)), lower: nil, upper: nil, damage: .subPage, &dups)
            return dups.damaged ? nil : count
        }
        var previous: KeyRef?
        var used = 0
        for i in 0..<count {
            guard let n = node(i, base: offset, limit: size, upper: upper), n.dataSize == 0, n.flags == 0, n.key.count <= PageLayout.maxKeySize else {
                report(.subPage, &dups, page: page, "node \(index): duplicate \(i) lies outside its sub-page or is not a plain key")
                return nil
            }
            if !inOrder(n.key, after: previous, lower: nil, upper: nil, dups.order) {
                report(.keyOrder, &dups, page: page, "node \(index): duplicate \(i) of its sub-page is out of order")
                return nil
            }
            previous = n.key
            used += (PageLayout.nodeHeaderSize + n.key.count + 1) & ~1
        }
        guard used == size - upper else {
            report(.subPage, &dups, page: page, "node \(index): its sub-page's duplicates take \(used) bytes, its free-space bound says \(size - upper)")
            return nil
        }
        return count
    }

    /// Checks the overflow run starting at `page` for a value of `size` bytes and marks it in
    /// use; returns the offset of the value.
    private mutating func overflow(_ page: UInt64, size: Int, _ tree: inout Tree) -> Int? {
        guard let base = enter(page, &tree, what: "an overflow page") else { return nil }
        let flags = file.u16(base + 10) & ~(PageLayout.dirty | PageLayout.keep)
        guard flags == PageLayout.overflow else {
            report(.overflow, &tree, page: page, "flags 0x\(String(flags, radix: 16)) where an overflow page was expected")
            return nil
        }
        let pages = UInt64(file.u32(base + 12))
        // OVPAGES(size, psize).
        let needed = UInt64((PageLayout.headerSize - 1 + size) / pageSize + 1)
        guard pages >= needed else {
            report(.overflow, &tree, page: page, "a run of \(pages) pages for a \(size)-byte value (\(needed) needed)")
            return nil
        }
        let last = page + pages - 1
        guard last <= lastPage, last < filePages else {
            report(.overflow, &tree, page: page, "a run of \(pages) pages reaches page \(last), past the \(last < filePages ? "last page in use" : "end of the file")")
            return nil
        }
        var p = page + 1
        while p <= last {
            if inUse.insert(p) || free.contains(p) {
                report(.pageReachedTwice, &tree, page: p, "page \(p) of the overflow run at \(page) is in use elsewhere or free")
                return nil
            }
            p += 1
        }
        pagesEntered &+= Int(pages - 1)
        tree.pagesWalked &+= Int(pages - 1)
        tree.overflowPages &+= pages
        return base + PageLayout.headerSize
    }

    /// A free-list record's data (`size` bytes at `data`): an ID list, its length then that many
    /// page numbers in descending order.
    private mutating func freeList(_ page: UInt64, data: Int, size: Int, _ tree: inout Tree) {
        let count = file.u64(data)
        guard size >= 8, count <= UInt64(size / 8 - 1), file.contains(data, size) else {
            report(.freeList, &tree, page: page, "a record of \(size) bytes lists \(count) pages")
            return
        }
        var previous = UInt64.max
        for i in 0..<Int(count) {
            let p = file.u64(data + 8 + 8 * i)
            guard p >= 2, p <= recordedLastPage, p < previous else {
                report(.freeList, &tree, page: page, "entry \(i) names page \(p) (after \(previous == .max ? "none" : String(previous)), last page in use \(recordedLastPage))")
                return
            }
            previous = p
            freeCount &+= 1
            guard p < free.count else { continue }
            if free.insert(p) || inUse.contains(p) {
                report(.pageReachedTwice, &tree, page: p, "the free list names page \(p) twice, or a tree uses it")
                return
            }
        }
    }
}

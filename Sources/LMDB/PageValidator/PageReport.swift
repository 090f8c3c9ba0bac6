/// What ``PageValidator`` found in an LMDB data file: both meta pages, the databases it walked,
/// and every damage it met, each named by database and page.
///
/// ```swift
/// let report = try PageValidator.validate(path: folder)
/// if !report.isClean {
///     for finding in report.findings { print(finding) }
/// }
/// ```
public struct PageReport: Sendable, CustomStringConvertible {
    /// The data file that was read.
    public var path: String
    /// The file's size in bytes.
    public var fileBytes: Int
    /// The page size the file was read with: the used meta page's (`mm_psize`), 4096 when no
    /// meta page gives a valid one.
    public var pageSize: Int
    /// Whether the whole file was walked (``PageValidator/Scope/full``) or only its meta pages
    /// and the edges of each tree (``PageValidator/Scope/quick``).
    public var scope: PageValidator.Scope
    /// The two meta pages (pages 0 and 1), as far as the file holds them.
    public var metas: [Meta]
    /// The meta page LMDB uses: the valid one with the higher transaction id (page 0 on a tie).
    /// When only one is valid, that one (LMDB itself then refuses the file: `MDB_INVALID`);
    /// `nil` when neither is.
    public var usedMeta: Int?
    /// The databases walked from the used meta page: `<free>` (the free list), `<main>`, then
    /// each named database in key order. DUPSORT sub-databases are counted in their database.
    public var databases: [Database]
    /// Pages read as part of a tree: branch, leaf and overflow pages, each counted once.
    public var pagesWalked: Int
    /// Pages the free list names (``PageValidator/Scope/full`` only).
    public var freePages: Int
    /// Every damage found, in the order met, up to ``PageValidator/Options/maxFindings``.
    public var findings: [PageFinding]
    /// Findings beyond ``PageValidator/Options/maxFindings``, counted and not kept.
    public var findingsOmitted: Int
    /// Whether the walk stopped at its page or time budget before it was done.
    public var stoppedEarly: Bool

    /// Whether the walk finished and found no damage. A ``PageValidator/Scope/quick`` check says
    /// only that the pages it read are sound.
    public var isClean: Bool { findings.isEmpty && findingsOmitted == 0 && !stoppedEarly }

    /// A meta page (`MDB_meta`): the root of one committed snapshot.
    public struct Meta: Sendable {
        /// 0 or 1.
        public var page: Int
        /// Whether the page has LMDB's meta flag, magic and version (LMDB refuses the file otherwise).
        public var isValid: Bool
        /// The transaction that wrote it (`mm_txnid`).
        public var transactionID: UInt64
        /// The last page in use (`mm_last_pg`).
        public var lastPage: UInt64
        /// The map size recorded (`mm_mapsize`).
        public var mapSize: UInt64
        /// The page size recorded (`mm_psize`).
        public var pageSize: UInt32
        /// The root page of the free list, `nil` when it is empty.
        public var freeRoot: UInt64?
        /// The root page of the main database, `nil` when it is empty.
        public var mainRoot: UInt64?
    }

    /// A database as walked.
    public struct Database: Sendable {
        /// `<free>`, `<main>` or the named database's name.
        public var name: String
        /// Its flags (`md_flags`: `MDB_DUPSORT` 0x04, `MDB_INTEGERKEY` 0x08, …).
        public var flags: UInt16
        /// Its root page as recorded (`md_root`), `nil` when it is empty.
        public var root: UInt64?
        /// The depth of its tree as recorded (`md_depth`).
        public var depth: Int
        /// Its entries as recorded (`md_entries`; each duplicate counts).
        public var entries: UInt64
        /// The pages of its tree that were read, its sub-databases' included.
        public var pagesWalked: Int
    }

    public var description: String {
        var lines: [String] = []
        let used = usedMeta.map { "meta page \($0)" } ?? "no valid meta page"
        lines.append("\(path): \(fileBytes) bytes, \(pageSize)-byte pages, \(scope) check from \(used)")
        for m in metas {
            let roots = "free root \(m.freeRoot.map(String.init) ?? "-"), main root \(m.mainRoot.map(String.init) ?? "-")"
            lines.append("  meta \(m.page): \(m.isValid ? "valid" : "invalid"), txn \(m.transactionID), last page \(m.lastPage), \(roots)")
        }
        for d in databases {
            lines.append("  \(d.name): \(d.entries) entries, depth \(d.depth), \(d.pagesWalked) pages walked")
        }
        lines.append("  \(pagesWalked) pages walked, \(freePages) free")
        for f in findings { lines.append("  damaged: \(f)") }
        if findingsOmitted > 0 { lines.append("  … and \(findingsOmitted) more findings") }
        if stoppedEarly { lines.append("  stopped early: the budget ran out") }
        lines.append(isClean ? "  clean" : "  NOT clean")
        return lines.joined(separator: "\n")
    }
}

/// One damage ``PageValidator`` found: where, and what is wrong.
public struct PageFinding: Sendable, Hashable, CustomStringConvertible {
    /// What kind of damage it is.
    public var kind: Kind
    /// The database whose tree holds the page: `<free>`, `<main>`, a named database's name
    /// (with `(duplicates)` for a DUPSORT key's sub-database); `nil` for the file and its meta pages.
    public var database: String?
    /// The page, when the damage is in one.
    public var page: UInt64?
    /// What is wrong, in words.
    public var message: String

    public var description: String {
        let db = database.map { " in \($0)" } ?? ""
        let page = page.map { " page \($0)" } ?? ""
        return "\(kind)\(db)\(page): \(message)"
    }

    /// The kind of a ``PageFinding``; a stable name, and more kinds may come.
    public struct Kind: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        /// The kind's stable name.
        public let rawValue: String

        /// The kind named `rawValue`.
        public init(rawValue: String) { self.rawValue = rawValue }

        public var description: String { rawValue }

        /// The file is shorter than its two meta pages, or not a whole number of pages long
        /// where that matters.
        public static let fileSize = Kind(rawValue: "fileSize")
        /// A meta page is not one, or holds impossible values (page size, last page, roots).
        public static let metaPage = Kind(rawValue: "metaPage")
        /// A page number outside the file, past the last page in use, or naming a meta page.
        public static let pageOutOfRange = Kind(rawValue: "pageOutOfRange")
        /// A page's own number (`mp_pgno`) differs from the number it was reached by.
        public static let pageNumber = Kind(rawValue: "pageNumber")
        /// A page's flags do not say the kind of page expected there.
        public static let pageKind = Kind(rawValue: "pageKind")
        /// A page's free-space bounds (`mp_lower`, `mp_upper`) are impossible.
        public static let pageBounds = Kind(rawValue: "pageBounds")
        /// A node lies (partly) outside its page, or outside the page's node area.
        public static let nodeBounds = Kind(rawValue: "nodeBounds")
        /// A node's flags or sizes are impossible (key too long, a database record of the
        /// wrong size, flags the database cannot have).
        public static let node = Kind(rawValue: "node")
        /// Keys out of order within a page, or outside the range the branch above gives them.
        public static let keyOrder = Kind(rawValue: "keyOrder")
        /// An overflow run is not an overflow page, too short for its value, or past the end.
        public static let overflow = Kind(rawValue: "overflow")
        /// A page reached twice: a loop, or a page shared by two trees or by a tree and the free list.
        public static let pageReachedTwice = Kind(rawValue: "pageReachedTwice")
        /// The tree's depth differs from its record, or leaves at different depths, or deeper
        /// than LMDB can descend.
        public static let depth = Kind(rawValue: "depth")
        /// Page or entry counts differ from the database's record.
        public static let counts = Kind(rawValue: "counts")
        /// A free-list record that does not parse, or names a page out of range or twice.
        public static let freeList = Kind(rawValue: "freeList")
        /// Pages neither in a tree nor on the free list (or both), counted over the whole file.
        public static let pageAccounting = Kind(rawValue: "pageAccounting")
        /// A DUPSORT sub-page (duplicates kept inside their node) is damaged.
        public static let subPage = Kind(rawValue: "subPage")
    }
}

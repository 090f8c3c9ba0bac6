import StrataLibc

/// Checks an LMDB data file page by page, without LMDB, before LMDB is allowed to read it.
///
/// LMDB trusts its file: a damaged page makes it follow a wild page number or node offset, and
/// the process dies (an `IS_LEAF` or `root > 1` assertion, SIGSEGV, SIGBUS). Where a child
/// process cannot take that risk (iOS), this walks the file first, in the same process, and
/// every number it reads from the file is range-checked before it is used: a damaged file
/// gives findings, never a crash or a hang.
///
/// ```swift
/// let report = try PageValidator.validate(path: storeFolder)
/// guard report.isClean else { throw … }   // report.findings says what and where
/// let env = try Environment(path: storeFolder)
/// ```
///
/// It reads LMDB 0.9's format (64-bit, little-endian) from the newer valid meta page, as LMDB
/// does: the free list, the main database, each named database, and each DUPSORT key's
/// duplicates (sub-pages and sub-databases). See ``validate(path:options:)`` for the checks.
///
/// Run it when no other process writes the file (before the environment is opened, or while
/// its writers are stopped): LMDB reuses free pages in place, so a page read during a write
/// may belong to the next snapshot and be reported as damage.
public enum PageValidator {
    /// How much of the file a check reads.
    public enum Scope: String, Sendable, Hashable {
        /// Every page of every tree, the free list, and the page accounting of the whole file.
        case full
        /// The meta pages and, in each tree, the pages from the root to the leftmost and the
        /// rightmost leaf (with the named databases and sub-databases met on them): a cost
        /// that does not grow with the file, for every open.
        case quick
    }

    /// What a check reads, and when it gives up.
    public struct Options: Sendable {
        /// ``Scope/full`` (the default) or ``Scope/quick``.
        public var scope: Scope = .full
        /// The most pages the walk enters; `nil` for no limit (each page is entered at most
        /// once in any case, so the walk always ends). The report says when it stopped early.
        public var pageBudget: Int?
        /// The most time the walk takes; `nil` for no limit.
        public var timeBudget: Duration?
        /// The most findings kept; the rest are counted (``PageReport/findingsOmitted``).
        public var maxFindings: Int = 1000

        /// A full check, with no budget.
        public init() {}

        /// A ``Scope/quick`` check.
        public static var quick: Options {
            var o = Options()
            o.scope = .quick
            return o
        }
    }

    /// Checks the LMDB data file at `path`: an environment's folder (its `data.mdb`) or the
    /// file itself.
    ///
    /// The file is mapped read-only. Checks, from the meta page LMDB would use:
    /// - both meta pages: meta flag, magic, version, page size, last page, map size, roots and
    ///   depths of the free list and the main database;
    /// - every page of each tree: its number within the file and not past the last page in
    ///   use, its own number (`mp_pgno`), its kind, its free-space bounds, every node offset and
    ///   node (key and in-page data) inside the page's node area, the nodes filling that area
    ///   exactly, key sizes, node flags the database can have;
    /// - key order within each page and against the range the branch above gives, with the
    ///   database's order: bytes (the default), reversed bytes (`MDB_REVERSEKEY`), integers
    ///   (`MDB_INTEGERKEY`), and the same for DUPSORT duplicates;
    /// - each overflow run: an overflow page, long enough for its value, inside the file;
    /// - each tree's depth, and its branch, leaf and overflow page and entry counts, against its
    ///   record; every leaf at the same depth, and no deeper than LMDB's 32 levels;
    /// - no page reached twice (a loop, or a page two trees share, or a page both in a tree and
    ///   on the free list); the free list's page numbers in range and in order;
    /// - every page up to the last page in use either in a tree or on the free list.
    ///
    /// Not checked: values' contents; the older meta page's snapshot (only its meta page);
    /// databases with a custom comparator (`mdb_set_compare`; the file does not say so, and
    /// their keys are checked in byte order); the reader table (`lock.mdb`).
    ///
    /// - Throws: ``LMDBError`` when the file cannot be opened or mapped (`errno`); damage is
    ///   never thrown, it is in the report.
    /// - Complexity: ``Scope/full``: O(*n*) in the file's pages, one pass, with one bit of
    ///   memory per page. ``Scope/quick``: O(*d* · *k*) for *k* databases of depth *d*.
    public static func validate(path: String, options: Options = Options()) throws(LMDBError) -> PageReport {
        var file = path
        var status = stat()
        if stat(path, &status) == 0, status.st_mode & S_IFMT == S_IFDIR {
            file = path.hasSuffix("/") ? path + "data.mdb" : path + "/data.mdb"
        }
        let fd = open(file, O_RDONLY)
        guard fd >= 0 else { throw LMDBError(code: errno, operation: "open(\(file))") }
        defer { close(fd) }
        guard fstat(fd, &status) == 0 else { throw LMDBError(code: errno, operation: "fstat(\(file))") }
        let size = Int(status.st_size)
        guard size > 0 else {
            return validate(FileBytes(base: nil, count: 0), path: file, options: options)
        }
        // Read-only and private: nothing this does can reach the file. A file that another
        // process truncates meanwhile could still fault the reads; LMDB never shrinks it.
        guard let map = mmap(nil, size, PROT_READ, MAP_PRIVATE, fd, 0), map != MAP_FAILED else {
            throw LMDBError(code: errno, operation: "mmap(\(file))")
        }
        defer { munmap(map, size) }
        _ = madvise(map, size, MADV_SEQUENTIAL)
        return validate(FileBytes(base: UnsafeRawPointer(map), count: size), path: file, options: options)
    }

    /// Checks the LMDB data file whose bytes are `bytes`, as ``validate(path:options:)`` does;
    /// for a copy already in memory.
    ///
    /// - Complexity: as ``validate(path:options:)``.
    public static func validate(bytes: UnsafeRawBufferPointer, options: Options = Options()) -> PageReport {
        validate(FileBytes(base: bytes.baseAddress, count: bytes.count), path: "(bytes)", options: options)
    }

    // MARK: The check

    private static func validate(_ file: FileBytes, path: String, options: Options) -> PageReport {
        let start = ContinuousClock.now
        var report = PageReport(
            path: path, fileBytes: file.count, pageSize: 4096, scope: options.scope, metas: [], usedMeta: nil,
            databases: [], pagesWalked: 0, freePages: 0, findings: [], findingsOmitted: 0, stoppedEarly: false)
        // An empty file is one LMDB has not initialised yet: it writes the meta pages on open.
        guard file.count > 0 else { return report }
        var findings: [PageFinding] = []
        func damaged(_ kind: PageFinding.Kind, page: UInt64? = nil, _ message: String) {
            findings.append(PageFinding(kind: kind, database: nil, page: page, message: message))
        }

        // The page size is the first meta page's (LMDB reads the second at that offset).
        let psize = Int(file.u32(PageLayout.metaFreeRecord))
        let pageSize = isPageSize(psize) && file.u32(PageLayout.metaMagic) == PageLayout.magic ? psize : 4096
        report.pageSize = pageSize
        guard file.count / pageSize >= 2 else {
            damaged(.fileSize, "\(file.count) bytes hold fewer than the two meta pages of \(pageSize) bytes")
            return finish(report, findings, options)
        }
        if file.count % pageSize != 0 {
            damaged(.fileSize, "\(file.count) bytes are not a whole number of \(pageSize)-byte pages")
        }

        let metas = (0..<2).map { readMeta($0, file, pageSize: pageSize) }
        report.metas = metas.map(\.summary)
        for meta in metas {
            for problem in meta.problems { damaged(.metaPage, page: UInt64(meta.summary.page), problem) }
        }
        let valid = metas.filter { $0.summary.isValid }
        // mdb_env_pick_meta: the higher transaction id, page 0 on a tie.
        guard let used = valid.max(by: { $0.summary.transactionID < $1.summary.transactionID || ($0.summary.transactionID == $1.summary.transactionID && $0.summary.page > $1.summary.page) }) else {
            return finish(report, findings, options)
        }
        report.usedMeta = used.summary.page
        if valid.count < 2 {
            damaged(.metaPage, page: UInt64(1 - used.summary.page), "LMDB refuses a file with an invalid meta page (MDB_INVALID); the other one was walked")
        }
        guard used.isWalkable else { return finish(report, findings, options) }

        var walker = PageWalker(file: file, pageSize: pageSize, lastPage: used.summary.lastPage, options: options, start: start)
        walker.walk(used.free, name: "<free>", role: .free)
        walker.walk(used.main, name: "<main>", role: .main)
        report.databases = walker.databases
        report.pagesWalked = walker.inUse.setCount
        report.freePages = walker.freeCount
        report.stoppedEarly = walker.stopped
        findings += walker.findings
        report.findingsOmitted = walker.findingsOmitted
        // Every page up to the last in use is in exactly one tree or on the free list (mdb.c's
        // MDB_page comment; mdb_audit) — worth saying only when nothing else was found.
        if options.scope == .full, !walker.stopped, findings.isEmpty, walker.findingsOmitted == 0 {
            let accounted = UInt64(walker.inUse.setCount) + UInt64(walker.freeCount) + 2
            let expected = used.summary.lastPage + 1
            if accounted != expected {
                damaged(.pageAccounting, "\(walker.inUse.setCount) pages in trees, \(walker.freeCount) on the free list and 2 meta pages make \(accounted), the last page in use says \(expected)")
            }
        }
        return finish(report, findings, options)
    }

    private static func finish(_ report: PageReport, _ findings: [PageFinding], _ options: Options) -> PageReport {
        var report = report
        let keep = max(0, options.maxFindings)
        report.findings = Array(findings.prefix(keep))
        report.findingsOmitted += max(0, findings.count - keep)
        return report
    }

    private static func isPageSize(_ n: Int) -> Bool {
        n >= PageLayout.minPageSize && n <= PageLayout.maxPageSize && n & (n - 1) == 0
    }

    // MARK: Meta pages

    private struct MetaRead {
        var summary: PageReport.Meta
        var free: DatabaseRecord
        var main: DatabaseRecord
        var problems: [String] = []
        /// Valid, and its last page and roots can be followed.
        var isWalkable = false
    }

    private static func readMeta(_ page: Int, _ file: FileBytes, pageSize: Int) -> MetaRead {
        let base = page * pageSize
        let free = file.databaseRecord(at: base + PageLayout.metaFreeRecord)
        let main = file.databaseRecord(at: base + PageLayout.metaMainRecord)
        func root(_ r: DatabaseRecord) -> UInt64? { r.root == PageLayout.invalidPage ? nil : r.root }
        var read = MetaRead(
            summary: PageReport.Meta(
                page: page, isValid: false,
                transactionID: file.u64(base + PageLayout.metaTxnID), lastPage: file.u64(base + PageLayout.metaLastPage),
                mapSize: file.u64(base + PageLayout.metaMapSize), pageSize: file.u32(base + PageLayout.metaFreeRecord),
                freeRoot: root(free), mainRoot: root(main)),
            free: free, main: main)
        let flags = file.u16(base + 10)
        let magic = file.u32(base + PageLayout.metaMagic), version = file.u32(base + PageLayout.metaVersion)
        guard flags & PageLayout.meta != 0, magic == PageLayout.magic, version == PageLayout.dataVersion else {
            read.problems.append("not an LMDB meta page: flags 0x\(String(flags, radix: 16)), magic 0x\(String(magic, radix: 16)), version \(version)")
            return read
        }
        read.summary.isValid = true
        let m = read.summary
        if file.u64(base) != UInt64(page) { read.problems.append("it says it is page \(file.u64(base))") }
        if Int(m.pageSize) != pageSize { read.problems.append("page size \(m.pageSize), meta page 0 says \(pageSize)") }
        // mdb_env_open2 maps at least (mm_last_pg + 1) · psize bytes; the map never holds less.
        let (used, overflow) = (m.lastPage &+ 1).multipliedReportingOverflow(by: UInt64(pageSize))
        var walkable = true
        if m.lastPage < 1 || m.lastPage == .max || overflow || used > m.mapSize {
            read.problems.append("last page \(m.lastPage) does not fit its map of \(m.mapSize) bytes")
            walkable = false
        }
        for (name, r) in [("free list", free), ("main database", main)] where r.root != PageLayout.invalidPage {
            if r.root < 2 || r.root > m.lastPage {
                read.problems.append("the \(name)'s root is page \(r.root) (2 to \(m.lastPage))")
                walkable = false
            }
        }
        read.isWalkable = walkable
        return read
    }
}

import LMDB

/// How much of a store's file a page check reads; see ``Store/check(at:options:)``.
public struct StoreCheckOptions: Sendable {
    /// How much of the file is read.
    public enum Scope: String, Sendable, Hashable, Codable {
        /// Every page of every tree, the free list, and the page accounting of the whole file:
        /// O(size of the file).
        case full
        /// LMDB's two meta pages and, in each tree, the pages from the root to its first and its
        /// last leaf (with the named databases met on them): the pages LMDB reads first, at a
        /// cost that does not grow with the file.
        case quick
    }

    /// ``Scope/full`` (the default) or ``Scope/quick``.
    public var scope: Scope = .full
    /// The most time the check takes; `nil` (the default) for no limit. A check that runs out
    /// of time says so (``StoreCheckReport/stoppedEarly``) and reports what it found until then.
    public var timeLimit: Duration?
    /// The most pages the check reads; `nil` (the default) for no limit. Each page is read at
    /// most once in any case, so a check always ends, even on a tree that loops.
    public var pageLimit: Int?

    /// A full check without limits.
    public init() {}

    /// A ``Scope/quick`` check.
    public static var quick: StoreCheckOptions {
        var options = StoreCheckOptions()
        options.scope = .quick
        return options
    }

    /// The validator's options for these.
    var pageValidatorOptions: PageValidator.Options {
        var options = PageValidator.Options()
        options.scope = scope == .full ? .full : .quick
        options.timeBudget = timeLimit
        options.pageBudget = pageLimit
        return options
    }
}

/// What a page check of a store's file found (``Store/check(at:options:)``): the databases it
/// read and each damage, named by database and page.
///
/// ```swift
/// let report = try Store.check(at: folder)
/// if report.isDamaged {
///     print(report)   // the findings, and how to salvage
///     let salvaged = try Store.salvage(from: folder, into: newFolder)
/// }
/// ```
public struct StoreCheckReport: Sendable, CustomStringConvertible {
    /// One damage: where it is, and what is wrong.
    public struct Finding: Sendable, Hashable, CustomStringConvertible {
        /// A stable name for the kind of damage (`pageBounds`, `keyOrder`, `metaPage`, …).
        public var kind: String
        /// The LMDB database whose tree holds the damaged page: a Strata database (`log`,
        /// `rows`, `meta`, …), `<main>` (the list of databases) or `<free>` (LMDB's free list);
        /// `nil` for the file itself and its meta pages.
        public var database: String?
        /// The damaged page's number, when the damage is in one page.
        public var page: UInt64?
        /// What is wrong, in words.
        public var message: String

        public var description: String {
            let db = database.map { " in \($0)" } ?? ""
            let page = page.map { " page \($0)" } ?? ""
            return "\(kind)\(db)\(page): \(message)"
        }
    }

    /// A database as the check read it.
    public struct Database: Sendable, Hashable {
        /// `<free>`, `<main>` or the database's name.
        public var name: String
        /// Its entries, as its record says.
        public var entries: UInt64
        /// The pages of its tree that were read.
        public var pagesRead: Int
    }

    /// The store's folder.
    public var path: String
    /// How much of the file was read.
    public var scope: StoreCheckOptions.Scope
    /// The size of `data.mdb`, in bytes.
    public var fileBytes: Int
    /// The pages read as part of a tree (each counted once).
    public var pagesRead: Int
    /// The databases read: `<free>`, `<main>`, then each named database in name order.
    public var databases: [Database]
    /// Every damage found, in the order met (at most 1,000; ``findingsOmitted`` counts the rest).
    public var findings: [Finding]
    /// Findings past the first 1,000, counted and not kept.
    public var findingsOmitted: Int
    /// Whether the check stopped at its time or page limit before it was done.
    public var stoppedEarly: Bool
    /// Whether another process committed to the store during every try of the check (it is
    /// tried three times): its findings may then be pages that changed under it, not damage,
    /// so they are kept but ``isDamaged`` is `false`. Check again when the store is quiet.
    public var changedDuringCheck: Bool
    /// How long the check took, its retries included.
    public var duration: Duration
    /// Whether a valid LMDB meta page was found: the file is LMDB's.
    let hasValidMeta: Bool

    /// Whether the check found damage in a file that did not change meanwhile: LMDB must not
    /// read this file (``StrataError/Code/corruptStore``); salvage it.
    public var isDamaged: Bool { !changedDuringCheck && (!findings.isEmpty || findingsOmitted > 0) }

    /// Whether the check read everything it meant to and found no damage. A ``StoreCheckOptions/Scope/quick``
    /// check says only that the pages it read are sound.
    public var isClean: Bool { findings.isEmpty && findingsOmitted == 0 && !stoppedEarly && !changedDuringCheck }

    /// The ``StrataError/Code/corruptStore`` error for this damage (its first findings, and
    /// how to salvage), `nil` when ``isDamaged`` is `false`.
    public var error: StrataError? {
        guard isDamaged else { return nil }
        let shown = findings.prefix(3).map(\.description).joined(separator: "; ")
        let more = findings.count - min(3, findings.count) + findingsOmitted
        let rest = more > 0 ? " (and \(more) more)" : ""
        return StrataError(.corruptStore, "the store at '\(path)' is damaged: \(shown)\(rest). It was not opened, so LMDB never read it and nothing was written. Recover what is readable into a new folder with Store.salvage(from:into:), or run `strata salvage '\(path)' <new folder>`")
    }

    public var description: String {
        var lines = ["\(path): \(scope) check of \(fileBytes) bytes, \(pagesRead) pages read in \(databases.count) databases, \(milliseconds(duration)) ms"]
        for f in findings { lines.append("  damaged: \(f)") }
        if findingsOmitted > 0 { lines.append("  … and \(findingsOmitted) more findings") }
        if stoppedEarly { lines.append("  stopped early: the time or page limit ran out") }
        if changedDuringCheck { lines.append("  another process committed to the store during the check: check again when it is quiet") }
        if isDamaged {
            lines.append("  DAMAGED: recover what is readable with Store.salvage(from:into:) or `strata salvage '\(path)' <new folder>`")
        } else if isClean {
            lines.append("  clean")
        } else {
            lines.append("  not finished: no damage found in the pages read")
        }
        return lines.joined(separator: "\n")
    }

    /// `d` in milliseconds, to a tenth.
    private func milliseconds(_ d: Duration) -> Double {
        let (seconds, attoseconds) = d.components
        return ((Double(seconds) * 1000 + Double(attoseconds) / 1e15) * 10).rounded() / 10
    }

    /// The report of `pages`, the validator's report on the store in `path`.
    init(path: String, pages: PageReport, changedDuringCheck: Bool, duration: Duration) {
        self.path = path
        scope = pages.scope == .full ? .full : .quick
        fileBytes = pages.fileBytes
        pagesRead = pages.pagesWalked
        databases = pages.databases.map { Database(name: $0.name, entries: $0.entries, pagesRead: $0.pagesWalked) }
        findings = pages.findings.map { Finding(kind: $0.kind.rawValue, database: $0.database, page: $0.page, message: $0.message) }
        findingsOmitted = pages.findingsOmitted
        stoppedEarly = pages.stoppedEarly
        self.changedDuringCheck = changedDuringCheck
        self.duration = duration
        hasValidMeta = pages.usedMeta != nil
    }
}

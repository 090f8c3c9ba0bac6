import Foundation
import LMDB

/// How much of a store's file ``Store/init(path:options:)`` checks before LMDB reads it
/// (``StoreOptions/checkAtOpen``).
///
/// LMDB trusts its file: a damaged page makes it follow a wild page number or node offset and
/// the process dies, at every launch of an app that opens the store. A check reads the file's
/// pages in Swift, every number range-checked, before LMDB maps it; a damaged store is then
/// ``StrataError/Code/corruptStore``, an error the app can handle by salvaging
/// (``Store/salvage(from:into:)``), never a crash.
///
/// After an open that did not end in a clean close (the process crashed or was killed, as iOS
/// ends apps), the next open runs the ``full`` check whatever was chosen, unless ``none``
/// was: see docs/damaged-stores.md.
public enum OpenCheck: String, Sendable, Hashable, CaseIterable, Codable {
    /// No check, not even after an unclean close: LMDB reads the file as it is.
    case none
    /// The meta pages and, in each database, the pages from the root to its first and last
    /// leaf: the pages LMDB reads first. A fraction of a millisecond (0.1 to 0.25 ms measured),
    /// whatever the store's size.
    /// The default.
    case quick
    /// Every page of the file: about half a millisecond per MB of store in the page cache (see
    /// docs/damaged-stores.md).
    case full
}

extension Store {
    /// Checks the pages of the store's file in the folder at `path`, in this process and
    /// without LMDB: the same check ``StoreOptions/checkAtOpen`` runs before an open.
    ///
    /// The store need not be openable: this never opens it with LMDB, never writes to the folder,
    /// and never crashes on a damaged file (every number read from it is range-checked, and each
    /// page is read at most once, so a tree that loops ends the walk too). Damage is in the report,
    /// not thrown: ``StoreCheckReport/isDamaged``, ``StoreCheckReport/findings``, and
    /// ``StoreCheckReport/error`` for the ``StrataError/Code/corruptStore`` an open would throw.
    ///
    /// It may run while another process (or this one) has the store open: a finding is reported
    /// as damage only when no transaction was committed during the check, since LMDB reuses free
    /// pages in place; a check disturbed three times says so
    /// (``StoreCheckReport/changedDuringCheck``).
    ///
    /// ```swift
    /// let report = try Store.check(at: folder)
    /// if report.isDamaged { try Store.salvage(from: folder, into: newFolder) }
    /// ```
    ///
    /// - Throws: ``StrataError`` `io` when the folder holds no `data.mdb` or it cannot be read,
    ///   `notAStore` when `data.mdb` is empty.
    /// - Complexity: O(pages of the file) for a ``StoreCheckOptions/Scope/full`` check, one pass
    ///   (about half a millisecond per MB in the page cache); O(depth × databases) for a quick one.
    public static func check(at path: String, options: StoreCheckOptions = StoreCheckOptions()) throws(StrataError) -> StoreCheckReport {
        guard FileManager.default.fileExists(atPath: path + "/data.mdb") else {
            throw StrataError(.io, "no Strata store at '\(path)' (no data.mdb in that folder)")
        }
        try StoreFiles.refuseEmptyDataFile(in: path)
        return try PageCheck.run(path, options)
    }
}

/// The page check shared by ``Store/check(at:options:)`` and the check at open.
enum PageCheck {
    /// How many times a check whose file changed under it is run.
    static let attempts = 3

    /// Validates the file in `path`; a finding counts as damage only if the file was quiet
    /// during the walk.
    ///
    /// Why that is enough: LMDB copies on write. The pages of the snapshot the walk reads (the
    /// newer meta page's) are never written while that snapshot is the newest; they can be
    /// reused only once a later transaction has committed and freed them (and a second one
    /// reuses them). So when both meta pages hold the transaction ids they held when the walk
    /// began, and the file has its size, no page the walk read changed under it, whatever a
    /// writer in another process was doing meanwhile, and what it found is in the file. Otherwise
    /// the walk runs again.
    static func run(_ path: String, _ options: StoreCheckOptions) throws(StrataError) -> StoreCheckReport {
        let start = ContinuousClock.now
        var report = try validate(path, options.pageValidatorOptions)
        var changed = false
        for attempt in 1...attempts {
            if attempt > 1 { report = try validate(path, options.pageValidatorOptions) }
            if report.findings.isEmpty && report.findingsOmitted == 0 {
                changed = false
                break
            }
            let after = try validate(path, .quick)
            changed = after.fileBytes != report.fileBytes || after.metas.map(\.transactionID) != report.metas.map(\.transactionID)
            if !changed { break }
        }
        return StoreCheckReport(path: path, pages: report, changedDuringCheck: changed, duration: ContinuousClock.now - start)
    }

    private static func validate(_ path: String, _ options: PageValidator.Options) throws(StrataError) -> PageReport {
        do {
            return try PageValidator.validate(path: path, options: options)
        } catch {
            throw StrataError(.io, "cannot read the store's file '\(path)/data.mdb' to check it: \(error.message)", cause: error)
        }
    }

    /// The check before the first open of `path` in this process (see ``StoreCore``), with the
    /// store's `data.mdb` present and not empty: throws ``StrataError/Code/corruptStore`` when the
    /// file is damaged.
    ///
    /// A file that is not LMDB's at all (neither meta page valid) is left to LMDB, which reads
    /// and refuses such a header without crashing: the open then says ``StrataError/Code/notAStore``,
    /// as it always has. A check that the file kept changing under is not taken for damage:
    /// another process is committing to the store, so its LMDB reads the file as well.
    static func beforeOpening(_ path: String, _ check: OpenCheck) throws(StrataError) {
        let options: StoreCheckOptions
        switch check {
        case .none: return
        case .quick: options = .quick
        case .full: options = StoreCheckOptions()
        }
        let report = try run(path, options)
        guard let error = report.error, report.hasValidMeta else { return }
        throw error
    }
}

import ArgumentParser
import Foundation
import Strata

/// `strata check`: every page of the store's file, checked in this process without LMDB
/// (``Store/check(at:options:)``), so that damage LMDB cannot survive (it keeps no checksums and
/// trusts its file) is reported, not a crash.
///
/// It used to read every entry with LMDB in a child process, which contained LMDB's crashes.
/// The page check reads the file itself, every number range-checked, and cannot crash or hang
/// on it, so the child no longer earns its place: it cost a process start, it left an orphan
/// when `check` was killed, and an app cannot start one at all (iOS).
struct CheckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Check every page of a store's file, without LMDB, and report damage.",
        discussion: """
            Reads the file page by page in Swift, as a store's open does before LMDB may read it: \
            both meta pages, every page of every database and of the free list, node bounds, key \
            order, overflow runs, loops. Never opens the store with LMDB and writes nothing.
            Exit status: 0 when the file is sound, 3 when it is damaged (each damage is named by \
            database and page; salvage it), 2 when the check could not finish (--timeout, or \
            another process kept committing to the store) or the folder holds no store.
            Example:
              strata check store || strata salvage store store-recovered
            """
    )
    @Argument(help: "The store's folder.") var store: String
    @OptionGroup var output: OutputOptions
    @Option(help: "Give up on a check that takes longer than this many seconds.")
    var timeout: Double = 300
    @Flag(help: "Only the pages LMDB reads first (the check of a store's open, StoreOptions.checkAtOpen = .quick).")
    var quick = false

    func validate() throws {
        guard timeout > 0, timeout.isFinite else { throw ValidationError("--timeout takes a number of seconds above 0") }
    }

    /// The report as JSON.
    struct Report: Encodable {
        struct Finding: Encodable { var kind: String; var database: String?; var page: UInt64?; var message: String }
        struct Database: Encodable {
            var name: String
            var entries: UInt64
            var pagesRead: Int
            /// `ok`, or `damaged` when a finding names it.
            var status: String
        }
        var clean: Bool
        var damaged: Bool
        var scope: String
        var fileBytes: Int
        var pagesRead: Int
        var milliseconds: Double
        var stoppedEarly: Bool
        var changedDuringCheck: Bool
        var databases: [Database]
        var findings: [Finding]
        var findingsOmitted: Int

        init(_ r: StoreCheckReport) {
            let damagedNames = Set(r.findings.compactMap(\.database))
            clean = r.isClean
            damaged = r.isDamaged
            scope = r.scope.rawValue
            fileBytes = r.fileBytes
            pagesRead = r.pagesRead
            let (seconds, attoseconds) = r.duration.components
            milliseconds = Double(seconds) * 1000 + Double(attoseconds) / 1e15
            stoppedEarly = r.stoppedEarly
            changedDuringCheck = r.changedDuringCheck
            databases = r.databases.map {
                Database(name: $0.name, entries: $0.entries, pagesRead: $0.pagesRead, status: damagedNames.contains($0.name) ? "damaged" : "ok")
            }
            findings = r.findings.map { Finding(kind: $0.kind, database: $0.database, page: $0.page, message: $0.message) }
            findingsOmitted = r.findingsOmitted
        }
    }

    func run() throws {
        var status: Int32 = 0
        try reportingErrors {
            var options = StoreCheckOptions()
            options.scope = quick ? .quick : .full
            options.timeLimit = .milliseconds(Int64((min(timeout, 1e9) * 1000).rounded(.up)))
            let report = try Store.check(at: store, options: options)
            status = report.isDamaged ? Exit.damaged : report.isClean ? 0 : Exit.error
            if output.json {
                try printJSON(Report(report))
            } else {
                print(report)
            }
        }
        if status != 0 { throw ExitCode(status) }
    }
}

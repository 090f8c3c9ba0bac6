import ArgumentParser
import Foundation
import Strata
import StrataSync

struct RebuildCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rebuild",
        abstract: "Drop the views and fold the whole log again.",
        discussion: "Example:\n  strata rebuild store"
    )
    @OptionGroup var target: StoreArgument

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            let start = ContinuousClock.now
            let bar = ProgressBar("rebuilding")
            let count = try store.rebuild(progress: bar.update)
            print("rebuilt from \(count) operations in \(ContinuousClock.now - start)")
        }
    }
}

struct CompactCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "compact",
        abstract: "Fold old, acknowledged operations into the base snapshot; optionally shrink the file.",
        discussion: """
            Keeps every operation a limit names (and everything pending or pinned); with no \
            limit, folds everything that may be folded. History and time travel before the new \
            horizon are gone afterwards. --reclaim then rewrites the file without its free pages; \
            it needs the store closed everywhere.
            Example:
              strata compact store --keep-operations 100000 --keep-days 30 --reclaim
            """
    )
    @OptionGroup var target: StoreArgument
    @OptionGroup var output: OutputOptions
    @Option(parsing: .unconditional, help: "Keep at least this many of the last operations.") var keepOperations: Int?
    @Option(parsing: .unconditional, help: "Keep every operation younger than this many days.") var keepDays: Double?
    @Option(help: "Keep every operation after this LSN.") var keepAfter: UInt64?
    @Flag(help: "Shrink the file afterwards (the store must not be open anywhere else).") var reclaim = false

    struct Report: Encodable {
        var foldedOperations: Int
        var horizon: UInt64
        var remainingOperations: Int
        var baseRows: Int
        var heldBy: String?
        var fileBytesBefore: Int?
        var fileBytesAfter: Int?
    }

    func validate() throws {
        if let keepOperations, keepOperations < 0 { throw ValidationError("--keep-operations takes a count from 0") }
        if let keepDays, !(keepDays >= 0 && keepDays.isFinite) { throw ValidationError("--keep-days takes a number of days from 0") }
    }

    func run() throws {
        try reportingErrors {
            let retention = Retention(operations: keepOperations, age: keepDays.map { $0 * 86_400 }, after: keepAfter)
            // Before anything is changed: --reclaim needs the store closed everywhere else.
            if reclaim { try Store.checkNotOpen(at: target.store) }
            let report: CompactionReport
            do {
                let store = try target.open()
                defer { store.close() }  // closed before its file is swapped
                report = try store.compact(retaining: retention)
            }
            var sizes: (before: Int, after: Int)? = nil
            if reclaim {
                do {
                    sizes = try Store.reclaimSpace(at: target.store)
                } catch let e as StrataError {
                    // Someone opened it in between: say what was done and what was not.
                    throw StrataError(e.code, "the compaction was committed (\(report.foldedOperations) operations folded, horizon \(report.horizon)), but the space was not reclaimed: \(e.message)", cause: e.cause)
                }
            }
            if output.json {
                return try printJSON(Report(
                    foldedOperations: report.foldedOperations, horizon: report.horizon, remainingOperations: report.remainingOperations,
                    baseRows: report.baseRows, heldBy: report.heldBy?.description, fileBytesBefore: sizes?.before, fileBytesAfter: sizes?.after))
            }
            print(report)
            if let sizes { print("file: \(sizes.before / 1024) KiB → \(sizes.after / 1024) KiB") }
        }
    }
}

struct VerifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Rebuild the views from the log in a scratch store and compare them with the live ones.",
        discussion: "Checks every page first, as `strata check` does (exit 3 when the file is damaged; --no-check skips it). Then checks every operation's checksum and folds the log: exits with status 1 and names each damaged operation by LSN, and the differing rows, when there are any.\nExample:\n  strata verify store && echo consistent"
    )
    @OptionGroup var target: StoreArgument
    @OptionGroup var output: OutputOptions

    struct Report: Encodable {
        var consistent: Bool
        var operations: Int
        var differences: [String]
        /// Damaged operations (checksum), as `LSN n: reason`.
        var damagedOperations: [String] = []
        /// Operations written before checksums.
        var operationsWithoutChecksum = 0
        /// Operations whose checksum does not cover their LSN (written before store format 7).
        var operationsWithoutLSNInChecksum = 0
    }

    func run() throws {
        var consistent = true
        var walkStatus: Int32 = 0
        try reportingErrors {
            // First every page, as `strata check` does: damage that would crash LMDB is
            // reported as such, and the comparison below only runs on a store whose pages are
            // sound. The open after it need not check them again.
            if !target.noCheck {
                let pages = try Store.check(at: target.store)
                if pages.isDamaged {
                    walkStatus = Exit.damaged
                    if output.json {
                        try printJSON(Report(consistent: false, operations: 0, differences: pages.findings.map(\.description)))
                    } else {
                        print(pages)
                    }
                    return
                }
            }
            let bar = ProgressBar("verifying")
            let report: VerifyReport
            do {
                report = try target.open(check: OpenCheck.none).verify(progress: bar.update)
            } catch let e as StrataError {
                // verify writes only its scratch store, in the temporary folder.
                throw Store.diagnosingDiskFull(e, writingIn: FileManager.default.temporaryDirectory.path)
            }
            consistent = report.isConsistent
            if output.json {
                try printJSON(Report(
                    consistent: report.isConsistent, operations: report.operations, differences: report.differences.map(\.description),
                    damagedOperations: report.damagedOperations.map(\.description), operationsWithoutChecksum: report.operationsWithoutChecksum,
                    operationsWithoutLSNInChecksum: report.operationsWithoutLSNInChecksum))
            } else {
                print(report)
            }
        }
        if walkStatus != 0 { throw ExitCode(walkStatus) }
        if !consistent { throw ExitCode(Exit.inconsistent) }
    }
}

struct ReplayCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "replay",
        abstract: "Build a new store from another store's log, up to a point: reproduce a bug as it was.",
        discussion: "Example:\n  strata replay user-store /tmp/as-of-1200 --through 1200\n  strata replay user-store /tmp/before --through 2026-11-20T17:00:00Z"
    )
    @Argument(help: "The store whose log is replayed.") var source: String
    @Argument(help: "An empty folder for the new store.") var destination: String
    // `--through`, as `Store.replay(into:through:)` says it; `--until` is the name it had first.
    @Option(name: [.customLong("through"), .customLong("until")], help: "The last LSN to replay, or an ISO 8601 time (the last operation at or before it). --until is another name for it.")
    var through: String?
    @Flag(name: .customLong("no-check"), help: "Skip the check of every page of the source store's file that runs before it is opened.")
    var noCheck = false

    func validate() throws {
        if let through, UInt64(through) == nil, (try? Date(through, strategy: .iso8601)) == nil {
            throw ValidationError("--through takes an LSN or an ISO 8601 time, not '\(through)'")
        }
    }

    func run() throws {
        try reportingErrors {
            var options = StoreOptions()
            options.createIfMissing = false
            options.checkAtOpen = noCheck ? .none : .full
            let store = try Store(path: source, options: options)
            defer { store.close() }
            var lsn = UInt64.max
            if let through {
                if let n = UInt64(through) {
                    lsn = n
                } else {
                    let time = try Date(through, strategy: .iso8601)
                    lsn = 0
                    try store.read { snap in
                        try snap.forEachOperation { e in
                            guard e.timestamp <= time else { return false }
                            lsn = e.lsn
                            return true
                        }
                    }
                }
            }
            let bar = ProgressBar("replaying")
            let folderExisted = FileManager.default.fileExists(atPath: destination)
            let holdsStore = FileManager.default.fileExists(atPath: destination + "/data.mdb")
            let count: UInt64
            do {
                let replayed = try store.replay(into: destination, through: lsn, progress: bar.update)
                defer { replayed.close() }
                count = try replayed.read { try $0.lastLSN }
            } catch {
                // A failed replay leaves no half-made store behind to refuse the next attempt.
                // Diagnosed before the cleanup: the diagnosis looks at the file's size.
                let diagnosed = (error as? StrataError).map { Store.diagnosingDiskFull($0, writingIn: destination) } ?? error
                if !holdsStore { removeCreatedStore(destination, folderExisted: folderExisted) }
                throw diagnosed
            }
            print("replayed \(count) operations into \(destination)")
        }
    }
}

struct CopyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "copy",
        abstract: "Copy a store (safe while it is in use), optionally compacted.",
        discussion: "Example:\n  strata copy store /backups/store-2026-11-21 --compact"
    )
    @OptionGroup var target: StoreArgument
    @Argument(help: "An empty (or new) folder for the copy.") var destination: String
    @Flag(help: "Leave out free pages and renumber the copy.") var compact = false

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            guard !FileManager.default.fileExists(atPath: destination + "/data.mdb") else {
                throw StrataError(.io, "'\(destination)' already holds a store")
            }
            try FileManager.default.createDirectory(atPath: destination, withIntermediateDirectories: true)
            try store.copy(to: destination, compact: compact)
            print("copied to \(destination)\(compact ? " (compacted)" : "")")
        }
    }
}

extension ConflictPolicy {
    /// A policy named on the command line.
    init?(argument: String) {
        switch argument {
        case "server-wins": self = .serverWins
        case "client-wins": self = .clientWins
        case "last-writer-wins": self = .lastWriterWins
        case "deferred": self = .deferred
        default: return nil
        }
    }
}

struct MergeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "merge",
        abstract: "Merge a server delta (a JSON file in the wire format) into a store.",
        discussion: "Example:\n  strata merge store delta.json --policy deferred --dry-run"
    )
    @OptionGroup var target: StoreArgument
    @Argument(help: "The delta file (JSON, see Sources/StrataSync/Wire/).") var delta: String
    @Option(help: "server-wins, client-wins, last-writer-wins or deferred.") var policy: String = "server-wins"
    @Flag(help: "Merge and report, but store nothing.") var dryRun = false
    @OptionGroup var output: OutputOptions

    func validate() throws {
        if ConflictPolicy(argument: policy) == nil {
            throw ValidationError("--policy must be server-wins, client-wins, last-writer-wins or deferred")
        }
    }

    struct Report: Encodable {
        var dryRun: Bool
        var rowsApplied: Int
        var fieldsFromServer: Int
        var fieldsKeptLocal: Int
        var fieldsSettled: Int
        var conflicts: [String]
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            guard let data = FileManager.default.contents(atPath: delta) else {
                throw StrataError(.io, "cannot read the delta file '\(delta)'")
            }
            let parsed = try WireFormat.decode(ServerDelta.self, from: data)
            let report = try SyncClient(store: store, policy: ConflictPolicy(argument: policy)!).merge(parsed, dryRun: dryRun)
            if output.json {
                return try printJSON(Report(
                    dryRun: dryRun, rowsApplied: report.rowsApplied, fieldsFromServer: report.fieldsFromServer,
                    fieldsKeptLocal: report.fieldsKeptLocal, fieldsSettled: report.fieldsSettled,
                    conflicts: report.conflicts.map { "\($0.table) \($0.key) \($0.fields.joined(separator: ",")) → \($0.resolution)" }
                ))
            }
            print("\(dryRun ? "dry run: " : "")\(report)")
            for c in report.conflicts { print("conflict: \(c.table) \(c.key) \(c.fields.joined(separator: ", ")) → \(c.resolution) (\(c.policy))") }
        }
    }
}

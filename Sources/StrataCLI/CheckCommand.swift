import ArgumentParser
import Foundation
import LMDB
import Strata

/// `strata check`: reads every page of every database in a child process, so that damage LMDB
/// cannot survive (it keeps no checksums and trusts its file) is reported, not a crash.
struct CheckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Read every page of every database of a store, in a child process, and report damage.",
        discussion: """
            Exit status: 0 when every page reads back, 1 when LMDB reports damage (named by \
            database), 3 when reading a page crashed LMDB itself: the crash is contained in the \
            child process and the report names the database and the page it had reached. `verify` \
            runs the same walk first.
            Example:
              strata check store || strata salvage store store-recovered
            """
    )
    @OptionGroup var target: StoreArgument
    @OptionGroup var output: OutputOptions
    @Option(help: "Give up on a walk that takes longer than this many seconds (a damaged tree can loop).")
    var timeout: Double = 300

    func run() throws {
        var status: Int32 = 0
        try reportingErrors {
            let report = try PageCheck.run(store: target.store, timeout: timeout)
            status = report.exitStatus
            if output.json {
                try printJSON(report)
            } else {
                print(report.summary)
            }
        }
        if status != 0 { throw ExitCode(status) }
    }
}

/// The child side of ``CheckCommand``: `strata walk-pages <store> --from N` (not shown in help).
struct WalkPagesCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "walk-pages",
        abstract: "Internal: the child process of `check`.",
        shouldDisplay: false
    )
    @Argument var store: String
    @Option var from: Int = 0

    func run() throws {
        PageWalk.run(path: store, from: from)
    }
}

/// What ``PageCheck`` found, per database.
struct PageCheckReport: Encodable {
    struct DatabaseResult: Encodable {
        var name: String
        var entries: Int
        /// `ok`, `damaged` (LMDB or the wrapper reported an error) or `crashed` (LMDB crashed
        /// in the child process).
        var status: String
        var message: String?
    }
    var databases: [DatabaseResult] = []

    var damaged: Bool { databases.contains { $0.status != "ok" } }
    var crashed: Bool { databases.contains { $0.status == "crashed" } }
    /// 0 clean, 1 damage reported, 3 a crash contained.
    var exitStatus: Int32 { crashed ? Exit.crashContained : damaged ? Exit.inconsistent : 0 }

    var summary: String {
        let entries = databases.reduce(0) { $0 + $1.entries }
        if !damaged {
            return "every page readable: \(databases.count) databases, \(entries) entries"
        }
        var lines = ["the store is damaged:"]
        for d in databases where d.status != "ok" {
            lines.append("  database \(d.name): \(d.message ?? d.status)")
        }
        lines.append("recover what is readable with: strata salvage <store> <new folder>")
        return lines.joined(separator: "\n")
    }
}

/// Runs ``PageWalk`` in child processes and turns what they print (and how they end) into a
/// ``PageCheckReport``. A child that dies of a signal is restarted after the database it died
/// in, so one damaged database does not hide the state of the others.
enum PageCheck {
    static func run(store path: String, timeout: Double) throws -> PageCheckReport {
        guard FileManager.default.fileExists(atPath: path + "/data.mdb") else {
            throw StrataError(.io, "no Strata store at '\(path)' (no data.mdb in that folder)")
        }
        // An empty data.mdb is no store to walk, and the child's LMDB would create a lock file
        // beside it.
        try Store.refuseEmptyDataFile(in: path)
        // The child's LMDB creates lock.mdb when it is missing; a check leaves the folder as it
        // found it.
        let hadLockFile = FileManager.default.fileExists(atPath: path + "/lock.mdb")
        defer { if !hadLockFile { Store.removeUnusedLockFile(in: path) } }
        // Made with its blocks allocated: on a full disk, LMDB's own would be a SIGBUS in the
        // child, reported as damage.
        try Store.allocateLockFile(in: path)
        var report = PageCheckReport()
        var from = 0
        while true {
            let run = try runChild(path: path, from: from, timeout: timeout)
            var current: (index: Int, name: String)? = nil
            var count = 0
            var lastPage: Int? = nil
            var lastEntries = 0
            var finished = false
            for line in run.lines {
                let f = line.split(separator: "\t", omittingEmptySubsequences: false).map(String.init)
                switch f.first {
                case "databases":
                    count = Int(f[1]) ?? 0
                case "db" where f.count >= 3:
                    current = (Int(f[1]) ?? 0, f[2])
                    lastPage = nil
                    lastEntries = 0
                case "page" where f.count >= 3:
                    lastPage = Int(f[1])
                    lastEntries = Int(f[2]) ?? 0
                case "ok" where f.count >= 3:
                    report.databases.append(.init(name: f[1], entries: Int(f[2]) ?? 0, status: "ok"))
                    current = nil
                case "damage" where f.count >= 4:
                    report.databases.append(.init(name: f[1], entries: Int(f[2]) ?? 0, status: "damaged", message: f[3]))
                    current = nil
                case "end":
                    finished = true
                default:
                    break
                }
            }
            if finished { return report }
            // The child died (or hung): name where it was.
            let how = run.signal.map { "crashed inside LMDB (signal \($0)\(signalName($0)))" } ?? (run.timedOut ? "did not finish in \(Int(timeout)) s (a damaged tree can loop)" : "stopped with status \(run.status)")
            let name = current?.name ?? "main"
            let place = lastPage.map { "after \(lastEntries) entries, having reached page \($0) of the file; the damage is on a page read after it" }
                ?? "before reading any entry of it (its root or first pages are damaged)"
            report.databases.append(.init(name: name, entries: lastEntries, status: "crashed", message: "reading it \(how), \(place)"))
            guard let index = current?.index, index + 1 < count else { return report }
            from = index + 1
        }
    }

    private static func signalName(_ signal: Int32) -> String {
        switch signal {
        case SIGSEGV: ", SIGSEGV"
        case SIGBUS: ", SIGBUS"
        case SIGABRT: ", SIGABRT: an LMDB assertion"
        case SIGILL: ", SIGILL"
        case SIGFPE: ", SIGFPE"
        default: ""
        }
    }

    /// Runs `strata walk-pages` and collects its lines.
    private static func runChild(path: String, from: Int, timeout: Double) throws -> (lines: [String], signal: Int32?, status: Int32, timedOut: Bool) {
        let process = Process()
        process.executableURL = selfExecutable()
        process.arguments = ["walk-pages", path, "--from", String(from)]
        var environment = ProcessInfo.processInfo.environment
        // A crash is the expected outcome here; Swift's backtracer would only slow it down.
        environment["SWIFT_BACKTRACE"] = "enable=no"
        process.environment = environment
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch {
            throw StrataError(.io, "cannot start the page walk (\(process.executableURL?.path ?? "?")): \(error.localizedDescription)")
        }
        // Read while the child runs, so a full pipe never blocks it; a timer kills a hung walk.
        let timedOut = TimeoutFlag()
        let timer = DispatchSource.makeTimerSource()
        timer.schedule(deadline: .now() + timeout)
        let pid = process.processIdentifier
        timer.setEventHandler {
            timedOut.set()
            kill(pid, SIGKILL)
        }
        timer.resume()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        timer.cancel()
        let lines = String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
        let signal = process.terminationReason == .uncaughtSignal ? process.terminationStatus : nil
        let hung = timedOut.value
        return (lines, hung ? nil : signal, process.terminationStatus, hung)
    }

    /// The running `strata` binary, to start it again as the walking child.
    static func selfExecutable() -> URL {
        #if os(Linux)
        if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            return URL(fileURLWithPath: path)
        }
        #endif
        return Bundle.main.executableURL ?? URL(fileURLWithPath: CommandLine.arguments[0])
    }
}

/// A flag set by the timeout timer and read after the child ended.
private final class TimeoutFlag: @unchecked Sendable {
    // @unchecked: guarded by `lock`.
    private let lock = NSLock()
    private var flag = false
    func set() { lock.withLock { flag = true } }
    var value: Bool { lock.withLock { flag } }
}

/// The walk itself, in the child: opens the environment read-only with LMDB alone (no Strata
/// code runs on the damaged file), lists the named databases, and reads every entry of each,
/// touching every page of every value, printing where it is as it goes. Lines go straight to the
/// descriptor (no buffering), so the parent has them even when LMDB kills the process.
enum PageWalk {
    static func run(path: String, from: Int) {
        // A crash is expected here at worst; leave no core file for it.
        var noCore = rlimit(rlim_cur: 0, rlim_max: 0)
        // Glibc declares the resources as an enum; Darwin and Musl as plain `Int32` macros.
        #if canImport(Glibc)
        _ = setrlimit(Int32(RLIMIT_CORE.rawValue), &noCore)
        #else
        _ = setrlimit(RLIMIT_CORE, &noCore)
        #endif
        var options = EnvironmentOptions()
        options.readOnly = true
        options.maxDatabases = 64
        // A lock file this process cannot write (another user's store, a read-only mount): read
        // without it, as `Store` does for such a store.
        if access(path + "/lock.mdb", W_OK) != 0 && !(errno == ENOENT && access(path, W_OK) == 0) { options.noLock = true }
        let env: Environment
        do {
            env = try Environment(path: path, options: options)
        } catch {
            emit("databases\t0")
            emit("damage\tmain\t0\tthe file cannot be opened: \(error)")
            emit("end")
            return
        }
        emit("db\t-1\tmain")
        var names: [String] = []
        do {
            let main = try env.openDatabase(nil, create: false)
            try env.read { txn in
                try txn.withCursor(main) { c in
                    var e = try c.first()
                    while let entry = e {
                        names.append(String(decoding: entry.key, as: UTF8.self))
                        e = try c.next()
                    }
                }
            }
        } catch {
            emit("damage\tmain\t\(names.count)\tthe list of databases cannot be read: \(error)")
            emit("end")
            return
        }
        emit("databases\t\(names.count)")
        let fileSize = (try? FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? Int) ?? 0
        for (i, name) in names.enumerated() where i >= from {
            emit("db\t\(i)\t\(name)")
            var entries = 0
            do {
                let db = try env.openDatabase(name, create: false)
                try env.read { txn in
                    try txn.withCursor(db) { c in
                        var lastPage = -1
                        var sum: UInt8 = 0
                        var e = try c.first()
                        while let entry = e {
                            entries += 1
                            // A byte of every page the value spans, and its last one: every
                            // overflow page is touched, and a value past the file's end faults
                            // here, in the child, if the wrapper's check let it through.
                            var i = 0
                            while i < entry.value.count {
                                sum &+= entry.value[i]
                                i += 1024
                            }
                            if let last = entry.value.last { sum &+= last }
                            if let base = entry.key.baseAddress, let page = env.page(of: base), page != lastPage {
                                lastPage = page
                                emit("page\t\(page)\t\(entries)")
                            }
                            // Each entry takes at least a few bytes of a page: more than that is a
                            // cycle in a damaged tree, not data.
                            if entries > fileSize / 4 + 1 {
                                throw StrataError(.corruptRecord, "more entries than the file can hold: the tree loops")
                            }
                            e = try c.next()
                        }
                        _ = sum
                    }
                }
                emit("ok\t\(name)\t\(entries)")
            } catch let e as LMDBError {
                emit("damage\t\(name)\t\(entries)\t\(e.description)")
            } catch let e as StrataError {
                emit("damage\t\(name)\t\(entries)\t\(e.message)")
            } catch {
                emit("damage\t\(name)\t\(entries)\t\(error)")
            }
        }
        emit("end")
    }

    private static func emit(_ line: String) {
        let bytes = Array((line.replacingOccurrences(of: "\n", with: " ") + "\n").utf8)
        bytes.withUnsafeBytes { b in
            var done = 0
            while done < b.count {
                let n = write(1, b.baseAddress! + done, b.count - done)
                if n <= 0 { if errno == EINTR { continue }; return }
                done += n
            }
        }
    }
}

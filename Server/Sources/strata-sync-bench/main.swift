import ArgumentParser
import BenchSupport
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Strata
import StrataSync

/// The first-sync benchmark (not a test): a new store syncs N rows from `strata-server` on
/// PostgreSQL, all on this machine, in-process (`SyncClient` + `HTTPSyncTransport`) and as
/// `strata sync`; with, in the same run, what limits it: PostgreSQL alone, the server alone and
/// Strata's merge alone. Also: a sync that brings one changed row after N, and a first sync
/// killed halfway and run again.
@main
struct SyncBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "strata-sync-bench",
        abstract: "Benchmark the first sync of a new store from strata-server, with the limits of the same run.",
        discussion: """
            Uses the strata-server built next to this program, and a database of its own (strata_sync_bench, \
            dropped and made again for each row count) on the PostgreSQL of --database-url. \
            Server/Scripts/sync-bench.sh builds everything in release mode and runs it.
            Example:
              strata-sync-bench --rows 10000,100000 --strata .build/release/strata
            """,
        subcommands: [Run.self, Phone.self, MergeAlone.self],
        defaultSubcommand: Run.self
    )
}

/// The phone: one process that makes a store and syncs it, and says what it took.
struct Phone: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "phone", abstract: "(internal) Sync a new store once, and report.", shouldDisplay: false)
    @Option var server: String
    @Option var token: String
    @Option var otherToken: String
    @Option var otherClient = "other"
    @Option var store: String
    @Option var pageSize = HTTPSyncTransport.defaultPageSize
    @Option var tables: String
    @Option(help: "StoreOptions.overlayBudget, in MiB (the default when not given).") var overlayBudgetMiB: Int?

    struct Result: Codable {
        var seconds: Double
        var rows: Int
        var oneRowMilliseconds: Double
        /// The process's peak resident memory when the first sync returned, before the count
        /// below reads every row (and maps every page of the store).
        var syncPeakResidentMiB: Double
    }

    func run() async throws {
        var options = StoreOptions()
        if let overlayBudgetMiB { options.overlayBudget = overlayBudgetMiB << 20 }
        let store = try Store(path: self.store, options: options)
        try TablesFile(contentsOf: URL(fileURLWithPath: tables)).createTables(in: store)
        let transport = HTTPSyncTransport(server: URL(string: server)!, token: token, timeout: 120, pageSize: pageSize)
        let sync = SyncClient(store: store)
        let t0 = ContinuousClock.now
        _ = try await sync.sync(with: transport)
        let seconds = (ContinuousClock.now - t0) / .seconds(1)
        let peak = Self.peakResidentMiB()
        let rows = try await store.read { try $0.count("tasks") }
        // Another client changes one row; the phone's next sync brings it.
        let other = HTTPSyncTransport(server: URL(string: server)!, token: otherToken)
        let title = try await store.read { try $0.row("tasks", key: 1)?["title"] } ?? .null
        _ = try await other.push(Batch(id: "\(otherClient)-1", clientID: otherClient, number: 1, changes: [
            RowChange(table: "tasks", key: 1, kind: .update, values: ["title": "changed"], originals: ["title": title]),
        ]))
        let t1 = ContinuousClock.now
        _ = try await sync.sync(with: transport)
        let one = (ContinuousClock.now - t1) / .milliseconds(1)
        guard try await store.read({ try $0.row("tasks", key: 1)?["title"] }) == "changed" else { throw BenchError("the changed row did not arrive") }
        print(String(decoding: try JSONEncoder().encode(Result(seconds: seconds, rows: rows, oneRowMilliseconds: one, syncPeakResidentMiB: peak)), as: UTF8.self))
    }

    /// This process's peak resident memory so far (`VmHWM` in /proc/self/status), in MiB.
    static func peakResidentMiB() -> Double {
        guard let status = FileHandle(forReadingAtPath: "/proc/self/status") else { return 0 }
        defer { try? status.close() }
        let text = String(decoding: status.readDataToEndOfFile(), as: UTF8.self)
        guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kib = Double(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else { return 0 }
        return kib / 1024
    }
}

/// A child process's outcome: exit status, wall seconds, peak resident memory, peak anonymous
/// memory and CPU seconds.
///
/// Resident memory counts the shared libraries' pages (about 40 MiB here: Foundation, ICU, the
/// Swift runtime) and the pages of the store's file that LMDB's map holds: clean file pages,
/// which iOS does not count against an app's memory limit, and which a long sync hands back
/// after each checkpoint. Anonymous memory is the process's own heap and stacks: what a phone
/// must hold.
struct Child {
    var status: Int32
    var seconds: Double
    var maxRSSMiB: Double
    var maxAnonMiB: Double = 0
    var cpuSeconds: Double

    /// Starts `path` with `arguments`, its standard output to `stdout` (a file) and standard
    /// error to /dev/null.
    static func start(_ path: String, _ arguments: [String], stdout: String = "/dev/null") throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, stdout, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        defer { for a in argv { free(a) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &actions, nil, argv, environ)
        guard rc == 0 else { throw BenchError("cannot start \(path): \(String(cString: strerror(rc)))") }
        return pid
    }

    /// Waits for `pid`, started at `start`, sampling its memory every 10 ms meanwhile.
    ///
    /// The peak resident memory is the child's own `VmHWM`, sampled, not `wait4`'s `ru_maxrss`:
    /// `posix_spawn` starts the child in this process's memory (`vfork`), and Linux carries that
    /// memory's peak into the child's `ru_maxrss` when it execs, so a child would report this
    /// benchmark's own peak (its merge of N rows) when that is larger than its own.
    static func wait(_ pid: pid_t, since start: ContinuousClock.Instant) -> Child {
        let peak = Peaks()
        let sampler = Thread {
            // /proc/<pid>/status lasts until the process is reaped: a zombie shows neither line.
            while let (anon, hwm) = memoryKiB(pid) {
                peak.update(anon: anon, resident: hwm)
                usleep(10_000)
            }
        }
        sampler.start()
        var status: Int32 = 0
        var usage = rusage()
        _ = wait4(pid, &status, 0, &usage)
        let cpu = Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
        return Child(status: status, seconds: (ContinuousClock.now - start) / .seconds(1), maxRSSMiB: Double(peak.resident) / 1024,
                     maxAnonMiB: Double(peak.anon) / 1024, cpuSeconds: cpu)
    }

    /// The `RssAnon` and `VmHWM` of a live process, in KiB.
    static func memoryKiB(_ pid: pid_t) -> (anon: Int, hwm: Int)? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        func kib(_ name: String) -> Int? {
            text.split(separator: "\n").first { $0.hasPrefix(name) }
                .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") }
        }
        guard let anon = kib("RssAnon:"), let hwm = kib("VmHWM:") else { return nil }
        return (anon, hwm)
    }

    /// The highest samples seen, shared with the sampling thread.
    final class Peaks: @unchecked Sendable {   // the values are behind the lock
        private let lock = NSLock()
        private var anonKiB = 0, residentKiB = 0
        func update(anon: Int, resident: Int) { lock.withLock { anonKiB = max(anonKiB, anon); residentKiB = max(residentKiB, resident) } }
        var anon: Int { lock.withLock { anonKiB } }
        var resident: Int { lock.withLock { residentKiB } }
    }

    static func run(_ path: String, _ arguments: [String], stdout: String = "/dev/null") throws -> Child {
        let start = ContinuousClock.now
        return wait(try Self.start(path, arguments, stdout: stdout), since: start)
    }
}

struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "run", abstract: "Run the benchmark (the default).")
    @Option(help: "PostgreSQL URL; the benchmark makes its own database beside the one named.") var databaseURL = "postgres://postgres@127.0.0.1:5432/strata"
    @Option(help: "Row counts, comma-separated.") var rows = "10000,100000"
    @Option(help: "Rows per pull page (HTTPSyncTransport's default).") var pageSize = HTTPSyncTransport.defaultPageSize
    @Option(help: "The `strata` command (release build).") var strata = ".build/release/strata"
    @Option(help: "The tables file.") var tables = "Server/Examples/tables.json"
    @Flag(help: "Print JSON.") var json = false
    @Option(help: "The overlay budget, in MiB, of the second in-process run (StoreOptions.overlayBudget).") var smallOverlayMiB = 8

    struct Figures: Codable {
        var rows: Int
        var inProcessSeconds, inProcessRowsPerSecond, inProcessPeakMiB, inProcessAnonPeakMiB, inProcessCPUSeconds: Double
        var cliSeconds, cliRowsPerSecond, cliPeakMiB, cliAnonPeakMiB, cliCPUSeconds: Double
        var serverCPUSeconds, postgresCPUSeconds: Double
        var postgresAloneRowsPerSecond, serverAloneRowsPerSecond, mergeAloneRowsPerSecond: Double
        var oneRowMilliseconds: Double
        /// In-process again, with `StoreOptions.overlayBudget` at ``smallOverlayMiB``.
        var smallOverlayRowsPerSecond, smallOverlayAnonPeakMiB, smallOverlayPeakMiB: Double
        var killedAtRows: Int
        var resumedSeconds: Double
    }

    func run() async throws {
        let counts = try rows.split(separator: ",").map { s throws(ValidationError) -> Int in
            guard let n = Int(s.trimmingCharacters(in: .whitespaces)), n > 0 else { throw ValidationError("--rows takes positive counts, not '\(s)'") }
            return n
        }
        let bin = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        var all: [Figures] = []
        for n in counts {
            all.append(try await measure(rows: n, bin: bin))
            if !json { printTable(all) }
        }
        if json {
            let e = JSONEncoder()
            e.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try e.encode(all), as: UTF8.self))
        }
    }

    func measure(rows n: Int, bin: URL) async throws -> Figures {
        var c = URLComponents(string: databaseURL)!
        c.path = "/strata_sync_bench"
        let db = c.string!
        _ = try Server.run("/usr/bin/psql", [databaseURL, "-qc", "DROP DATABASE IF EXISTS strata_sync_bench WITH (FORCE)", "-c", "CREATE DATABASE strata_sync_bench"])
        let server = try Server(binary: bin.appendingPathComponent("strata-server").path, databaseURL: db, tables: tables)
        defer { server.stop() }
        log("\(n) rows: seeding")
        // Rows as the server stores them after clients pushed them (wire JSON, sorted keys).
        _ = try Server.run("/usr/bin/psql", [db, "-qc", """
            INSERT INTO strata_rows (tbl, key, fields, deleted, version)
            SELECT 'tasks', '[{"int":' || i || '}]',
              '{"done":{"bool":' || (i % 2 = 0) || '},"notes":{"string":"a note on task ' || i || '"},"priority":{"int":' || (i % 5) || '},"title":{"string":"task number ' || i || '"}}',
              false, nextval('strata_version') FROM generate_series(1, \(n)) AS i
            """, "-c", "VACUUM ANALYZE strata_rows"])
        let tokens = try Server.run(server.binary, ["token", "create", "--database-url", db, "--client-id", "phone", "--client-id", "cli", "--client-id", "other", "--client-id", "killed",
                                                "--client-id", "phone-small", "--client-id", "other-small"])
            .split(separator: "\n").map(String.init)
        guard tokens.count == 6 else { throw BenchError("token create gave \(tokens)") }
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("strata-sync-bench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }

        log("\(n) rows: PostgreSQL alone")
        let pg = try Child.run("/usr/bin/psql", [db, "-c", "COPY (SELECT tbl, key, fields, version, extract(epoch FROM updated_at) FROM strata_rows WHERE NOT deleted ORDER BY tbl, key) TO STDOUT"])
        log("\(n) rows: the server alone")
        let serverAlone = try await fetchAllPages(server.url, token: tokens[0])
        log("\(n) rows: the merge alone")
        let mergeAlone = try mergeAlone(rows: n, folder: scratch.appendingPathComponent("merge").path)

        log("\(n) rows: first sync in-process")
        var cpu = (server.cpuSeconds(), Server.postgresCPUSeconds())
        let out = scratch.appendingPathComponent("phone.json").path
        let phone = try Child.run(CommandLine.arguments[0], [
            "phone", "--server", server.url.absoluteString, "--token", tokens[0], "--other-token", tokens[2],
            "--store", scratch.appendingPathComponent("phone").path, "--page-size", String(pageSize), "--tables", tables,
        ], stdout: out)
        guard phone.status == 0, let result = try? JSONDecoder().decode(Phone.Result.self, from: Data(contentsOf: URL(fileURLWithPath: out))), result.rows == n else {
            throw BenchError("the in-process sync failed (status \(phone.status)): \((try? String(contentsOfFile: out, encoding: .utf8)) ?? "")")
        }
        let serverCPU = server.cpuSeconds() - cpu.0, postgresCPU = Server.postgresCPUSeconds() - cpu.1

        log("\(n) rows: first sync in-process, overlay budget \(smallOverlayMiB) MiB")
        let small = try Child.run(CommandLine.arguments[0], [
            "phone", "--server", server.url.absoluteString, "--token", tokens[4], "--other-token", tokens[5],
            "--store", scratch.appendingPathComponent("phone-small").path, "--page-size", String(pageSize), "--tables", tables,
            "--overlay-budget-mi-b", String(smallOverlayMiB), "--other-client", "other-small",
        ], stdout: out)
        guard small.status == 0, let smallResult = try? JSONDecoder().decode(Phone.Result.self, from: Data(contentsOf: URL(fileURLWithPath: out))), smallResult.rows == n else {
            throw BenchError("the in-process sync with a small overlay failed (status \(small.status))")
        }

        log("\(n) rows: first sync with strata sync")
        let cliStore = scratch.appendingPathComponent("cli").path
        guard try Child.run(strata, ["create", cliStore, "--tables", tables]).status == 0 else { throw BenchError("strata create failed") }
        cpu = (server.cpuSeconds(), Server.postgresCPUSeconds())
        let cli = try Child.run(strata, ["sync", cliStore, "--server", server.url.absoluteString, "--token", tokens[1]])
        guard cli.status == 0 else { throw BenchError("strata sync failed (status \(cli.status))") }

        log("\(n) rows: a first sync killed halfway, then run again")
        let killedStore = scratch.appendingPathComponent("killed").path
        _ = try Child.run(strata, ["create", killedStore, "--tables", tables])
        let start = ContinuousClock.now
        let pid = try Child.start(strata, ["sync", killedStore, "--server", server.url.absoluteString, "--token", tokens[3]])
        try await Task.sleep(for: .milliseconds(Int(cli.seconds * 500)))
        kill(pid, SIGKILL)
        _ = Child.wait(pid, since: start)
        let killedAt = try await Store(path: killedStore).read { try $0.count("tasks") }
        let resumed = try Child.run(strata, ["sync", killedStore, "--server", server.url.absoluteString, "--token", tokens[3]])
        let finalCount = try await Store(path: killedStore).read { try $0.count("tasks") }
        guard resumed.status == 0, finalCount == n else { throw BenchError("the resumed sync failed (status \(resumed.status), \(finalCount) rows)") }

        return Figures(
            rows: n,
            inProcessSeconds: result.seconds, inProcessRowsPerSecond: Double(n) / result.seconds, inProcessPeakMiB: result.syncPeakResidentMiB, inProcessAnonPeakMiB: phone.maxAnonMiB,
            inProcessCPUSeconds: phone.cpuSeconds,
            cliSeconds: cli.seconds, cliRowsPerSecond: Double(n) / cli.seconds, cliPeakMiB: cli.maxRSSMiB, cliAnonPeakMiB: cli.maxAnonMiB, cliCPUSeconds: cli.cpuSeconds,
            serverCPUSeconds: serverCPU, postgresCPUSeconds: postgresCPU,
            postgresAloneRowsPerSecond: Double(n) / pg.seconds, serverAloneRowsPerSecond: Double(n) / serverAlone, mergeAloneRowsPerSecond: Double(n) / mergeAlone,
            oneRowMilliseconds: result.oneRowMilliseconds,
            smallOverlayRowsPerSecond: Double(n) / smallResult.seconds, smallOverlayAnonPeakMiB: small.maxAnonMiB, smallOverlayPeakMiB: smallResult.syncPeakResidentMiB,
            killedAtRows: killedAt, resumedSeconds: resumed.seconds)
    }

    /// Every snapshot page fetched and thrown away: seconds.
    func fetchAllPages(_ server: URL, token: String) async throws -> Double {
        let session = URLSession(configuration: .ephemeral)
        var query = "limit=\(pageSize)"
        let start = ContinuousClock.now
        while true {
            var request = URLRequest(url: URL(string: "\(server.absoluteString)/v1/changes?\(query)")!)
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
            let (_, response) = try await session.data(for: request)
            guard let http = response as? HTTPURLResponse, http.statusCode == 200 else { throw BenchError("a page failed: \(response)") }
            guard http.value(forHTTPHeaderField: "Strata-More") == "true", let until = http.value(forHTTPHeaderField: "Strata-Until"),
                  let after = http.value(forHTTPHeaderField: "Strata-After") else { break }
            query = "limit=\(pageSize)&until=\(until)&after=\(after)"
        }
        return (ContinuousClock.now - start) / .seconds(1)
    }

    /// The same rows merged into a new store from deltas in memory, page by page: seconds.
    func mergeAlone(rows n: Int, folder: String) throws -> Double {
        let store = try Store(path: folder)
        try TablesFile(contentsOf: URL(fileURLWithPath: tables)).createTables(in: store)
        let sync = SyncClient(store: store)
        var total: Duration = .zero
        for first in stride(from: 1, through: n, by: pageSize) {
            let rows = (first..<min(first + pageSize, n + 1)).map { (i: Int) -> ServerRow in
                var fields: [String: Value] = ["id": .int(Int64(i)), "title": .string("task number \(i)")]
                fields["priority"] = .int(Int64(i % 5))
                fields["done"] = .bool(i % 2 == 0)
                fields["notes"] = .string("a note on task \(i)")
                return ServerRow(fields, version: String(i), timestamp: Date(timeIntervalSince1970: 1_700_000_000))
            }
            let page = ServerDelta(anchor: String(first), tables: [TableDelta("tasks", upserts: rows)])
            let t0 = ContinuousClock.now
            try sync.merge(page)
            total += ContinuousClock.now - t0
        }
        return total / .seconds(1)
    }

    func log(_ s: String) { FileHandle.standardError.write(Data("\(s)\n".utf8)) }

    func printTable(_ all: [Figures]) {
        print("\nFirst sync of N rows from strata-server on PostgreSQL, all on this machine (\(ProcessInfo.processInfo.activeProcessorCount) cores):")
        print("| rows | in-process rows/s | peak anon / resident MiB | phone CPU s | `strata sync` rows/s | peak anon / resident MiB | server CPU s | PostgreSQL CPU s | 1 row after N | killed at, resumed in |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for f in all {
            print(String(format: "| %d | %.0f | %.1f / %.1f | %.1f | %.0f | %.1f / %.1f | %.1f | %.1f | %.1f ms | %d rows, %.1f s |", f.rows, f.inProcessRowsPerSecond, f.inProcessAnonPeakMiB, f.inProcessPeakMiB,
                         f.inProcessCPUSeconds, f.cliRowsPerSecond, f.cliAnonPeakMiB, f.cliPeakMiB, f.serverCPUSeconds, f.postgresCPUSeconds, f.oneRowMilliseconds, f.killedAtRows, f.resumedSeconds))
        }
        print("\nIn-process again, with StoreOptions.overlayBudget at \(smallOverlayMiB) MiB (the default: \(StoreOptions().overlayBudget >> 20) MiB):")
        print("| rows | rows/s | peak anon / resident MiB |")
        print("|---:|---:|---:|")
        for f in all {
            print(String(format: "| %d | %.0f | %.1f / %.1f |", f.rows, f.smallOverlayRowsPerSecond, f.smallOverlayAnonPeakMiB, f.smallOverlayPeakMiB))
        }
        print("\nThe limits, same run (rows/s):")
        print("| rows | PostgreSQL alone (COPY) | the server alone (pages fetched, discarded) | the merge alone | in-process sync / server alone |")
        print("|---:|---:|---:|---:|---:|")
        for f in all {
            print(String(format: "| %d | %.0f | %.0f | %.0f | %.2f× |", f.rows, f.postgresAloneRowsPerSecond, f.serverAloneRowsPerSecond, f.mergeAloneRowsPerSecond, f.inProcessRowsPerSecond / f.serverAloneRowsPerSecond))
        }
    }
}

/// The merge alone, in a process of its own (for a profiler): N rows merged page by page into a
/// new store.
struct MergeAlone: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "merge-alone", abstract: "(internal) Merge N rows into a new store, page by page.", shouldDisplay: false)
    @Option var rows = 100_000
    @Option var pageSize = 1000
    @Option var tables = "Server/Examples/tables.json"
    @Option var store: String

    func run() async throws {
        var r = try Run.parse(["--page-size", String(pageSize), "--tables", tables])
        r.json = true
        let seconds = try r.mergeAlone(rows: rows, folder: store)
        print(String(format: "%d rows in %.2f s: %.0f rows/s", rows, seconds, Double(rows) / seconds))
    }
}

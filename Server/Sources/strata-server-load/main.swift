import ArgumentParser
import BenchSupport
import Foundation
import Strata
import StrataSync

/// The load benchmark (not a test): many clients push batches of changed rows to one
/// `strata-server` and pull, through `HTTPSyncTransport`, for a while; it reports the rows the
/// server applied per second and the latency of pushes and pulls, with the CPU each process used
/// and PostgreSQL's own counters, to show what limits the rate.
@main
struct LoadCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "strata-server-load",
        abstract: "Load-test strata-server: N clients push batches of changed rows and pull.",
        discussion: """
            Starts the strata-server built next to this program on a free loopback port, on the given \
            database (use an empty one: it gets the load's rows), and makes one token per client.
            Example:
              strata-server-load --database-url postgres://postgres@127.0.0.1:5432/strata_load --clients 50 --seconds 20
            """
    )

    @Option(help: "PostgreSQL URL of the database the server uses.") var databaseURL: String
    @Option(help: "The tables file.") var tables = "Server/Examples/tables.json"
    @Option(help: "Concurrent clients.") var clients = 50
    @Option(help: "Changed rows per batch.") var rows = 100
    @Option(help: "Seconds of load after the warm-up.") var seconds = 20.0
    @Option(help: ArgumentHelp(
        "Pull after every Nth push; 0 never pulls.",
        discussion: "Each pull returns every row the other clients changed since, so pulls serve about `clients` times the rows pushed; 0 measures the push path alone."))
    var pullEvery = 1
    @Flag(help: "Print JSON.") var json = false

    struct Result: Encodable {
        var clients, rowsPerBatch, pullEvery: Int
        var seconds: Double
        var rowsApplied, rowsPulled, pushes, pulls, conflicts, errors: Int
        var rowsPerSecond: Double
        var pushP50ms, pushP99ms, pullP50ms, pullP99ms: Double
        var cpuSecondsServer, cpuSecondsPostgres, cpuSecondsLoad: Double
        var postgres: [String: Int64]
    }

    /// What one client saw.
    struct Tally: Sendable {
        var applied = 0, pulled = 0, conflicts = 0, errors = 0
        var push: [Double] = [], pull: [Double] = []
    }

    func run() async throws {
        #if canImport(Glibc)
        // The clients stand for phones, each with a heap of its own. Sharing this process's
        // glibc heap, they had it trimmed back to the system after nearly every pulled page and
        // faulted in again for the next: about a sixth of their CPU (`perf`, 2026-11-28), taken
        // from the server they share the machine with. Fixed thresholds keep the heap; the
        // server runs with glibc's defaults.
        _ = mallopt(-1, 64 << 20)   // M_TRIM_THRESHOLD: trim only past 64 MiB free
        _ = mallopt(-3, 32 << 20)   // M_MMAP_THRESHOLD: a fixed one, so the trim threshold stays
        #endif
        let bin = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        let server = try Server(binary: bin.appendingPathComponent("strata-server").path, databaseURL: databaseURL, tables: tables)
        defer { server.stop() }
        let ids = (0..<clients).map { "load-\($0)-\(UUID().uuidString.prefix(6))" }
        let tokenRun = try Server.run(server.binary, ["token", "create", "--database-url", databaseURL] + ids.flatMap { ["--client-id", $0] })
        let tokens = tokenRun.split(separator: "\n").map(String.init)
        guard tokens.count == clients else { throw ValidationError("token create gave \(tokens.count) tokens for \(clients) clients") }

        let pgBefore = postgresCounters()
        let cpuBefore = (server.cpuSeconds(), Server.postgresCPUSeconds(), Server.ownCPUSeconds())
        let start = ContinuousClock.now
        let deadline = start + .milliseconds(Int(seconds * 1000))
        let rows = self.rows, pullEvery = self.pullEvery
        guard pullEvery >= 0 else { throw ValidationError("--pull-every must be 0 or more") }
        let tallies = try await withThrowingTaskGroup(of: Tally.self) { group in
            for (i, (id, token)) in zip(ids, tokens).enumerated() {
                group.addTask {
                    try await Self.client(index: i, id: id, token: token, server: server.url, rows: rows, pullEvery: pullEvery, until: deadline)
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let elapsed = (ContinuousClock.now - start) / .seconds(1)
        let cpu = (server.cpuSeconds() - cpuBefore.0, Server.postgresCPUSeconds() - cpuBefore.1, Server.ownCPUSeconds() - cpuBefore.2)
        let pgAfter = postgresCounters()

        func pct(_ xs: [Double], _ p: Double) -> Double {
            let s = xs.sorted()
            return s.isEmpty ? 0 : s[min(s.count - 1, Int(Double(s.count) * p))] * 1000
        }
        let push = tallies.flatMap(\.push), pull = tallies.flatMap(\.pull)
        let applied = tallies.reduce(0) { $0 + $1.applied }
        let result = Result(
            clients: clients, rowsPerBatch: rows, pullEvery: pullEvery, seconds: elapsed, rowsApplied: applied, rowsPulled: tallies.reduce(0) { $0 + $1.pulled }, pushes: push.count, pulls: pull.count,
            conflicts: tallies.reduce(0) { $0 + $1.conflicts }, errors: tallies.reduce(0) { $0 + $1.errors },
            rowsPerSecond: Double(applied) / elapsed,
            pushP50ms: pct(push, 0.5), pushP99ms: pct(push, 0.99), pullP50ms: pct(pull, 0.5), pullP99ms: pct(pull, 0.99),
            cpuSecondsServer: cpu.0, cpuSecondsPostgres: cpu.1, cpuSecondsLoad: cpu.2,
            postgres: pgAfter.merging(pgBefore) { $0 - $1 })
        if json {
            let e = JSONEncoder()
            e.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try e.encode(result), as: UTF8.self))
        } else {
            print(String(format: "%d clients, %d rows a batch, a pull every %d pushes, %.1f s: %d rows applied, %.0f rows/s", clients, rows, pullEvery, elapsed, applied, result.rowsPerSecond))
            print(String(format: "push: %d, p50 %.1f ms, p99 %.1f ms; pull: %d (%d rows), p50 %.1f ms, p99 %.1f ms", push.count, result.pushP50ms, result.pushP99ms, pull.count, result.rowsPulled, result.pullP50ms, result.pullP99ms))
            print("conflicts \(result.conflicts), errors \(result.errors)")
            print(String(format: "CPU seconds: server %.1f, postgres %.1f, load clients %.1f (of %.1f wall × %d cores)", cpu.0, cpu.1, cpu.2, elapsed, ProcessInfo.processInfo.activeProcessorCount))
            print("postgres: " + result.postgres.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        }
    }

    /// One client: a first batch inserts its rows, each later batch updates all of them (naming
    /// the values it last sent as originals); after every `pullEvery`th push it pulls what
    /// changed since.
    static func client(index: Int, id: String, token: String, server: URL, rows: Int, pullEvery: Int, until deadline: ContinuousClock.Instant) async throws -> Tally {
        let transport = HTTPSyncTransport(server: server, token: token, timeout: 60, pageSize: 5000)
        var tally = Tally()
        var anchor = try await transport.pull(since: nil).anchor
        var number: UInt64 = 0
        let keys = (0..<rows).map { Int64(index * 1_000_000 + $0) }
        while ContinuousClock.now < deadline {
            number += 1
            let changes: [RowChange] = keys.map { k in
                number == 1
                    ? RowChange(table: "tasks", key: RowKey(.int(k)), kind: .insert, values: ["id": .int(k), "title": "v1", "priority": .int(Int64(index))])
                    : RowChange(table: "tasks", key: RowKey(.int(k)), kind: .update, values: ["title": .string("v\(number)")], originals: ["title": .string("v\(number - 1)")])
            }
            let batch = Batch(id: "\(id)-\(number)", clientID: id, number: number, changes: changes)
            do {
                let t0 = ContinuousClock.now
                let ack = try await transport.push(batch)
                tally.push.append((ContinuousClock.now - t0) / .seconds(1))
                tally.applied += ack.results.filter { $0.status == .ok }.count
                tally.conflicts += ack.results.filter { $0.status == .conflict }.count
                if pullEvery > 0 && number % UInt64(pullEvery) == 0 {
                    let t1 = ContinuousClock.now
                    let delta = try await transport.pull(since: anchor)
                    anchor = delta.anchor
                    tally.pulled += delta.tables.reduce(0) { $0 + $1.upserts.count + $1.deletes.count }
                    tally.pull.append((ContinuousClock.now - t1) / .seconds(1))
                }
            } catch {
                tally.errors += 1
                FileHandle.standardError.write(Data("\(id): \(error)\n".utf8))
                if tally.errors > 20 { break }
            }
        }
        return tally
    }

    /// PostgreSQL's counters for the database (pg_stat_database), through psql.
    func postgresCounters() -> [String: Int64] {
        let names = ["xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "blks_read", "blks_hit", "deadlocks"]
        guard let out = try? Server.run("/usr/bin/psql", [databaseURL, "-tA", "-F", " ", "-c",
            "SELECT \(names.joined(separator: ", ")) FROM pg_stat_database WHERE datname = current_database()"]) else { return [:] }
        let values = out.split(whereSeparator: { $0 == " " || $0 == "\n" }).compactMap { Int64($0) }
        return values.count == names.count ? Dictionary(uniqueKeysWithValues: zip(names, values)) : [:]
    }
}

#if canImport(Glibc)
/// glibc's `mallopt` (`malloc.h`), which Swift's Glibc module does not declare.
@_silgen_name("mallopt") private func mallopt(_ parameter: Int32, _ value: Int32) -> Int32
#endif

import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Strata
import StrataSync
import Testing

/// The PostgreSQL that the tests use, from `STRATA_TEST_PG_URL` (`.ci/run` sets it, after
/// `Server/Scripts/start-postgres.sh`): postgres://postgres@127.0.0.1:5432/strata.
let pgURL = ProcessInfo.processInfo.environment["STRATA_TEST_PG_URL"]
let pgAvailable = pgURL != nil

/// A folder next to the test binary, where the build put `strata-server`.
func productsFolder() -> URL {
    var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    while dir.pathExtension == "xctest" || dir.lastPathComponent == "MacOS" || dir.lastPathComponent == "Contents" {
        dir.deleteLastPathComponent()
    }
    return dir
}

let tablesFile: String = {
    // Server/Tests/StrataServerTests/Support.swift → Server/Examples/tables.json
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Examples/tables.json").path
}()

/// Runs a program to completion; returns its status and output.
@discardableResult
func run(_ path: String, _ arguments: [String], environment: [String: String] = [:]) throws -> (status: Int32, out: String, err: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = arguments
    p.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    let out = Pipe(), err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    let o = out.fileHandleForReading.readDataToEndOfFile()
    let e = err.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
}

/// A database of its own for one test, dropped afterwards.
final class TestDatabase: @unchecked Sendable {   // immutable after init
    let name: String
    let url: String
    private let admin: String

    init(admin: String = pgURL!) throws {
        self.admin = admin
        name = "strata_test_\(UUID().uuidString.prefix(8).lowercased())"
        var c = URLComponents(string: admin)!
        c.path = "/\(name)"
        url = c.string!
        try psql(admin, "CREATE DATABASE \(name)")
    }

    deinit { _ = try? psql(admin, "DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }

    /// Runs SQL; returns the rows, one line each, columns separated by `|`.
    @discardableResult
    func sql(_ statement: String) throws -> String { try psql(url, statement) }

    /// Everything the server stores about rows and batches, to compare before and after.
    func state() throws -> String {
        try sql("SELECT tbl, key, fields, deleted, version FROM strata_rows ORDER BY tbl, key")
            + (try sql("SELECT id, client_id, ack FROM strata_batches ORDER BY id"))
            + (try sql("SELECT last_value FROM strata_version"))
    }

    func token(for clientID: String) throws -> String {
        let r = try run(productsFolder().appendingPathComponent("strata-server").path, ["token", "create", "--database-url", url, "--client-id", clientID])
        guard r.status == 0 else { throw TestFailure("token create failed: \(r.err)") }
        return r.out.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

@discardableResult
func psql(_ url: String, _ statement: String) throws -> String {
    // A test that restarts PostgreSQL may find it down for a moment: wait (bounded).
    for _ in 0..<100 {
        let r = try run("/usr/bin/psql", [url, "-v", "ON_ERROR_STOP=1", "-tA", "-c", statement])
        if r.status == 0 { return r.out }
        guard r.err.contains("connection to server") else { throw TestFailure("psql failed: \(r.err)") }
        Thread.sleep(forTimeInterval: 0.1)
    }
    throw TestFailure("PostgreSQL at \(url) stayed unreachable")
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// A `strata-server` process on a free loopback port, killed when the test is done with it.
///
/// Killed when released: a test keeps it (and its `TestDatabase`, dropped when released) alive
/// with `withExtendedLifetime` to its end, since an optimized build may release an object right
/// after its last use — a request still to be made to `server.url` would find no server.
final class ServerProcess: @unchecked Sendable {   // used by one task at a time
    private(set) var process = Process()
    private let environment: [String: String]
    private let extra: [String]
    private let tables: String
    private(set) var port = 0
    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }
    let database: TestDatabase

    init(_ database: TestDatabase, port: Int = 0, tables: String = tablesFile, arguments: [String] = [], environment: [String: String] = [:]) throws {
        self.database = database
        self.environment = environment
        self.extra = arguments
        self.tables = tables
        try start(port: port)
    }

    private func start(port: Int) throws {
        process = Process()
        process.executableURL = productsFolder().appendingPathComponent("strata-server")
        process.arguments = ["--database-url", database.url, "--tables", tables, "--port", String(port)] + extra
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.standardError
        try process.run()
        // Wait (bounded) for the line that names the port.
        var seen = Data()
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            let chunk = out.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            seen += chunk
            let text = String(decoding: seen, as: UTF8.self)
            if let r = text.range(of: "listening on http://127.0.0.1:"), let line = text[r.upperBound...].split(separator: "\n").first, let p = Int(line) {
                self.port = p
                return
            }
        }
        process.terminate()
        throw TestFailure("strata-server did not start: \(String(decoding: seen, as: UTF8.self))")
    }

    /// Starts it again on the same port.
    func restart() throws {
        kill()
        var last: (any Error)?
        // The port may take a moment to be free again.
        for _ in 0..<20 {
            do { return try start(port: port) } catch { last = error; Thread.sleep(forTimeInterval: 0.1) }
        }
        throw last!
    }

    /// SIGKILL: no chance to finish anything.
    func kill() {
        guard process.isRunning else { return }
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    deinit { kill() }
}

/// A transport that records every batch and its acknowledgement, to build the model of what
/// the server accepted.
final class RecordingTransport: SyncTransport, @unchecked Sendable {   // `log` is behind the lock
    let inner: any SyncTransport
    private let lock = NSLock()
    private var log: [(Batch, BatchAck)] = []

    init(_ inner: any SyncTransport) { self.inner = inner }

    func pull(since anchor: String?) async throws -> ServerDelta { try await inner.pull(since: anchor) }

    func push(_ batch: Batch) async throws -> BatchAck {
        let ack = try await inner.push(batch)
        lock.withLock { log.append((batch, ack)) }
        return ack
    }

    func take() -> [(Batch, BatchAck)] { lock.withLock { defer { log = [] }; return log } }
}

let tasks = TableSchema.fixed("tasks", primaryKey: ["id"], fields: [
    .int("id"), .string("title"), .int("priority", default: 0), .bool("done", default: false), .string("notes", nullable: true),
])

/// A new store with the `tasks` table, in a temporary folder removed by `cleanup`.
func makeStore() throws -> (Store, String) {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-server-test-\(UUID().uuidString)").path
    var options = StoreOptions()
    options.durability = .noSync
    let store = try Store(path: path, options: options)
    try store.createTable(tasks)
    // A client holds every table the server serves (Examples/tables.json).
    try store.createTable(.fixed("comments", primaryKey: ["id"], fields: [.int("id"), .int("task"), .string("text")]))
    try store.createTable(.propertyBag("settings", key: [.string("name")]))
    return (store, path)
}

/// A small deterministic generator (SplitMix64), seeded from `STRATA_SEED` or at random, with
/// the seed printed so that a failure can be replayed.
struct Random {
    var state: UInt64
    init(_ name: String) {
        let seed = ProcessInfo.processInfo.environment["STRATA_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
        print("\(name): seed \(seed) (replay with STRATA_SEED=\(seed))")
        state = seed
    }
    /// A generator from a given seed (one trial of a run), printing nothing.
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}

/// The key field of each table the convergence tests edit.
let keyField = ["tasks": "id", "settings": "name"]

/// Keys of `settings` that Swift's `==` calls equal in twos and threes but whose bytes differ (NFC
/// and NFD forms, and U+212B ANGSTROM SIGN beside U+00C5): each is its own row everywhere.
let settingKeys: [String] = ["\u{e9}", "e\u{301}", "\u{f1}", "n\u{303}", "\u{c5}", "A\u{30a}", "\u{212b}", "a"]

/// A row of a table, keyed by its key's bytes (`RowKey` compares them).
struct RowID: Hashable {
    let table: String
    let key: RowKey
}

/// A string as its UTF-8 bytes: the oracles key on these, since `String`'s `==` would take two
/// keys that differ only in Unicode form for one row.
func utf8(_ s: String) -> [UInt8] { Array(s.utf8) }

/// The server's rows of `tasks` and `settings`, through a snapshot pull: the bytes of "table key
/// sorted-fields" lines, sorted.
func serverRows(_ server: URL, token: String) async throws -> [[UInt8]] {
    let delta = try await HTTPSyncTransport(server: server, token: token, pageSize: 7).pull(since: nil)
    return delta.tables.filter { keyField[$0.table] != nil }.flatMap { table in
        let k = keyField[table.table]!
        return table.upserts.map { row in
            utf8("\(table.table) \(RowKey([row.fields[k]!])) \(row.fields.filter { $0.key != k && !$0.value.isNull }.sorted { $0.key < $1.key })")
        }
    }.sorted { $0.lexicographicallyPrecedes($1) }
}

/// A store's rows of `tasks` and `settings` in the same form.
func storeRows(_ store: Store) throws -> [[UInt8]] {
    try store.read { snap in try snap.rows("tasks") + snap.rows("settings") }.map { row in
        utf8("\(row.table) \(row.key) \(row.values.filter { !row.keyFieldNames.contains($0.key) && !$0.value.isNull }.sorted { $0.key < $1.key })")
    }.sorted { $0.lexicographicallyPrecedes($1) }
}

/// Lines of ``serverRows(_:token:)`` as text, for a failure's message.
func text(_ lines: [[UInt8]]) -> [String] { lines.map { String(decoding: $0, as: UTF8.self).debugDescription } }

/// Sends one raw request; returns the status and the body.
func request(_ method: String, _ url: URL, token: String?, body: Data? = nil) async throws -> (status: Int, body: String) {
    var r = URLRequest(url: url)
    r.httpMethod = method
    r.httpBody = body
    if let token { r.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
    let (data, response) = try await URLSession.shared.data(for: r)
    return ((response as! HTTPURLResponse).statusCode, String(decoding: data, as: UTF8.self))
}

/// Whether, and how often, ``DroppingTransport`` loses responses.
final class DropSwitch: @unchecked Sendable {   // guarded by `lock`
    private let lock = NSLock()
    private var _enabled = true
    private var _dropped = 0
    private var state: UInt64 = 1
    var enabled: Bool {
        get { lock.withLock { _enabled } }
        set { lock.withLock { _enabled = newValue } }
    }
    var seed: UInt64 {
        get { lock.withLock { state } }
        set { lock.withLock { state = newValue } }
    }
    var dropped: Int { lock.withLock { _dropped } }
    /// One draw in four drops, while enabled.
    func drop() -> Bool {
        lock.withLock {
            guard _enabled else { return false }
            state = state &* 6364136223846793005 &+ 1442695040888963407
            let hit = (state >> 33) % 4 == 0
            if hit { _dropped += 1 }
            return hit
        }
    }
}

/// Loses responses after the server handled the request: the test hook for "the response was
/// dropped after the server committed".
struct DroppingTransport: SyncTransport {
    let inner: HTTPSyncTransport
    let drops: DropSwitch
    init(_ inner: HTTPSyncTransport, _ drops: DropSwitch) {
        self.inner = inner
        self.drops = drops
    }
    func pull(since anchor: String?) async throws -> ServerDelta {
        let delta = try await inner.pull(since: anchor)
        if drops.drop() { throw StrataError(.io, "test: the response to the pull was lost") }
        return delta
    }
    func push(_ batch: Batch) async throws -> BatchAck {
        let ack = try await inner.push(batch)
        if drops.drop() { throw StrataError(.io, "test: the acknowledgement of \(batch.id) was lost") }
        return ack
    }
}

/// A PostgreSQL cluster of the test's own (so that restarting it disturbs no other test), started
/// with `Scripts/start-postgres.sh` on a free port and removed afterwards.
final class PostgresCluster: @unchecked Sendable {   // immutable after init
    let dir: String
    let port: Int
    var url: String { "postgres://postgres@127.0.0.1:\(port)/strata" }
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Scripts/start-postgres.sh").path

    init() throws {
        dir = "/tmp/strata-pg-test-\(UUID().uuidString.prefix(8))"
        port = 20000 + Int.random(in: 0..<20000)
        try Self.detached("STRATA_PG_DIR=\(dir) STRATA_PG_PORT=\(port) bash \(Self.script)")
    }

    /// Runs a shell command whose output goes to a file, with no descriptor for the postgres it
    /// starts to inherit.
    private static func detached(_ command: String) throws {
        let log = "/tmp/strata-pg-test-\(UUID().uuidString.prefix(8)).log"
        defer { try? FileManager.default.removeItem(atPath: log) }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/bash")
        // Foundation's Process learns of the exit through a descriptor the child inherits; a
        // daemon that kept it would make waitUntilExit wait for ever, so close all but 0-2.
        p.arguments = ["-c", "for fd in $(ls /proc/$$/fd); do [ \"$fd\" -gt 2 ] && eval \"exec $fd>&-\"; done; (\(command)) >\(log) 2>&1"]
        try p.run()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else {
            throw TestFailure("\(command) failed: \((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")")
        }
    }

    private func pgctl(_ args: String) throws {
        try Self.detached("su postgres -s /bin/bash -c '$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)/pg_ctl -D \(dir) -w \(args)'")
    }

    /// A fast restart: every connection is cut.
    func restart() throws { try pgctl("-m fast restart") }

    deinit {
        try? pgctl("-m immediate stop")
        try? FileManager.default.removeItem(atPath: dir)
    }
}

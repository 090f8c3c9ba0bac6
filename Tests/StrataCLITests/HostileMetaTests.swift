import Foundation
import Synchronization
import LMDB
@testable import Strata
import StrataSync
import Testing

/// Runs `strata` and reports whether it died of a signal (a trap, SIGBUS, SIGSEGV, an abort).
func runStrataWatchingSignals(_ arguments: [String]) throws -> (signal: Int32?, status: Int32, err: String) {
    let r = try runProcess(try strataExecutable(), arguments, keepingOutput: false)
    return (r.signal, r.status, r.err)
}

/// Stores whose `meta` counters hold hostile values: every CLI command and the main public API
/// must give an answer or a clear error, never a trap ("arithmetic overflow", "Not enough bits").
@Suite struct HostileMetaTests {
    static func be(_ v: UInt64) -> [UInt8] { withUnsafeBytes(of: v.bigEndian) { Array($0) } }

    /// The hostile values every entry gets in turn.
    static let values: [(name: String, bytes: [UInt8])] = [
        ("0", be(0)), ("1", be(1)), ("2^63", be(1 << 63)), ("2^64-1", be(.max)),
        ("no bytes", []), ("3 bytes", [1, 2, 3]), ("9 bytes", be(.max) + [0xFF]),
    ]

    @Test func everyCommandAndTheAPISurviveHostileMetaEntries() throws {
        try withPreparedStore { path, store in
            // Give the store every kind of meta entry: a horizon, a log pin, batch state.
            _ = try store.compact()
            let sync = SyncClient(store: store, policy: .deferred)
            _ = try sync.nextBatch()
            let keys: [[UInt8]] = try store.env.read { txn in
                var keys: [[UInt8]] = []
                try txn.withCursor(store.databases.meta) { c in
                    var e = try c.first()
                    while let entry = e { keys.append(Array(entry.key)); e = try c.next() }
                }
                return keys
            }
            let names = Set(keys.map { String(decoding: $0, as: UTF8.self) })
            for expected in ["format", "catalog", "catalogVersion", "lastTxn", "clientID", "horizon"] {
                #expect(names.contains(expected), "the prepared store has no meta entry \(expected)")
            }
            #expect(names.contains { $0.hasPrefix("pin:") } && names.contains { $0.hasPrefix("p:") })

            let delta = path + "-delta.json"
            try WireFormat.encode(ServerDelta(anchor: "a9", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 4, "title": "s"])])]))
                .write(to: URL(fileURLWithPath: delta))
            let briefcase = path + ".briefcase"
            #expect(try runStrata(["export", path, briefcase]).status == 0)
            defer { for p in [delta, briefcase] { try? FileManager.default.removeItem(atPath: p) } }

            // Under a sanitizer (`.ci/sanitizers`) each child process is several times slower,
            // and this test alone took over five minutes: `STRATA_HOSTILE_VALUES=n` gives each
            // entry n of the values, starting one further along for each entry, so that every
            // value still meets some entry. The plain run gives every entry every value.
            let perEntry = ProcessInfo.processInfo.environment["STRATA_HOSTILE_VALUES"].flatMap(Int.init).map { min(max($0, 1), Self.values.count) } ?? Self.values.count
            var cases: [(key: [UInt8], value: (name: String, bytes: [UInt8]))] = []
            for (k, key) in keys.enumerated() {
                for j in 0..<perEntry { cases.append((key, Self.values[(k + j) % Self.values.count])) }
                if key.starts(with: Array("p:".utf8)) {
                    // Properties hold encoded values: the extremes of an int too.
                    cases.append((key, ("int max", Value.int(.max).encoded)))
                    cases.append((key, ("int min", Value.int(.min).encoded)))
                }
            }
            let allCases = cases
            print("HostileMetaTests: \(keys.count) meta entries, \(cases.count) stores")
            let failures = Locked<[String]>([])
            DispatchQueue.concurrentPerform(iterations: allCases.count) { i in
                let (key, value) = allCases[i]
                let label = "meta \(String(decoding: key, as: UTF8.self)) = \(value.name)"
                do {
                    let problems = try Self.run(case: key, value.bytes, from: store, delta: delta, briefcase: briefcase)
                    if !problems.isEmpty { failures.withLock { $0.append("\(label): \(problems.joined(separator: "; "))") } }
                } catch {
                    failures.withLock { $0.append("\(label): setting up failed: \(error)") }
                }
            }
            let all = failures.withLock { $0 }
            #expect(all.isEmpty, "\(all.count) failures:\n\(all.prefix(40).joined(separator: "\n"))")
        }
    }

    /// Sets `key` to `bytes` in a copy of `store`, then runs every command and the API on it.
    /// Returns what died of a signal.
    static func run(case key: [UInt8], _ bytes: [UInt8], from store: Store, delta: String, briefcase: String) throws -> [String] {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("strata-hostile-\(UUID().uuidString)").path
        defer { for p in [dir, dir + "-replay", dir + "-copy", dir + "-out.briefcase"] { try? FileManager.default.removeItem(atPath: p) } }
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try store.copy(to: dir, compact: false)
        do {
            let env = try Environment(path: dir)
            let meta = try env.openDatabase("meta", create: false)
            try env.write { try $0.put(key, bytes, in: meta) }
        }
        var problems: [String] = []
        var errors = ""
        let commands: [[String]] = [
            ["info", dir], ["info", dir, "--json"], ["show", dir, "tasks"], ["show", dir, "tasks", "--as-of", "9"],
            ["log", dir], ["history", dir, "tasks", "1"], ["pending", dir], ["conflicts", dir],
            ["merge", dir, delta, "--dry-run"], ["merge", dir, delta], ["compact", dir], ["rebuild", dir], ["verify", dir],
            ["replay", dir, dir + "-replay", "--until", "10"], ["export", dir, dir + "-out.briefcase"],
            ["import", dir, briefcase], ["copy", dir, dir + "-copy"], ["compact", dir, "--reclaim"],
        ]
        for arguments in commands {
            let r = try runStrataWatchingSignals(arguments)
            errors += r.err
            if let signal = r.signal {
                problems.append("`strata \(arguments[0]) \(arguments.dropFirst(2).joined(separator: " "))` died of signal \(signal): \(r.err.split(separator: "\n").prefix(3).joined(separator: " | "))")
            }
        }
        // A counter out of range, or of the wrong length, is reported naming its entry.
        let name = String(decoding: key, as: UTF8.self)
        if ["horizon", "lastTxn", "catalogVersion"].contains(name), bytes.count != 8 || bytes[0] >= 0x80 {
            if !errors.contains("meta entry '\(name)'") { problems.append("no command named the damaged entry: \(errors.prefix(300))") }
        }
        // The public API, in this process: a trap here ends the test run, which fails it too.
        exerciseAPI(dir, delta: delta)
        return problems
    }

    /// Calls the main public API on the store at `path`; errors are fine, traps are not.
    static func exerciseAPI(_ path: String, delta: String) {
        var options = StoreOptions()
        options.createIfMissing = false
        guard let store = try? Store(path: path, options: options) else { return }
        _ = try? store.read { s in
            _ = try? s.lastLSN
            _ = try? s.horizon
            _ = try? s.logPins
            _ = try? s.rows("tasks")
            _ = try? s.pendingRows()
            _ = try? s.operations()
            _ = try? s.history("tasks", key: 1)
            _ = try? s.row("tasks", key: 1, asOf: 9)
            _ = try? s.property(SyncClient.anchorProperty)
        }
        _ = try? store.write { tx in try tx.insert("tasks", ["id": 99, "title": "x"]) }
        _ = try? store.write { tx in try tx.update("tasks", key: 1, ["title": "y"]) }
        _ = try? store.createTable(.fixed("more", fields: [.int("id")]))
        _ = try? store.verify()
        _ = try? store.rebuild()
        _ = try? store.compact()
        _ = try? store.read { try $0.blame("tasks", key: 1) }
        let sync = SyncClient(store: store, policy: .serverWins)
        _ = try? sync.anchor()
        _ = try? sync.conflicts()
        _ = try? sync.pendingChanges()
        _ = try? sync.inFlightBatch()
        _ = try? sync.nextBatch()
        if let data = FileManager.default.contents(atPath: delta), let d = try? WireFormat.decode(ServerDelta.self, from: data) {
            _ = try? sync.merge(d)
        }
        _ = try? store.replay(into: path + "-replay", through: 10)
    }
}

import Foundation
import Strata
import StrataSync
import Testing

/// Five stores edit offline and sync in random order through a real `strata-server` on a real
/// PostgreSQL; everything must converge and nothing may be lost.
@Suite(.serialized, .enabled(if: pgAvailable, "set STRATA_TEST_PG_URL (see Server/Scripts/start-postgres.sh)"))
struct EndToEndTests {
    final class Client {
        let id: Int
        let store: Store
        let path: String
        let sync: SyncClient
        let transport: RecordingTransport
        init(id: Int, store: Store, path: String, policy: ConflictPolicy, server: URL, token: String, drops: DropSwitch?) {
            self.id = id
            self.store = store
            self.path = path
            sync = SyncClient(store: store, policy: policy)
            let http = HTTPSyncTransport(server: server, token: token, timeout: 10, pageSize: 5)
            transport = RecordingTransport(drops.map { DroppingTransport(http, $0) } ?? http)
        }
    }

    /// Every batch the clients got an acknowledgement for; applied in the order the server
    /// committed them, it must give the server's rows.
    struct Model {
        var records: [String: (Batch, BatchAck)] = [:]

        /// Records acknowledgements; returns what they accepted, as the bytes of "table key field
        /// value" and "table key <delete>" (bytes: two keys that differ only in Unicode form are
        /// two rows).
        mutating func record(_ log: [(Batch, BatchAck)]) -> Set<[UInt8]> {
            var accepted = Set<[UInt8]>()
            for (batch, ack) in log {
                records[batch.id] = (batch, ack)
                for (change, result) in zip(batch.changes, ack.results) where result.status == .ok {
                    if change.kind == .delete { accepted.insert(utf8("\(change.table) \(change.key) <delete>")) }
                    for (f, v) in change.values where f != keyField[change.table] { accepted.insert(utf8("\(change.table) \(change.key) \(f) \(v)")) }
                }
            }
            return accepted
        }

        /// The rows of `tasks` and `settings` after applying the accepted changes in the server's
        /// commit order, as ``serverRows(_:token:)`` gives them.
        func lines(_ db: TestDatabase) throws -> [[UInt8]] {
            var rows: [RowID: [String: Value]] = [:]
            let order = try db.sql("SELECT id FROM strata_batches WHERE seq IS NOT NULL ORDER BY seq").split(separator: "\n").map(String.init)
            for id in order {
                guard let (batch, ack) = records[id] else { continue }   // asserted elsewhere
                for (change, result) in zip(batch.changes, ack.results) where result.status == .ok && keyField[change.table] != nil {
                    let key = RowID(table: change.table, key: change.key)
                    switch change.kind {
                    case .insert:
                        var row: [String: Value] = change.table == "tasks" ? ["priority": 0, "done": false] : [:]
                        for (f, v) in change.values where f != keyField[change.table] { row[f] = v }
                        rows[key] = row.filter { !$0.value.isNull }
                    case .update:
                        for (f, v) in change.values {
                            if v.isNull { rows[key]?.removeValue(forKey: f) } else { rows[key]?[f] = v }
                        }
                    case .delete:
                        rows[key] = nil
                    }
                }
            }
            return rows.map { id, fields in utf8("\(id.table) \(id.key) \(fields.sorted { $0.key < $1.key })") }.sorted { $0.lexicographicallyPrecedes($1) }
        }
    }

    /// Half the edits go to `tasks` (int keys), half to the property bag `settings`, whose keys
    /// include Unicode twins (`settingKeys`).
    static func randomEdit(_ c: Client, _ g: inout Random) throws {
        let titles: [Value] = ["a", "b", "c", "d"]
        if g.below(2) == 0 {
            let key = RowKey(.string(settingKeys[g.below(settingKeys.count)]))
            try c.store.write { tx in
                switch g.below(10) {
                case 0, 1, 2:
                    try? tx.insert("settings", ["name": key.values[0], "v": .int(Int64(g.below(3))), "w": titles[g.below(4)]])
                case 3, 4, 5, 6:
                    let field = ["v", "w"][g.below(2)]
                    let value: Value = g.below(4) == 0 ? .null : field == "v" ? .int(Int64(g.below(3))) : titles[g.below(4)]
                    try? tx.update("settings", key: key, FieldValues([(field, value)]))
                case 7, 8:
                    try? tx.delete("settings", key: key)
                default:
                    try? tx.revert("settings", key: key)
                }
            }
            return
        }
        let key = RowKey(.int(Int64(1 + g.below(12))))
        try c.store.write { tx in
            switch g.below(10) {
            case 0, 1, 2:
                try? tx.insert("tasks", ["id": key.values[0], "title": titles[g.below(4)], "priority": .int(Int64(g.below(3)))])
            case 3, 4, 5, 6:
                let field = ["title", "priority", "done", "notes"][g.below(4)]
                let value: Value = switch field {
                case "title": titles[g.below(4)]
                case "priority": .int(Int64(g.below(3)))
                case "done": .bool(g.below(2) == 0)
                default: g.below(3) == 0 ? .null : titles[g.below(4)]
                }
                try? tx.update("tasks", key: key, FieldValues([(field, value)]))
            case 7, 8:
                try? tx.delete("tasks", key: key)
            default:
                try? tx.revert("tasks", key: key)
            }
        }
    }

    /// Syncs until nothing sendable is pending (a conflict on push waits for the next pull), and
    /// checks that every value pending at the start reached the server or was decided by a merge.
    /// Syncs until nothing sendable is pending (a conflict on push waits for the next pull), and
    /// checks that every value pending at the start reached the server, was decided by a merge, or
    /// was set aside with its reason. With faults a cycle may fail; its edits stay pending and are
    /// checked by a later cycle.
    /// Returns how many transport calls failed (and were retried, or ended the cycle).
    @discardableResult
    static func syncCycle(_ c: Client, _ model: inout Model, _ g: inout Random, _ db: TestDatabase, faults: Bool = false, context: String) async throws -> Int {
        var failures = 0
        let pending = try await c.store.read { try $0.pendingRows() }
        let lsnBefore = try await c.store.read { try $0.lastLSN }
        var accepted = Set<[UInt8]>()
        // Fields ("table key field", as bytes) and rows whose conflict this cycle settled for the server: the app
        // chose to drop their local values (a delete, for a row). A conflict found by a cycle that
        // a fault ended is settled by a later one, so its merge's audit is not among this cycle's
        // operations.
        var resolvedForServer = Set<[UInt8]>()
        var rowsResolvedForServer = Set<RowID>()
        var rowsRemovedForServer = Set<RowID>()
        for _ in 0..<4 {
            do {
                failures += try await c.sync.sync(with: c.transport, maxAttempts: 3, backoff: .milliseconds(5)).retries
            } catch where faults {
                _ = model.record(c.transport.take())
                return failures + 1
            }
            accepted.formUnion(model.record(c.transport.take()))
            for conflict in try c.sync.conflicts() {
                let side: SyncClient.Choice = g.below(2) == 0 ? .server : .local
                try c.sync.resolve(conflict.table, key: conflict.key, with: side)
                if side == .server {
                    let id = RowID(table: conflict.table, key: conflict.key)
                    resolvedForServer.formUnion(conflict.fields.map { utf8("\(conflict.table) \(conflict.key) \($0)") })
                    rowsResolvedForServer.insert(id)
                    // The server's side of a server delete is no row: every local field goes.
                    if conflict.isDeletedOnServer { rowsRemovedForServer.insert(id) }
                }
            }
            if try await c.store.read({ try $0.pendingRows().filter { !$0.isConflicted }.isEmpty }) { break }
        }
        let ops = try await c.store.read { try $0.operations(from: lsnBefore + 1) }
        let decided = Set(ops.compactMap { MergeAudit($0) }.flatMap { $0.decisions.map { utf8("\($0.field) \($0.local)") } })
        let conflictRows = Set(ops.filter { MergeAudit($0)?.conflict != nil }.map { RowID(table: $0.table, key: $0.key) })
        let rejected = Set(try c.sync.rejectedRows().map { RowID(table: $0.table, key: $0.key) })
        for row in pending {
            let id = RowID(table: row.table, key: row.key)
            if rejected.contains(id) { continue }
            if row.status == .deleted {
                let keyText = String(decoding: try WireFormat.encode(row.key.values), as: UTF8.self)
                let live = try db.sql("SELECT count(*) FROM strata_rows WHERE tbl = '\(row.table)' AND key = '\(keyText)' AND NOT deleted")
                let ok = accepted.contains(utf8("\(row.table) \(row.key) <delete>")) || conflictRows.contains(id) || rowsResolvedForServer.contains(id) || live.hasPrefix("0")
                #expect(ok, "\(context): client \(c.id)'s delete of \(row.table) \(row.key) vanished")
                continue
            }
            let fields = row.status == .inserted ? row.fieldNames.filter { !row.keyFieldNames.contains($0) && !row[$0].isNull } : row.changedFields
            for f in fields {
                let ok = accepted.contains(utf8("\(row.table) \(row.key) \(f) \(row[f])")) || decided.contains(utf8("\(f) \(row[f])"))
                    || resolvedForServer.contains(utf8("\(row.table) \(row.key) \(f)")) || rowsRemovedForServer.contains(id)
                #expect(ok, "\(context): client \(c.id)'s value \(row[f]) for \(row.table) \(row.key).\(f) vanished")
            }
        }
        return failures
    }

    /// What goes wrong during a run.
    struct Faults: CustomStringConvertible, Sendable {
        var servers = 1
        /// Responses lost after the server committed (pushes and pulls).
        var dropResponses = false
        /// The server SIGKILLed in the middle of syncs, and restarted.
        var killServer = false
        /// PostgreSQL restarted in the middle of syncs (a cluster of the test's own).
        var restartPostgres = false
        var description: String { "servers \(servers) drop \(dropResponses) kill \(killServer) pg \(restartPostgres)" }
    }

    /// Five stores, 20 rounds of random offline edits, syncing in random order; then everyone
    /// syncs until quiet, and the stores, the server and the model must agree. `STRATA_SEED`
    /// replays a run, `STRATA_TRIAL_SEED` one trial of it, `STRATA_TRIALS` runs more trials (1 by
    /// default), each on a database and server of its own.
    static func converge(_ faults: Faults) async throws {
        var g = Random("converge(\(faults))")
        let trials = ProcessInfo.processInfo.environment["STRATA_TRIALS"].flatMap(Int.init) ?? 1
        let only = ProcessInfo.processInfo.environment["STRATA_TRIAL_SEED"].flatMap(UInt64.init)
        var twinRows = 0
        for trial in 0..<(only == nil ? trials : 1) {
            let trialSeed = only ?? g.next()
            twinRows += try await Self.trial(faults, seed: trialSeed, label: "trial \(trial) (trial seed \(trialSeed))")
        }
        print("converge(\(faults)): \(only == nil ? trials : 1) trials, \(twinRows) settings rows under a key with a Unicode twin on the server at the end")
    }

    /// One run; returns how many `settings` rows the server holds at the end under a key whose
    /// Unicode twin is a row too.
    static func trial(_ faults: Faults, seed: UInt64, label: String) async throws -> Int {
        var g = Random(seed: seed)
        let cluster = faults.restartPostgres ? try PostgresCluster() : nil
        let db = try TestDatabase(admin: cluster?.url ?? pgURL!)
        let servers = try (0..<faults.servers).map { _ in try ServerProcess(db) }
        // Alive to the end: an optimized build may release an object after its last use, and
        // these stop their server process (and drop the database, and the cluster) when released.
        defer { withExtendedLifetime((cluster, db, servers)) {} }
        var model = Model()
        let policies: [ConflictPolicy] = [.serverWins, .clientWins, .lastWriterWins, .deferred]
        var clients: [Client] = []
        defer { for c in clients { try? FileManager.default.removeItem(atPath: c.path) } }
        let drops = DropSwitch()
        for id in 0..<5 {
            let (store, path) = try makeStore()
            let server = servers[id % servers.count]
            clients.append(Client(id: id, store: store, path: path, policy: policies[g.below(4)], server: server.url,
                                  token: try db.token(for: store.clientID), drops: faults.dropResponses ? drops : nil))
        }
        drops.seed = g.next()
        var failed = 0, struck = 0
        for round in 0..<20 {
            for c in clients { for _ in 0..<g.below(6) { try Self.randomEdit(c, &g) } }
            var order = Array(clients.indices)
            for i in order.indices.reversed() { order.swapAt(i, g.below(i + 1)) }
            for i in order where g.below(3) != 0 {
                // A fault strikes during this client's sync, after a random delay.
                // The fault returns when it began; it overlapped the sync if that is before the
                // sync ended.
                var fault: Task<ContinuousClock.Instant, any Error>?
                let delay = Duration.milliseconds(g.below(40))
                if faults.killServer && g.below(4) == 0 {
                    let server = servers[g.below(servers.count)]
                    fault = Task {
                        try await Task.sleep(for: delay)
                        let began = ContinuousClock.now
                        server.kill()
                        try server.restart()
                        return began
                    }
                } else if let cluster, g.below(5) == 0 {
                    // A restart takes a few hundred milliseconds: start it, then sync into it.
                    fault = Task.detached { let began = ContinuousClock.now; try cluster.restart(); return began }
                    try await Task.sleep(for: delay * 5)
                }
                failed += try await Self.syncCycle(clients[i], &model, &g, db, faults: true, context: "\(label), round \(round)")
                let ended = ContinuousClock.now
                if let began = try await fault?.value, began < ended { struck += 1 }
            }
        }
        drops.enabled = false
        print("converge(\(faults)) \(label): \(struck) faults struck during a sync; \(failed) transport calls failed")
        if faults.killServer || faults.restartPostgres { #expect(struck > 0, "\(label): no fault struck during a sync") }
        var quiet = false
        for _ in 0..<6 where !quiet {
            let before = try db.sql("SELECT last_value FROM strata_version")
            for c in clients { try await Self.syncCycle(c, &model, &g, db, context: "\(label), final") }
            let pending = try clients.map { c in try c.store.read { try $0.pendingRows().count } }.reduce(0, +)
            let after = try db.sql("SELECT last_value FROM strata_version")
            quiet = pending == 0 && after == before
        }
        #expect(quiet, "\(label): the clients did not settle")
        let onServer = try await serverRows(servers[0].url, token: try db.token(for: "observer"))
        let modelRows = try model.lines(db)
        #expect(onServer == modelRows, "\(label): the server's rows \(text(onServer)) differ from the model of accepted changes \(text(modelRows))")
        for c in clients {
            let rows = try storeRows(c.store)
            #expect(rows == onServer, "\(label): client \(c.id) differs from the server: \(text(rows)) against \(text(onServer))")
        }
        // No batch applied twice: every acknowledgement a client got is the one stored with the
        // batch, and every applied batch reached its client.
        let stored = try db.sql("SELECT id FROM strata_batches WHERE ack IS NOT NULL").split(separator: "\n").map(String.init)
        #expect(Set(stored) == Set(model.records.keys), "\(label): batches applied but never acknowledged to their client, or the reverse")
        for (id, (_, ack)) in model.records {
            let text = try db.sql("SELECT ack FROM strata_batches WHERE id = '\(id)'").trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(try WireFormat.decode(BatchAck.self, from: Data(text.utf8)) == ack, "\(label): batch \(id) got another answer than the one stored")
        }
        #expect(model.records.count > 20, "\(label): too little happened to prove anything")
        if faults.dropResponses { #expect(drops.dropped > 0, "\(label): no response was dropped") }
        // Rows of `settings` whose key has a twin among the server's rows (same to `==`, other bytes).
        let names = try db.sql("SELECT key FROM strata_rows WHERE tbl = 'settings' AND NOT deleted").split(separator: "\n")
            .map { try WireFormat.decode([Value].self, from: Data($0.utf8))[0] }
        return names.count { v in names.contains { $0 != v && "\($0)" == "\(v)" } }
    }

    @Test func fiveStoresConvergeThroughTheServer() async throws {
        try await Self.converge(Faults())
    }

    @Test func twoServerProcessesOnOneDatabaseConverge() async throws {
        try await Self.converge(Faults(servers: 2))
    }

    @Test func responsesLostAfterTheServerCommittedLoseNothing() async throws {
        try await Self.converge(Faults(dropResponses: true))
    }

    @Test func aServerKilledMidSyncLosesNothing() async throws {
        try await Self.converge(Faults(killServer: true))
    }

    @Test(.enabled(if: getuid() == 0, "restarting a PostgreSQL cluster of the test's own needs root (su postgres)"))
    func aPostgreSQLRestartLosesNothing() async throws {
        try await Self.converge(Faults(restartPostgres: true))
    }
}

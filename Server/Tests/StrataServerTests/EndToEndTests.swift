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
        init(id: Int, store: Store, path: String, policy: ConflictPolicy, server: URL, token: String) {
            self.id = id
            self.store = store
            self.path = path
            sync = SyncClient(store: store, policy: policy)
            transport = RecordingTransport(HTTPSyncTransport(server: server, token: token, timeout: 10, pageSize: 5))
        }
    }

    /// The server's accepted changes, applied in the order the server acknowledged them.
    struct Model {
        var rows: [RowKey: [String: Value]] = [:]
        var applied = Set<String>()

        /// Applies the ok rows of each batch once; returns what was accepted, as "key field value"
        /// and "key <delete>".
        mutating func apply(_ log: [(Batch, BatchAck)]) -> Set<String> {
            var accepted = Set<String>()
            for (batch, ack) in log where applied.insert(batch.id).inserted {
                for (change, result) in zip(batch.changes, ack.results) where result.status == .ok {
                    let key = change.key
                    switch change.kind {
                    case .insert:
                        var row: [String: Value] = ["priority": 0, "done": false]
                        for (f, v) in change.values where f != "id" { row[f] = v }
                        rows[key] = row.filter { !$0.value.isNull }
                    case .update:
                        for (f, v) in change.values {
                            if v.isNull { rows[key]?.removeValue(forKey: f) } else { rows[key]?[f] = v }
                        }
                    case .delete:
                        rows[key] = nil
                        accepted.insert("\(key) <delete>")
                    }
                    for (f, v) in change.values where f != "id" { accepted.insert("\(key) \(f) \(v)") }
                }
            }
            return accepted
        }

        var lines: [String] {
            rows.map { key, fields in "\(key) \(fields.sorted { $0.key < $1.key })" }.sorted()
        }
    }

    static func randomEdit(_ c: Client, _ g: inout Random) throws {
        let key = RowKey(.int(Int64(1 + g.below(12))))
        let titles: [Value] = ["a", "b", "c", "d"]
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
    static func syncCycle(_ c: Client, _ model: inout Model, _ g: inout Random, context: String) async throws {
        let pending = try await c.store.read { try $0.pendingRows() }
        let lsnBefore = try await c.store.read { try $0.lastLSN }
        var accepted = Set<String>()
        for _ in 0..<4 {
            _ = try await c.sync.sync(with: c.transport, maxAttempts: 3, backoff: .milliseconds(5))
            accepted.formUnion(model.apply(c.transport.take()))
            for conflict in try c.sync.conflicts() {
                try c.sync.resolve(conflict.table, key: conflict.key, with: g.below(2) == 0 ? .server : .local)
            }
            if try await c.store.read({ try $0.pendingRows().filter { !$0.isConflicted }.isEmpty }) { break }
        }
        let ops = try await c.store.read { try $0.operations(from: lsnBefore + 1) }
        let decided = Set(ops.compactMap { MergeAudit($0) }.flatMap { $0.decisions.map { "\($0.field) \($0.local)" } })
        let conflictKeys = Set(ops.filter { MergeAudit($0)?.conflict != nil }.map(\.key))
        let rejected = Set(try c.sync.rejectedRows().map(\.key))
        for row in pending where !rejected.contains(row.key) {
            if row.status == .deleted {
                let ok = accepted.contains("\(row.key) <delete>") || conflictKeys.contains(row.key) || model.rows[row.key] == nil
                #expect(ok, "\(context): client \(c.id)'s delete of \(row.key) vanished")
                continue
            }
            let fields = row.status == .inserted ? row.fieldNames.filter { $0 != "id" && !row[$0].isNull } : row.changedFields
            for f in fields {
                let ok = accepted.contains("\(row.key) \(f) \(row[f])") || decided.contains("\(f) \(row[f])")
                #expect(ok, "\(context): client \(c.id)'s value \(row[f]) for \(row.key).\(f) vanished")
            }
        }
    }

    @Test func fiveStoresConvergeThroughTheServer() async throws {
        var g = Random("fiveStoresConvergeThroughTheServer")
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        var model = Model()
        let policies: [ConflictPolicy] = [.serverWins, .clientWins, .lastWriterWins, .deferred]
        var clients: [Client] = []
        defer { for c in clients { try? FileManager.default.removeItem(atPath: c.path) } }
        for id in 0..<5 {
            let (store, path) = try makeStore()
            clients.append(Client(id: id, store: store, path: path, policy: policies[g.below(4)], server: server.url, token: try db.token(for: store.clientID)))
        }
        for round in 0..<20 {
            for c in clients { for _ in 0..<g.below(6) { try Self.randomEdit(c, &g) } }
            var order = Array(clients.indices)
            for i in order.indices.reversed() { order.swapAt(i, g.below(i + 1)) }
            for i in order where g.below(3) != 0 {
                try await Self.syncCycle(clients[i], &model, &g, context: "round \(round)")
            }
        }
        var quiet = false
        for _ in 0..<6 where !quiet {
            let before = try db.sql("SELECT last_value FROM strata_version")
            for c in clients { try await Self.syncCycle(c, &model, &g, context: "final") }
            let pending = try clients.map { c in try c.store.read { try $0.pendingRows().count } }.reduce(0, +)
            let after = try db.sql("SELECT last_value FROM strata_version")
            quiet = pending == 0 && after == before
        }
        #expect(quiet, "the clients did not settle")
        let onServer = try await serverRows(server.url, token: try db.token(for: "observer"))
        #expect(onServer == model.lines, "the server's rows differ from the model of accepted changes")
        for c in clients {
            #expect(try storeRows(c.store) == onServer, "client \(c.id) differs from the server")
        }
        // Every batch the server applied is acknowledged exactly once in its table.
        #expect(try db.sql("SELECT count(*) FROM strata_batches WHERE ack IS NULL").trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        #expect(model.applied.count > 20, "too little happened to prove anything")
    }
}

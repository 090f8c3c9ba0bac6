import Foundation
import Strata
import StrataSync
import StrataWorkload
import Testing

/// A minimal server: one `tasks` table, a change log for pulls, and optimistic concurrency on
/// push (an update or delete must name the values the server holds, an insert a free key).
final class TestServer {
    var rows: [RowKey: [String: Value]] = [:]
    var stamps: [RowKey: Date] = [:]
    var log: [(version: Int, key: RowKey)] = []
    var version = 0
    /// Every value the server accepted, as "client key field value"; deletes as "client key <delete>".
    var accepted: Set<String> = []

    func pull(since: Int) -> ServerDelta {
        var keys: [RowKey] = []
        var seen = Set<RowKey>()
        for change in log.reversed() where change.version > since && seen.insert(change.key).inserted { keys.append(change.key) }
        var upserts: [ServerRow] = []
        var deletes: [RowKey] = []
        for key in keys.reversed() {
            if let row = rows[key] {
                // Complete rows: a field the server holds no value for is listed as null, since a
                // field left out of an upsert means "unchanged".
                var full: [String: Value] = ["id": key.values[0]]
                for f in ["title", "priority", "done", "notes"] { full[f] = row[f] ?? .null }
                upserts.append(ServerRow(full, version: "\(version)", timestamp: stamps[key]))
            } else {
                deletes.append(key)
            }
        }
        return ServerDelta(since: since == 0 ? nil : "\(since)", anchor: "\(version)", tables: [TableDelta("tasks", upserts: upserts, deletes: deletes)])
    }

    private func record(_ key: RowKey) {
        version += 1
        log.append((version, key))
        stamps[key] = Date()
    }

    /// Applies one pending row; returns whether it was accepted.
    func push(client: Int, _ row: Row) -> Bool {
        let key = row.key
        let fields = row.fieldNames.filter { $0 != "id" }
        switch row.status {
        case .inserted:
            guard rows[key] == nil else { return false }
            rows[key] = Dictionary(uniqueKeysWithValues: fields.compactMap { row[$0].isNull ? nil : ($0, row[$0]) })
            for f in fields { accepted.insert("\(client) \(key) \(f) \(row[f])") }
        case .updated:
            guard var current = rows[key] else { return false }
            for f in row.changedFields where (current[f] ?? .null) != row.original(f) { return false }
            for f in row.changedFields {
                if row[f].isNull { current.removeValue(forKey: f) } else { current[f] = row[f] }
                accepted.insert("\(client) \(key) \(f) \(row[f])")
            }
            rows[key] = current
        case .deleted:
            if let current = rows[key] {
                for f in fields where (current[f] ?? .null) != row.original(f) { return false }
                rows[key] = nil
            }
            accepted.insert("\(client) \(key) <delete>")
        case .unchanged:
            return true
        }
        record(key)
        return true
    }
}

@Suite struct ConvergenceTests {
    struct Client {
        let id: Int
        let store: Store
        let sync: SyncClient
    }

    static func randomEdit(_ c: Client, _ g: inout SplitMix64) throws {
        let key = RowKey(.int(Int64(1 + g.below(8))))
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

    /// Pull, merge, resolve deferred conflicts, push, acknowledge. Checks that every value
    /// pending at the start either reached the server or is in a recorded merge decision.
    static func syncCycle(_ c: Client, _ server: TestServer, _ g: inout SplitMix64, context: String) throws {
        let pending = try c.store.read { try $0.pendingRows() }
        let lsnBefore = try c.store.read { try $0.lastLSN }
        server.accepted.removeAll()
        for attempt in 0..<3 {
            let since = Int(try c.sync.anchor() ?? "0")!
            try c.sync.merge(server.pull(since: since))
            for conflict in try c.sync.conflicts() {
                try c.sync.resolve(conflict.table, key: conflict.key, with: g.below(2) == 0 ? .server : .local)
            }
            var rejected = 0
            for row in try c.store.read({ try $0.pendingRows() }) where !row.isConflicted {
                if server.push(client: c.id, row) {
                    try c.store.write { try $0.acknowledge("tasks", key: row.key) }
                } else {
                    rejected += 1
                }
            }
            if rejected == 0 { break }
            #expect(attempt < 2, "\(context): pushes keep being rejected")
        }
        // No edit vanished.
        let audits = try c.store.read { try $0.operations(from: lsnBefore + 1) }.compactMap { MergeAudit($0) }
        let decided = Set(audits.flatMap { $0.decisions.map { "\(c.id) \($0.field) \($0.local)" } })
        let conflictKeys = Set(try c.store.read { try $0.operations(from: lsnBefore + 1) }.filter { MergeAudit($0)?.conflict != nil }.map(\.key))
        for row in pending {
            if row.status == .deleted {
                let ok = server.accepted.contains("\(c.id) \(row.key) <delete>") || conflictKeys.contains(row.key) || server.rows[row.key] == nil
                #expect(ok, "\(context): client \(c.id)'s delete of \(row.key) vanished")
                continue
            }
            // An inserted row's null fields carry nothing to upload; a field updated to null does.
            let fields = row.status == .inserted ? row.fieldNames.filter { $0 != "id" && !row[$0].isNull } : row.changedFields
            for f in fields {
                let ok = server.accepted.contains("\(c.id) \(row.key) \(f) \(row[f])") || decided.contains("\(c.id) \(f) \(row[f])")
                #expect(ok, "\(context): client \(c.id)'s value \(row[f]) for \(row.key).\(f) vanished")
            }
        }
    }

    /// `overlayBudget`: a checkpoint after every commit (0), every few commits, or never.
    @Test(arguments: [3, 4], [0, 4096, Int.max])
    func clientsConvergeAndNoEditIsLost(clients count: Int, overlayBudget: Int) throws {
        let seed = testSeed("clientsConvergeAndNoEditIsLost(\(count), overlayBudget: \(overlayBudget))")
        var g = SplitMix64(seed: seed)
        let server = TestServer()
        let policies: [ConflictPolicy] = [.serverWins, .clientWins, .lastWriterWins, .deferred]
        var folders: [String] = []
        defer { for f in folders { try? FileManager.default.removeItem(atPath: f) } }
        var clients: [Client] = []
        for id in 0..<count {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-converge-\(UUID().uuidString)").path
            folders.append(path)
            var options = StoreOptions()
            options.durability = .noSync
            options.checkInvariants = true
            options.overlayBudget = overlayBudget
            let store = try Store(path: path, options: options)
            try store.createTable(tasks)
            clients.append(Client(id: id, store: store, sync: SyncClient(store: store, policy: policies[g.below(4)])))
        }
        for epoch in 0..<40 {
            for c in clients {
                for _ in 0..<g.below(5) { try Self.randomEdit(c, &g) }
            }
            for c in clients where g.below(2) == 0 {
                try Self.syncCycle(c, server, &g, context: "epoch \(epoch)")
            }
            // Compaction now and then, mid-conversation: it must lose nothing either.
            for c in clients where g.below(4) == 0 {
                try c.store.compact(retaining: .operations(g.below(30)))
            }
        }
        // Everyone syncs until nothing is pending and nothing new arrives.
        var quiet = false
        for _ in 0..<10 where !quiet {
            let versionBefore = server.version
            for c in clients { try Self.syncCycle(c, server, &g, context: "final") }
            let pending = try clients.map { c in try c.store.read { try $0.pendingRows().count } }.reduce(0, +)
            quiet = pending == 0 && server.version == versionBefore
        }
        #expect(quiet, "the clients did not settle")
        let expected = server.rows.map { key, fields in "\(key) \(fields.sorted { $0.key < $1.key })" }.sorted()
        for c in clients {
            let rows = try c.store.read { try $0.rows("tasks") }.map { row in
                "\(row.key) \(row.values.filter { $0.key != "id" && !$0.value.isNull }.sorted { $0.key < $1.key })"
            }.sorted()
            #expect(rows == expected, "client \(c.id) differs from the server")
            #expect(try c.store.verify().isConsistent)
        }
        #expect(server.version > 20, "too little happened to prove anything")
    }
}

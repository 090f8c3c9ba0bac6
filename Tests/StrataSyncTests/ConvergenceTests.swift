import Foundation
import Strata
import StrataSync
import StrataWorkload
import Testing

/// A table keyed by string, whose key space holds names that Swift's `==` calls equal but whose
/// bytes differ (NFC and NFD forms, and U+212B ANGSTROM SIGN beside U+00C5): each is its own
/// row, on the server and on every client.
let words = TableSchema.fixed("words", primaryKey: ["name"], fields: [
    .string("name"), .string("title"), .int("priority", default: 0), .bool("done", default: false), .string("notes", nullable: true),
])
let wordKeys: [String] = ["\u{e9}", "e\u{301}", "\u{f1}", "n\u{303}", "\u{c5}", "A\u{30a}", "\u{212b}", "a"]

/// A string as its UTF-8 bytes: the oracles key on these, since `String`'s `==` would take two
/// twins for one row.
func utf8(_ s: String) -> [UInt8] { Array(s.utf8) }

/// A minimal server: a `tasks` table keyed by int and a `words` table keyed by string, a change
/// log for pulls, and optimistic concurrency on push (an update or delete must name the values
/// the server holds, an insert a free key).
final class TestServer {
    struct ID: Hashable {
        let table: String
        let key: RowKey
    }
    static let keyField = ["tasks": "id", "words": "name"]
    var rows: [ID: [String: Value]] = [:]
    var stamps: [ID: Date] = [:]
    var log: [(version: Int, id: ID)] = []
    var version = 0
    /// Every value the server accepted, as the bytes of "client table key field value"; deletes
    /// as "client table key <delete>".
    var accepted: Set<[UInt8]> = []

    func pull(since: Int) -> ServerDelta {
        var ids: [ID] = []
        var seen = Set<ID>()
        for change in log.reversed() where change.version > since && seen.insert(change.id).inserted { ids.append(change.id) }
        var tables: [TableDelta] = []
        for table in ["tasks", "words"] {
            var upserts: [ServerRow] = []
            var deletes: [RowKey] = []
            for id in ids.reversed() where id.table == table {
                if let row = rows[id] {
                    // Complete rows: a field the server holds no value for is listed as null, since a
                    // field left out of an upsert means "unchanged".
                    var full: [String: Value] = [Self.keyField[table]!: id.key.values[0]]
                    for f in ["title", "priority", "done", "notes"] { full[f] = row[f] ?? .null }
                    upserts.append(ServerRow(full, version: "\(version)", timestamp: stamps[id]))
                } else {
                    deletes.append(id.key)
                }
            }
            tables.append(TableDelta(table, upserts: upserts, deletes: deletes))
        }
        return ServerDelta(since: since == 0 ? nil : "\(since)", anchor: "\(version)", tables: tables)
    }

    private func record(_ id: ID) {
        version += 1
        log.append((version, id))
        stamps[id] = Date()
    }

    /// Applies one pending row of `table`; returns whether it was accepted.
    func push(client: Int, _ table: String, _ row: Row) -> Bool {
        let id = ID(table: table, key: row.key)
        let keyField = Self.keyField[table]!
        let fields = row.fieldNames.filter { $0 != keyField }
        switch row.status {
        case .inserted:
            guard rows[id] == nil else { return false }
            rows[id] = Dictionary(uniqueKeysWithValues: fields.compactMap { row[$0].isNull ? nil : ($0, row[$0]) })
            for f in fields { accepted.insert(utf8("\(client) \(table) \(row.key) \(f) \(row[f])")) }
        case .updated:
            guard var current = rows[id] else { return false }
            for f in row.changedFields where (current[f] ?? .null) != row.original(f) { return false }
            for f in row.changedFields {
                if row[f].isNull { current.removeValue(forKey: f) } else { current[f] = row[f] }
                accepted.insert(utf8("\(client) \(table) \(row.key) \(f) \(row[f])"))
            }
            rows[id] = current
        case .deleted:
            if let current = rows[id] {
                for f in fields where (current[f] ?? .null) != row.original(f) { return false }
                rows[id] = nil
            }
            accepted.insert(utf8("\(client) \(table) \(row.key) <delete>"))
        case .unchanged:
            return true
        }
        record(id)
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
        // Half the edits go to `words`, whose keys include Unicode twins.
        let (table, keyField, key): (String, String, RowKey) = g.below(2) == 0
            ? ("tasks", "id", RowKey(.int(Int64(1 + g.below(8)))))
            : ("words", "name", RowKey(.string(wordKeys[g.below(wordKeys.count)])))
        let titles: [Value] = ["a", "b", "c", "d"]
        try c.store.write { tx in
            switch g.below(10) {
            case 0, 1, 2:
                try? tx.insert(table, [keyField: key.values[0], "title": titles[g.below(4)], "priority": .int(Int64(g.below(3)))])
            case 3, 4, 5, 6:
                let field = ["title", "priority", "done", "notes"][g.below(4)]
                let value: Value = switch field {
                case "title": titles[g.below(4)]
                case "priority": .int(Int64(g.below(3)))
                case "done": .bool(g.below(2) == 0)
                default: g.below(3) == 0 ? .null : titles[g.below(4)]
                }
                try? tx.update(table, key: key, FieldValues([(field, value)]))
            case 7, 8:
                try? tx.delete(table, key: key)
            default:
                try? tx.revert(table, key: key)
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
                if server.push(client: c.id, row.table, row) {
                    try c.store.write { try $0.acknowledge(row.table, key: row.key) }
                } else {
                    rejected += 1
                }
            }
            if rejected == 0 { break }
            #expect(attempt < 2, "\(context): pushes keep being rejected")
        }
        // No edit vanished.
        let ops = try c.store.read { try $0.operations(from: lsnBefore + 1) }
        let decided = Set(ops.compactMap { MergeAudit($0) }.flatMap { $0.decisions.map { utf8("\(c.id) \($0.field) \($0.local)") } })
        let conflictRows = Set(ops.filter { MergeAudit($0)?.conflict != nil }.map { TestServer.ID(table: $0.table, key: $0.key) })
        for row in pending {
            let id = TestServer.ID(table: row.table, key: row.key)
            if row.status == .deleted {
                let ok = server.accepted.contains(utf8("\(c.id) \(row.table) \(row.key) <delete>")) || conflictRows.contains(id) || server.rows[id] == nil
                #expect(ok, "\(context): client \(c.id)'s delete of \(row.table) \(row.key) vanished")
                continue
            }
            // An inserted row's null fields carry nothing to upload; a field updated to null does.
            let fields = row.status == .inserted ? row.fieldNames.filter { !row.keyFieldNames.contains($0) && !row[$0].isNull } : row.changedFields
            for f in fields {
                let ok = server.accepted.contains(utf8("\(c.id) \(row.table) \(row.key) \(f) \(row[f])")) || decided.contains(utf8("\(c.id) \(f) \(row[f])"))
                #expect(ok, "\(context): client \(c.id)'s value \(row[f]) for \(row.table) \(row.key).\(f) vanished")
            }
        }
    }

    /// A store's rows of both tables, as the bytes of "table key sorted-fields" lines, sorted.
    static func lines(_ store: Store) throws -> [[UInt8]] {
        try store.read { snap in
            try (snap.rows("tasks") + snap.rows("words")).map { row in
                utf8("\(row.table) \(row.key) \(row.values.filter { !row.keyFieldNames.contains($0.key) && !$0.value.isNull }.sorted { $0.key < $1.key })")
            }
        }.sorted { $0.lexicographicallyPrecedes($1) }
    }

    /// `overlayBudget`: a checkpoint after every commit (0), every few commits, or never.
    /// `STRATA_SEED` replays a run, `STRATA_TRIAL_SEED` one trial of it, `STRATA_TRIALS` runs more
    /// trials (1 by default).
    @Test(arguments: [3, 4], [0, 4096, Int.max])
    func clientsConvergeAndNoEditIsLost(clients count: Int, overlayBudget: Int) throws {
        let name = "clientsConvergeAndNoEditIsLost(\(count), overlayBudget: \(overlayBudget))"
        let seed = testSeed(name)
        let trials = ProcessInfo.processInfo.environment["STRATA_TRIALS"].flatMap(Int.init) ?? 1
        let only = ProcessInfo.processInfo.environment["STRATA_TRIAL_SEED"].flatMap(UInt64.init)
        // Each case draws its own trials from one `STRATA_SEED`.
        var g = SplitMix64(seed: seed ^ (UInt64(count) << 56) ^ UInt64(truncatingIfNeeded: overlayBudget &* 0x9E37_79B9))
        var twinRows = 0
        for trial in 0..<(only == nil ? trials : 1) {
            let trialSeed = only ?? g.next()
            twinRows += try Self.trial(clients: count, overlayBudget: overlayBudget, seed: trialSeed,
                                       label: "seed \(seed), trial \(trial) (trial seed \(trialSeed))")
        }
        print("\(name): \(only == nil ? trials : 1) trials, \(twinRows) rows of words under a key with a Unicode twin on the server at the end")
    }

    /// One run; returns how many `words` rows the server holds at the end under a key whose
    /// Unicode twin is a row too.
    static func trial(clients count: Int, overlayBudget: Int, seed: UInt64, label: String) throws -> Int {
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
            try store.createTable(words)
            clients.append(Client(id: id, store: store, sync: SyncClient(store: store, policy: policies[g.below(4)])))
        }
        for epoch in 0..<40 {
            for c in clients {
                for _ in 0..<g.below(5) { try Self.randomEdit(c, &g) }
            }
            for c in clients where g.below(2) == 0 {
                try Self.syncCycle(c, server, &g, context: "\(label), epoch \(epoch)")
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
            for c in clients { try Self.syncCycle(c, server, &g, context: "\(label), final") }
            let pending = try clients.map { c in try c.store.read { try $0.pendingRows().count } }.reduce(0, +)
            quiet = pending == 0 && server.version == versionBefore
        }
        #expect(quiet, "\(label): the clients did not settle")
        let expected = server.rows.map { id, fields in
            utf8("\(id.table) \(id.key) \(fields.sorted { $0.key < $1.key })")
        }.sorted { $0.lexicographicallyPrecedes($1) }
        for c in clients {
            let rows = try lines(c.store)
            #expect(rows == expected, "\(label): client \(c.id) differs from the server: \(rows.map { String(decoding: $0, as: UTF8.self).debugDescription }) against \(expected.map { String(decoding: $0, as: UTF8.self).debugDescription })")
            #expect(try c.store.verify().isConsistent, "\(label): client \(c.id)'s store is not consistent")
        }
        #expect(server.version > 20, "\(label): too little happened to prove anything")
        // Rows of `words` whose key has a twin among the server's rows (same to `==`, other bytes).
        let wordRows = server.rows.keys.filter { $0.table == "words" }.map { $0.key.values[0] }
        return wordRows.count { v in wordRows.contains { $0 != v && "\($0)" == "\(v)" } }
    }
}

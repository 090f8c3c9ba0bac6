import Foundation
import Strata
import StrataSync
import StrataTesting
import StrataWorkload
import Testing

/// A server row this store cannot hold (`RowRule`) is set aside with its reason; the rest of the
/// delta merges and the anchor moves on. One bad row on a server never walls a client in.
@Suite struct RefusedServerRowTests {
    static let settings = TableSchema.propertyBag("settings", key: [.string("name")])
    static let longName = String(repeating: "K", count: 1500)

    /// Every kind of row the rule refuses, beside good rows, in one delta.
    static let delta = ServerDelta(anchor: "v2", tables: [
        TableDelta("tasks", upserts: [
            ServerRow(["id": 1, "title": "fine"]),
            ServerRow(["id": 2, "title": 5]),                          // a string field given an int
            ServerRow(["id": 3, "title": "t", "colour": "red"]),       // a field the table lacks
            ServerRow(["id": 4]),                                      // new here, without its required title
            ServerRow(["title": "no key"]),                            // no key at all
            ServerRow(["id": 5, "title": "t", "priority": 1.5]),       // a double for an int field
            ServerRow(["id": 6, "title": "also fine"]),
        ], deletes: [RowKey(.string("a string key for an int table"))]),
        TableDelta("settings", upserts: [
            ServerRow(["name": "e2", "": "x"]),                        // an empty field name
            ServerRow(["name": .string(longName), "v": 1]),            // a key past RowRule.maxKeyBytes
            ServerRow(["name": "ok", "v": 1]),
        ], deletes: [RowKey(.string(longName))]),                      // a tombstone no row here can match
    ])

    static func makeStore(_ store: Store) throws -> SyncClient {
        try store.createTable(settings)
        let sync = SyncClient(store: store)
        // Task 2 is here already: a refused server row leaves it as it was.
        try sync.merge(ServerDelta(anchor: "v1", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 2, "title": "before"])])]))
        return sync
    }

    static func titles(_ store: Store) throws -> [String] {
        try store.read { try $0.rows("tasks").map { "\($0.key) \($0["title"].stringValue ?? "-")" } }
    }

    @Test func rowsThisStoreCannotHoldAreSetAsideAndTheRestMerges() throws {
        try withStore { store in
            let sync = try Self.makeStore(store)
            let report = try sync.merge(Self.delta)
            let refused = report.refusedRows.map { "\($0.table) \($0.key)" }
            #expect(refused == ["tasks 2", "tasks 3", "tasks 4", "tasks ()", "tasks 5", "settings \"e2\"", "settings \"\(Self.longName)\""])
            for (row, words) in zip(report.refusedRows, ["holds string values", "sets field 'colour'", "required field 'title'", "key field", "holds int values", "field name cannot be empty", "the limit is 500"]) {
                #expect(row.reason.contains(words), "\(row.reason)")
                #expect(row.anchor == "v2")
            }
            #expect(try sync.refusedServerRows() == report.refusedRows)
            #expect(try sync.anchor() == "v2")
            #expect(try Self.titles(store) == ["1 fine", "2 before", "6 also fine"])
            #expect(try store.read { try $0.rows("settings").map(\.key) } == ["ok"])
        }
    }

    @Test func aListedRowLeavesTheListWhenTheServerMendsOrDeletesIt() throws {
        try withStore { store in
            let sync = try Self.makeStore(store)
            try sync.merge(Self.delta)
            try sync.merge(ServerDelta(since: "v2", anchor: "v3", tables: [
                TableDelta("tasks", upserts: [ServerRow(["id": 2, "title": "mended"])], deletes: [3]),
                TableDelta("settings", deletes: [RowKey(.string(Self.longName))]),
            ]))
            #expect(try sync.refusedServerRows().map { "\($0.table) \($0.key)" } == ["tasks 4", "tasks ()", "tasks 5", "settings \"e2\""])
            #expect(try store.read { try $0.row("tasks", key: 2)?["title"] } == "mended")
            // A snapshot of a table settles its list: refused again, or gone.
            try sync.merge(ServerDelta(anchor: "v4", mode: .snapshot, tables: [
                TableDelta("tasks", upserts: [ServerRow(["id": 2, "title": 7])]),
            ]))
            #expect(try sync.refusedServerRows().map { "\($0.table) \($0.key)" } == ["settings \"e2\"", "tasks 2"])
            // The snapshot's refused row keeps what the store held under its key.
            #expect(try Self.titles(store) == ["2 mended"])
        }
    }

    @Test func aDryRunReportsRefusalsAndStoresNothing() throws {
        try withStore { store in
            let sync = try Self.makeStore(store)
            let before = try observable(store)
            let report = try sync.merge(Self.delta, dryRun: true)
            #expect(report.refusedRows.count == 7)
            #expect(try observable(store) == before)
            #expect(try sync.refusedServerRows().isEmpty)
        }
    }

    @Test func aClientResetSetsAsideTheRowsItCannotHold() throws {
        try withStore { store in
            let sync = try Self.makeStore(store)
            var snapshot = Self.delta
            snapshot.mode = .snapshot
            let report = try sync.reset(with: snapshot, keepLocalChanges: true)
            #expect(report.refusedRows.map { "\($0.table) \($0.key)" } == ["tasks 2", "tasks 3", "tasks 4", "tasks ()", "tasks 5", "settings \"e2\"", "settings \"\(Self.longName)\""])
            #expect(try sync.refusedServerRows() == report.refusedRows)
            #expect(try sync.anchor() == "v2")
            #expect(try Self.titles(store) == ["1 fine", "2 before", "6 also fine"])
        }
    }
}

/// `InMemorySyncServer` given its tables checks rows as `strata-server` does: the rows it takes
/// are exactly those a store takes, near every limit of `RowRule` (`RowRuleTests` in `Server/`
/// runs the same against `strata-server`).
@Suite struct InMemoryServerRowRuleTests {
    @Test func theServerAcceptsExactlyTheRowsAClientStores() async throws {
        var random = SplitMix64(seed: testSeed("InMemoryServerRowRuleTests"))
        let settings = RefusedServerRowTests.settings
        let server = InMemorySyncServer(tables: [tasks, settings])
        let longest = RowRule.maxKeyBytes - 7   // a string key of n bytes takes n + 7 encoded
        var changes: [RowChange] = []
        for i in 0..<300 {
            let prefix = "k\(i)-"
            let name: String = switch random.below(4) {
            case 0: prefix + String(repeating: "x", count: longest - prefix.utf8.count + random.below(3) - 1)
            case 1: prefix + String(repeating: "é", count: (longest - prefix.utf8.count) / 2 + random.below(2))
            default: "k\(i)"
            }
            var values: [String: Value] = ["name": .string(name)]
            switch random.below(5) {
            case 0: values[""] = 1
            case 1: values["f"] = .double(1.5)
            case 2: values["g"] = .null
            default: values["v"] = .int(Int64(i))
            }
            changes.append(RowChange(table: "settings", key: RowKey(.string(name)), kind: .insert, values: values))
            if random.below(4) == 0 {
                var task: [String: Value] = ["id": .int(Int64(i))]
                if random.below(3) != 0 { task["title"] = random.below(4) == 0 ? .null : "t" }
                task["priority"] = random.below(3) == 0 ? .double(1.5) : 1
                changes.append(RowChange(table: "tasks", key: RowKey(.int(Int64(i))), kind: .insert, values: task))
            }
        }
        let ack = try await server.push(Batch(id: "c-1", clientID: "c", number: 1, changes: changes))
        try await withStoreAsync { probe in
            try probe.createTable(settings)
            for (change, result) in zip(changes, ack.results) {
                let stored = (try? await probe.write { tx in try tx.insert(change.table, FieldValues(change.values)) }) != nil
                #expect((result.status == .ok) == stored, "\(change.table) \(change.values.keys.sorted()): server \(result.status), store \(stored)")
            }
        }
    }
}

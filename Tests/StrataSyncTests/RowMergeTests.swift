import Foundation
import Strata
import StrataSync
import Testing

/// Row-level rules: every local state of a row against every kind of server change, under the
/// server-wins, client-wins and deferred policies, against a written table of outcomes.
@Suite struct RowMergeTests {
    enum Local: String, CaseIterable, Sendable { case none, synced, updated, inserted, deleted }
    enum Server: String, CaseIterable, Sendable { case upsertY, upsertX, upsertB, delete }
    enum Policy: String, CaseIterable, Sendable { case serverWins, clientWins, deferred }

    /// The row afterwards: `nil` for no row; otherwise status, title and its original, conflict.
    struct Expected: Sendable, CustomStringConvertible {
        var status: Row.Status
        var title: Value
        var original: Value
        var conflicted = false
        var description: String { "\(status) \(title)/\(original)\(conflicted ? " conflicted" : "")" }
    }
    typealias Outcome = [Policy: Expected?]

    static func same(_ e: Expected?) -> Outcome { [.serverWins: e, .clientWins: e, .deferred: e] }
    static func row(_ s: Row.Status, _ t: Value, _ o: Value, conflicted: Bool = false) -> Expected {
        Expected(status: s, title: t, original: o, conflicted: conflicted)
    }

    static let table: [Local: [Server: Outcome]] = [
        .none: [
            .upsertY: same(row(.unchanged, "Y", "Y")), .upsertX: same(row(.unchanged, "X", "X")),
            .upsertB: same(row(.unchanged, "B", "B")), .delete: same(nil),
        ],
        .synced: [
            .upsertY: same(row(.unchanged, "Y", "Y")), .upsertX: same(row(.unchanged, "X", "X")),
            .upsertB: same(row(.unchanged, "B", "B")), .delete: same(nil),
        ],
        .updated: [
            .upsertY: [.serverWins: row(.unchanged, "Y", "Y"), .clientWins: row(.updated, "X", "Y"), .deferred: row(.updated, "X", "Y", conflicted: true)],
            .upsertX: same(row(.unchanged, "X", "X")),
            .upsertB: same(row(.updated, "X", "B")),
            // Local update vs server delete: server → gone; local → uploaded again as an insert.
            .delete: [.serverWins: nil, .clientWins: row(.inserted, "X", .null), .deferred: row(.inserted, "X", .null, conflicted: true)],
        ],
        .inserted: [
            // Insert vs insert: no base; the server's row wins or becomes the original.
            .upsertY: [.serverWins: row(.unchanged, "Y", "Y"), .clientWins: row(.updated, "X", "Y"), .deferred: row(.updated, "X", "Y", conflicted: true)],
            .upsertX: same(row(.unchanged, "X", "X")),
            .upsertB: [.serverWins: row(.unchanged, "B", "B"), .clientWins: row(.updated, "X", "B"), .deferred: row(.updated, "X", "B", conflicted: true)],
            // The server never had this row: the local insert stays.
            .delete: same(row(.inserted, "X", .null)),
        ],
        .deleted: [
            // Local delete vs server update: server → restored; local → still deleted, new originals.
            .upsertY: [.serverWins: row(.unchanged, "Y", "Y"), .clientWins: row(.deleted, "Y", "Y"), .deferred: row(.deleted, "Y", "Y", conflicted: true)],
            .upsertX: [.serverWins: row(.unchanged, "X", "X"), .clientWins: row(.deleted, "X", "X"), .deferred: row(.deleted, "X", "X", conflicted: true)],
            .upsertB: same(row(.deleted, "B", "B")),
            .delete: same(nil),
        ],
    ]

    static var cases: [(Local, Server, Policy)] {
        Local.allCases.flatMap { l in Server.allCases.flatMap { s in Policy.allCases.map { (l, s, $0) } } }
    }

    static func setUp(_ local: Local, _ store: Store) throws {
        try store.write { tx in
            switch local {
            case .none: break
            case .inserted: try tx.insert("tasks", ["id": 1, "title": "X"])
            case .synced, .updated, .deleted:
                try tx.insert("tasks", ["id": 1, "title": "B"])
                try tx.acknowledge("tasks", key: 1)
                if local == .updated { try tx.update("tasks", key: 1, ["title": "X"]) }
                if local == .deleted { try tx.delete("tasks", key: 1) }
            }
        }
    }

    @Test func theTableCoversEveryCombination() {
        #expect(Self.cases.allSatisfy { Self.table[$0.0]?[$0.1]?.keys.contains($0.2) == true })
    }

    @Test(arguments: cases)
    func outcome(local: Local, server: Server, policy: Policy) throws {
        let expected = Self.table[local]![server]![policy]!
        try withStore { store in
            try Self.setUp(local, store)
            let p: ConflictPolicy = switch policy {
            case .serverWins: .serverWins
            case .clientWins: .clientWins
            case .deferred: .deferred
            }
            // Server rows are complete: the other fields hold the values the local rows have.
            func upsert(_ title: Value) -> TableDelta {
                TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": title, "priority": 0, "done": false])])
            }
            let delta: TableDelta = switch server {
            case .upsertY: upsert("Y")
            case .upsertX: upsert("X")
            case .upsertB: upsert("B")
            case .delete: TableDelta("tasks", deletes: [1])
            }
            try SyncClient(store: store, policy: p).merge(ServerDelta(anchor: "a", tables: [delta]))
            let row = try store.read { try $0.row("tasks", key: 1, includingDeleted: true) }
            let context = "\(local) + \(server) under \(policy): got \(row.map(String.init(describing:)) ?? "no row"), expected \(expected.map(String.init(describing:)) ?? "no row")"
            guard let expected else {
                #expect(row == nil, "\(context)")
                return
            }
            let r = try #require(row, "\(context)")
            #expect(r.status == expected.status, "\(context)")
            #expect(r["title"] == expected.title, "\(context)")
            #expect(r.original("title") == expected.original, "\(context)")
            #expect(r.isConflicted == expected.conflicted, "\(context)")
            #expect(try store.verify().isConsistent)
        }
    }
}

@Suite struct MergeBehaviourTests {
    @Test func snapshotModeDeletesRowsTheServerNoLongerHasButKeepsLocalInserts() throws {
        try withStore { store in
            try store.write { tx in
                for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t\(i)"]) }
                for i in 1...3 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
                try tx.insert("tasks", ["id": 4, "title": "local only"])
            }
            let report = try SyncClient(store: store).merge(ServerDelta(anchor: "s1", mode: .snapshot, tables: [
                TableDelta("tasks", upserts: [ServerRow(["id": 2, "title": "t2"]), ServerRow(["id": 5, "title": "new"])]),
            ]))
            let keys = try store.read { try $0.rows("tasks").map(\.key) }
            #expect(keys == [2, 4, 5])
            #expect(report.rowsApplied == 3)
        }
    }

    /// A snapshot (a first pull) into a property bag whose rows bring fields the device has
    /// never seen: the fields join the catalog, and the pass that looks for rows the snapshot
    /// left out reads them. It used to read through the catalog from before the merge, so the
    /// first sync of any store with property-bag data on the server failed with `corruptRecord`
    /// ("field id 1 unknown to table 'bag'").
    @Test func aSnapshotBringsNewPropertyBagFields() throws {
        try withStore { store in
            try store.createTable(.propertyBag("bag", key: [.int("id")]))
            try store.write { tx in
                try tx.insert("bag", ["id": 3, "shape": "round"])
                try tx.acknowledge("bag", key: 3)
            }
            let report = try SyncClient(store: store).merge(ServerDelta(anchor: "s1", mode: .snapshot, tables: [
                TableDelta("bag", upserts: [ServerRow(["id": 1, "color": "red"]), ServerRow(["id": 2, "size": "large", "color": "blue"])]),
            ]))
            #expect(report.rowsApplied == 3)  // two new rows, and row 3, which the snapshot leaves out, removed
            let rows = try store.read { try $0.rows("bag") }
            #expect(rows.map(\.key) == [1, 2])
            #expect(rows.map { $0["color"] } == ["red", "blue"] && rows[1]["size"] == "large")
            #expect(try store.verify().isConsistent)
        }
    }

    /// A local insert the server has not acknowledged holds no server copy, so a server row for
    /// its key is new to the device: it must carry the required fields, and the fields it leaves
    /// out take their defaults as the server's values. (Before, they got `null` originals, and a
    /// later merge of the row refused the whole delta for the missing required title.)
    @Test func aServerRowForALocalInsertIsNewToTheDevice() throws {
        try withStore { store in
            try store.write { tx in try tx.insert("tasks", ["id": 5, "title": "L", "priority": 2]) }
            let sync = SyncClient(store: store, policy: .clientWins)
            let before = try observableRows(store)
            let refused = try sync.merge(ServerDelta(anchor: "a1", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 5, "done": true])])])).refusedRows
            #expect(refused.first?.reason.contains("required field 'title'") == true, "\(refused)")
            #expect(try observableRows(store) == before)

            try sync.merge(ServerDelta(anchor: "a1", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 5, "title": "S", "done": true])])]))
            let merged = try #require(try store.read { try $0.row("tasks", key: 5) })
            #expect(merged["title"] == "L" && merged.original("title") == "S")
            #expect(merged["priority"] == 2 && merged.original("priority") == 0)  // the default, not null
            #expect(merged["done"] == false && merged.original("done") == true)  // the client wins

            // The row, deleted here, meets a server update that leaves the title out.
            try store.write { tx in try tx.delete("tasks", key: 5) }
            try sync.merge(ServerDelta(anchor: "a2", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 5, "priority": 1])])]), policy: .deferred)
            let after = try #require(try store.read { try $0.row("tasks", key: 5, includingDeleted: true) })
            #expect(after.original("title") == "S" && after.original("priority") == 1)
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func deferredConflictsAreListedHeldAndResolvable() throws {
        for choice in [SyncClient.Choice.server, .local, .values(["title": "mine and theirs"])] {
            try withStore { store in
                try store.write { tx in
                    try tx.insert("tasks", ["id": 1, "title": "B"])
                    try tx.acknowledge("tasks", key: 1)
                    try tx.update("tasks", key: 1, ["title": "X"])
                }
                let sync = SyncClient(store: store, policy: .serverWins, tablePolicies: ["tasks": .deferred])
                let report = try sync.merge(ServerDelta(anchor: "a", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "Y"])])]))
                #expect(report.deferred == 1)
                let conflicts = try sync.conflicts()
                #expect(conflicts.count == 1)
                #expect(conflicts.first?.fields == ["title"] && conflicts.first?.local == ["title": "X"] && conflicts.first?.server == ["title": "Y"])
                try sync.resolve("tasks", key: 1, with: choice)
                #expect(try sync.conflicts().isEmpty)
                let row = try #require(try store.read { try $0.row("tasks", key: 1) })
                switch choice {
                case .server: #expect(row["title"] == "Y" && !row.isPending)
                case .local: #expect(row["title"] == "X" && row.original("title") == "Y" && row.isPending)
                case .values: #expect(row["title"] == "mine and theirs" && row.original("title") == "Y" && row.isPending)
                }
                #expect(try store.read { try $0.history("tasks", key: 1) }.last?.kind == .resolve)
                let again = #expect(throws: StrataError.self) { try sync.resolve("tasks", key: 1, with: .local) }
                #expect(again?.code == .invalidOperation)
            }
        }
    }

    @Test func policyPrecedenceIsCallThenTableThenClient() throws {
        try withStore { store in
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "B"])
                try tx.acknowledge("tasks", key: 1)
                try tx.update("tasks", key: 1, ["title": "X"])
            }
            let delta = { (a: String, t: Value) in ServerDelta(anchor: a, tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": t])])]) }
            let sync = SyncClient(store: store, policy: .serverWins, tablePolicies: ["tasks": .clientWins])
            try sync.merge(delta("1", "Y"))
            // The table's policy (client wins) beat the client's (server wins).
            #expect(try store.read { try $0.row("tasks", key: 1) }?["title"] == "X")
            try sync.merge(delta("2", "Z"), policy: .serverWins)
            // The call's policy beat the table's.
            #expect(try store.read { try $0.row("tasks", key: 1) }?["title"] == "Z")
        }
    }

    @Test func clientResetKeepsOrDiscardsLocalEdits() throws {
        for keep in [true, false] {
            try withStore { store in
                try store.write { tx in
                    for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "old\(i)"]) }
                    for i in 1...3 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
                    try tx.update("tasks", key: 1, ["title": "local edit"])
                    try tx.delete("tasks", key: 2)
                    try tx.insert("tasks", ["id": 9, "title": "local insert"])
                }
                let snapshot = ServerDelta(anchor: "fresh", mode: .snapshot, tables: [TableDelta("tasks", upserts: [
                    ServerRow(["id": 1, "title": "server1"]), ServerRow(["id": 2, "title": "server2"]), ServerRow(["id": 4, "title": "server4"]),
                ])])
                try SyncClient(store: store).reset(with: snapshot, keepLocalChanges: keep)
                let rows = try store.read { try $0.rows("tasks", includingDeleted: true) }
                let byKey = Dictionary(uniqueKeysWithValues: rows.map { ($0.key, $0) })
                #expect(try SyncClient(store: store).anchor() == "fresh")
                #expect(byKey[3] == nil)  // gone from the server, not edited locally
                #expect(byKey[4]?["title"] == "server4")
                if keep {
                    #expect(byKey[1]?["title"] == "local edit" && byKey[1]?.original("title") == "server1")
                    #expect(byKey[2]?.status == .deleted && byKey[2]?.original("title") == "server2")
                    #expect(byKey[9]?.status == .inserted)
                } else {
                    #expect(byKey[1]?["title"] == "server1" && byKey[1]?.isPending == false)
                    #expect(byKey[2]?.status == .unchanged)
                    #expect(byKey[9] == nil)
                }
                #expect(try store.verify().isConsistent)
            }
        }
    }
}

@Suite struct MalformedDeltaTests {
    static let bad: [(String, StrataError.Code, ServerDelta)] = [
        ("unknown table", .tableNotFound, ServerDelta(anchor: "n", tables: [TableDelta("nope", upserts: [ServerRow(["id": 1])])])),
        ("key listed twice", .invalidOperation, ServerDelta(anchor: "n", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "a"])], deletes: [1])])),
        ("wrong anchor", .invalidOperation, ServerDelta(since: "elsewhere", anchor: "n", tables: [])),
        // The first table merges fine; the failure in the second must undo it (and the anchor).
        ("failure after a partial merge", .tableNotFound, ServerDelta(anchor: "n", tables: [
            TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "changed"]), ServerRow(["id": 2, "title": "new"])], deletes: [3]),
            TableDelta("missing"),
        ])),
    ]

    /// Rows this store cannot hold: each is set aside with its reason, the rows stay as they
    /// were, and the anchor moves (`RefusedServerRowTests`).
    static let refused: [(String, String, ServerDelta)] = [
        ("unknown field", "sets field 'colour'", ServerDelta(anchor: "n", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "colour": "red"])])])),
        ("wrong type", "holds string values", ServerDelta(anchor: "n", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": 5])])])),
        ("wrong key type", "holds int values", ServerDelta(anchor: "n", tables: [TableDelta("tasks", upserts: [ServerRow(["id": "one", "title": "t"])])])),
        ("missing key", "lacks its key field 'id'", ServerDelta(anchor: "n", tables: [TableDelta("tasks", upserts: [ServerRow(["title": "t"])])])),
        ("new row without a required field", "required field 'title'", ServerDelta(anchor: "n", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 7])])])),
    ]

    /// A store with rows 1 to 3 from the server, row 2 changed here, at anchor `start`.
    static func withThreeRows(_ body: (Store, SyncClient) throws -> Void) throws {
        try withStore { store in
            try store.write { tx in
                for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) }
                for i in 1...3 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
                try tx.update("tasks", key: 2, ["done": true])
            }
            let sync = SyncClient(store: store)
            try sync.merge(ServerDelta(anchor: "start", tables: []))
            try body(store, sync)
        }
    }

    @Test(arguments: refused.indices)
    func refusedRowsAreSetAsideAndTheAnchorMoves(_ i: Int) throws {
        let (name, words, delta) = Self.refused[i]
        try Self.withThreeRows { store, sync in
            let before = try observableRows(store)
            let report = try sync.merge(delta)
            #expect(report.refusedRows.count == 1 && report.refusedRows[0].reason.contains(words), "\(name): \(report.refusedRows)")
            #expect(try observableRows(store) == before, "\(name) changed the rows")
            #expect(try sync.anchor() == "n")
        }
    }

    @Test(arguments: bad.indices)
    func rejectedWithNoChangeAnchorIncluded(_ i: Int) throws {
        let (name, code, delta) = Self.bad[i]
        try Self.withThreeRows { store, sync in
            let before = try observable(store)
            let error = #expect(throws: StrataError.self, "\(name)") { try sync.merge(delta) }
            #expect(error?.code == code, "\(name): \(error.map(String.init(describing:)) ?? "-")")
            #expect(try observable(store) == before, "\(name) changed the store")
            #expect(try sync.anchor() == "start")
        }
    }

    @Test func truncatedPayloadsAreRejected() throws {
        let delta = ServerDelta(since: nil, anchor: "a", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "t"])], deletes: [2])])
        let json = try JSONEncoder().encode(delta)
        #expect(try JSONDecoder().decode(ServerDelta.self, from: json) == delta)
        for cut in stride(from: 0, to: json.count - 1, by: 7) {
            #expect(throws: (any Error).self) { try JSONDecoder().decode(ServerDelta.self, from: json.prefix(cut)) }
        }
    }
}

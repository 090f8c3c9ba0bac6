import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// Rows the server set aside, against later server deletes, merges and resets: an entry of
/// `rejectedRows()` lists a row's local changes the server refused, so it goes when those changes
/// are gone and stays while they remain.
@Suite struct RejectedRowTests {
    static func row(_ title: String, priority: Int64 = 0) -> [String: Value] {
        ["title": .string(title), "priority": .int(priority), "done": false, "notes": nil]
    }

    /// Rows 1–3 synced; then row 1 updated, row 2 deleted and row 10 inserted here, and the server
    /// sets all three aside.
    func setAside(_ policy: ConflictPolicy, _ body: (Store, InMemorySyncServer, SyncClient) async throws -> Void) async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            for i in 1...3 { server.write("tasks", key: RowKey(.int(Int64(i))), Self.row("t\(i)")) }
            let sync = SyncClient(store: store, policy: policy)
            _ = try await sync.sync(with: server)
            try await store.write { tx in
                try tx.update("tasks", key: 1, ["title": "bad"])
                try tx.delete("tasks", key: 2)
                try tx.insert("tasks", ["id": 10, "title": "bad"])
            }
            let batch = try #require(try sync.nextBatch())
            let refused = batch.changes.map { RowResult(table: $0.table, key: $0.key, status: .error, error: RowError(reason: "no", action: .setAside)) }
            try sync.acknowledge(BatchAck(batchID: batch.id, results: refused))
            #expect(try sync.rejectedRows().map(\.key) == [1, 10, 2])
            try await body(store, server, sync)
        }
    }

    @Test func anEntryGoesWhenTheRowsLocalChangesAreGone() async throws {
        typealias Case = (name: String, policy: ConflictPolicy, server: [(RowKey, [String: Value]?)], reset: Bool?, kept: [RowKey])
        let deleteAll: [(RowKey, [String: Value]?)] = [(1, nil), (2, nil), (10, nil)]
        let cases: [Case] = [
            // Row 1 removed (no edit left), row 2's delete settled; the insert stays: the server never had it.
            ("deleted there, server wins", .serverWins, deleteAll, nil, [10]),
            // Row 1 is uploaded again as an insert of the local values: a local change remains.
            ("deleted there, client wins", .clientWins, deleteAll, nil, [1, 10]),
            ("the same change there", .serverWins, [(1, Self.row("bad"))], nil, [10, 2]),
            ("another value there, server wins", .serverWins, [(1, Self.row("theirs"))], nil, [10, 2]),
            ("another value there, client wins", .clientWins, [(1, Self.row("theirs"))], nil, [1, 10, 2]),
            ("another field changed there", .serverWins, [(1, Self.row("t1", priority: 5))], nil, [1, 10, 2]),
            ("left out of a snapshot", .serverWins, [(1, nil), (2, nil)], nil, [10]),
            ("a reset discarding local changes", .serverWins, [], false, []),
            ("a reset keeping local changes", .serverWins, [(1, nil)], true, [1, 10, 2]),
        ]
        for c in cases {
            try await setAside(c.policy) { store, server, sync in
                for (key, fields) in c.server { server.write("tasks", key: key, fields) }
                switch c.reset {
                case nil:
                    let snapshot = c.name.contains("snapshot")
                    let delta = try await server.pull(since: snapshot ? nil : try sync.anchor())
                    // A dry run changes nothing, the list included.
                    try sync.merge(delta, dryRun: true)
                    #expect(try sync.rejectedRows().map(\.key) == [1, 10, 2], "\(c.name): dry run")
                    try sync.merge(delta)
                case let keep?:
                    try sync.reset(with: try await server.pull(since: nil), keepLocalChanges: keep)
                }
                #expect(try sync.rejectedRows().map(\.key) == c.kept, "\(c.name)")
                // What stays listed is a row with local changes, still held back.
                for key in c.kept {
                    #expect(try await store.read { try $0.row("tasks", key: key, includingDeleted: true) }?.isPending == true, "\(c.name): row \(key)")
                }
                #expect(try sync.pendingChanges().filter { c.kept.contains($0.key) }.isEmpty, "\(c.name)")
                #expect(try store.verify().isConsistent, "\(c.name)")
            }
        }
    }

    /// The entry of a row the server deleted does not outlive it: a row the server creates again
    /// under the same key, and edited here, is uploaded, not held back as if set aside.
    @Test func aRowTheServerDeletedAndCreatedAgainIsNotHeldBack() async throws {
        try await setAside(.serverWins) { store, server, sync in
            server.write("tasks", key: 1, nil)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            server.write("tasks", key: 1, Self.row("new"))
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try await store.write { try $0.update("tasks", key: 1, ["title": "edited"]) }
            #expect(try sync.nextBatch()?.changes.map(\.key) == [1])
            _ = try await sync.sync(with: server)
            #expect(server.rows("tasks")[1]?["title"] == "edited")
        }
    }
}

import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// A live query follows a sync: rows another device uploaded arrive through a pull, and the
/// acknowledgement of this device's own upload yields nothing new.
@Suite(.timeLimit(.minutes(1))) struct LiveQuerySyncTests {
    @Test func aLiveQueryFollowsASync() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store)
            let open = Query("tasks", where: .equals("done", false), orderBy: [.ascending("title")])
            var results = store.observe(open).makeAsyncIterator()
            var states = store.observe(open, includingSyncState: true).makeAsyncIterator()
            #expect(try await results.next() == [])
            #expect(try await states.next() == [])

            // Another device's row, pulled.
            server.write("tasks", key: 1, ["title": "from the server", "priority": 0, "done": false, "notes": nil])
            _ = try await sync.sync(with: server)
            let pulled = try #require(try await results.next())
            #expect(pulled.map { $0["title"] } == ["from the server"] && pulled.map(\.status) == [.unchanged])
            #expect(try await states.next()?.map(\.key) == [1])

            // A local edit, then its upload: the edit is a new result; the acknowledgement is one
            // only for the sequence that follows sync state.
            try await store.write { tx in try tx.insert("tasks", ["id": 2, "title": "mine"]) }
            #expect(try await results.next()?.map(\.status) == [.unchanged, .inserted])
            #expect(try await states.next()?.map(\.status) == [.unchanged, .inserted])
            _ = try await sync.sync(with: server)
            #expect(server.rows("tasks")[2]?["title"] == "mine")
            #expect(try await states.next()?.map(\.status) == [.unchanged, .unchanged])

            // The server changes a row: both sequences see the new value, the value-following one
            // with nothing between (the acknowledgement above was skipped).
            server.write("tasks", key: 1, ["title": "renamed on the server", "priority": 0, "done": true, "notes": nil])
            _ = try await sync.sync(with: server)
            let renamed = try #require(try await results.next())
            #expect(renamed.map { $0["title"] } == ["mine"])
            #expect(try await states.next()?.map { $0["title"] } == ["mine"])
        }
    }
}

import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// A client reset through `sync()`: the transport says the server forgot the client or the anchor
/// is too old; `sync` pulls a full snapshot and resets by the app's policy, without retrying.
/// Also the batch limits of `sync`.
@Suite struct SyncResetTests {
    /// A store synced with `server` through `client`: rows 1–3 on both sides; then a local edit
    /// of row 1, and the server changes row 2 and deletes row 3.
    static func setUp(_ store: Store, _ server: InMemorySyncServer, _ transport: InMemorySyncServer.Client) async throws -> SyncClient {
        let sync = SyncClient(store: store)
        try await store.write { tx in for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)")]) } }
        _ = try await sync.sync(with: transport)
        #expect(try await store.read { try $0.pendingRows() }.isEmpty)
        try await store.write { tx in try tx.update("tasks", key: 1, ["title": "edited here"]) }
        server.write("tasks", key: 2, ["title": "changed there", "priority": 0, "done": false])
        server.write("tasks", key: 3, nil)
        return sync
    }

    @Test func aForgottenClientResetsKeepingItsEditsAndUploadsThem() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let transport = server.client(store.clientID)
            let sync = try await Self.setUp(store, server, transport)
            server.forget(client: store.clientID)

            let report = try await sync.sync(with: transport, backoff: .milliseconds(1))
            #expect(report.retries == 0, "a reset must not be retried")
            #expect(report.reset?.reason == .unknownClient && report.reset?.keptLocalChanges == true)
            #expect(report.reset?.merge.rowsApplied == 2)  // row 2 changed, row 3 removed; row 1 kept its edit
            #expect(report.batches == 1)
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            #expect(server.rows("tasks")[1]?["title"] == "edited here")
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")))
            #expect(try sync.anchor() != nil)
            // Known again: the next sync is an ordinary one.
            #expect(try await sync.sync(with: transport).reset == nil)
        }
    }

    /// A reset that keeps local changes keeps a deferred conflict too: the row is not uploaded
    /// as if the app had chosen its local values; it waits, in conflict against the server's
    /// current values, until the app resolves it. The same for a row deleted here and changed
    /// there, and for one changed here and deleted there.
    @Test func aResetKeepsDeferredConflictsUnresolved() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let transport = server.client(store.clientID)
            let sync = SyncClient(store: store, policy: .deferred)
            try await store.write { tx in for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)")]) } }
            _ = try await sync.sync(with: transport)
            try await store.write { tx in
                try tx.update("tasks", key: 1, ["title": "mine"])
                try tx.delete("tasks", key: 2)
                try tx.update("tasks", key: 3, ["title": "mine"])
            }
            server.write("tasks", key: 1, ["title": "theirs", "priority": 0, "done": false])
            server.write("tasks", key: 2, ["title": "theirs", "priority": 0, "done": false])
            server.write("tasks", key: 3, nil)
            _ = try await sync.sync(with: transport)
            #expect(try sync.conflicts().map(\.key) == [1, 2, 3])
            let conflictingFields = try sync.conflicts().map(\.fields)

            server.forget(client: store.clientID)
            let report = try await sync.sync(with: transport, backoff: .milliseconds(1))
            #expect(report.reset?.keptLocalChanges == true)
            #expect(try sync.conflicts().map(\.key) == [1, 2, 3], "the reset resolved the conflicts itself")
            #expect(try sync.conflicts().map(\.fields) == conflictingFields)
            #expect(server.rows("tasks")[1]?["title"] == "theirs")
            #expect(server.rows("tasks")[2]?["title"] == "theirs")
            #expect(server.rows("tasks")[3] == nil)
            #expect(try await store.read { try $0.row("tasks", key: 1)?["title"] } == "mine")

            // The app decides; then the rows go up.
            try sync.resolve("tasks", key: 1, with: .local)
            try sync.resolve("tasks", key: 2, with: .server)
            try sync.resolve("tasks", key: 3, with: .server)
            _ = try await sync.sync(with: transport)
            #expect(server.rows("tasks")[1]?["title"] == "mine")
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")))
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func anExpiredAnchorResetsDiscardingEditsWhenAsked() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let transport = server.client(store.clientID)
            let sync = try await Self.setUp(store, server, transport)
            server.expireChanges()

            let report = try await sync.sync(with: transport, onReset: .discardLocalChanges)
            #expect(report.retries == 0)
            #expect(report.reset?.reason == .anchorExpired && report.reset?.keptLocalChanges == false)
            #expect(report.batches == 0)
            #expect(try await store.read { try $0.row("tasks", key: 1)?["title"] } == "t1")
            #expect(try await store.read { try $0.row("tasks", key: 3) } == nil)
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")))
        }
    }

    @Test func withFailTheErrorIsThrownAndNothingChanges() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let transport = server.client(store.clientID)
            let sync = try await Self.setUp(store, server, transport)
            server.forget(client: store.clientID)
            let before = try observable(store)
            await #expect(throws: ResetRequired(.unknownClient, message: "client '\(store.clientID)' is not known here")) {
                _ = try await sync.sync(with: transport, backoff: .milliseconds(1), onReset: .fail)
            }
            #expect(try observable(store) == before)
        }
    }

    @Test func aResetAskedForOnPushDropsTheBatchInFlightAndItsRowsGoUpAgain() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let transport = server.client(store.clientID)
            let sync = try await Self.setUp(store, server, transport)
            // A batch frozen and sent, whose answer was lost; then the server forgets the client.
            let batch = try #require(try sync.nextBatch())
            try sync.markSent(batch)
            server.forget(client: store.clientID)
            let report = try await sync.sync(with: transport)
            #expect(report.reset?.reason == .unknownClient)
            #expect(try sync.inFlightBatch() == nil)
            #expect(!server.appliedBatches.contains(batch.id))
            #expect(server.rows("tasks")[1]?["title"] == "edited here")
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")))
        }
    }

    @Test(arguments: [(3, 1 << 20, 3), (500, 1, 7), (500, 1 << 20, 1)])
    func batchLimitsAreParameters(maxRows: Int, maxBytes: Int, batches: Int) async throws {
        try await withStoreAsync { store in
            try await store.write { tx in for i in 1...7 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
            let server = InMemorySyncServer()
            let report = try await SyncClient(store: store).sync(with: server, maxBatchRows: maxRows, maxBatchBytes: maxBytes)
            #expect(report.batches == batches)
            #expect(server.rows("tasks").count == 7)
        }
    }
}

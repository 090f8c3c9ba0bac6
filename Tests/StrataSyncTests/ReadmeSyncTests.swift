import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// The samples of docs/sync.md (merging, uploading, client reset), verbatim apart from the store set-up.
@Suite struct ReadmeSyncTests {
    @Test func syncTour() async throws {
        try await withStoreAsync { store in
            try await store.write { tx in
                try tx.insert("tasks", ["id": 7, "title": "Buy milk"])
                try tx.acknowledge("tasks", key: 7)
                try tx.update("tasks", key: 7, ["title": "Buy oat milk"])
            }
            // --- sample sync begins ---
            let sync = SyncClient(store: store, policy: .serverWins, tablePolicies: ["tasks": .deferred])

            let delta = ServerDelta(since: try sync.anchor(), anchor: "v42", tables: [
                TableDelta("tasks", upserts: [ServerRow(["id": 7, "title": "Buy soy milk"], timestamp: .now)], deletes: [8]),
            ])
            let report = try sync.merge(delta)          // one transaction, the anchor included
            print(report)                               // … 1 conflicts (1 deferred)

            for conflict in try sync.conflicts() {      // title: local "Buy oat milk", server "Buy soy milk"
                try sync.resolve(conflict.table, key: conflict.key, with: .local)
            }
            // --- sample sync ends ---
            // The server holds what its delta said, under its own anchor for it: InMemorySyncServer
            // counts versions, and refuses an anchor it never handed out ("v42", the sample's).
            let server = InMemorySyncServer()
            server.write("tasks", key: 7, ["title": "Buy soy milk", "priority": 0, "done": false, "notes": nil])
            try await store.write { tx in try tx.setStrataProperty(SyncClient.anchorProperty, "1") }
            // --- sample upload begins ---
            // Upload by hand: the batch stays "in flight" (stored) until its acknowledgement.
            if let batch = try sync.nextBatch(maxRows: 500) {
                let ack = try await server.push(batch)      // your transport; a retry resends `batch` as is
                try sync.acknowledge(ack)                   // originals become the values sent
            }

            // Or let Strata drive pull → merge → push → ack, with retries and back-off:
            let round = try await sync.sync(with: server) { progress in print(progress.phase, progress.remaining) }
            print(round.batches, round.merge)
            // --- sample upload ends ---
            #expect(report.deferred == 1)
            let row = try #require(try await store.read { try $0.row("tasks", key: 7) })
            #expect(row["title"] == "Buy oat milk" && !row.isPending)  // uploaded and acknowledged
            #expect(try sync.anchor() != nil)
            #expect(server.rows("tasks")[7]?["title"] == "Buy oat milk")

            try await store.write { tx in try tx.update("tasks", key: 7, ["notes": "from the corner shop"]) }
            // --- sample reset begins ---
            let transport = server.client(store.clientID)     // InMemorySyncServer can forget a client
            server.forget(client: store.clientID)             // …or expireChanges(): the anchor is too old
            let after = try await sync.sync(with: transport, onReset: .keepLocalChanges)
            if let reset = after.reset {                      // unknownClient, kept local changes: true
                print(reset.reason, "kept local changes:", reset.keptLocalChanges, reset.merge.rowsApplied)
            }
            // --- sample reset ends ---
            #expect(after.reset?.reason == .unknownClient && after.reset?.keptLocalChanges == true)
            #expect(server.rows("tasks")[7]?["notes"] == "from the corner shop")
        }
    }
}

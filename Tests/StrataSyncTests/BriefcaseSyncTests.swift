import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// A briefcase carries the store's properties (the sync anchor among them) and conflicts exactly.
@Suite struct BriefcaseSyncTests {
    @Test func aStoreRestoredFromItsBriefcaseContinuesFromItsAnchor() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store, policy: .deferred)
            try await store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "B", "priority": 1])
                try tx.insert("tasks", ["id": 2, "title": "two"])
                try tx.setProperty("app.user", "ada")
            }
            _ = try await sync.sync(with: server)
            try await store.write { tx in try tx.update("tasks", key: 1, ["title": "L", "priority": 2]) }
            server.write("tasks", key: 1, ["title": "S", "priority": 1, "done": false])
            _ = try await sync.sync(with: server)
            let anchor = try #require(try sync.anchor())
            let conflicts = try sync.conflicts()
            #expect(conflicts.map(\.fields) == [["title"]])

            let file = FileManager.default.temporaryDirectory.appendingPathComponent("bc-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: file) }
            let info = try store.exportBriefcase(to: file)
            #expect(info.storeProperties?[SyncClient.anchorProperty] == .string(anchor))
            #expect(info.storeProperties?["app.user"] == "ada")

            try await withStoreAsync { restored in
                try await restored.write { tx in try tx.setProperty("stale", 1) }
                try restored.importBriefcase(from: file, restoringProperties: true)
                let again = SyncClient(store: restored)
                #expect(try again.anchor() == anchor)
                #expect(try await restored.read { try $0.property("app.user") } == "ada")
                #expect(try await restored.read { try $0.property("stale") } == nil)
                // The conflict comes back exactly: title only; the local priority stays pending.
                #expect(try again.conflicts() == conflicts)
                try again.resolve("tasks", key: 1, with: .server)
                #expect(try await restored.read { try $0.row("tasks", key: 1) }.map { "\($0["title"]) \($0["priority"])" } == "\"S\" 2")
                // It continues from the anchor: nothing changed on the server, nothing comes back.
                let report = try await again.sync(with: server)
                #expect(report.merge.rowsApplied == 0 && report.reset == nil)
                #expect(server.rows("tasks")[1]?["priority"] == 2)
            }
            try await withStoreAsync { other in
                try other.importBriefcase(from: file)
                #expect(try SyncClient(store: other).anchor() == nil, "properties are restored only when asked")
            }
        }
    }
}

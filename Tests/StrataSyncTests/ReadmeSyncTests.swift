import Foundation
import Strata
import StrataSync
import Testing

/// The README's sync sample, verbatim apart from the store set-up.
@Suite struct ReadmeSyncTests {
    @Test func syncTour() throws {
        try withStore { store in
            try store.write { tx in
                try tx.insert("tasks", ["id": 7, "title": "Buy milk"])
                try tx.acknowledge("tasks", key: 7)
                try tx.update("tasks", key: 7, ["title": "Buy oat milk"])
            }
            // --- README sync begins ---
            let sync = SyncClient(store: store, policy: .serverWins, tablePolicies: ["tasks": .deferred])

            let delta = ServerDelta(since: try sync.anchor(), anchor: "v42", tables: [
                TableDelta("tasks", upserts: [ServerRow(["id": 7, "title": "Buy soy milk"], timestamp: .now)], deletes: [8]),
            ])
            let report = try sync.merge(delta)          // one transaction, the anchor included
            print(report)                               // … 1 conflicts (1 deferred)

            for conflict in try sync.conflicts() {      // title: local "Buy oat milk", server "Buy soy milk"
                try sync.resolve(conflict.table, key: conflict.key, with: .local)
            }
            // --- README sync ends ---
            #expect(report.deferred == 1)
            let row = try #require(try store.read { try $0.row("tasks", key: 7) })
            #expect(row["title"] == "Buy oat milk" && row.original("title") == "Buy soy milk")
            #expect(try sync.anchor() == "v42")
        }
    }
}

import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

@Suite struct SalvageSyncTests {
    /// The sync client's properties sort after the app's (`strata.…`): with enough app
    /// properties, `meta`'s B-tree splits and they end up on another leaf page than the catalog.
    /// Salvage must keep the batch number, or the next batch would reuse an id the server has
    /// already acknowledged.
    @Test func salvageKeepsTheBatchNumberWhenMetaHasSplit() async throws {
        try await withTemporaryFolderAsync { base in
            let (damaged, recovered) = (base + "/damaged", base + "/recovered")
            let uploaded: UInt64 = try await {
                let store = try Store(path: damaged)
                defer { store.close() }
                try store.createTable(tasks)
                let server = InMemorySyncServer()
                let sync = SyncClient(store: store)
                var last: UInt64 = 0
                for i in 1...3 {
                    try await store.write { tx in try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) }
                    last = try #require(try sync.nextBatch()).number
                    _ = try await sync.sync(with: server)
                }
                try await store.write { tx in
                    for i in 0..<60 { try tx.setProperty("app.\(i)", .string(String(repeating: "v", count: 300))) }
                }
                try store.checkpoint()
                return last
            }()
            let report = try Store.salvage(from: damaged, into: recovered)
            #expect(!report.metaIncomplete, "\(report)")
            let store = try Store(path: recovered)
            defer { store.close() }
            try await store.write { tx in try tx.insert("tasks", ["id": 100, "title": "after salvage"]) }
            let next = try #require(try SyncClient(store: store).nextBatch())
            #expect(next.number == uploaded + 1, "batch \(next.number) after \(uploaded) were uploaded")
        }
    }
}

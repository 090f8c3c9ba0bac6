import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// `withTemporaryStore` (StrataTesting): a working store with the tables asked for, and no folder
/// left behind, whether the test returns or throws.
struct TemporaryStoreTests {
    struct Failure: Error {}

    @Test func aTemporaryStoreHasItsTablesAndIsRemovedAfterwards() throws {
        let folder = try withTemporaryStore(tables: [tasks]) { store, folder in
            #expect(FileManager.default.fileExists(atPath: folder + "/data.mdb"))
            #expect(store.options.durability == .noSync)
            try store.write { try $0.insert("tasks", ["id": 1, "title": "Buy milk"]) }
            #expect(try store.read { try $0.row("tasks", key: 1)?["title"] } == "Buy milk")
            return folder
        }
        #expect(!FileManager.default.fileExists(atPath: folder))
    }

    @Test func theFolderIsRemovedWhenTheTestThrows() throws {
        var seen: String?
        #expect(throws: Failure.self) {
            try withTemporaryStore { _, folder in
                seen = folder
                throw Failure()
            }
        }
        let folder = try #require(seen)
        #expect(!FileManager.default.fileExists(atPath: folder))
    }

    @Test func givenOptionsAreKept() throws {
        var options = StoreOptions()
        options.durability = .noMetaSync
        try withTemporaryStore(options: options) { store, _ in
            #expect(store.options.durability == .noMetaSync)
        }
    }

    @Test func theAsyncFormSyncsWithTheInMemoryServer() async throws {
        let server = InMemorySyncServer()
        let folder = try await withTemporaryStore(tables: [tasks]) { store, folder in
            try await store.write { try $0.insert("tasks", ["id": 7, "title": "Call mum"]) }
            let report = try await SyncClient(store: store).sync(with: server)
            #expect(report.batches == 1)
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            return folder
        }
        #expect(!FileManager.default.fileExists(atPath: folder))
    }
}

/// The examples of StrataTesting's documentation, as written there.
struct StrataTestingDocExamples {
    @Test func aTaskCanBeAdded() throws {
        try withTemporaryStore(tables: [.fixed("tasks", fields: [.int("id"), .string("title")])]) { store, _ in
            try store.write { try $0.insert("tasks", ["id": 1, "title": "Buy milk"]) }
            #expect(try store.read { try $0.count("tasks") } == 1)
        }
    }

    @Test func theLandingPageExampleSyncs() async throws {
        let server = InMemorySyncServer()
        try await withTemporaryStore(tables: [tasks]) { store, _ in
            try await store.write { try $0.insert("tasks", ["id": 1, "title": "Buy milk"]) }
            _ = try await SyncClient(store: store).sync(with: server)
        }
        let pulled = try await server.pull(since: nil)
        #expect(pulled.tables.flatMap(\.upserts).map { $0.fields["title"] } == ["Buy milk"])
    }
}

import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// Arguments out of range — a negative query limit, a page or batch size below 1 — are refused
/// with `invalidOperation` and a message naming the argument, never a trap, and change nothing.
@Suite struct BadArgumentTests {
    @Test func aNegativeQueryLimitIsRefused() throws {
        try withStore { store in
            try store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a"]) }
            for query in [Query("tasks", limit: -1), Query("tasks", orderBy: [.ascending("title")], limit: -5)] {
                let rows = #expect(throws: StrataError.self) { try store.read { try $0.rows(query) } }
                #expect(rows?.code == .invalidOperation)
                #expect(rows?.message.contains("limit of \(query.limit!)") == true)
                let page = #expect(throws: StrataError.self) { try store.read { try $0.page(query, size: 10) } }
                #expect(page?.code == .invalidOperation)
            }
            // A limit of 0 is a valid, empty answer.
            #expect(try store.read { try $0.rows(Query("tasks", limit: 0)) }.isEmpty)
        }
    }

    @Test(arguments: [0, -1])
    func aPageSizeBelowOneIsRefused(_ size: Int) throws {
        try withStore { store in
            try store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a"]) }
            try store.createView("by_title", Query("tasks", orderBy: [.ascending("title")]))
            let query = #expect(throws: StrataError.self) { try store.read { try $0.page(Query("tasks"), size: size) } }
            #expect(query?.code == .invalidOperation)
            #expect(query?.message.contains("page size of \(size)") == true)
            let view = #expect(throws: StrataError.self) { try store.read { try $0.page(view: "by_title", size: size) } }
            #expect(view?.code == .invalidOperation)
            #expect(view?.message.contains("page size of \(size)") == true)
        }
    }

    @Test func aBatchWithNoRoomForARowIsRefused() async throws {
        try await withStoreAsync { store in
            try await store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a"]) }
            let sync = SyncClient(store: store)
            let server = InMemorySyncServer()
            for (rows, bytes) in [(0, 1 << 20), (500, 0), (-1, -1)] {
                let next = #expect(throws: StrataError.self) { try sync.nextBatch(maxRows: rows, maxBytes: bytes) }
                #expect(next?.code == .invalidOperation)
                #expect(next?.message.contains("maxRows is \(rows)") == true)
                await #expect {
                    _ = try await sync.sync(with: server, maxBatchRows: rows, maxBatchBytes: bytes)
                } throws: { error in
                    let e = error as? StrataError
                    return e?.code == .invalidOperation && e?.message.contains("maxBatchRows is \(rows)") == true
                }
            }
            // Nothing was frozen or sent: the row is still pending and the next sync uploads it.
            #expect(server.appliedBatches.isEmpty)
            #expect(server.rows("tasks").isEmpty)
            _ = try await sync.sync(with: server)
            #expect(server.rows("tasks").count == 1)
        }
    }

    @Test(arguments: [(0, 10), (10, 0), (-3, 10)])
    func anHTTPTransportWithoutRoomForARowThrowsOnPull(_ pageSize: Int, _ maxPages: Int) async throws {
        // Nothing listens on port 9 (discard): a request, if one were made, would fail with `io`.
        let transport = HTTPSyncTransport(server: URL(string: "http://127.0.0.1:9")!, token: "t", timeout: 2, pageSize: pageSize, maxPages: maxPages)
        await #expect {
            _ = try await transport.pull(since: nil)
        } throws: { error in
            let e = error as? StrataError
            return e?.code == .invalidOperation && e?.message.contains("pageSize \(pageSize) and maxPages \(maxPages)") == true
        }
    }
}

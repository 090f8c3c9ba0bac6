import Foundation
import Strata
import Synchronization
import Testing

@Suite struct ReadmeReadingTests {
    struct TodoItem: Codable, Equatable {
        var id: Int64
        var title: String
        var priority: Int
        var done: Bool
    }

    @Test func readingTour() throws {
        try withTemporaryFolder { folder in
            let store = try Store(path: folder)
            try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title"), .int("priority", default: 0), .bool("done", default: false)]))
            try store.write { tx in
                for i in 1...30 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "task \(i)", "priority": .int(Int64(i % 4))]) }
            }
            let seen = Locked(0)
            // --- sample reading begins ---
            try store.createIndex("by_priority", on: "tasks", fields: ["priority"])
            let urgent = Query("tasks", where: .and([.equals("done", false), .lessThan("priority", 2)]),
                               orderBy: [.ascending("priority"), .descending("title")], limit: 10)
            let rows = try store.read { try $0.rows(urgent) }          // an index range scan, then filter and sort
            let plan = try store.read { try $0.explain(urgent) }       // "index by_priority ranges (1), then sort (…)"

            // Pages continue from the last row seen, never from an offset.
            var token: PageToken? = nil
            repeat {
                let page = try store.read { try $0.page(Query("tasks", orderBy: [.ascending("priority")]), size: 8, after: token) }
                token = page.next
            } while token != nil

            // A named view is a query kept materialized as rows change.
            try store.createView("open by priority", Query("tasks", where: .equals("done", false), orderBy: [.ascending("priority")]))
            let firstPage = try store.read { try $0.page(view: "open by priority", size: 20) }

            // Typed records beside rows; history and time travel; change notifications.
            try store.write { try $0.upsert(TodoItem(id: 31, title: "Pay rent", priority: 1, done: false), into: "tasks") }
            let task = try store.read { try $0.record(TodoItem.self, from: "tasks", key: 31) }
            let token2 = store.observe { commit in seen.withLock { $0 += commit.changes.count } }
            try store.write { try $0.update("tasks", key: 31, ["done": true]) }
            let before = try store.read { try $0.row("tasks", key: 31, asOf: 31) }   // as it was at LSN 31
            // --- sample reading ends ---
            #expect(rows.count == 10 && rows.allSatisfy { $0["priority"].intValue! < 2 })
            #expect(plan == "index by_priority ranges (1), then sort (no index gives this order: each page sorts the whole result)")
            #expect(firstPage.rows.count == 20 && firstPage.next != nil)
            #expect(task == TodoItem(id: 31, title: "Pay rent", priority: 1, done: false))
            #expect(before?["done"] == false && seen.withLock { $0 } == 1)
            token2.cancel()
        }
    }
}

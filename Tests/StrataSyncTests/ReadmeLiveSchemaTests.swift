import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// The samples of docs/live-queries.md and docs/schema.md, verbatim between the
/// markers, written as an app would: in an `async` function, the tables from the server's file.
@Suite(.timeLimit(.minutes(1))) struct ReadmeLiveSchemaTests {
    static let tablesURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Server/Examples/tables.json")

    @MainActor @Test func schemaThenLiveQuery() async throws {
        try await withTemporaryStore(tables: []) { store, _ in
            let tablesURL = Self.tablesURL
            // --- sample schema begins ---
            try TablesFile(contentsOf: tablesURL).createTables(in: store)   // tables and associations
            var migrator = Migrator()
            migrator.registerMigration("v2: notes") { tx in try tx.addField(.string("notes", nullable: true), to: "tasks") }
            try migrator.migrate(store)                                     // at every launch; runs what has not run
            // --- sample schema ends ---
            #expect(try migrator.appliedMigrations(in: store) == ["v2: notes"])
            #expect(try await store.read { try $0.associations() }.map(\.parent) == ["tasks"])

            try await store.write { tx in try tx.insert("tasks", ["id": 1, "title": "Buy milk"]) }
            var edits: Task<Void, any Error>? = nil
            var seen: [[Value]] = []
            // --- sample live begins ---
            let open = Query("tasks", where: .equals("done", false), orderBy: [.ascending("title")])
            for try await rows in store.observe(open) {   // the rows now, then after each commit that changed them
                print(rows.map { $0["title"] })
                // --- sample live pauses ---
                seen.append(rows.map { $0["title"] })
                if rows.map({ $0["title"] }) == ["Call mum"] { break }
                // Edits made once the first result is in, as a user would.
                if edits == nil {
                    edits = Task {
                        try await store.write { tx in try tx.insert("tasks", ["id": 2, "title": "Call mum"]) }
                        try await store.write { tx in try tx.update("tasks", key: 1, ["done": true]) }
                    }
                }
                // --- sample live resumes ---
            }
            let model = LiveQuery(store, open)            // @Observable, for a SwiftUI view: model.rows
            // --- sample live ends ---
            try await edits?.value
            #expect(seen.first == ["Buy milk"] && seen.last == ["Call mum"])
            while !model.isLoaded { await Task.yield() }
            #expect(model.rows.map { $0["title"] } == ["Call mum"])
        }
    }
}

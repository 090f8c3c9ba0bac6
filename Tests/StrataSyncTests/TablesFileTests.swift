import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// One schema: the tables file strata-server runs with creates an app's tables, and its
/// associations, stored with the store, order every SyncClient's uploads.
@Suite struct TablesFileTests {
    static let example = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Server/Examples/tables.json")

    static func file(_ json: String) throws(StrataError) -> TablesFile { try TablesFile(json: Data(json.utf8)) }

    @Test func theServersExampleLoads() throws {
        let file = try TablesFile(contentsOf: Self.example)
        #expect(file.tables.map(\.name) == ["tasks", "comments", "settings"])
        #expect(file.associations == [Association(child: "comments", field: "task", parent: "tasks")])
        #expect(file[table: "comments"]?.serverAssignedKey == true && file[table: "settings"]?.isPropertyBag == true)
        let tasks = try #require(file.schemas.first)
        #expect(tasks.primaryKey == ["id"] && tasks.field("done") == .bool("done", default: false) && tasks.field("notes")?.isNullable == true)
        // Written back and read again, it is the same file.
        #expect(try TablesFile(json: JSONEncoder().encode(file)) == file)
    }

    /// A file that does not hold together is refused, saying what is wrong.
    @Test(arguments: [
        (#"{"tables": [{"name": "t", "primaryKey": ["id"], "fields": [{"name": "id", "type": "int"}]}, {"name": "t", "primaryKey": ["id"], "fields": [{"name": "id", "type": "int"}]}]}"#,
         "table 't' is listed twice"),
        (#"{"tables": [{"name": "t", "primaryKey": ["nope"], "fields": [{"name": "id", "type": "int"}]}]}"#,
         "key field 'nope' is not among its fields"),
        (#"{"tables": [{"name": "t", "primaryKey": ["id"], "serverAssignedKey": true, "fields": [{"name": "id", "type": "string"}]}]}"#,
         "a server-assigned key needs a single int key field"),
        (#"{"tables": [{"name": "t", "primaryKey": ["id"], "fields": [{"name": "id", "type": "int"}, {"name": "n", "type": "int", "default": {"string": "x"}}]}]}"#,
         "the default of field 'n' is string, not int"),
        (#"{"tables": [{"name": "t", "primaryKey": ["id"], "fields": [{"name": "id", "type": "int"}]}], "associations": [{"child": "t", "field": "parent", "parent": "t"}]}"#,
         "association t.parent → t names a table or field the file does not define"),
        (#"{"tables": [{"name": "t", "primaryKey": ["id"], "fields": [{"name": "id", "type": "integer"}]}]}"#,
         "integer"),
    ])
    func aBadFileIsRefused(json: String, message: String) {
        #expect { try Self.file(json) } throws: { ($0 as? StrataError)?.code == .malformedInput && "\($0)".contains(message) }
    }

    @Test func aMissingFileSaysWhichFile() {
        #expect { try TablesFile(contentsOf: URL(fileURLWithPath: "/nonexistent/tables.json")) } throws: {
            ($0 as? StrataError)?.code == .io && "\($0)".contains("/nonexistent/tables.json")
        }
    }

    /// An app creates its tables from the file and syncs without passing associations: the new
    /// comment uploads after its new task, though "comments" sorts first.
    @Test func aSyncClientUsesTheStoredAssociations() async throws {
        try await withTemporaryStore(tables: []) { store, _ in
            let file = try TablesFile(contentsOf: Self.example)
            try file.createTables(in: store)
            try file.createTables(in: store)  // again: the same tables are left as they are
            #expect(try await store.read { try $0.associations() } == file.associations)
            #expect(try await store.read { try $0.properties() }.isEmpty)
            try await store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "new task"])
                try tx.insert("comments", ["id": -1, "task": 1, "text": "on the new task"])
            }
            #expect(try SyncClient(store: store).pendingChanges().map(\.table) == ["tasks", "comments"])
            // Associations passed to the client are used instead of the stored ones.
            #expect(try SyncClient(store: store, associations: []).pendingChanges().map(\.table) == ["comments", "tasks"])

            // The server gives the task its own key: the comment, sent after it, follows it there,
            // and so does the comment on this device, by the stored associations.
            let server = InMemorySyncServer(associations: file.associations) { c in
                c.table == "tasks" && c.kind == .insert ? .ok(c.table, c.key, newKey: 100) : nil
            }
            _ = try await SyncClient(store: store).sync(with: server)
            #expect(server.rows("comments").values.map { $0["task"] } == [100])
            #expect(try await store.read { try $0.rows("comments").map { $0["task"] } } == [100])
        }
    }

    /// A file whose table differs from the store's creates nothing and stores nothing.
    @Test func aConflictingTableCreatesNothing() async throws {
        try await withTemporaryStore(tables: [.fixed("tasks", primaryKey: ["id"], fields: [.int("id")])]) { store, _ in
            let file = try TablesFile(contentsOf: Self.example)
            #expect { try file.createTables(in: store) } throws: {
                ($0 as? StrataError)?.code == .tableExists && "\($0)".contains("add 'title', 'priority', 'done', 'notes' with addField(_:to:)")
            }
            #expect(try await store.read { try $0.tables.map(\.name) } == ["tasks"])
            #expect(try await store.read { try $0.associations() } == [])
        }
    }

    /// A store made by an earlier `strata create` kept its associations in a property: still read.
    @Test func associationsKeptInTheOldPropertyAreRead() async throws {
        try await withTemporaryStore(tables: []) { store, _ in
            try await store.write { tx in
                try tx.setStrataProperty("strata.cli.associations", #"[{"child":"comments","field":"task","parent":"tasks"}]"#)
            }
            #expect(try await store.read { try $0.associations() } == [Association(child: "comments", field: "task", parent: "tasks")])
            try await store.write { tx in try tx.setAssociations([]) }
            #expect(try await store.read { try $0.associations() } == [])
            #expect(try await store.read { try $0.property("strata.cli.associations") } == nil)
        }
    }
}

import Foundation
import Strata
import Testing

@Suite struct SchemaChangeTests {
    func prepared(_ body: (Store, String) throws -> Void) throws {
        try withStore { store, path in
            try store.createTable(tasksSchema)
            try store.write { tx in
                for i in 1...4 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)")]) }
                for i in 1...3 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
                try tx.update("tasks", key: 1, ["notes": "local note"])
                try tx.delete("tasks", key: 3)
            }
            try body(store, path)
        }
    }

    @Test func addingAFieldWithADefaultFillsExistingRowsWithoutMakingThemPending() throws {
        try prepared { store, path throws in
            let pendingBefore = try store.read { try $0.pendingRows().map { "\($0.key) \($0.status)" } }
            let lsnBefore = try store.read { try $0.lastLSN }
            try store.addField(.string("owner", default: "nobody"), to: "tasks")
            try store.addField(.int("estimate", nullable: true), to: "tasks")
            let rows = try store.read { try $0.rows("tasks", includingDeleted: true) }
            #expect(rows.allSatisfy { $0["owner"] == "nobody" && $0["estimate"] == .null })
            #expect(try store.read { try $0.pendingRows().map { "\($0.key) \($0.status)" } } == pendingBefore)
            #expect(try store.read { try $0.history("tasks", key: 2) }.last?.kind == .schemaChange)
            try store.write { try $0.insert("tasks", ["id": 9, "title": "new", "estimate": 3]) }
            #expect(try store.read { try $0.row("tasks", key: 9) }?["owner"] == "nobody")
            #expect(try store.verify().isConsistent)
            try store.rebuild()
            #expect(try store.read { try $0.rows("tasks", includingDeleted: true) }.count == 5)
            // As of before the change, the field had no value.
            let replayed = try store.replay(into: path + "-before", through: lsnBefore)
            defer { try? FileManager.default.removeItem(atPath: path + "-before") }
            #expect(try replayed.read { try $0.row("tasks", key: 2) }?["owner"] == .null)
        }
    }

    @Test func aRequiredFieldWithoutDefaultIsRefusedOnATableWithRows() throws {
        try prepared { store, _ throws in
            let e = #expect(throws: StrataError.self) { try store.addField(.string("owner"), to: "tasks") }
            #expect(e?.code == .invalidSchema && e?.message.contains("give it a default") == true)
            #expect(try store.read { try $0.schema("tasks").fields.map(\.name) } == tasksSchema.fields.map(\.name))
            let twice = #expect(throws: StrataError.self) { try store.addField(.string("title", nullable: true), to: "tasks") }
            #expect(twice?.code == .invalidSchema)
        }
    }

    @Test func droppingAFieldRemovesItsValuesButNotItsHistory() throws {
        try prepared { store, path throws in
            try store.dropField("notes", from: "tasks")
            let row = try #require(try store.read { try $0.row("tasks", key: 1) })
            // The only local change was to the dropped field: the row is no longer pending.
            #expect(!row.fieldNames.contains("notes") && row.status == .unchanged)
            let e = #expect(throws: StrataError.self) { try store.write { try $0.update("tasks", key: 2, ["notes": "x"]) } }
            #expect(e?.code == .fieldNotFound)
            let history = try store.read { try $0.history("tasks", key: 1) }
            #expect(history.contains { $0.changes.contains { $0.field == "notes" && $0.current == "local note" } })
            #expect(try store.verify().isConsistent)
            // The name can be declared again; it is a new field, with none of the old values.
            try store.addField(.string("notes", nullable: true), to: "tasks")
            #expect(try store.read { try $0.row("tasks", key: 1) }?["notes"] == .null)
            try store.rebuild()
            #expect(try store.verify().isConsistent)
            #expect(try store.read { try $0.row("tasks", key: 1) }?["notes"] == .null)
            // The schema survives a reopen.
            let fields = try store.read { try $0.schema("tasks").fields.map(\.name) }
            #expect(fields.last == "notes")
            let key = #expect(throws: StrataError.self) { try store.dropField("id", from: "tasks") }
            #expect(key?.code == .invalidOperation)
        }
    }

    @Test func aFieldUsedByAnIndexCannotBeDropped() throws {
        try prepared { store, _ throws in
            try store.createIndex("by_title", on: "tasks", fields: ["title"])
            let e = #expect(throws: StrataError.self) { try store.dropField("title", from: "tasks") }
            #expect(e?.code == .invalidOperation && e?.message.contains("by_title") == true)
        }
    }

    @Test func schemaChangesSurviveReopening() throws {
        try withTemporaryFolder { path in
            do {
                let store = try Store(path: path)
                try store.createTable(tasksSchema)
                try store.write { try $0.insert("tasks", ["id": 1, "title": "t", "notes": "n"]) }
                try store.dropField("notes", from: "tasks")
                try store.addField(.int("size", default: 1), to: "tasks")
            }
            let store = try Store(path: path)
            let row = try #require(try store.read { try $0.row("tasks", key: 1) })
            #expect(row["size"] == 1 && !row.fieldNames.contains("notes"))
            #expect(try store.verify().isConsistent)
        }
    }
}

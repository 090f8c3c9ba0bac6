import Foundation
import Strata
import Testing

/// The migrator runs each named step once per store, in order, and records it with the store;
/// a step that fails leaves the store as before it. Changing a table says how.
@Suite struct MigratorTests {
    struct Refused: Error {}

    static func migrator(failingAt failing: String? = nil) -> Migrator {
        var m = Migrator()
        m.registerMigration("v1 tasks") { tx in
            try tx.createTable(.fixed("tasks", primaryKey: ["id"], fields: [.int("id"), .string("title")]))
            try tx.insert("tasks", ["id": 1, "title": "first"])
        }
        m.registerMigration("v2 notes") { tx in
            try tx.addField(.string("notes", nullable: true), to: "tasks")
            try tx.update("tasks", key: 1, ["notes": "added by v2"])
            if failing == "v2 notes" { throw Refused() }
        }
        m.registerMigration("v3 lists") { tx in
            try tx.createTable(.fixed("lists", primaryKey: ["id"], fields: [.int("id")]))
        }
        return m
    }

    @Test func eachStepRunsOnceInOrderAndIsRecordedWithTheStore() throws {
        try withStore { store, path throws in
            let m = Self.migrator()
            #expect(try !m.hasCompletedMigrations(in: store))
            #expect(try m.migrate(store) == ["v1 tasks", "v2 notes", "v3 lists"])
            #expect(try m.appliedMigrations(in: store) == ["v1 tasks", "v2 notes", "v3 lists"])
            #expect(try m.hasCompletedMigrations(in: store))
            let lsn = try store.read { try $0.lastLSN }
            // Again: nothing runs (v1's insert would be a duplicate key, v2's addField is fine).
            #expect(try m.migrate(store) == [])
            #expect(try store.read { try $0.lastLSN } == lsn)
            // The record is the store's own, not an app property.
            #expect(try store.read { try $0.properties() }.isEmpty)
            store.close()

            // Reopened, with a step added at the end: only that one runs.
            let reopened = try Store(path: path)
            defer { reopened.close() }
            var longer = Self.migrator()
            longer.registerMigration("v4 index") { tx in try tx.createIndex("by_title", on: "tasks", fields: ["title"]) }
            #expect(try longer.migrate(reopened) == ["v4 index"])
            #expect(try reopened.read { try $0.row("tasks", key: 1) }?["notes"] == "added by v2")
        }
    }

    /// The record goes where the store goes: a copy and a salvaged store ran the same steps.
    @Test func theRecordSurvivesACopyAndASalvage() throws {
        try withTemporaryFolder { base in
            do {
                let store = try Store(path: base + "/original")
                defer { store.close() }
                try Self.migrator().migrate(store)
                try store.checkpoint()
                try FileManager.default.createDirectory(atPath: base + "/copy", withIntermediateDirectories: true)
                try store.copy(to: base + "/copy")
            }
            _ = try Store.salvage(from: base + "/original", into: base + "/salvaged")
            for folder in ["copy", "salvaged"] {
                let store = try Store(path: base + "/" + folder)
                defer { store.close() }
                #expect(try Self.migrator().migrate(store) == [], "\(folder)")
                #expect(try Self.migrator().hasCompletedMigrations(in: store), "\(folder)")
            }
        }
    }

    @Test func aFailingStepLeavesTheStoreAsBeforeIt() throws {
        try withStore { store, _ throws in
            #expect { try Self.migrator(failingAt: "v2 notes").migrate(store) } throws: { error in
                let e = error as? StrataError
                return e?.code == .invalidOperation && e?.cause is Refused && e!.message.contains("migration step 'v2 notes' failed and was rolled back")
            }
            // v1 stays; v2's field and edit are rolled back; v3 did not run.
            #expect(try Self.migrator().appliedMigrations(in: store) == ["v1 tasks"])
            #expect(try store.read { try $0.schema("tasks").fields.map(\.name) } == ["id", "title"])
            #expect(try store.read { try $0.row("tasks", key: 1) }?["title"] == "first")
            #expect(try store.read { try $0.tables.map(\.name) } == ["tasks"])
            // Fixed, it goes on from there.
            #expect(try Self.migrator().migrate(store) == ["v2 notes", "v3 lists"])
        }
    }

    @Test func aStoreMigratedByOtherStepsIsRefused() throws {
        try withStore { store, _ throws in
            try Self.migrator().migrate(store)
            var other = Migrator()
            other.registerMigration("v1 tasks") { _ in }
            other.registerMigration("v2 something else") { _ in }
            #expect { try other.migrate(store) } throws: {
                ($0 as? StrataError)?.code == .invalidOperation && "\($0)".contains("'v2 notes', which this migrator does not register")
            }
            var twice = Migrator()
            twice.registerMigration("a") { _ in }
            twice.registerMigration("a") { _ in }
            #expect { try twice.migrate(store) } throws: { "\($0)".contains("registers step 'a' twice") }
            #expect(try Self.migrator().appliedMigrations(in: store) == ["v1 tasks", "v2 notes", "v3 lists"])
        }
    }

    /// Creating a table whose definition differs from the stored one says what differs and how
    /// to change it; adding a field the table already has, identically, does nothing.
    @Test func changingATableSaysHow() throws {
        try withStore { store, _ throws in
            try store.createTable(.fixed("tasks", primaryKey: ["id"], fields: [.int("id"), .string("title"), .int("old", nullable: true)]))
            let wanted = TableSchema.fixed("tasks", primaryKey: ["id"], fields: [.int("id"), .string("title", nullable: true), .bool("done", default: false)])
            #expect { try store.createTable(wanted) } throws: { error in
                let m = (error as? StrataError)?.message ?? ""
                return (error as? StrataError)?.code == .tableExists && m.contains("add 'done' with addField(_:to:)")
                    && m.contains("drop 'old' with dropField(_:from:)") && m.contains("field 'title' is string, not null, not string, nullable")
                    && m.contains("Migrator")
            }
            try store.addField(.bool("done", default: false), to: "tasks")
            let lsn = try store.read { try $0.lastLSN }
            try store.addField(.bool("done", default: false), to: "tasks")
            #expect(try store.read { try $0.lastLSN } == lsn)
            #expect { try store.addField(.bool("done", default: true), to: "tasks") } throws: {
                ($0 as? StrataError)?.code == .invalidSchema && "\($0)".contains("defined as bool, not null, default false")
            }
        }
    }
}

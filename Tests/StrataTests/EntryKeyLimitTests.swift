import Foundation
import Strata
import Testing

/// Index and named-view entries are LMDB keys (indexed or sorted values plus the row key), so
/// they have LMDB's 511-byte limit although the row key alone is within its own limit. An entry
/// over it is refused at the edit — before anything is logged — and never reaches a checkpoint.
@Suite struct EntryKeyLimitTests {
    /// A table whose row keys are long (a 400-character string: within the 500-byte row key
    /// limit), so that a 150-character title makes an index or view entry of about 560 bytes.
    static let notes = TableSchema.fixed("notes", primaryKey: ["id"], fields: [.string("id"), .string("title")])
    static let longID = String(repeating: "k", count: 400)
    static let otherID = String(repeating: "m", count: 400)
    static let longTitle = String(repeating: "t", count: 150)

    /// Runs the edits that must be refused for a table with an index or view named `name`:
    /// an insert and an update, each leaving the row, the log and later checkpoints as they were.
    func expectRefused(_ store: Store, path: String, name: String) throws {
        try store.write { tx in try tx.insert("notes", ["id": .string(Self.longID), "title": "short"]) }
        let lsn = try store.read { try $0.lastLSN }

        let insert = #expect(throws: StrataError.self) {
            try store.write { tx in try tx.insert("notes", ["id": .string(Self.otherID), "title": .string(Self.longTitle)]) }
        }
        #expect(insert?.code == .invalidValue)
        #expect(insert?.message.contains("'\(name)'") == true)
        #expect(insert?.message.contains("511") == true)
        #expect(try store.read { try $0.row("notes", key: RowKey(.string(Self.otherID))) } == nil)
        #expect(try store.read { try $0.lastLSN } == lsn)

        let update = #expect(throws: StrataError.self) {
            try store.write { tx in try tx.update("notes", key: RowKey(.string(Self.longID)), ["title": .string(Self.longTitle)]) }
        }
        #expect(update?.code == .invalidValue)
        #expect(try store.read { try $0.row("notes", key: RowKey(.string(Self.longID)))?["title"] } == "short")
        #expect(try store.read { try $0.lastLSN } == lsn)

        // The refused edit leaves its transaction as it was: the closure may go on and commit.
        try store.write { tx in
            #expect(throws: StrataError.self) {
                try tx.insert("notes", ["id": .string(Self.otherID), "title": .string(Self.longTitle)])
            }
            try tx.insert("notes", ["id": .string(Self.otherID), "title": "fine"])
        }
        #expect(try store.read { try $0.lastLSN } == lsn + 1)

        // Nothing over the limit entered the overlay: checkpoints, later writes and a reopen work.
        try store.checkpoint()
        try store.write { tx in try tx.insert("notes", ["id": "x", "title": .string(Self.longTitle)]) }
        try store.checkpoint()
        store.close()
        let reopened = try Store(path: path)
        defer { reopened.close() }
        #expect(try reopened.read { try $0.row("notes", key: RowKey(.string(Self.otherID)))?["title"] } == "fine")
        try reopened.checkpoint()
    }

    @Test func anIndexEntryOverLMDBsKeyLimitIsRefusedAtTheEdit() throws {
        try withStore { store, path in
            try store.createTable(Self.notes)
            try store.createIndex("notes_by_title", on: "notes", fields: ["title"])
            try expectRefused(store, path: path, name: "notes_by_title")
        }
    }

    @Test func aNamedViewEntryOverLMDBsKeyLimitIsRefusedAtTheEdit() throws {
        try withStore { store, path in
            try store.createTable(Self.notes)
            try store.createView("notes_by_title", Query("notes", orderBy: [.ascending("title")]))
            try expectRefused(store, path: path, name: "notes_by_title")
        }
    }

    @Test func anIndexOrViewOverARowWhoseEntryIsTooLongIsNotCreated() throws {
        try withStore { store, _ in
            try store.createTable(Self.notes)
            // Without an index or view the row is fine: its key is within the row key limit.
            try store.write { tx in try tx.insert("notes", ["id": .string(Self.longID), "title": .string(Self.longTitle)]) }
            let lsn = try store.read { try $0.lastLSN }

            let index = #expect(throws: StrataError.self) {
                try store.createIndex("notes_by_title", on: "notes", fields: ["title"])
            }
            #expect(index?.code == .invalidValue)
            #expect(index?.message.contains("'notes_by_title'") == true)
            #expect(try store.read { try $0.indexes("notes") }.isEmpty)

            let view = #expect(throws: StrataError.self) {
                try store.createView("notes_view", Query("notes", orderBy: [.descending("title")]))
            }
            #expect(view?.code == .invalidValue)
            #expect(view?.message.contains("'notes_view'") == true)
            #expect(try store.read { try $0.namedViews }.isEmpty)

            #expect(try store.read { try $0.lastLSN } == lsn)
            try store.checkpoint()
            // Rows with short enough entries still get an index.
            try store.write { tx in try tx.update("notes", key: RowKey(.string(Self.longID)), ["title": "short"]) }
            try store.createIndex("notes_by_title", on: "notes", fields: ["title"])
            try store.checkpoint()
        }
    }
}

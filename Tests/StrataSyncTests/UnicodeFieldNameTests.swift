import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// Field names compare by their UTF-8 bytes, on every way in (docs/errors-and-validation.md,
/// "Strings compare byte for byte"): `"café"` written with U+00E9 (NFC) and with "e" + U+0301
/// (NFD) are two names, though Swift's `==` calls them equal. A table holds one of two such
/// names; a name in the other form is refused with a message that says so, and the store is
/// left as it was.
@Suite struct UnicodeFieldNameTests {
    static let nfc = "caf\u{e9}"
    static let nfd = "cafe\u{301}"
    static let accents = TableSchema.fixed("accents", primaryKey: ["id"], fields: [.int("id"), .string(nfc, nullable: true), .int("n", default: 0)])
    static let settings = TableSchema.propertyBag("settings", key: [.string("name")])

    static func makeStore(_ store: Store) throws {
        try store.createTable(accents)
        try store.createTable(settings)
        try store.write { tx in
            try tx.insert("accents", FieldValues([("id", 1), (nfc, "x")]))
            try tx.insert("settings", FieldValues([("name", "a"), (nfc, 1)]))
        }
    }

    /// Everything a refused call must leave as it was: rows with their states, names as bytes,
    /// the schemas and the log.
    static func state(_ store: Store) throws -> [String] {
        try store.read { snap in
            try (snap.rows("accents", includingDeleted: true) + snap.rows("settings", includingDeleted: true)).map { row in
                "\(row) \(row.fieldNames.map { Array($0.utf8) })"
            } + ["\(try snap.schema("accents").fields.map { Array($0.name.utf8) })", "lsn \(try snap.lastLSN)"]
        }
    }

    /// `body` throws `code` with a message naming the other Unicode form, and changes nothing.
    static func expectRefused(_ store: Store, _ code: StrataError.Code, _ what: String, _ body: () throws -> Void) throws {
        let before = try state(store)
        do {
            try body()
            Issue.record("\(what): accepted")
        } catch {
            let error = StrataError.from(error)
            #expect(error.code == code, "\(what): \(error)")
            #expect(error.message.contains("Unicode form"), "\(what): \(error.message)")
        }
        #expect(try state(store) == before, "\(what): the store changed")
    }

    @Test func aSchemaDeclaresOneFormOfAName() throws {
        try withStore { store in
            try Self.makeStore(store)
            try Self.expectRefused(store, .invalidSchema, "two forms declared") {
                try store.createTable(.fixed("twins", primaryKey: ["id"], fields: [.int("id"), .string(Self.nfc), .string(Self.nfd)]))
            }
            try Self.expectRefused(store, .invalidSchema, "the other form added") {
                try store.write { try $0.addField(.string(Self.nfd, nullable: true), to: "accents") }
            }
            try store.createTable(.fixed("\u{e9}t\u{e9}", primaryKey: ["id"], fields: [.int("id")]))
            try Self.expectRefused(store, .tableExists, "a table named in the other form") {
                try store.createTable(.fixed("e\u{301}te\u{301}", primaryKey: ["id"], fields: [.int("id")]))
            }
            // The same definition with a field name in the other form is another definition.
            #expect(throws: StrataError.self) {
                try store.createTable(.fixed("accents", primaryKey: ["id"], fields: [.int("id"), .string(Self.nfd, nullable: true), .int("n", default: 0)]))
            }
            do {
                try store.createTable(.fixed("twins", primaryKey: ["id"], fields: [.int("id"), .string(Self.nfc), .string(Self.nfd)]))
            } catch {
                let error = StrataError.from(error)
                // Both forms, told apart by their code points.
                #expect(error.message.contains("U+00E9") && error.message.contains("U+0065 U+0301"), "\(error.message)")
            }
        }
    }

    @Test func editsNamingADeclaredFieldInAnotherFormAreRefused() throws {
        try withStore { store in
            try Self.makeStore(store)
            try Self.expectRefused(store, .fieldNotFound, "insert") {
                try store.write { try $0.insert("accents", FieldValues([("id", 2), (Self.nfd, "y")])) }
            }
            try Self.expectRefused(store, .fieldNotFound, "update") {
                try store.write { try $0.update("accents", key: 1, FieldValues([(Self.nfd, "y")])) }
            }
            try Self.expectRefused(store, .fieldNotFound, "upsert") {
                try store.write { try $0.upsert("accents", FieldValues([("id", 1), (Self.nfd, "y")])) }
            }
            try Self.expectRefused(store, .fieldNotFound, "revert") {
                try store.write { try $0.revert("accents", key: 1, field: Self.nfd) }
            }
            try Self.expectRefused(store, .fieldNotFound, "index") {
                try store.write { try $0.createIndex("by_cafe", on: "accents", fields: [Self.nfd]) }
            }
            try Self.expectRefused(store, .fieldNotFound, "query") {
                _ = try store.read { try $0.rows(Query("accents", where: .equals(Self.nfd, "x"))) }
            }
            // Reads: the other form names no field of the row.
            let row = try #require(try store.read { try $0.row("accents", key: 1) })
            #expect(row[Self.nfc] == "x")
            #expect(row[Self.nfd] == .null)
            #expect(row.original(Self.nfd) == .null)
            #expect(!row.isChanged(Self.nfd) && row.isChanged(Self.nfc))
            let given: FieldValues = FieldValues([(Self.nfc, "x")])
            #expect(given[Self.nfc] == "x" && given[Self.nfd] == nil)
        }
    }

    @Test func aPropertyBagHoldsOneFormOfAName() throws {
        try withStore { store in
            try Self.makeStore(store)
            try Self.expectRefused(store, .fieldNotFound, "a new row") {
                try store.write { try $0.insert("settings", FieldValues([("name", "b"), (Self.nfd, 2)])) }
            }
            try Self.expectRefused(store, .fieldNotFound, "the row that holds the other form") {
                try store.write { try $0.update("settings", key: RowKey(.string("a")), FieldValues([(Self.nfd, 2)])) }
            }
            try Self.expectRefused(store, .fieldNotFound, "upsert") {
                try store.write { try $0.upsert("settings", FieldValues([("name", "a"), (Self.nfd, 2)])) }
            }
            try Self.expectRefused(store, .fieldNotFound, "an index") {
                try store.write { try $0.createIndex("by_cafe", on: "settings", fields: [Self.nfd]) }
            }
            // One edit naming both forms, in a table that has neither yet: refused, naming both.
            try store.createTable(.propertyBag("bag", key: [.string("name")]))
            let before = try store.read { try $0.lastLSN }
            do {
                try store.write { try $0.insert("bag", FieldValues([("name", "a"), (Self.nfc, 1), (Self.nfd, 2)])) }
                Issue.record("both forms in one row: accepted")
            } catch {
                let error = StrataError.from(error)
                #expect(error.code == .fieldNotFound)
                #expect(error.message.contains("U+00E9") && error.message.contains("U+0065 U+0301"), "\(error.message)")
            }
            #expect(try store.read { try $0.lastLSN } == before)
            #expect(try store.read { try $0.rows("bag") }.isEmpty)
        }
    }

    @Test func aServerRowNamingAFieldInAnotherFormIsSetAside() throws {
        try withStore { store in
            try Self.makeStore(store)
            try store.write { tx in try tx.acknowledge("accents", key: 1); try tx.acknowledge("settings", key: RowKey(.string("a"))) }
            let sync = SyncClient(store: store)
            let report = try sync.merge(ServerDelta(anchor: "v1", tables: [
                TableDelta("accents", upserts: [
                    ServerRow(["id": 1, Self.nfd: "server"]),             // the declared field in the other form
                    ServerRow(["id": 2, Self.nfc: "fine"]),
                ]),
                TableDelta("settings", upserts: [
                    ServerRow(["name": "a", Self.nfd: 9]),                // the row holds the other form
                    ServerRow(["name": "b", Self.nfd: 9]),                // the table holds the other form
                    ServerRow(["name": "c", Self.nfc: 3]),
                ]),
            ]))
            #expect(report.refusedRows.map { "\($0.table) \($0.key)" } == ["accents 1", "settings \"a\"", "settings \"b\""])
            for row in report.refusedRows { #expect(row.reason.contains("Unicode form"), "\(row.reason)") }
            #expect(try sync.anchor() == "v1")
            try store.read { snap in
                #expect(try snap.row("accents", key: 1)?[Self.nfc] == "x")
                #expect(try snap.row("accents", key: 2)?[Self.nfc] == "fine")
                #expect(try snap.row("settings", key: RowKey(.string("a")))?[Self.nfc] == 1)
                #expect(try snap.row("settings", key: RowKey(.string("b"))) == nil)
                #expect(try snap.row("settings", key: RowKey(.string("c")))?[Self.nfc] == 3)
                // No field of the other form came in through the merge.
                let names = try snap.rows("settings").flatMap(\.fieldNames)
                #expect(!names.contains { $0.utf8.elementsEqual(Self.nfd.utf8) })
            }
        }
    }

    @Test func aBriefcaseInTheOtherFormIsRefusedWhole() throws {
        try withTemporaryFolder { folder in
            let file = folder + ".briefcase"
            defer { try? FileManager.default.removeItem(atPath: file) }
            try withStore { source in
                try source.createTable(Self.settings)
                try source.write { try $0.insert("settings", FieldValues([("name", "z"), (Self.nfd, 5)])) }
                _ = try source.exportBriefcase(to: file, tables: ["settings"])
            }
            try withStore { store in
                try Self.makeStore(store)
                try Self.expectRefused(store, .fieldNotFound, "import") {
                    _ = try store.importBriefcase(from: file)
                }
            }
        }
    }

    @Test func inMemorySyncServerKeepsTheFormsApart() async throws {
        let server = InMemorySyncServer(tables: [Self.accents, Self.settings])
        func push(_ n: UInt64, _ changes: [RowChange]) async throws -> [RowResult] {
            try await server.push(Batch(id: "c-\(n)", clientID: "c", number: n, changes: changes)).results
        }
        var results = try await push(1, [
            RowChange(table: "accents", key: 1, kind: .insert, values: ["id": 1, Self.nfd: "x"]),
            RowChange(table: "settings", key: RowKey(.string("a")), kind: .insert, values: ["name": "a", Self.nfc: 1]),
            RowChange(table: "settings", key: RowKey(.string("b")), kind: .insert, values: ["name": "b", Self.nfd: 2]),
        ])
        #expect(results.map(\.status) == [.error, .ok, .ok])
        #expect(results[0].error?.action == .setAside)
        #expect(results[0].error?.reason.contains("Unicode form") == true, "\(String(describing: results[0].error))")
        // A row holds one of the two forms: an update naming the other is set aside.
        results = try await push(2, [
            RowChange(table: "settings", key: RowKey(.string("a")), kind: .update, values: [Self.nfd: 7], originals: [Self.nfd: 1]),
        ])
        #expect(results.map(\.status) == [.error])
        #expect(results[0].error?.reason.contains("Unicode form") == true)
        // Each row keeps its own form, and a pull lists each row's own name only.
        let rows = server.rows("settings")
        #expect(rows[RowKey(.string("a"))].map { $0.keys.map { Array($0.utf8) } } == [Array(Self.nfc.utf8)])
        #expect(rows[RowKey(.string("b"))].map { $0.keys.map { Array($0.utf8) } } == [Array(Self.nfd.utf8)])
        let delta = try await server.pull(since: nil)
        let pulled = delta.tables.first { $0.table == "settings" }!.upserts.map { row in
            row.fields.keys.filter { $0 != "name" }.map { Array($0.utf8) }
        }
        #expect(Set(pulled) == [[Array(Self.nfc.utf8)], [Array(Self.nfd.utf8)]])
        // A store takes the form its table has first, and sets the other row aside with its reason.
        try await withStoreAsync { store in
            try store.createTable(Self.accents)
            try store.createTable(Self.settings)
            let report = try SyncClient(store: store).merge(delta)
            #expect(report.refusedRows.count == 1)
            #expect(report.refusedRows.first?.reason.contains("Unicode form") == true)
        }
    }
}

extension StrataError {
    /// `error` as a `StrataError` (a test's plain `catch`), or an `internalError` saying what it was.
    static func from(_ error: any Error) -> StrataError {
        (error as? StrataError) ?? StrataError(.invalidOperation, "not a StrataError: \(error)")
    }
}

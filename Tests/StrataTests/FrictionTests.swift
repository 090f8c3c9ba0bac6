import Foundation
import Strata
import Testing

/// Defaults converted as edits convert values, and one lookup by key or alternate id.
@Suite struct FrictionTests {
    @Test func anIntDefaultOfADoubleFieldIsADouble() throws {
        try withStore { store, _ in
            let accounts = TableSchema.fixed("accounts", primaryKey: ["id"], fields: [
                .int("id"), .double("balance", default: 0), .double("limit", nullable: true, default: 250),
            ])
            #expect(accounts.field("balance")?.defaultValue == .double(0))
            try store.createTable(accounts)
            try store.write { tx in try tx.insert("accounts", ["id": 1]) }
            let row = try #require(try store.read { try $0.row("accounts", key: 1) })
            #expect(row["balance"] == .double(0) && row["limit"] == .double(250))
            // Set after the fact, too; a default of another type is still refused.
            var field = FieldDefinition.double("fee")
            field.defaultValue = 3
            #expect(field.defaultValue == .double(3))
            try store.write { tx in try tx.addField(field, to: "accounts") }
            #expect(try store.read { try $0.row("accounts", key: 1)?["fee"] } == .double(3))
            let e = #expect(throws: StrataError.self) {
                try store.createTable(.fixed("bad", fields: [.int("id"), .double("x", default: "zero")]))
            }
            #expect(e?.code == .invalidSchema)
        }
    }

    @Test func oneLookupTriesTheKeyThenEachUniqueIndex() throws {
        try withStore { store, _ in
            try store.createTable(.fixed("items", primaryKey: ["id"], fields: [
                .int("id"), .string("clientID", nullable: true), .string("sku", nullable: true), .string("name"),
            ]))
            try store.createIndex("items_by_clientID", on: "items", fields: ["clientID"], unique: true)
            try store.createIndex("items_by_sku", on: "items", fields: ["sku"], unique: true)
            try store.createIndex("items_by_name", on: "items", fields: ["name"])  // not unique: not an id
            try store.write { tx in
                try tx.insert("items", ["id": 1, "clientID": "c-1", "sku": "S1", "name": "one"])
                try tx.insert("items", ["id": 2, "clientID": "c-2", "sku": "S2", "name": "two"])
                try tx.insert("items", ["id": 3, "clientID": "7", "name": "three"])
                try tx.insert("items", ["id": 7, "name": "seven"])
            }
            func find(_ id: RowKey) throws -> RowKey? { try store.read { try $0.row("items", keyOrAlternateID: id)?.key } }
            #expect(try find(2) == 2)                 // the primary key
            #expect(try find("c-1") == 1)             // a string for an int key: no error, the next index
            #expect(try find("S2") == 2)              // the second unique index
            #expect(try find("7") == 3)               // as a string it is the client id of row 3…
            #expect(try find(7) == 7)                 // …as an int the key of row 7
            #expect(try find("one") == nil)           // a non-unique index is not an id
            #expect(try find("nothing") == nil)
            #expect(try find([1, 2]) == nil)          // no key or unique index of two fields
            try store.write { tx in try tx.delete("items", key: 1) }
            #expect(try find("c-1") == nil)
            #expect(throws: StrataError.self) { try store.read { try $0.row("nope", keyOrAlternateID: 1) } }
        }
    }
}

import Foundation
import Strata
import StrataSync
import StrataTesting
import StrataWorkload
import Testing

/// `ServerRules` on its own, without a server: what `strata-server` and `InMemorySyncServer`
/// both rely on it to decide (their agreement is `ServerRulesEquivalenceTests`, Server/Tests).
@Suite struct ServerRulesTests {
    static let file = TablesFile(
        tables: [
            .init(name: "lists", primaryKey: ["id"], fields: [.init(name: "id", type: .int), .init(name: "name", type: .string)], serverAssignedKey: true),
            .init(name: "tasks", primaryKey: ["id"], fields: [
                .init(name: "id", type: .int), .init(name: "title", type: .string),
                .init(name: "done", type: .bool, default: false), .init(name: "list", type: .int, nullable: true),
            ]),
            .init(name: "settings", mode: .propertyBag, primaryKey: ["name"], fields: [.init(name: "name", type: .string)]),
        ],
        associations: [Association(child: "tasks", field: "list", parent: "lists")])

    static func decide(_ changes: [RowChange], stored: [ServerRules.RowID: ServerRules.StoredRow] = [:], liveParents: Set<ServerRules.RowID> = [], keys: [Value] = []) -> ServerRules.Outcome {
        let rules = ServerRules(file)
        let prepared = rules.prepare(changes)
        return rules.decide(prepared, stored: stored, liveParents: liveParents, drawnKeys: keys)
    }

    /// A new list takes the drawn key; a task in the same batch naming the list's client key is
    /// written naming the drawn key, with the table's default filled in.
    @Test func aChildFollowsItsParentsDrawnKey() {
        let rules = ServerRules(Self.file)
        let changes = [
            RowChange(table: "lists", key: -1, kind: .insert, values: ["name": "l"]),
            RowChange(table: "tasks", key: 1, kind: .insert, values: ["id": 1, "title": "t", "list": -1]),
        ]
        let prepared = rules.prepare(changes)
        #expect(prepared.keysToDraw == 1)
        let out = rules.decide(prepared, stored: [:], liveParents: [], drawnKeys: [40])
        #expect(out.results.map(\.status) == [.ok, .ok])
        #expect(out.results[0].newKey == RowKey(40))
        #expect(out.writes.map(\.id) == [ServerRules.RowID("lists", 40), ServerRules.RowID("tasks", 1)])
        #expect(out.writes[1].fields == ["title": "t", "list": 40, "done": false])
    }

    /// A child naming a parent that is neither stored nor live is set aside, and nothing written.
    @Test func aChildOfAMissingParentIsSetAside() {
        let change = RowChange(table: "tasks", key: 1, kind: .insert, values: ["id": 1, "title": "t", "list": 7])
        let missing = Self.decide([change])
        #expect(missing.results[0].status == .error && missing.results[0].error?.action == .setAside)
        #expect(missing.writes.isEmpty)
        let present = Self.decide([change], liveParents: [ServerRules.RowID("lists", 7)])
        #expect(present.results[0].status == .ok && present.writes.count == 1)
    }

    /// A delete of a row already gone is `ok` and writes nothing; a delete that leaves a non-null
    /// field unnamed is a conflict; one that names every field deletes the row.
    @Test func deletesCoverTheWholeRow() {
        let id = ServerRules.RowID("tasks", 1)
        let stored = [id: ServerRules.StoredRow(fields: ["title": "t", "done": true])]
        let gone = Self.decide([RowChange(table: "tasks", key: 1, kind: .delete, originals: ["title": "t"])], stored: [id: .init(fields: [:], deleted: true)])
        #expect(gone.results[0].status == .ok && gone.writes.isEmpty)
        let partial = Self.decide([RowChange(table: "tasks", key: 1, kind: .delete, originals: ["title": "t"])], stored: stored)
        #expect(partial.results[0].status == .conflict && partial.writes.isEmpty)
        let whole = Self.decide([RowChange(table: "tasks", key: 1, kind: .delete, originals: ["title": "t", "done": true])], stored: stored)
        #expect(whole.results[0].status == .ok && whole.writes.map(\.id) == [id] && whole.writes[0].fields == nil)
    }

    /// Refusals name the change and the reason; an unknown table is refused unless taken.
    @Test func refusalsSayWhy() {
        let out = Self.decide([
            RowChange(table: "tasks", key: 1, kind: .insert, values: ["id": 1]),
            RowChange(table: "nope", key: 1, kind: .insert, values: ["id": 1]),
        ])
        #expect(out.results.map(\.error?.reason) == [
            "changes[0]: an insert into 'tasks' needs field 'title'", "changes[1]: unknown table 'nope'",
        ])
        let open = ServerRules(tables: [], unknownTable: .taken(keyFields: [:]))
        let taken = open.decide(open.prepare([RowChange(table: "nope", key: 1, kind: .insert, values: ["id": 1, "x": 2])]), stored: [:], liveParents: [], drawnKeys: [])
        #expect(taken.results[0].status == .ok && taken.writes[0].fields == ["x": 2])
    }

    /// A property bag keeps a cleared field as null; a fixed table drops it.
    @Test func aPropertyBagKeepsAClearedFieldAsNull() {
        let bag = ServerRules.RowID("settings", RowKey(.string("a")))
        let out = Self.decide([RowChange(table: "settings", key: RowKey(.string("a")), kind: .update, values: ["v": .null], originals: ["v": 1])], stored: [bag: .init(fields: ["v": 1])])
        #expect(out.writes[0].fields == ["v": .null])
        let task = ServerRules.RowID("tasks", 1)
        let fixed = Self.decide([RowChange(table: "tasks", key: 1, kind: .update, values: ["list": .null], originals: ["list": 3])], stored: [task: .init(fields: ["title": "t", "list": 3])])
        #expect(fixed.writes[0].fields == ["title": "t"])
    }

    /// A property-bag row inserted over its tombstone lists the old row's fields as null; one
    /// naming the other Unicode form of a name the tombstone keeps is set aside with the reason,
    /// not stored under the old name's bytes.
    @Test func anInsertOverATombstoneListsItsNamesAndRefusesTheirOtherForm() {
        let key = RowKey(.string("a"))
        let tombstone = [ServerRules.RowID("settings", key): ServerRules.StoredRow(fields: ["e\u{301}": .null, "v": .null], deleted: true)]
        let again = Self.decide([RowChange(table: "settings", key: key, kind: .insert, values: ["name": "a", "v": 2])], stored: tombstone)
        #expect(again.results[0].status == .ok)
        #expect(again.writes[0].fields == ["e\u{301}": .null, "v": 2])
        let twin = Self.decide([RowChange(table: "settings", key: key, kind: .insert, values: ["name": "a", "\u{e9}": 2])], stored: tombstone)
        #expect(twin.results[0].status == .error && twin.results[0].error?.action == .setAside)
        #expect(twin.results[0].error?.reason.contains("tombstone keeps the field") == true)
        #expect(twin.writes.isEmpty)
    }

    /// The double keeps a deleted property-bag row's names, as strata-server's tombstone does:
    /// a row inserted again lists the old fields as null, so a client that missed the delete
    /// does not keep their values.
    @Test func theDoubleKeepsTombstoneNames() async throws {
        let server = InMemorySyncServer(tablesFile: Self.file)
        let key = RowKey(.string("a"))
        func push(_ n: UInt64, _ change: RowChange) async throws -> RowResult.Status {
            try await server.push(Batch(id: "c-\(n)", clientID: "c", number: n, changes: [change])).results[0].status
        }
        #expect(try await push(1, RowChange(table: "settings", key: key, kind: .insert, values: ["name": "a", "v": 1, "w": "old"])) == .ok)
        #expect(try await push(2, RowChange(table: "settings", key: key, kind: .delete, originals: ["v": 1, "w": "old"])) == .ok)
        #expect(try await push(3, RowChange(table: "settings", key: key, kind: .insert, values: ["name": "a", "v": 2])) == .ok)
        #expect(server.rows("settings")[key] == ["v": 2, "w": Value.null])
    }

    /// A row's key text is the key's values as the `Codable` path (`JSONEncoder`, sorted keys)
    /// writes them, byte for byte: the server stores and finds rows by it, so a key written
    /// otherwise would name another row. Random keys: Unicode, escapes, doubles at the edges of
    /// their formatting, negative ints, bytes and timestamps.
    @Test func aKeyIsWrittenAsTheEncoderWritesIt() throws {
        var gen = WireCodecTests.Generator(g: SplitMix64(seed: testSeed("ServerRules keyText")))
        for _ in 0..<3000 {
            let key = gen.key()
            let reference = String(decoding: try WireFormat.encodeWithFoundation(key.values), as: UTF8.self)
            #expect(ServerRules.RowID.text(key) == reference, "key \(key)")
            #expect(ServerRules.RowID("t", key).keyText == reference)
        }
        let mixed = RowKey([.int(-42), .double(-0.5), .string("a\"/\\\u{1}é😀")])
        let expected = #"[{"int":-42},{"double":-0.5},{"string":"a\"\/\\\u0001é😀"}]"#
        #expect(ServerRules.RowID.text(mixed) == expected)
        // A key the format cannot write (never one the tables take) has the empty text, as before.
        #expect(ServerRules.RowID.text(RowKey([.double(.nan)])) == "")
    }

    /// Row ids are equal, hashed and ordered by the bytes of the table name and of the key
    /// text: two Unicode forms of a key (or a table name) are two rows, and the order is the
    /// bytes' order.
    @Test func rowIDsCompareByBytes() {
        var g = SplitMix64(seed: testSeed("ServerRules rowIDs"))
        let pieces = ["a", "b", "é", "e\u{301}", "\u{212B}", "\u{C5}", "A\u{30A}", "\u{0}", "😀", "z", "\u{7F}", "ab"]
        func text() -> String { (0..<Int(g.next() % 3)).map { _ in pieces[Int(g.next() % UInt64(pieces.count))] }.joined() }
        let ids = (0..<300).map { _ in ServerRules.RowID(text(), RowKey([.string(text())])) }
        for a in ids {
            for b in ids.prefix(60) {
                let same = Array(a.table.utf8) == Array(b.table.utf8) && Array(a.keyText.utf8) == Array(b.keyText.utf8)
                #expect((a == b) == same, "\(a.table.codePoints) \(a.keyText) vs \(b.table.codePoints) \(b.keyText)")
                if same { #expect(a.hashValue == b.hashValue) }
                let before = Array(a.table.utf8) == Array(b.table.utf8)
                    ? a.keyText.utf8.lexicographicallyPrecedes(b.keyText.utf8) : a.table.utf8.lexicographicallyPrecedes(b.table.utf8)
                #expect((a < b) == before)
            }
        }
        // 0xFF never occurs in UTF-8: it separates the table from the key.
        let byBytes = Set(ids.map { (id: ServerRules.RowID) -> [UInt8] in Array(id.table.utf8) + [0xFF] + Array(id.keyText.utf8) })
        #expect(Set(ids).count == byBytes.count)
        let (nfc, nfd) = (ServerRules.RowID("t", RowKey([.string("\u{e9}")])), ServerRules.RowID("t", RowKey([.string("e\u{301}")])))
        #expect(nfc != nfd)
    }
}

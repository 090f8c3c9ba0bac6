import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Strata
import StrataSync
import StrataTesting
import Testing

/// `InMemorySyncServer`, the double most sync tests run against, and `strata-server` decide
/// batches by the same `ServerRules`: the same random batches pushed to both get the same
/// acknowledgements and leave the same rows.
@Suite(.serialized, .enabled(if: pgAvailable, "set STRATA_TEST_PG_URL (see Server/Scripts/start-postgres.sh)"))
struct ServerRulesEquivalenceTests {
    /// Lists get server-assigned keys and tasks name them; comments get server-assigned keys and
    /// name tasks; settings is a property bag.
    static let tables = """
        {
          "tables": [
            { "name": "lists", "primaryKey": ["id"], "serverAssignedKey": true,
              "fields": [{ "name": "id", "type": "int" }, { "name": "name", "type": "string" }] },
            { "name": "tasks", "primaryKey": ["id"],
              "fields": [
                { "name": "id", "type": "int" },
                { "name": "title", "type": "string" },
                { "name": "priority", "type": "int", "default": { "int": 0 } },
                { "name": "done", "type": "bool", "default": { "bool": false } },
                { "name": "notes", "type": "string", "nullable": true },
                { "name": "list", "type": "int", "nullable": true }
              ] },
            { "name": "comments", "primaryKey": ["id"], "serverAssignedKey": true,
              "fields": [{ "name": "id", "type": "int" }, { "name": "task", "type": "int" }, { "name": "text", "type": "string" }] },
            { "name": "settings", "mode": "propertyBag", "primaryKey": ["name"], "fields": [{ "name": "name", "type": "string" }] }
          ],
          "associations": [
            { "child": "tasks", "field": "list", "parent": "lists" },
            { "child": "comments", "field": "task", "parent": "tasks" }
          ]
        }
        """

    /// Field names of `settings`, two of them the same name in two Unicode forms.
    static let settingFields = ["v", "w", "\u{e9}", "e\u{301}"]

    @Test func theDoubleAndTheServerAnswerTheSameBatchesAlike() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("equivalence-\(UUID().uuidString).json")
        try Data(Self.tables.utf8).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let db = try TestDatabase()
        let server = try ServerProcess(db, tables: file.path)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let http = HTTPSyncTransport(server: server.url, token: try db.token(for: "alice"))
        let double = InMemorySyncServer(tablesFile: try TablesFile(json: Data(Self.tables.utf8)))

        var r = Random("ServerRulesEquivalenceTests")
        for number in UInt64(1)...60 {
            var changes: [RowChange] = []
            for _ in 0...r.below(8) { changes.append(Self.change(&r, double)) }
            let batch = Batch(id: "alice-\(number)", clientID: "alice", number: number, changes: changes)
            let expected = try await double.push(batch)
            let got = try await http.push(batch)
            try #require(got == expected, "batch \(number): \(changes)\nthe double answered \(expected.results)\nstrata-server answered \(got.results)")
            let doubleRows = try await Self.rows(double)
            let serverRows = try await Self.rows(http)
            try #require(serverRows == doubleRows, "after batch \(number): the double holds \(doubleRows.subtracting(serverRows).sorted()), strata-server \(serverRows.subtracting(doubleRows).sorted())")
        }
    }

    /// Every row of a snapshot as "table key fields" (non-null fields, as the wire writes them).
    static func rows(_ transport: some SyncTransport) async throws -> Set<String> {
        let keys = ["lists": "id", "tasks": "id", "comments": "id", "settings": "name"]
        var out = Set<String>()
        for table in try await transport.pull(since: nil).tables {
            let k = try #require(keys[table.table], "an unknown table \(table.table)")
            for row in table.upserts {
                let fields = row.fields.filter { !$0.key.utf8.elementsEqual(k.utf8) && !$0.value.isNull }
                out.insert("\(table.table) \(ServerRules.RowID.text(RowKey([row.fields[k] ?? .null]))) \(String(decoding: try WireFormat.encode(fields), as: UTF8.self))")
            }
        }
        return out
    }

    /// One random change: inserts, updates and deletes with the server's originals or stale
    /// ones, keys in two Unicode forms, children of parents new in the batch or missing, and
    /// changes the tables refuse.
    static func change(_ r: inout Random, _ double: InMemorySyncServer) -> RowChange {
        func pick<T>(_ xs: [T]) -> T { xs[r.below(xs.count)] }
        let taskID = Int64(1 + r.below(5))
        let taskKey = RowKey(.int(taskID))
        let task = double.rows("tasks")[taskKey]
        switch r.below(13) {
        case 0, 1:
            var values: [String: Value] = ["id": .int(taskID), "title": .string("t\(r.below(100))")]
            if r.below(2) == 0 { values["priority"] = .int(Int64(r.below(3))) }
            if r.below(3) == 0 { values["notes"] = pick([Value.null, "n"]) }
            // A list inserted in this batch (its client key), one the server may hold, or none.
            if r.below(2) == 0 { values["list"] = .int(pick([Int64(-1), -2, 1, 2, 3])) }
            return RowChange(table: "tasks", key: taskKey, kind: .insert, values: values)
        case 2, 3:
            var values: [String: Value] = [:]
            var originals: [String: Value] = [:]
            for f in ["title", "priority", "done", "notes", "list"] where r.below(3) == 0 {
                let value: Value = switch f {
                case "title": .string("u\(r.below(100))")
                case "priority": .int(Int64(r.below(3)))
                case "done": .bool(r.below(2) == 0)
                case "notes": pick([Value.null, "m"])
                default: pick([Value.null, 1, 2, -1])
                }
                values[f] = value
                originals[f] = task?[f] ?? .null
            }
            if r.below(4) == 0 { originals["title"] = "stale" }
            return RowChange(table: "tasks", key: taskKey, kind: .update, values: values, originals: originals)
        case 4:
            var originals = (task ?? [:]).filter { !$0.value.isNull }
            switch r.below(4) {
            case 0: if let f = originals.keys.sorted().first { originals[f] = nil }   // a field left unnamed
            case 1: originals["title"] = "stale"
            default: break
            }
            return RowChange(table: "tasks", key: taskKey, kind: .delete, originals: originals)
        case 5:
            return RowChange(table: "lists", key: RowKey(.int(Int64(-1 - r.below(2)))), kind: .insert, values: ["name": "l"])
        case 6:
            let listKey = RowKey(.int(Int64(1 + r.below(3))))
            let list = double.rows("lists")[listKey]
            if r.below(2) == 0 {
                return RowChange(table: "lists", key: listKey, kind: .update, values: ["name": .string("m\(r.below(9))")], originals: ["name": list?["name"] ?? .null])
            }
            return RowChange(table: "lists", key: listKey, kind: .delete, originals: (list ?? [:]).filter { !$0.value.isNull })
        case 7:
            return RowChange(table: "comments", key: RowKey(.int(Int64(-1 - r.below(2)))), kind: .insert, values: ["task": .int(Int64(1 + r.below(6))), "text": "c"])
        case 8, 9, 10:
            let name = pick(settingKeys)
            let key = RowKey(.string(name))
            let row = double.rows("settings")[key] ?? [:]
            switch r.below(3) {
            case 0:
                return RowChange(table: "settings", key: key, kind: .insert, values: ["name": .string(name), pick(settingFields): .int(Int64(r.below(9)))])
            case 1:
                let f = pick(settingFields)
                let stale = r.below(4) == 0
                return RowChange(table: "settings", key: key, kind: .update, values: [f: pick([Value.null, .int(Int64(r.below(9)))])], originals: [f: stale ? Value.string("stale") : (row[f] ?? .null)])
            default:
                return RowChange(table: "settings", key: key, kind: .delete, originals: row.filter { !$0.value.isNull })
            }
        default:
            // Changes the tables refuse.
            return pick([
                RowChange(table: "tasks", key: taskKey, kind: .insert, values: ["id": .int(taskID)]),
                RowChange(table: "tasks", key: taskKey, kind: .insert, values: ["id": .int(taskID), "title": 5]),
                RowChange(table: "tasks", key: taskKey, kind: .insert, values: ["id": .int(taskID + 1), "title": "t"]),
                RowChange(table: "tasks", key: taskKey, kind: .insert, values: ["id": .int(taskID), "title": "t"], originals: ["title": "s"]),
                RowChange(table: "tasks", key: taskKey, kind: .update, values: ["id": 9]),
                RowChange(table: "tasks", key: taskKey, kind: .update, values: ["colour": "red"]),
                RowChange(table: "tasks", key: taskKey, kind: .delete, values: ["title": "t"]),
                RowChange(table: "tasks", key: RowKey(.string("one")), kind: .delete),
                RowChange(table: "nope", key: taskKey, kind: .insert, values: ["id": .int(taskID)]),
            ])
        }
    }
}

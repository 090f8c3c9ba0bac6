import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Strata
import StrataSync
import Testing

/// The server takes only rows every client can store (`RowRule`, shared with the clients), a
/// row already on the server that a client cannot store is set aside on that client instead of
/// stopping its sync, and keys compare by their bytes on the server as in the clients.
@Suite(.serialized, .enabled(if: pgAvailable, "set STRATA_TEST_PG_URL (see Server/Scripts/start-postgres.sh)"))
struct RowRuleTests {
    static func batch(_ client: String, _ number: UInt64, _ changes: [RowChange]) -> Batch {
        Batch(id: "\(client)-\(number)", clientID: client, number: number, changes: changes)
    }

    /// A new store with the server's tables, synced once; `cleanup` removes its folder.
    static func syncedStore(_ server: ServerProcess) async throws -> (Store, SyncClient, HTTPSyncTransport, cleanup: () -> Void) {
        let (store, path) = try makeStore()
        let transport = HTTPSyncTransport(server: server.url, token: try server.database.token(for: store.clientID))
        let sync = SyncClient(store: store)
        _ = try await sync.sync(with: transport)
        return (store, sync, transport, { try? FileManager.default.removeItem(atPath: path) })
    }

    /// The `settings` rows of a store, by the bytes of their key: name → fields (key left out).
    static func settings(_ store: Store) throws -> [[UInt8]: [String: Value]] {
        var out: [[UInt8]: [String: Value]] = [:]
        for row in try store.read({ try $0.rows("settings") }) {
            out[Array(row.key.values[0].stringValue!.utf8)] = row.values.filter { $0.key != "name" && !$0.value.isNull }
        }
        return out
    }

    /// The same of the server, through a snapshot pull.
    static func settings(_ transport: HTTPSyncTransport) async throws -> [[UInt8]: [String: Value]] {
        var out: [[UInt8]: [String: Value]] = [:]
        for row in try await transport.pull(since: nil).tables.first(where: { $0.table == "settings" })?.upserts ?? [] {
            out[Array(row.fields["name"]!.stringValue!.utf8)] = row.fields.filter { $0.key != "name" && !$0.value.isNull }
        }
        return out
    }

    /// The first reproduction: one client pushed a `settings` row with an empty field name, and
    /// another with a 1,500-byte key; the server answered `ok`, and from then on no client could
    /// sync. Now both are refused on their own rows, and every client syncs. A row an older
    /// server took (written here straight into PostgreSQL) is set aside on each client, listed
    /// with its reason, and the anchor moves past it; a tombstone with a key no client can hold
    /// is nothing to delete.
    @Test func aRowNoClientCanStoreIsRefusedAndEveryClientKeepsSyncing() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let alice = HTTPSyncTransport(server: server.url, token: try db.token(for: "alice"))
        let longKey = String(repeating: "K", count: 1500)
        let ack = try await alice.push(Self.batch("alice", 1, [
            RowChange(table: "settings", key: "e2", kind: .insert, values: ["name": "e2", "": "x"]),
            RowChange(table: "settings", key: RowKey(.string(longKey)), kind: .insert, values: ["name": .string(longKey), "v": 1]),
            RowChange(table: "settings", key: "fine", kind: .insert, values: ["name": "fine", "v": 1]),
        ]))
        #expect(ack.results.map(\.status) == [.error, .error, .ok])
        #expect(ack.results[0].error?.action == .setAside && ack.results[0].error?.reason.contains("a field name cannot be empty") == true, "\(ack.results[0])")
        #expect(ack.results[1].error?.action == .setAside && ack.results[1].error?.reason.contains("the limit is \(RowRule.maxKeyBytes)") == true, "\(ack.results[1])")

        let (early, earlySync, earlyTransport, cleanEarly) = try await Self.syncedStore(server)
        defer { cleanEarly() }
        #expect(try Self.settings(early) == [Array("fine".utf8): ["v": 1]])

        // Rows an older server accepted: an empty field name, and the tombstone of a key too long.
        let longKeyJSON = String(decoding: try WireFormat.encode([Value.string(longKey)]), as: UTF8.self)
        try db.sql("""
            INSERT INTO strata_rows (tbl, key, fields, deleted, version) VALUES
              ('settings', '[{"string":"legacy"}]', '{"":{"string":"x"},"v":{"int":2}}', false, nextval('strata_version')),
              ('settings', '\(longKeyJSON)', '{}', true, nextval('strata_version'))
            """)
        _ = try await alice.push(Self.batch("alice", 2, [RowChange(table: "settings", key: "later", kind: .insert, values: ["name": "later", "v": 3])]))

        // The store that synced before: it pulls the incremental delta holding all three.
        let report = try await earlySync.sync(with: earlyTransport)
        #expect(report.merge.refusedRows.map(\.key) == ["legacy"])
        #expect(report.merge.refusedRows.first?.reason.contains("a field name cannot be empty") == true, "\(report.merge)")
        #expect(try earlySync.refusedServerRows().map(\.key) == ["legacy"])
        #expect(try Self.settings(early) == [Array("fine".utf8): ["v": 1], Array("later".utf8): ["v": 3]])
        let latest = try db.sql("SELECT max(version) FROM strata_rows").trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try earlySync.anchor() == latest)
        // The next sync does not meet the row again: the anchor is past it.
        #expect(try await earlySync.sync(with: earlyTransport).merge.refusedRows.isEmpty)

        // A new store: its first sync is a snapshot, with the same outcome.
        let (fresh, freshSync, freshTransport, cleanFresh) = try await Self.syncedStore(server)
        defer { cleanFresh() }
        #expect(try freshSync.refusedServerRows().map(\.key) == ["legacy"])
        #expect(try Self.settings(fresh) == [Array("fine".utf8): ["v": 1], Array("later".utf8): ["v": 3]])

        // Mended on the server, the row comes in and leaves the list.
        try db.sql("UPDATE strata_rows SET fields = '{\"v\":{\"int\":4}}', version = nextval('strata_version') WHERE key = '[{\"string\":\"legacy\"}]'")
        for (store, sync, transport) in [(early, earlySync, earlyTransport), (fresh, freshSync, freshTransport)] {
            _ = try await sync.sync(with: transport)
            #expect(try sync.refusedServerRows().isEmpty)
            #expect(try Self.settings(store)[Array("legacy".utf8)] == ["v": 4])
        }
    }

    /// The second reproduction: `"r\u{f1}"` (ñ precomposed) and `"rn\u{303}"` (n and a combining
    /// tilde) are equal to Swift's `==` but two keys to a client. One batch changing both put
    /// both changes on the first row. Now each change lands on its own row, under every pair of
    /// change kinds in one batch, and a new phone holds exactly the server's rows.
    @Test func keysThatDifferOnlyInUnicodeFormAreTwoRows() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let nfc = "r\u{f1}", nfd = "rn\u{303}"
        #expect(nfc == nfd && !nfc.utf8.elementsEqual(nfd.utf8))   // the premise
        let a = Array(nfc.utf8), b = Array(nfd.utf8)
        let alice = HTTPSyncTransport(server: server.url, token: try db.token(for: "alice"))
        func push(_ n: UInt64, _ changes: [RowChange]) async throws {
            let ack = try await alice.push(Self.batch("alice", n, changes))
            #expect(ack.results.map(\.status) == changes.map { _ in .ok }, "batch \(n): \(ack.results)")
        }
        func key(_ s: String) -> RowKey { RowKey(.string(s)) }
        // insert + insert
        try await push(1, [
            RowChange(table: "settings", key: key(nfc), kind: .insert, values: ["name": .string(nfc), "v": 1]),
            RowChange(table: "settings", key: key(nfd), kind: .insert, values: ["name": .string(nfd), "v": 1]),
        ])
        #expect(try await Self.settings(alice) == [a: ["v": 1], b: ["v": 1]])
        // update + update (the issue's batch)
        try await push(2, [
            RowChange(table: "settings", key: key(nfc), kind: .update, values: ["v": 10], originals: ["v": 1]),
            RowChange(table: "settings", key: key(nfd), kind: .update, values: ["w": 5], originals: ["w": .null]),
        ])
        #expect(try await Self.settings(alice) == [a: ["v": 10], b: ["v": 1, "w": 5]])
        // delete + update
        try await push(3, [
            RowChange(table: "settings", key: key(nfc), kind: .delete, originals: ["v": 10]),
            RowChange(table: "settings", key: key(nfd), kind: .update, values: ["v": 2], originals: ["v": 1]),
        ])
        #expect(try await Self.settings(alice) == [b: ["v": 2, "w": 5]])
        // insert + delete
        try await push(4, [
            RowChange(table: "settings", key: key(nfc), kind: .insert, values: ["name": .string(nfc), "v": 3]),
            RowChange(table: "settings", key: key(nfd), kind: .delete, originals: ["v": 2, "w": 5]),
        ])
        let onServer = try await Self.settings(alice)
        #expect(onServer == [a: ["v": 3]])

        let (phone, _, _, cleanup) = try await Self.syncedStore(server)
        defer { cleanup() }
        #expect(try Self.settings(phone) == onServer)
    }

    /// Field names compare by their bytes on the server too, as in a client's store: `"café"` with
    /// U+00E9 and with "e" + U+0301 are two names. A change naming a declared field in the other
    /// form is refused (`error`, `setAside`, the reason naming both forms), as is a change naming
    /// the other form of a field its row holds: it is not merged into that field. A new phone
    /// holds each row in its own form; of two property-bag rows using the two forms, it takes the
    /// first and sets the other aside with its reason, and its sync completes.
    @Test func fieldNamesThatDifferOnlyInUnicodeFormAreTwoNames() async throws {
        let nfc = "caf\u{e9}", nfd = "cafe\u{301}"
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("strata-twin-tables-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("tables.json")
        let accents = TableSchema.fixed("accents", primaryKey: ["id"], fields: [.int("id"), .string(nfc, nullable: true)])
        let settings = TableSchema.propertyBag("settings", key: [.string("name")])
        try JSONSerialization.data(withJSONObject: ["tables": [
            ["name": "accents", "primaryKey": ["id"], "fields": [["name": "id", "type": "int"], ["name": nfc, "type": "string", "nullable": true]]],
            ["name": "settings", "mode": "propertyBag", "primaryKey": ["name"], "fields": [["name": "name", "type": "string"]]],
        ]]).write(to: file)
        let db = try TestDatabase()
        let server = try ServerProcess(db, tables: file.path)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let alice = HTTPSyncTransport(server: server.url, token: try db.token(for: "alice"))
        @Sendable func key(_ s: String) -> RowKey { RowKey(.string(s)) }

        var ack = try await alice.push(Self.batch("alice", 1, [
            RowChange(table: "accents", key: 1, kind: .insert, values: ["id": 1, nfd: "declared in the other form"]),
            RowChange(table: "accents", key: 2, kind: .insert, values: ["id": 2, nfc: "fine"]),
            RowChange(table: "settings", key: key("a"), kind: .insert, values: ["name": "a", nfc: 1]),
            RowChange(table: "settings", key: key("b"), kind: .insert, values: ["name": "b", nfd: 2]),
        ]))
        #expect(ack.results.map(\.status) == [.error, .ok, .ok, .ok], "\(ack.results)")
        #expect(ack.results[0].error?.action == .setAside)
        #expect(ack.results[0].error?.reason.contains("Unicode form") == true, "\(ack.results[0])")
        ack = try await alice.push(Self.batch("alice", 2, [
            RowChange(table: "settings", key: key("a"), kind: .update, values: [nfd: 7], originals: [nfd: 1]),
        ]))
        #expect(ack.results.map(\.status) == [.error], "\(ack.results)")
        #expect(ack.results[0].error?.action == .setAside)
        #expect(ack.results[0].error?.reason.contains("Unicode form") == true, "\(ack.results[0])")

        // Each row in its own form, by the bytes of its field names.
        func names(_ fields: [String: Value], key: String) -> [[UInt8]: Value] {
            Dictionary(uniqueKeysWithValues: fields.filter { $0.key != key && !$0.value.isNull }.map { (Array($0.key.utf8), $0.value) })
        }
        var rows: [String: [[UInt8]: Value]] = [:]
        for t in try await alice.pull(since: nil).tables {
            let k = t.table == "accents" ? "id" : "name"
            for row in t.upserts { rows["\(t.table) \(row.fields[k]!)"] = names(row.fields, key: k) }
        }
        let (c, d) = (Array(nfc.utf8), Array(nfd.utf8))
        #expect(rows == ["accents 2": [c: "fine"], "settings \(Value.string("a"))": [c: 1], "settings \(Value.string("b"))": [d: 2]], "\(rows)")

        let path = folder.appendingPathComponent("phone").path
        var options = StoreOptions()
        options.durability = .noSync
        let phone = try Store(path: path, options: options)
        try phone.createTable(accents)
        try phone.createTable(settings)
        let sync = SyncClient(store: phone)
        _ = try await sync.sync(with: HTTPSyncTransport(server: server.url, token: try db.token(for: phone.clientID)))
        #expect(try sync.anchor() != nil)
        let (two, a, b) = try await phone.read { snap in
            (try snap.row("accents", key: 2), try snap.row("settings", key: "a"), try snap.row("settings", key: "b"))
        }
        #expect(two?[nfc] == "fine")
        #expect(a?[nfc] == 1)
        #expect(b == nil)
        let refused = try sync.refusedServerRows()
        #expect(refused.map { "\($0.table) \($0.key)" } == ["settings \"b\""])
        #expect(refused.first?.reason.contains("Unicode form") == true)
    }

    /// Rows near every limit of `RowRule`, just inside and just outside, go to the server; the
    /// rows it accepts are exactly those a client store takes (tried one by one in a store of
    /// the same tables).
    @Test func theServerAcceptsExactlyTheRowsAClientStores() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let alice = HTTPSyncTransport(server: server.url, token: try db.token(for: "alice"))
        var random = Random("theServerAcceptsExactlyTheRowsAClientStores")
        // A string key of n bytes takes n + 7 encoded with its table id: 493 is the longest.
        let longest = RowRule.maxKeyBytes - 7
        var changes: [RowChange] = []
        for i in 0..<200 {
            let name: String
            switch random.below(4) {
            case 0: name = "k\(i)-" + String(repeating: "x", count: longest - 3 - String(i).count + random.below(3))   // 493 to 495 bytes
            case 1: name = "k\(i)-" + String(repeating: "é", count: (longest - 3 - String(i).count) / 2 + random.below(2))   // 2 bytes each
            default: name = "k\(i)"
            }
            var values: [String: Value] = ["name": .string(name)]
            switch random.below(6) {
            case 0: values[""] = 1
            case 1: values["f"] = .double(random.below(2) == 0 ? 1.5 : 2)
            case 2: values["g"] = .null
            case 3: values["h"] = .string(String(repeating: "y", count: random.below(3000)))
            default: values["v"] = .int(Int64(i))
            }
            changes.append(RowChange(table: "settings", key: RowKey(.string(name)), kind: .insert, values: values))
            if random.below(5) == 0 {
                changes.append(RowChange(table: "tasks", key: RowKey(.int(Int64(i))), kind: .insert,
                    values: ["id": .int(Int64(i)), "title": random.below(2) == 0 ? .null : "t", "priority": random.below(2) == 0 ? .double(1.5) : 1]))
            }
        }
        let ack = try await alice.push(Self.batch("alice", 1, changes))
        let (probe, path) = try makeStore()
        defer { try? FileManager.default.removeItem(atPath: path) }
        for (change, result) in zip(changes, ack.results) {
            let stored: Bool
            do {
                try await probe.write { tx in try tx.insert(change.table, FieldValues(change.values)) }
                stored = true
            } catch {
                stored = false
            }
            #expect((result.status == .ok) == stored, "\(change.table) \(change.key.values[0].stringValue?.utf8.count ?? 0) bytes, \(change.values.keys.sorted()): server \(result.status), client \(stored ? "stores it" : "refuses it")")
        }
    }

    /// Decoding is strict as the wire format's schema says (the codec of `WireFormat`): an int
    /// written with a fraction, a key given twice, batch number 0 and a leading byte-order mark
    /// are each a 400 that names what was wrong, and nothing is written.
    @Test func whatTheSchemaForbidsIsRefused() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let token = try db.token(for: "c")
        let insert = #"{"table":"tasks","key":[{"int":3}],"kind":"insert","values":{"id":{"int":3},"title":{"string":"t"}}}"#
        let cases: [(String, Data, String)] = [
            ("an int with a fraction", Data(#"{"id":"c-1","clientID":"c","number":1,"changes":[{"table":"tasks","key":[{"int":3.0}],"kind":"insert","values":{"id":{"int":3},"title":{"string":"t"}}}]}"#.utf8), "changes[0].key[0].int"),
            ("a key given twice", Data(#"{"id":"c-1","clientID":"c","number":1,"number":1,"changes":[\#(insert)]}"#.utf8), "duplicate key 'number'"),
            ("a field given twice", Data(#"{"id":"c-1","clientID":"c","number":1,"changes":[{"table":"tasks","key":[{"int":3}],"kind":"insert","values":{"id":{"int":3},"title":{"string":"t"},"title":{"string":"u"}}}]}"#.utf8), "duplicate key 'title'"),
            ("batch number 0", Data(#"{"id":"c-0","clientID":"c","number":0,"changes":[\#(insert)]}"#.utf8), "number"),
            ("a byte-order mark", Data([0xEF, 0xBB, 0xBF]) + Data(#"{"id":"c-1","clientID":"c","number":1,"changes":[\#(insert)]}"#.utf8), "byte-order mark"),
        ]
        let before = try db.state()
        for (what, body, words) in cases {
            let r = try await request("POST", server.url.appendingPathComponent("v1/batches"), token: token, body: body)
            #expect(r.status == 400 && r.body.contains(words), "\(what): \(r.status) \(r.body)")
        }
        #expect(try db.state() == before)
        // The same batch, well formed, is taken.
        let r = try await request("POST", server.url.appendingPathComponent("v1/batches"), token: token, body: Data(#"{"id":"c-1","clientID":"c","number":1,"changes":[\#(insert)]}"#.utf8))
        #expect(r.status == 200 && r.body.contains(#""status":"ok""#), "\(r.body)")
    }
}

import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Strata
import StrataSync
import Testing

/// The protocol's rules, one request at a time: refusals change nothing, batches apply once,
/// concurrency is checked per field.
@Suite(.serialized, .enabled(if: pgAvailable, "set STRATA_TEST_PG_URL (see Server/Scripts/start-postgres.sh)"))
struct ProtocolTests {
    static func batch(_ client: String, _ number: UInt64, _ changes: [RowChange]) -> Batch {
        Batch(id: "\(client)-\(number)", clientID: client, number: number, changes: changes)
    }

    static func insert(_ id: Int64, _ title: String) -> RowChange {
        RowChange(table: "tasks", key: RowKey(.int(id)), kind: .insert, values: ["id": .int(id), "title": .string(title)])
    }

    @Test func refusedRequestsGetA4xxAndChangeNothing() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db, arguments: ["--max-body", "4000"])
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let token = try db.token(for: "alice")
        let alice = HTTPSyncTransport(server: server.url, token: token)
        _ = try await alice.push(Self.batch("alice", 1, [Self.insert(1, "Buy milk")]))
        let before = try db.state()
        let batches = server.url.appendingPathComponent("v1/batches")
        func body(_ text: String) -> Data { Data(text.utf8) }
        let good = String(decoding: try WireFormat.encode(Self.batch("alice", 2, [Self.insert(2, "x")])), as: UTF8.self)

        let cases: [(String, Data, Int, String)] = [
            ("not JSON", body("{"), 400, "malformed"),
            ("an unknown field", body(good.replacingOccurrences(of: "\"number\"", with: "\"colour\":1,\"number\"")), 400, "unknown field 'colour'"),
            ("a batch id that is not client-number", try WireFormat.encode(Batch(id: "alice-99", clientID: "alice", number: 8, changes: [Self.insert(3, "x")])), 400, "not '<clientID>-<number>'"),
            ("an oversized batch", try WireFormat.encode(Self.batch("alice", 10, (10..<200).map { Self.insert($0, String(repeating: "x", count: 40)) })), 413, "larger than the server takes"),
        ]
        for (what, data, status, message) in cases {
            let r = try await request("POST", batches, token: token, body: data)
            #expect(r.status == status, "\(what): \(r.body)")
            #expect(r.body.contains(message), "\(what): \(r.body)")
            #expect(try db.state() == before, "\(what) changed the server's data")
        }

        let changes = server.url.appendingPathComponent("v1/changes")
        for (query, message) in [("since=v41", "anchor 'v41'"), ("since=0&limit=0", "limit"), ("since=0&limit=x", "limit"), ("until=zz", "until"), ("after=bm90IGEgY3Vyc29y", "not a cursor")] {
            let r = try await request("GET", URL(string: "\(changes.absoluteString)?\(query)")!, token: token)
            #expect(r.status == 400 && r.body.contains(message), "\(query): \(r.status) \(r.body)")
        }
        #expect(try db.state() == before)
    }

    /// A row the tables refuse is answered on its own row (`error`, `setAside`, the reason) and
    /// not written; the other rows of the batch apply. Before, the whole batch was a 400.
    @Test func rowsTheTablesRefuseAreAnsweredOnTheirOwnRows() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let alice = HTTPSyncTransport(server: server.url, token: try db.token(for: "alice"))
        _ = try await alice.push(Self.batch("alice", 1, [Self.insert(1, "one")]))
        let bad: [(RowChange, String)] = [
            (RowChange(table: "nope", key: 1, kind: .insert, values: ["id": 1]), "unknown table 'nope'"),
            (RowChange(table: "tasks", key: 3, kind: .insert, values: ["id": 3, "title": 5]), "field 'title' of table 'tasks' holds string values"),
            (RowChange(table: "tasks", key: 4, kind: .insert, values: ["id": 4, "title": "t", "colour": "red"]), "no field 'colour'"),
            (RowChange(table: "tasks", key: 5, kind: .insert, values: ["id": 5]), "needs field 'title'"),
            (RowChange(table: "tasks", key: RowKey([1, 2]), kind: .delete), "the key (1, 2) has 2"),
            (RowChange(table: "tasks", key: 6, kind: .insert, values: ["id": 6, "title": .null]), "cannot be null"),
            (RowChange(table: "tasks", key: 1, kind: .update, values: ["id": 9], originals: ["id": 1]), "cannot change key field 'id'"),
            (RowChange(table: "tasks", key: 1, kind: .delete, values: ["title": "x"], originals: ["title": "one"]), "a delete has no values"),
        ]
        let ack = try await alice.push(Self.batch("alice", 2, [Self.insert(2, "fine")] + bad.map(\.0) + [Self.insert(7, "also fine")]))
        #expect(ack.results.map(\.status) == [.ok] + bad.map { _ in .error } + [.ok])
        for (result, (change, message)) in zip(ack.results.dropFirst(), bad) {
            #expect(result.key == change.key && result.error?.action == .setAside && result.error?.reason.contains(message) == true, "\(result)")
        }
        let titles = try await alice.pull(since: nil).tables.first { $0.table == "tasks" }!.upserts.map { $0.fields["title"]! }
        #expect(Set(titles) == ["one", "fine", "also fine"])
    }

    /// A key longer than PostgreSQL can index is refused on its row, before PostgreSQL sees it,
    /// and a value PostgreSQL refuses is a 400 that says so, not a 503 "try again": neither
    /// goes better the next time. Before, both were 503.
    @Test func whatPostgreSQLCannotStoreIsRefusedForGood() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let token = try db.token(for: "a")
        let a = HTTPSyncTransport(server: server.url, token: token)
        // 3,000 characters that do not compress: a key past PostgreSQL's index row limit.
        var x: UInt64 = 1
        let long = String((0..<3000).map { _ in
            x = x &* 6364136223846793005 &+ 1442695040888963407
            return Character(Unicode.Scalar(UInt8(48 + (x >> 33) % 75)))
        })
        let ack = try await a.push(Self.batch("a", 1, [
            RowChange(table: "settings", key: RowKey(.string(long)), kind: .insert, values: ["name": .string(long)]),
            Self.insert(1, "fine"),
        ]))
        #expect(ack.results.map(\.status) == [.error, .ok])
        #expect(ack.results[0].error?.action == .setAside && ack.results[0].error?.reason.contains("key") == true, "\(ack.results[0])")
        // A text parameter with a NUL character, which PostgreSQL refuses (SQLSTATE 22021).
        let before = try db.state()
        let changes = server.url.appendingPathComponent("v1/changes")
        for query in ["until=1&afterTable=tasks&afterKey=%00", "until=1&after=\(Data(#"["tasks","\u0000"]"#.utf8).base64EncodedString().replacingOccurrences(of: "=", with: ""))"] {
            let r = try await request("GET", URL(string: "\(changes.absoluteString)?\(query)")!, token: token)
            #expect(r.status == 400 && r.body.contains("PostgreSQL refused"), "\(query): \(r.status) \(r.body)")
        }
        #expect(try db.state() == before)
    }

    /// A batch applied before is answered before its rows are checked: after the tables file
    /// changed, its repeat still gets the stored answer. Before, it was a 400.
    @Test func aRepeatedBatchIsAnsweredWhateverTheTablesFileSaysNow() async throws {
        let db = try TestDatabase()
        var server = try ServerProcess(db)
        let token = try db.token(for: "alice")
        let batch = Self.batch("alice", 1, [Self.insert(1, "one")])
        let ack = try await HTTPSyncTransport(server: server.url, token: token).push(batch)
        // `title` now takes ints.
        let changed = FileManager.default.temporaryDirectory.appendingPathComponent("tables-\(UUID().uuidString).json").path
        defer { try? FileManager.default.removeItem(atPath: changed) }
        let text = try String(contentsOfFile: tablesFile, encoding: .utf8)
        try text.replacingOccurrences(of: #""name": "title", "type": "string""#, with: #""name": "title", "type": "int""#)
            .write(toFile: changed, atomically: true, encoding: .utf8)
        server = try ServerProcess(db, tables: changed)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let alice = HTTPSyncTransport(server: server.url, token: token)
        #expect(try await alice.push(batch) == ack)
        #expect(try await alice.push(Self.batch("alice", 2, [Self.insert(2, "two")])).results.first?.error?.reason.contains("holds int values") == true)
    }

    /// A store with a row the server's tables refuse (a field the server does not have) and a
    /// row larger than the server's body limit: both are set aside with the server's reason,
    /// the other rows go up, and later syncs still download. Before, every sync threw (a 400, or
    /// a 413, for the batch in flight, which goes first).
    @Test func rowsTheServerRefusesAreSetAsideAndTheStoreKeepsSyncing() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db, arguments: ["--max-body", "4000"])
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-server-test-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        var options = StoreOptions()
        options.durability = .noSync
        let store = try Store(path: path, options: options)
        try store.createTable(.fixed("tasks", primaryKey: ["id"], fields: tasks.fields + [.string("colour", nullable: true)]))
        try store.createTable(.fixed("comments", primaryKey: ["id"], fields: [.int("id"), .int("task"), .string("text")]))
        try store.createTable(.propertyBag("settings", key: [.string("name")]))
        let sync = SyncClient(store: store)
        let transport = HTTPSyncTransport(server: server.url, token: try db.token(for: store.clientID))
        try await store.write { tx in
            for i in 1...5 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string(i == 4 ? String(repeating: "x", count: 5000) : "t\(i)")]) }
            try tx.update("tasks", key: 2, ["colour": "red"])
        }
        _ = try await sync.sync(with: transport)
        let rejected = try sync.rejectedRows()
        #expect(rejected.map(\.key) == [2, 4])
        #expect(rejected.first?.reason.contains("no field 'colour'") == true, "\(rejected)")
        #expect(rejected.last?.reason.contains("too large") == true && rejected.last?.reason.contains("4000 bytes") == true, "\(rejected)")
        let other = HTTPSyncTransport(server: server.url, token: try db.token(for: "other"))
        let onServer = try await other.pull(since: nil).tables.first { $0.table == "tasks" }!.upserts.map { $0.fields["id"]! }
        #expect(Set(onServer) == [1, 3, 5])
        _ = try await other.push(Self.batch("other", 1, [Self.insert(9, "from another client")]))
        _ = try await sync.sync(with: transport)
        #expect(try await store.read { try $0.row("tasks", key: 9)?["title"] } == "from another client")
    }

    @Test func tokensAreCheckedAndClientsPushOnlyAsThemselves() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let aliceToken = try db.token(for: "alice")
        _ = try db.token(for: "bob")
        _ = try await HTTPSyncTransport(server: server.url, token: aliceToken).push(Self.batch("alice", 1, [Self.insert(1, "a")]))
        let before = try db.state()
        let bobsBatch = try WireFormat.encode(Self.batch("bob", 1, [Self.insert(2, "b")]))
        let batches = server.url.appendingPathComponent("v1/batches")
        let changes = server.url.appendingPathComponent("v1/changes")

        for (token, status) in [(nil, 401), ("wrong", 401), (aliceToken, 403)] as [(String?, Int)] {
            let r = try await request("POST", batches, token: token, body: bobsBatch)
            #expect(r.status == status, "\(String(describing: token)): \(r.body)")
            #expect(try db.state() == before)
        }
        for token in [nil, "wrong"] as [String?] {
            #expect(try await request("GET", changes, token: token).status == 401)
        }
        // The transport says what happened.
        await #expect { try await HTTPSyncTransport(server: server.url, token: "wrong").pull(since: nil) } throws: {
            ($0 as? StrataError)?.code == .invalidOperation && ($0 as? StrataError)?.message.contains("401") == true
        }
        await #expect { try await HTTPSyncTransport(server: server.url, token: aliceToken).push(Self.batch("bob", 1, [Self.insert(2, "b")])) } throws: {
            ($0 as? StrataError)?.message.contains("403") == true
        }
        #expect(try db.state() == before)
    }

    @Test func anUnreachableServerIsAnIOErrorThatSaysSo() async throws {
        // Port 9 on loopback: nothing listens there.
        let t = HTTPSyncTransport(server: URL(string: "http://127.0.0.1:9")!, token: "t", timeout: 2)
        await #expect { try await t.pull(since: nil) } throws: {
            ($0 as? StrataError)?.code == .io && ($0 as? StrataError)?.message.contains("cannot reach the sync server") == true
        }
    }

    @Test func aBatchIsAppliedOnceEvenWhenItArrivesConcurrently() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let token = try db.token(for: "alice")
        let transport = HTTPSyncTransport(server: server.url, token: token)
        let batch = Self.batch("alice", 1, (1...50).map { Self.insert($0, "t\($0)") })
        let acks = try await withThrowingTaskGroup(of: BatchAck.self) { group in
            for _ in 0..<8 { group.addTask { try await transport.push(batch) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(Set(acks).count == 1, "every copy gets the same acknowledgement")
        #expect(acks[0].results.allSatisfy { $0.status == .ok })
        #expect(try db.sql("SELECT count(*), max(version) FROM strata_rows").trimmingCharacters(in: .whitespacesAndNewlines) == "50|50",
                "each row written once")
        #expect(try db.sql("SELECT count(*) FROM strata_batches").trimmingCharacters(in: .whitespacesAndNewlines) == "1")
        // Later, the same id again: the stored answer.
        #expect(try await transport.push(batch) == acks[0])
    }

    @Test func aReusedBatchIdIsAnsweredOnlyForTheSameChanges() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let token = try db.token(for: "alice")
        let alice = HTTPSyncTransport(server: server.url, token: token)
        let first = Self.batch("alice", 1, [Self.insert(1, "one")])
        let ack = try await alice.push(first)
        _ = try await alice.push(Self.batch("alice", 3, [Self.insert(3, "three")]))
        _ = try await HTTPSyncTransport(server: server.url, token: try db.token(for: "bob")).push(Self.batch("bob", 9, [Self.insert(9, "nine")]))
        #expect(try await alice.push(first) == ack, "the same batch again: the stored answer")
        let before = try db.state()
        // Other rows under a used id, and the same row with another value: both refused, with
        // alice's highest batch number, and nothing changes.
        for reused in [Self.batch("alice", 1, [Self.insert(2, "two")]), Self.batch("alice", 1, [Self.insert(1, "uno")])] {
            let r = try await request("POST", server.url.appendingPathComponent("v1/batches"), token: token, body: try WireFormat.encode(reused))
            #expect(r.status == 409 && r.body.contains(#""error":"batchIDReused""#) && r.body.contains(#""highestBatchNumber":3"#), "\(r.status) \(r.body)")
            await #expect { try await alice.push(reused) } throws: {
                ($0 as? BatchRefused)?.reason == .idReused && ($0 as? BatchRefused)?.highestBatchNumber == 3
            }
            #expect(try db.state() == before)
        }
        // A batch stored before digests were kept (schema 2) is matched on the rows it answered:
        // other rows are refused; the same rows with other values cannot be told apart.
        try db.sql("UPDATE strata_batches SET digest = NULL")
        #expect(try await alice.push(first) == ack)
        #expect(try await alice.push(Self.batch("alice", 1, [Self.insert(1, "uno")])) == ack)
        await #expect { try await alice.push(Self.batch("alice", 1, [Self.insert(2, "two")])) } throws: {
            ($0 as? BatchRefused)?.highestBatchNumber == 3
        }
    }

    /// A store goes back to a briefcase exported after its first batch, batch counter included,
    /// and numbers its next batch 2 again, with other changes than the batch 2 the server
    /// applied: the server refuses the id, and the client sends the edit again as batch 3.
    @Test func aStoreWhoseBatchCounterWentBackSendsItsEditUnderANewId() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let (store, path) = try makeStore()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let token = try db.token(for: store.clientID)
        let transport = HTTPSyncTransport(server: server.url, token: token)
        let sync = SyncClient(store: store, policy: .clientWins)
        try await store.write { try $0.insert("tasks", ["id": 1, "title": "zero"]) }
        _ = try await sync.sync(with: transport)
        let file = path + ".briefcase"
        defer { try? FileManager.default.removeItem(atPath: file) }
        try store.exportBriefcase(to: file)
        try await store.write { try $0.update("tasks", key: 1, ["title": "first"]) }
        _ = try await sync.sync(with: transport)

        try store.importBriefcase(from: file, restoringProperties: true)
        try await store.write { try $0.update("tasks", key: 1, ["title": "second"]) }
        _ = try await sync.sync(with: transport)
        #expect(try await serverRows(server.url, token: token) == (try storeRows(store)))
        #expect(try await store.read { try $0.row("tasks", key: 1)?["title"] } == "second")
        #expect(try await store.read { try $0.pendingRows() }.isEmpty)
        let ids = try db.sql("SELECT id FROM strata_batches ORDER BY seq").split(separator: "\n").map(String.init)
        #expect(ids == (1...3).map { "\(store.clientID)-\($0)" })
    }

    /// A property-bag row deleted and inserted again on the server reaches a store that missed
    /// the delete as one upsert, where a field left out means "unchanged": the old row's fields
    /// must come as null, or the store keeps them, and its later delete of the row, naming them,
    /// is a conflict forever. Found by `EndToEndTests` (trial seed 14939751394073512899 of
    /// `fiveStoresConvergeThroughTheServer`: the clients never settled).
    @Test func aPropertyBagRowInsertedAgainLeavesNoFieldOfTheOldRow() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let (a, pathA) = try makeStore()
        let (b, pathB) = try makeStore()
        defer { for p in [pathA, pathB] { try? FileManager.default.removeItem(atPath: p) } }
        let (sa, sb) = (SyncClient(store: a), SyncClient(store: b))
        let ta = HTTPSyncTransport(server: server.url, token: try db.token(for: a.clientID))
        let tb = HTTPSyncTransport(server: server.url, token: try db.token(for: b.clientID))
        try await a.write { try $0.insert("settings", ["name": "k", "v": 1, "w": "old"]) }
        _ = try await sa.sync(with: ta)
        _ = try await sb.sync(with: tb)
        #expect(try await b.read { try $0.row("settings", key: "k") }?["w"] == "old")
        try await a.write { try $0.delete("settings", key: "k") }
        _ = try await sa.sync(with: ta)
        try await a.write { try $0.insert("settings", ["name": "k", "v": 2]) }
        _ = try await sa.sync(with: ta)
        _ = try await sb.sync(with: tb)
        let row = try await b.read { try $0.row("settings", key: "k") }
        #expect(row?["v"] == 2)
        #expect(row?["w"] == .null)
        #expect(try storeRows(b) == (try storeRows(a)))
        // And b's delete of the row, naming what it holds, goes through.
        try await b.write { try $0.delete("settings", key: "k") }
        _ = try await sb.sync(with: tb)
        #expect(try await b.read { try $0.pendingRows() }.isEmpty)
        #expect(try await serverRows(server.url, token: try db.token(for: "observer")) == (try storeRows(b)))
    }

    @Test func concurrencyIsCheckedPerField() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let a = HTTPSyncTransport(server: server.url, token: try db.token(for: "a"))
        let b = HTTPSyncTransport(server: server.url, token: try db.token(for: "b"))
        _ = try await a.push(Self.batch("a", 1, [RowChange(table: "tasks", key: 1, kind: .insert, values: ["id": 1, "title": "t", "priority": 1])]))
        func update(_ f: String, _ old: Value, _ new: Value) -> RowChange {
            RowChange(table: "tasks", key: 1, kind: .update, values: [f: new], originals: [f: old])
        }
        // Different fields of one row: both apply.
        #expect(try await a.push(Self.batch("a", 2, [update("title", "t", "title A")])).results[0].status == .ok)
        #expect(try await b.push(Self.batch("b", 1, [update("priority", 1, 2)])).results[0].status == .ok)
        // The same field, changed first by someone else: a conflict, and nothing changes.
        let before = try db.state().components(separatedBy: "\n").first
        #expect(try await b.push(Self.batch("b", 2, [update("title", "t", "title B")])).results[0].status == .conflict)
        #expect(try db.state().components(separatedBy: "\n").first == before)
        // A delete naming stale originals is a conflict too; with the right ones it applies and
        // leaves a tombstone that the changes feed lists.
        #expect(try await b.push(Self.batch("b", 3, [RowChange(table: "tasks", key: 1, kind: .delete, originals: ["title": "t", "priority": 2])])).results[0].status == .conflict)
        // A delete changes every field: one that does not name a field the server holds (here
        // `done`, filled in by its default, and `notes`, set by another client since) is a
        // conflict, so that no value is deleted unseen.
        #expect(try await a.push(Self.batch("a", 3, [update("notes", .null, "set by a")])).results[0].status == .ok)
        #expect(try await b.push(Self.batch("b", 4, [RowChange(table: "tasks", key: 1, kind: .delete, originals: ["title": "title A", "priority": 2, "done": false])])).results[0].status == .conflict)
        #expect(try await b.push(Self.batch("b", 5, [RowChange(table: "tasks", key: 1, kind: .delete, originals: ["title": "title A", "priority": 2, "notes": "set by a"])])).results[0].status == .conflict)
        #expect(try await b.push(Self.batch("b", 6, [RowChange(table: "tasks", key: 1, kind: .delete, originals: ["title": "title A", "priority": 2, "done": false, "notes": "set by a"])])).results[0].status == .ok)
        let delta = try await a.pull(since: "0")
        #expect(delta.tables.first { $0.table == "tasks" }?.deletes == [1])
        #expect(try await a.pull(since: nil).tables.first { $0.table == "tasks" }?.upserts.isEmpty == true)
    }

    @Test func serverAssignedKeysReplaceClientKeys() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let a = HTTPSyncTransport(server: server.url, token: try db.token(for: "a"))
        let ack = try await a.push(Self.batch("a", 1, [
            Self.insert(7, "parent"),
            RowChange(table: "comments", key: -1, kind: .insert, values: ["id": -1, "task": 7, "text": "first"]),
            RowChange(table: "comments", key: -2, kind: .insert, values: ["id": -2, "task": 7, "text": "second"]),
        ]))
        let keys = ack.results.compactMap(\.newKey)
        #expect(keys.count == 2 && Set(keys).count == 2 && !keys.contains(-1) && !keys.contains(-2))
        let rows = try await a.pull(since: nil).tables.first { $0.table == "comments" }!.upserts
        #expect(Set(rows.map { RowKey([$0.fields["id"]!]) }) == Set(keys))
    }

    @Test func aChildOfAMissingParentIsRefusedWithItsReasonAndAction() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let a = HTTPSyncTransport(server: server.url, token: try db.token(for: "a"))
        _ = try await a.push(Self.batch("a", 1, [Self.insert(1, "one"), Self.insert(2, "two")]))
        let before = try db.sql("SELECT tbl, key, fields, deleted FROM strata_rows ORDER BY 1, 2")
        let ack = try await a.push(Self.batch("a", 2, [
            RowChange(table: "tasks", key: 2, kind: .delete, originals: ["title": "two", "priority": 0, "done": false]),
            RowChange(table: "comments", key: -1, kind: .insert, values: ["id": -1, "task": 9, "text": "no such task"]),
            RowChange(table: "comments", key: -2, kind: .insert, values: ["id": -2, "task": 2, "text": "task deleted just before"]),
            RowChange(table: "comments", key: -3, kind: .insert, values: ["id": -3, "task": 1, "text": "fine"]),
        ]))
        #expect(ack.results.map(\.status) == [.ok, .error, .error, .ok])
        #expect(ack.results[1].error == RowError(reason: "task names tasks 9, which does not exist on the server", action: .setAside))
        #expect(ack.results[2].error?.action == .setAside)
        // Only the delete and the good comment were written.
        let after = try db.sql("SELECT tbl, key, fields, deleted FROM strata_rows ORDER BY 1, 2")
        #expect(after.split(separator: "\n").count == before.split(separator: "\n").count + 1)
        #expect(after.contains("\"fine\"") && !after.contains("no such task") && !after.contains("deleted just before"))
    }

    /// A snapshot page that ends on a key outside ASCII: the next page starts right after it.
    /// Before, the cursor went back raw in a header, which an HTTP stack may read as Latin-1.
    @Test func aSnapshotPageMayEndOnAKeyOutsideASCII() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let token = try db.token(for: "a")
        let names = ["ascii", "café", "naïve", "日本語", "zürich", "ñandú", "émoji 🙂"]
        _ = try await HTTPSyncTransport(server: server.url, token: token).push(Self.batch("a", 1, names.map {
            RowChange(table: "settings", key: RowKey(.string($0)), kind: .insert, values: ["name": .string($0), "value": 1])
        }))
        for pageSize in [1, 2, 3] {
            let snapshot = try await HTTPSyncTransport(server: server.url, token: token, pageSize: pageSize).pull(since: nil)
            let got = snapshot.tables.first { $0.table == "settings" }!.upserts.map { $0.fields["name"]! }
            #expect(got.count == names.count && Set(got) == Set(names.map { Value.string($0) }), "pages of \(pageSize): \(got)")
        }
        // Page by hand, through a client that reads header values as Latin-1 (as URLSession does
        // on Apple's platforms; on Linux it reads UTF-8), sending back whatever cursor it got.
        func latin1(_ s: String) -> String { String(String.UnicodeScalarView(s.utf8.map { Unicode.Scalar($0) })) }
        var got: [Value] = []
        var query = "limit=1"
        for _ in 0..<20 {
            var r = URLRequest(url: URL(string: "\(server.url.absoluteString)/v1/changes?\(query)")!)
            r.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
            let (data, response) = try await URLSession.shared.data(for: r)
            let http = response as! HTTPURLResponse
            #expect(http.statusCode == 200, "\(query): \(String(decoding: data, as: UTF8.self))")
            got += try WireFormat.decode(ServerDelta.self, from: data).tables.first { $0.table == "settings" }?.upserts.map { $0.fields["name"]! } ?? []
            guard http.value(forHTTPHeaderField: "Strata-More") == "true" else { break }
            var items = [URLQueryItem(name: "limit", value: "1"), URLQueryItem(name: "until", value: http.value(forHTTPHeaderField: "Strata-Until"))]
            for (header, parameter) in [("Strata-After", "after"), ("Strata-After-Table", "afterTable"), ("Strata-After-Key", "afterKey")] {
                if let v = http.value(forHTTPHeaderField: header) { items.append(URLQueryItem(name: parameter, value: latin1(v))) }
            }
            var c = URLComponents()
            c.queryItems = items
            query = c.percentEncodedQuery!.replacingOccurrences(of: "+", with: "%2B")
        }
        #expect(got.count == names.count && Set(got) == Set(names.map { Value.string($0) }), "\(got)")
    }

    @Test func pagesAndResets() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let t = HTTPSyncTransport(server: server.url, token: try db.token(for: "a"), pageSize: 3)
        _ = try await t.push(Self.batch("a", 1, (1...10).map { Self.insert($0, "t\($0)") }))
        // A delete names every non-null field, the defaults the server filled in too.
        _ = try await t.push(Self.batch("a", 2, [RowChange(table: "tasks", key: 2, kind: .delete, originals: ["title": "t2", "priority": 0, "done": false])]))
        // Ten rows in pages of three, as one delta; the deleted row is absent from a snapshot.
        let snapshot = try await t.pull(since: nil)
        #expect(snapshot.mode == .snapshot && snapshot.anchor == "11")
        #expect(snapshot.tables.first { $0.table == "tasks" }!.upserts.count == 9)
        let incremental = try await t.pull(since: "4")
        #expect(incremental.since == "4" && incremental.anchor == "11")
        #expect(incremental.tables[0].upserts.count == 6 && incremental.tables[0].deletes == [2])
        // An anchor the server never handed out, and one older than the pruned tombstones.
        await #expect { try await t.pull(since: "99") } throws: { ($0 as? ResetRequired)?.reason == .unknownClient }
        let r = try run(productsFolder().appendingPathComponent("strata-server").path, ["prune", "--database-url", db.url, "--through", "11"])
        #expect(r.status == 0, "\(r.err)")
        do {
            _ = try await t.pull(since: "4")
            Issue.record("an expired anchor must ask for a reset")
        } catch let e as ResetRequired {
            #expect(e.reason == .anchorExpired)
        }
        #expect(try await t.pull(since: "11").tables.isEmpty)
    }

    /// A client reset against strata-server, streamed in pages of three: the rows deleted on
    /// the server while the client was away are swept, the rows changed come in, and the local
    /// edit made meanwhile survives and goes up. Keys 1…25 put the JSON text order the server
    /// pages in ("[10]" before "[2]") against the store's key order.
    @Test func aClientResetStreamsPageByPage() async throws {
        let db = try TestDatabase()
        let server = try ServerProcess(db)
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let (store, path) = try makeStore()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let phone = HTTPSyncTransport(server: server.url, token: try db.token(for: store.clientID), pageSize: 3)
        let other = HTTPSyncTransport(server: server.url, token: try db.token(for: "other"), pageSize: 3)
        _ = try await other.push(Self.batch("other", 1, (1...25).map { Self.insert($0, "t\($0)") }))
        let client = SyncClient(store: store)
        _ = try await client.sync(with: phone)
        #expect(try storeRows(store).count == 25)
        // While the phone is away: rows deleted and changed on the server, its history pruned.
        let gone: [Int64] = [2, 10, 17, 25]
        _ = try await other.push(Self.batch("other", 2, gone.map { id in
            RowChange(table: "tasks", key: RowKey(.int(id)), kind: .delete, originals: ["title": .string("t\(id)"), "priority": 0, "done": false])
        } + [RowChange(table: "tasks", key: 3, kind: .update, values: ["title": "three"], originals: ["title": "t3"])]))
        let latest = try db.sql("SELECT max(version) FROM strata_rows").trimmingCharacters(in: .whitespacesAndNewlines)
        let r = try run(productsFolder().appendingPathComponent("strata-server").path, ["prune", "--database-url", db.url, "--through", latest])
        #expect(r.status == 0, "\(r.err)")
        try await store.write { tx in try tx.update("tasks", key: 4, ["title": "mine"]) }
        let report = try await client.sync(with: phone)
        #expect(report.reset?.reason == .anchorExpired)
        #expect(report.batches == 1)
        let onServer = try await serverRows(server.url, token: try db.token(for: "other"))
        #expect(try storeRows(store) == onServer)
        let titles = try await store.read { snap in try snap.rows("tasks").map { ($0.key, $0["title"]) } }
        #expect(titles.count == 21)
        #expect(titles.contains { $0.0 == 3 && $0.1 == "three" } && titles.contains { $0.0 == 4 && $0.1 == "mine" })
        #expect(try await store.read { try $0.pendingRows() }.isEmpty)
    }

    /// The server and its admin commands start without PostgresNIO's warning about a pool used
    /// before it runs ("PostgresClient.run() hasn't been called yet"): the migration runs on a
    /// connection of its own. The warning came from a race (about one start in five here), so
    /// each is started several times.
    @Test func theServerStartsWithoutWarnings() async throws {
        let db = try TestDatabase()
        let token = try db.token(for: "a")
        for i in 0..<6 {
            let admin = try run(productsFolder().appendingPathComponent("strata-server").path, ["token", "create", "--database-url", db.url, "--client-id", "b\(i)"])
            #expect(admin.status == 0 && !admin.err.contains("run()"), "\(admin.err)")
            let p = Process()
            p.executableURL = productsFolder().appendingPathComponent("strata-server")
            p.arguments = ["--database-url", db.url, "--tables", tablesFile, "--port", "0"]
            let out = Pipe(), err = Pipe()
            p.standardOutput = out
            p.standardError = err
            try p.run()
            var seen = ""
            while !seen.contains("listening on http://127.0.0.1:") {
                let chunk = out.fileHandleForReading.availableData
                if chunk.isEmpty { break }
                seen += String(decoding: chunk, as: UTF8.self)
            }
            let port = try #require(seen.components(separatedBy: "listening on http://127.0.0.1:").last?.split(separator: "\n").first.flatMap { Int($0) }, "\(seen)")
            // A request, so that the pool leases a connection.
            let r = try await request("GET", URL(string: "http://127.0.0.1:\(port)/v1/changes")!, token: token)
            #expect(r.status == 200, "\(r.body)")
            p.terminate()
            p.waitUntilExit()
            let log = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            #expect(!log.contains("run()") && !log.contains("warning"), "start \(i): \(log)")
        }
    }
}

import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Strata
import StrataSync
import Testing

/// The request paths that run on prepared statements: tokens, pushes, replays and pulls. Each
/// test's database makes PostgreSQL use the generic plan of every prepared statement from its
/// first run (`plan_cache_mode = force_generic_plan`), which it otherwise switches to after five
/// runs on a connection: what the server does under load is what is tested.
@Suite(.serialized, .enabled(if: pgAvailable, "set STRATA_TEST_PG_URL (see Server/Scripts/start-postgres.sh)"))
struct PreparedStatementTests {
    /// A database whose connections plan prepared statements generically, and a server on it.
    static func start() throws -> (TestDatabase, ServerProcess) {
        let db = try TestDatabase()
        try db.sql("ALTER DATABASE \(db.name) SET plan_cache_mode = force_generic_plan")
        return (db, try ServerProcess(db))
    }

    /// The server hashes tokens itself: one stored as PostgreSQL hashed it still works, and one
    /// deleted from `strata_tokens` is refused from the next request on (there is no cache).
    @Test func tokensAreHashedAsStoredAndADeletedOneIsRefusedAtOnce() async throws {
        let (db, server) = try Self.start()
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let made = try db.token(for: "alice")
        // As the server stored tokens before it hashed them in the process.
        let older = "a-token-hashed-by-postgresql-0123"
        try db.sql("INSERT INTO strata_tokens (token_sha256, client_id) VALUES (encode(sha256(convert_to('\(older)', 'UTF8')), 'hex'), 'bob')")
        let changes = server.url.appendingPathComponent("v1/changes")
        for _ in 0..<6 {
            #expect(try await request("GET", changes, token: made).status == 200)
            #expect(try await request("GET", changes, token: older).status == 200)
        }
        #expect(try await request("GET", changes, token: made + "0").status == 401)
        try db.sql("DELETE FROM strata_tokens WHERE client_id = 'alice'")
        #expect(try await request("GET", changes, token: made).status == 401)
        let push = try WireFormat.encode(Batch(id: "alice-1", clientID: "alice", number: 1, changes: [ProtocolTests.insert(1, "a")]))
        #expect(try await request("POST", server.url.appendingPathComponent("v1/batches"), token: made, body: push).status == 401)
        #expect(try db.sql("SELECT count(*) FROM strata_batches").trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        #expect(try await request("GET", changes, token: older).status == 200)
    }

    /// Batches that insert, update, conflict and name parents, each pushed twice: the second
    /// push of each gets the first one's answer and changes nothing.
    @Test func batchesApplyOnceAndTheirRepeatsGetTheStoredAnswer() async throws {
        let (db, server) = try Self.start()
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let t = HTTPSyncTransport(server: server.url, token: try db.token(for: "alice"))
        var batches: [Batch] = [ProtocolTests.batch("alice", 1, (1...5).map { ProtocolTests.insert($0, "v1") })]
        for n in 2...8 as ClosedRange<UInt64> {
            var changes = (1...5).map { k in
                RowChange(table: "tasks", key: RowKey(.int(k)), kind: .update, values: ["title": .string("v\(n)")], originals: ["title": .string("v\(n - 1)")])
            }
            changes.append(ProtocolTests.insert(Int64(100 + n), "new"))
            // A comment on task 1 (a parent that exists) and on task 999 (one that does not).
            changes.append(RowChange(table: "comments", key: RowKey(.int(Int64(-Int(n)))), kind: .insert,
                                     values: ["id": .int(Int64(-Int(n))), "task": 1, "text": "c"]))
            changes.append(RowChange(table: "comments", key: RowKey(.int(Int64(-100 - Int(n)))), kind: .insert,
                                     values: ["id": .int(Int64(-100 - Int(n))), "task": 999, "text": "orphan"]))
            batches.append(ProtocolTests.batch("alice", n, changes))
        }
        // Stale originals: a conflict on every row.
        batches.append(ProtocolTests.batch("alice", 9, (1...5).map { k in
            RowChange(table: "tasks", key: RowKey(.int(k)), kind: .update, values: ["title": "x"], originals: ["title": "v1"])
        }))
        var acks: [BatchAck] = []
        for b in batches { acks.append(try await t.push(b)) }
        #expect(acks[0].results.allSatisfy { $0.status == .ok })
        for ack in acks[1..<8] {
            let statuses = ack.results.map(\.status)
            #expect(statuses.prefix(7).allSatisfy { $0 == .ok } && statuses.last != .ok, "\(statuses)")
        }
        #expect(acks[8].results.allSatisfy { $0.status == .conflict })
        let before = try db.state()
        #expect(try db.sql("SELECT count(*) FROM strata_rows WHERE tbl = 'tasks'").trimmingCharacters(in: .whitespacesAndNewlines) == "12")
        #expect(try db.sql("SELECT count(*) FROM strata_rows WHERE tbl = 'comments'").trimmingCharacters(in: .whitespacesAndNewlines) == "7")
        for (b, ack) in zip(batches, acks) {
            #expect(try await t.push(b) == ack)
        }
        #expect(try db.state() == before)
    }

    /// A page is read by one statement: its anchor checks still refuse what they refused, and
    /// each row's time of change is the one PostgreSQL stored, to the last bit of the double.
    @Test func pagesCheckTheirAnchorsAndCarryTheStoredTimes() async throws {
        let (db, server) = try Self.start()
        defer { withExtendedLifetime((db, server)) {} }   // see `ServerProcess`
        let token = try db.token(for: "a")
        let t = HTTPSyncTransport(server: server.url, token: token, pageSize: 4)
        for n in 1...12 as ClosedRange<UInt64> {
            _ = try await t.push(ProtocolTests.batch("a", n, [ProtocolTests.insert(Int64(n), "t\(n)")]))
        }
        let changes = server.url.appendingPathComponent("v1/changes")
        func get(_ query: String) async throws -> (status: Int, body: String) {
            try await request("GET", URL(string: changes.absoluteString + "?" + query)!, token: token)
        }
        let page = try await get("since=0&limit=20")
        #expect(page.status == 200)
        let sent = page.body.components(separatedBy: #""timestamp":"#).dropFirst().map { Double($0.prefix { "0123456789.eE+-".contains($0) })! }
        let stored = try db.sql("SELECT extract(epoch FROM updated_at)::float8 FROM strata_rows ORDER BY version")
            .split(separator: "\n").map { Double($0.trimmingCharacters(in: .whitespaces))! }
        #expect(sent.count == 12 && sent == stored, "\(sent) \(stored)")

        #expect(try await get("since=13").status == 410)
        #expect(try await get("since=2&until=13").status == 400)
        #expect(try await get("until=13").status == 400)
        // Paged with `until` fixed: rows changed meanwhile come in the next pull, not this one.
        let first = try await get("since=0&limit=5&until=8")
        #expect(first.status == 200 && first.body.contains(#""anchor":"5""#), "\(first.body)")
        let last = try await get("since=5&limit=5&until=8")
        #expect(last.status == 200 && last.body.contains(#""anchor":"8""#) && !last.body.contains(#""title":"t9""#), "\(last.body)")
        let r = try run(productsFolder().appendingPathComponent("strata-server").path, ["prune", "--database-url", db.url, "--through", "6"])
        #expect(r.status == 0, "\(r.err)")
        #expect(try await get("since=5").status == 410)
        #expect(try await get("since=6").status == 200)
        let delta = try await t.pull(since: "6")
        #expect(delta.anchor == "12" && delta.tables.flatMap(\.upserts).count == 6)
    }
}

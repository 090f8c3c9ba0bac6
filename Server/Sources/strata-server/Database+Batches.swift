import Crypto
import Foundation
import Logging
import PostgresNIO
import Strata
import StrataSync

extension Database {
    /// Applies a batch pushed by `clientID` and returns its acknowledgement; a batch id seen
    /// before with the same payload gets its stored acknowledgement and is not applied again.
    /// The same id with another payload is refused (409, with the client's highest batch
    /// number): its client's batch counter went back, and the stored acknowledgement would
    /// settle rows the server never saw.
    ///
    /// One PostgreSQL transaction holds the whole batch and its acknowledgement:
    /// 1. claim the batch id (`INSERT … ON CONFLICT DO NOTHING`), with the SHA-256 of the payload:
    ///    a second transaction carrying the same id waits on the first one's uncommitted row, then
    ///    finds it taken and answers with the stored acknowledgement, so a batch is never applied
    ///    twice, even concurrently;
    /// 2. lock the rows the batch names (`FOR UPDATE`) and the parents it names (`FOR SHARE`), draw
    ///    the server-assigned keys, and decide every change in memory by `ServerRules`;
    /// 3. take the version lock, write the rows with versions from the sequence, store the ack,
    ///    and commit. Holding that lock from the first version drawn to the commit makes versions
    ///    commit in order, so a pull that sees version v has seen every version below it.
    func apply(_ batch: Batch) async throws -> BatchAck {
        guard batch.id == "\(batch.clientID)-\(batch.number)" else {
            throw RequestError.bad("the batch id '\(batch.id)' is not '<clientID>-<number>' (\(batch.clientID)-\(batch.number))")
        }
        // The payload as the wire format writes it (sorted keys: equal batches, equal bytes),
        // whatever bytes the client sent; its digest is what a repeat of the id is matched on.
        // Hex, lowercase: as PostgreSQL's encode(sha256(…), 'hex') wrote the digests stored before.
        let digest = SHA256.hash(data: try WireFormat.encode(batch)).map { String(format: "%02x", $0) }.joined()
        // A batch applied before is answered before its rows are checked: the tables file may
        // have changed since, and the answer must not.
        let stored = try await client.withConnection { c in try await storedAnswer(batch, digest: digest, on: c) }
        if let stored { return stored }
        // Checked against the tables before anything is written. A change that violates them is
        // answered on its own row (`error`, `setAside`, with the reason), as a child of a missing
        // parent is: refusing the whole batch would hold back every other row of it, and the
        // client's downloads behind it, for good.
        let changes = rules.prepare(batch.changes)
        // A deadlock (two batches locking the same rows in another order) or a serialization
        // failure rolls back the whole transaction; it is safe to run it again.
        for attempt in 1... {
            do {
                return try await applyOnce(batch, digest, changes)
            } catch let e as PSQLError where attempt < 5 && ["40P01", "40001"].contains(e.serverInfo?[.sqlState] ?? "") {
                logger.info("batch \(batch.id): retrying after \(e.serverInfo?[.sqlState] ?? "")")
            }
        }
        fatalError("unreachable")
    }

    /// The rules every batch is decided by, shared with `InMemorySyncServer`.
    var rules: ServerRules { ServerRules(tables) }

    /// The stored acknowledgement of `batch`'s id, if a batch with that id was applied, and
    /// only if it carried the same payload (`digest`).
    ///
    /// - Throws: a 409 (`batchIDReused`, with `highestBatchNumber`: the highest number stored for
    ///   the client) when the stored batch carried another payload.
    private func storedAnswer(_ batch: Batch, digest: String, on c: PostgresConnection) async throws -> BatchAck? {
        let stored = try await c.query("SELECT ack, digest FROM strata_batches WHERE id = \(batch.id)", logger: logger).collect()
        guard let row = stored.first else { return nil }
        let (text, storedDigest) = try row.decode((String?, String?).self)
        guard let text else { throw ServerError("batch \(batch.id) has no stored acknowledgement") }
        let ack = try WireFormat.decode(BatchAck.self, from: Data(text.utf8))
        // A batch stored before digests were kept (schema 2) can only be matched on the rows its
        // acknowledgement answers, in order.
        let same = storedDigest.map { $0 == digest }
            ?? (ack.results.map { ServerRules.RowID($0.table, $0.key) } == batch.changes.map { ServerRules.RowID($0.table, $0.key) })
        guard same else {
            // Batch ids are `<clientID>-<number>` (checked before any is stored).
            let highest = try await c.query("""
                SELECT max(substr(id, char_length(client_id) + 2)::numeric)::text FROM strata_batches WHERE client_id = \(batch.clientID)
                """, logger: logger).collect().first?.decode(String?.self).flatMap { UInt64($0) }
            var refusal = RequestError(409, "batchIDReused", """
                batch \(batch.id) was applied before with other changes: this client's batch counter went back \
                (a restored backup?); send the changes under a number above \(highest.map(String.init) ?? "the highest used")
                """)
            refusal.highestBatchNumber = highest
            throw refusal
        }
        return ack
    }

    private func applyOnce(_ batch: Batch, _ digest: String, _ changes: ServerRules.Prepared) async throws -> BatchAck {
        try await client.withConnection { c in
            try await c.query("BEGIN", logger: logger)
            do {
                let claimed = try await c.query("""
                    INSERT INTO strata_batches (id, client_id, digest) VALUES (\(batch.id), \(batch.clientID), \(digest))
                    ON CONFLICT (id) DO NOTHING RETURNING id
                    """, logger: logger).collect()
                if claimed.isEmpty {
                    try await c.query("ROLLBACK", logger: logger)
                    guard let ack = try await storedAnswer(batch, digest: digest, on: c) else {
                        throw ServerError("batch \(batch.id) has no stored acknowledgement")
                    }
                    return ack
                }
                let ack = try await decideAndWrite(batch, changes, on: c)
                try await c.query("COMMIT", logger: logger)
                return ack
            } catch {
                _ = try? await c.query("ROLLBACK", logger: logger)
                throw error
            }
        }
    }

    private func decideAndWrite(_ batch: Batch, _ prepared: ServerRules.Prepared, on c: PostgresConnection) async throws -> BatchAck {
        // Lock every row the batch names (the rows the tables refuse are neither read nor
        // written), in one statement, in key order. A row found comes back as its place in
        // `prepared.rows` (from 1), not as its table and key: nothing to decode or look up.
        let named = prepared.rows
        var stored: [ServerRules.RowID: ServerRules.StoredRow] = [:]
        stored.reserveCapacity(named.count)
        let locked = try await c.query("""
            SELECT u.i, r.fields, r.deleted
            FROM unnest(\(named.map(\.table))::text[], \(named.map(\.keyText))::text[]) WITH ORDINALITY AS u(t, k, i)
            JOIN strata_rows r ON r.tbl = u.t AND r.key = u.k
            ORDER BY r.tbl, r.key FOR UPDATE OF r
            """, logger: logger)
        for try await row in locked {
            var cells = Cells(row)
            let (i, fields, deleted) = (try cells.next(Int64.self), try cells.next(String.self), try cells.next(Bool.self))
            stored[named[try Self.place(i, of: named.count)]] = ServerRules.StoredRow(
                fields: try WireFormat.decode([String: Value].self, from: Data(fields.utf8)), deleted: deleted)
        }

        // The parents that children in this batch name, as they are now (shared locks, so that
        // no batch deletes one before this one commits). A parent this batch itself inserts or
        // deletes is judged by the batch's own state.
        var liveParents = Set<ServerRules.RowID>()
        if !prepared.parents.isEmpty {
            let refs = prepared.parents
            let found = try await c.query("""
                SELECT u.i FROM unnest(\(refs.map(\.table))::text[], \(refs.map(\.keyText))::text[]) WITH ORDINALITY AS u(t, k, i)
                JOIN strata_rows r ON r.tbl = u.t AND r.key = u.k
                WHERE NOT r.deleted ORDER BY r.tbl, r.key FOR SHARE OF r
                """, logger: logger)
            for try await row in found {
                var cells = Cells(row)
                liveParents.insert(refs[try Self.place(try cells.next(Int64.self), of: refs.count)])
            }
        }
        var keys: [Value] = []
        if prepared.keysToDraw > 0 {
            let drawn = try await c.query("SELECT nextval('strata_keys') FROM generate_series(1, \(prepared.keysToDraw))", logger: logger)
            for try await k in drawn.decode(Int64.self) { keys.append(.int(k)) }
            keys.sort { $0.intValue! < $1.intValue! }
        }

        let outcome = rules.decide(prepared, stored: stored, liveParents: liveParents, drawnKeys: keys)
        var results = outcome.results
        // A row written twice is listed twice; its last write holds its state.
        var last: [ServerRules.RowID: Int] = [:]   // row → index in `outcome.writes` of its last write
        last.reserveCapacity(outcome.writes.count)
        for (i, w) in outcome.writes.enumerated() { last[w.id] = i }

        try await c.query("SELECT pg_advisory_xact_lock(\(Self.versionLock))", logger: logger)
        if !last.isEmpty {
            let ids = last.keys.sorted()
            func write(_ id: ServerRules.RowID) -> ServerRules.Write { outcome.writes[last[id]!] }
            func encoded(_ id: ServerRules.RowID) throws -> String {
                let w = write(id)
                let fields = w.fields ?? Dictionary(uniqueKeysWithValues: w.tombstoneNames.map { ($0, Value.null) })
                return String(decoding: try WireFormat.encode(fields), as: UTF8.self)
            }
            // A row is updated if the lock found it (tombstones included), inserted otherwise.
            let old = ids.filter { stored[$0] != nil }
            if !old.isEmpty {
                try await c.query("""
                    UPDATE strata_rows r SET fields = u.f, deleted = u.d, version = nextval('strata_version'), updated_at = now()
                    FROM unnest(\(old.map(\.table))::text[], \(old.map(\.keyText))::text[], \(try old.map(encoded))::text[], \(old.map { write($0).fields == nil })::bool[]) AS u(t, k, f, d)
                    WHERE r.tbl = u.t AND r.key = u.k
                    """, logger: logger)
            }
            let new = ids.filter { stored[$0] == nil }
            if !new.isEmpty {
                // A row no transaction had when we locked may have been inserted by a concurrent
                // batch since: that insert wins, and ours is a conflict. The statement answers
                // with the places (in `new`, from 1) of the rows it did not insert.
                let refused = try await c.query("""
                    WITH u AS (SELECT * FROM unnest(\(new.map(\.table))::text[], \(new.map(\.keyText))::text[], \(try new.map(encoded))::text[], \(new.map { write($0).fields == nil })::bool[]) WITH ORDINALITY AS u(t, k, f, d, i)),
                    ins AS (INSERT INTO strata_rows (tbl, key, fields, deleted, version)
                            SELECT t, k, f, d, nextval('strata_version') FROM u
                            ON CONFLICT (tbl, key) DO NOTHING RETURNING tbl, key)
                    SELECT u.i FROM u WHERE NOT EXISTS (SELECT FROM ins WHERE ins.tbl = u.t AND ins.key = u.k)
                    """, logger: logger)
                for try await row in refused {
                    var cells = Cells(row)
                    let r = write(new[try Self.place(try cells.next(Int64.self), of: new.count)]).result
                    results[r] = RowResult(table: results[r].table, key: results[r].key, status: .conflict)
                }
            }
        }
        let ack = BatchAck(batchID: batch.id, results: results)
        let text = String(decoding: try WireFormat.encode(ack), as: UTF8.self)
        try await c.query("""
            UPDATE strata_batches SET ack = \(text), seq = nextval('strata_batch_order') WHERE id = \(batch.id)
            """, logger: logger)
        return ack
    }

    /// The index in a list of `count` rows of the place PostgreSQL answered for one of them
    /// (`WITH ORDINALITY`, counted from 1).
    private static func place(_ i: Int64, of count: Int) throws -> Int {
        guard i >= 1, i <= count else { throw ServerError("PostgreSQL answered row \(i) of a list of \(count)") }
        return Int(i) - 1
    }
}

import Crypto
import Foundation
import Logging
import PostgresNIO
import Strata
import StrataSync

extension Database {
    /// Applies a batch pushed by `clientID` and returns its acknowledgement, in the wire format;
    /// a batch id seen before with the same payload gets its stored acknowledgement and is not
    /// applied again. The same id with another payload is refused (409, with the client's highest
    /// batch number): its client's batch counter went back, and the stored acknowledgement would
    /// settle rows the server never saw.
    ///
    /// One PostgreSQL transaction holds the whole batch and its acknowledgement, in two
    /// statements between `BEGIN` and `COMMIT`:
    /// 1. claim the batch id (`INSERT … ON CONFLICT DO NOTHING`), with the SHA-256 of the payload,
    ///    and only if it was claimed, lock the rows the batch names (`FOR UPDATE`). A second
    ///    transaction carrying the same id waits on the first one's uncommitted row, then finds it
    ///    taken, locks nothing, and answers with the stored acknowledgement, so a batch is never
    ///    applied twice, even concurrently. Then lock the parents the batch names (`FOR SHARE`),
    ///    draw the server-assigned keys (each only if the batch needs it), and decide every change
    ///    in memory by `ServerRules`;
    /// 2. take the version lock, write the rows with versions from the sequence, and store the ack;
    ///    then commit. Holding that lock from the first version drawn to the commit makes versions
    ///    commit in order, so a pull that sees version v has seen every version below it; one
    ///    statement under it, not four, keeps the time it is held short.
    func apply(_ batch: Batch) async throws -> Data {
        guard batch.id == "\(batch.clientID)-\(batch.number)" else {
            throw RequestError.bad("the batch id '\(batch.id)' is not '<clientID>-<number>' (\(batch.clientID)-\(batch.number))")
        }
        // The payload as the wire format writes it (sorted keys: equal batches, equal bytes),
        // whatever bytes the client sent; its digest is what a repeat of the id is matched on.
        let digest = Self.hex(SHA256.hash(data: try WireFormat.encode(batch)))
        // Checked against the tables before anything is written. A change that violates them is
        // answered on its own row (`error`, `setAside`, with the reason), as a child of a missing
        // parent is: refusing the whole batch would hold back every other row of it, and the
        // client's downloads behind it, for good. A batch applied before gets its stored answer
        // (step 1) whatever this says: the tables file may have changed since, and the answer
        // must not.
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

    /// A digest in lowercase hex: as PostgreSQL's encode(sha256(…), 'hex') wrote the digests
    /// stored before.
    static func hex(_ digest: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for b in digest {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The stored acknowledgement of `batch`'s id, if a batch with that id was applied, and
    /// only if it carried the same payload (`digest`).
    ///
    /// - Throws: a 409 (`batchIDReused`, with `highestBatchNumber`: the highest number stored for
    ///   the client) when the stored batch carried another payload.
    private func storedAnswer(_ batch: Batch, digest: String, on c: PostgresConnection) async throws -> BatchAck? {
        var found: (ack: String?, digest: String?)?
        for try await row in try await c.execute(StoredBatch(id: batch.id), logger: logger) {
            var cells = Cells(row)
            found = (try cells.next(String?.self), try cells.next(String?.self))
        }
        guard let (text, storedDigest) = found else { return nil }
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

    private func applyOnce(_ batch: Batch, _ digest: String, _ changes: ServerRules.Prepared) async throws -> Data {
        try await client.withConnection { c in
            try await c.run(Begin(), logger: logger)
            do {
                guard let stored = try await claimAndLock(batch, digest, changes, on: c) else {
                    try await c.query("ROLLBACK", logger: logger)
                    guard let ack = try await storedAnswer(batch, digest: digest, on: c) else {
                        throw ServerError("batch \(batch.id) has no stored acknowledgement")
                    }
                    return try WireFormat.encode(ack)
                }
                let ack = try await decideAndWrite(batch, changes, stored.rows, stored.places, on: c)
                try await c.run(Commit(), logger: logger)
                return ack
            } catch {
                _ = try? await c.query("ROLLBACK", logger: logger)
                throw error
            }
        }
    }

    /// Step 1 of ``apply(_:)``: claims the batch id and, if it was free, locks every row the
    /// batch names (the rows the tables refuse are neither read nor written) in key order, and
    /// reads them, tombstones included, with where each is stored (its `ctid`, as text); `nil`
    /// when the id was taken.
    ///
    /// One statement: the claim is a data-modifying `WITH`, and the rows are locked in a
    /// `LATERAL` subquery that names the claimed id, so that it runs after the claim and only
    /// when the claim returned a row (a taken id returns none: no rows at all). A row found comes
    /// back as its place in `prepared.rows` (from 1), not as its table and key: nothing to decode
    /// or look up. When none is found, the one row has nulls.
    private func claimAndLock(
        _ batch: Batch, _ digest: String, _ prepared: ServerRules.Prepared, on c: PostgresConnection
    ) async throws -> (rows: [ServerRules.RowID: ServerRules.StoredRow], places: [ServerRules.RowID: String])? {
        let named = prepared.rows
        let locked = try await c.execute(
            ClaimAndLock(id: batch.id, clientID: batch.clientID, digest: digest, tables: named.map(\.table), keys: named.map(\.keyText)),
            logger: logger)
        var claimed = false
        var stored: [ServerRules.RowID: ServerRules.StoredRow] = [:]
        var places: [ServerRules.RowID: String] = [:]
        stored.reserveCapacity(named.count)
        places.reserveCapacity(named.count)
        for try await row in locked {
            claimed = true
            var cells = Cells(row)
            guard let i = try cells.next(Int64?.self) else { continue }
            let (fields, deleted, ctid) = (try cells.next(String.self), try cells.next(Bool.self), try cells.next(String.self))
            let id = named[try Self.place(i, of: named.count)]
            stored[id] = ServerRules.StoredRow(fields: try WireFormat.decode([String: Value].self, from: Data(fields.utf8)), deleted: deleted)
            places[id] = ctid
        }
        return claimed ? (stored, places) : nil
    }

    /// Steps 1 (the parents and the keys) and 2 of ``apply(_:)``, after the rows were locked
    /// and read (`stored`, stored at `places`); returns the acknowledgement in the wire format.
    private func decideAndWrite(
        _ batch: Batch, _ prepared: ServerRules.Prepared, _ stored: [ServerRules.RowID: ServerRules.StoredRow],
        _ places: [ServerRules.RowID: String], on c: PostgresConnection
    ) async throws -> Data {
        // The parents that children in this batch name, as they are now (shared locks, so that
        // no batch deletes one before this one commits). A parent this batch itself inserts or
        // deletes is judged by the batch's own state.
        var liveParents = Set<ServerRules.RowID>()
        if !prepared.parents.isEmpty {
            let refs = prepared.parents
            let found = try await c.execute(LockParents(tables: refs.map(\.table), keys: refs.map(\.keyText)), logger: logger)
            for try await row in found {
                var cells = Cells(row)
                liveParents.insert(refs[try Self.place(try cells.next(Int64.self), of: refs.count)])
            }
        }
        var keys: [Value] = []
        if prepared.keysToDraw > 0 {
            for try await row in try await c.execute(DrawKeys(count: Int64(prepared.keysToDraw)), logger: logger) {
                var cells = Cells(row)
                keys.append(.int(try cells.next(Int64.self)))
            }
            keys.sort { $0.intValue! < $1.intValue! }
        }

        let outcome = rules.decide(prepared, stored: stored, liveParents: liveParents, drawnKeys: keys)
        let results = outcome.results
        // A row written twice is listed twice; its last write holds its state.
        var last: [ServerRules.RowID: Int] = [:]   // row → index in `outcome.writes` of its last write
        last.reserveCapacity(outcome.writes.count)
        for (i, w) in outcome.writes.enumerated() { last[w.id] = i }

        // A row is updated if the lock found it (tombstones included), inserted otherwise.
        let ids = last.keys.sorted()
        let old = ids.filter { stored[$0] != nil }, new = ids.filter { stored[$0] == nil }
        func write(_ id: ServerRules.RowID) -> ServerRules.Write { outcome.writes[last[id]!] }
        func encoded(_ id: ServerRules.RowID) throws -> String {
            let w = write(id)
            let fields = w.fields ?? Dictionary(uniqueKeysWithValues: w.tombstoneNames.map { ($0, Value.null) })
            return String(decoding: try WireFormat.encode(fields), as: UTF8.self)
        }
        var ack = BatchAck(batchID: batch.id, results: results)
        var text = try WireFormat.encode(ack)
        func rows(_ ids: [ServerRules.RowID]) throws -> Write.Rows {
            Write.Rows(tables: ids.map(\.table), keys: ids.map(\.keyText), fields: try ids.map(encoded), deleted: ids.map { write($0).fields == nil })
        }
        // Answers the places (in `new`, from 1) of the rows it did not insert, and the count of
        // rows it updated, negated (see `Write`).
        let refused = try await c.execute(
            Write(places: old.map { places[$0]! }, updates: try rows(old), inserts: try rows(new), ack: String(decoding: text, as: UTF8.self), id: batch.id),
            logger: logger)
        var conflicts = false
        for try await row in refused {
            var cells = Cells(row)
            let i = try cells.next(Int64.self)
            guard i > 0 else {
                // Every row locked in step 1 is still where it was found: updated, all of them.
                guard -i == old.count else { throw ServerError("batch \(batch.id): \(-i) of the \(old.count) rows locked were updated") }
                continue
            }
            let r = write(new[try Self.place(i, of: new.count)]).result
            ack.results[r] = RowResult(table: ack.results[r].table, key: ack.results[r].key, status: .conflict)
            conflicts = true
        }
        if conflicts {
            text = try WireFormat.encode(ack)
            try await c.query("UPDATE strata_batches SET ack = \(String(decoding: text, as: UTF8.self)) WHERE id = \(batch.id)", logger: logger)
        }
        return text
    }

    /// The index in a list of `count` rows of the place PostgreSQL answered for one of them
    /// (`WITH ORDINALITY`, counted from 1).
    private static func place(_ i: Int64, of count: Int) throws -> Int {
        guard i >= 1, i <= count else { throw ServerError("PostgreSQL answered row \(i) of a list of \(count)") }
        return Int(i) - 1
    }

    // MARK: Statements

    /// The statement of ``claimAndLock(_:_:_:on:)``: `$1` the batch id, `$2` its client, `$3` the
    /// payload's digest, `$4` and `$5` the tables and keys of the rows the batch names.
    private struct ClaimAndLock: PreparedRows {
        static let name = "strata_claim"
        static let sql = """
            WITH claim AS (
              INSERT INTO strata_batches (id, client_id, digest) VALUES ($1::text, $2::text, $3::text)
              ON CONFLICT (id) DO NOTHING RETURNING id)
            SELECT l.i, l.fields, l.deleted, l.ctid FROM claim LEFT JOIN LATERAL (
              SELECT u.i, r.fields, r.deleted, r.ctid::text
              FROM unnest($4::text[], $5::text[]) WITH ORDINALITY AS u(t, k, i)
              JOIN strata_rows r ON r.tbl = u.t AND r.key = u.k
              WHERE claim.id IS NOT NULL
              ORDER BY r.tbl, r.key FOR UPDATE OF r) l ON true
            """
        var id, clientID, digest: String
        var tables, keys: [String]

        func makeBindings() -> PostgresBindings {
            var b = PostgresBindings(capacity: 5)
            b.append(id)
            b.append(clientID)
            b.append(digest)
            b.append(tables)
            b.append(keys)
            return b
        }
    }

    /// The parents a batch's children name that exist and are live, locked `FOR SHARE` in key
    /// order: each as its place (from 1) in the lists `$1` (tables) and `$2` (keys).
    private struct LockParents: PreparedRows {
        static let name = "strata_parents"
        static let sql = """
            SELECT u.i FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(t, k, i)
            JOIN strata_rows r ON r.tbl = u.t AND r.key = u.k
            WHERE NOT r.deleted ORDER BY r.tbl, r.key FOR SHARE OF r
            """
        var tables, keys: [String]

        func makeBindings() -> PostgresBindings {
            var b = PostgresBindings(capacity: 2)
            b.append(tables)
            b.append(keys)
            return b
        }
    }

    /// `$1` new server-assigned keys.
    private struct DrawKeys: PreparedRows {
        static let name = "strata_draw_keys"
        static let sql = "SELECT nextval('strata_keys') FROM generate_series(1, $1::bigint)"
        var count: Int64

        func makeBindings() -> PostgresBindings {
            var b = PostgresBindings(capacity: 1)
            b.append(count)
            return b
        }
    }

    /// Step 2 of ``apply(_:)`` in one statement: the version lock (`v`), then, each joined to it
    /// so that it runs after the lock is held, the updates, the inserts, and the acknowledgement
    /// with its commit order. A row no transaction had when step 1 locked may have been inserted
    /// by a concurrent batch since: that insert wins, and ours is a conflict; the statement
    /// answers with the places (in `inserts`, from 1) of the rows it did not insert, then the
    /// number of rows it updated, negated.
    ///
    /// A row to update is found by where step 1 found it (`places`, its `ctid`), not by a second
    /// descent of the primary key: step 1 holds its lock, so no other transaction can update,
    /// delete or move it before this one commits (`VACUUM FULL` and `CLUSTER` wait for the
    /// table's lock). Its table and key are still compared, and the count of rows updated is
    /// checked by the caller, so a row not found there fails the batch instead of losing a write.
    private struct Write: PreparedRows {
        /// Rows to write, as four lists of one length.
        struct Rows {
            var tables, keys, fields: [String]
            var deleted: [Bool]
        }

        static let name = "strata_write"
        static let sql = """
            WITH v AS (SELECT pg_advisory_xact_lock(\(Database.versionLock))),
            up AS (UPDATE strata_rows r SET fields = u.f, deleted = u.d, version = nextval('strata_version'), updated_at = now()
                   FROM v, unnest($11::text[]::tid[], $1::text[], $2::text[], $3::text[], $4::bool[]) AS u(c, t, k, f, d)
                   WHERE r.ctid = u.c AND r.tbl = u.t AND r.key = u.k RETURNING 1),
            n AS (SELECT u.* FROM v, unnest($5::text[], $6::text[], $7::text[], $8::bool[]) WITH ORDINALITY AS u(t, k, f, d, i)),
            ins AS (INSERT INTO strata_rows (tbl, key, fields, deleted, version)
                    SELECT t, k, f, d, nextval('strata_version') FROM n
                    ON CONFLICT (tbl, key) DO NOTHING RETURNING tbl, key),
            ack AS (UPDATE strata_batches SET ack = $9::text, seq = nextval('strata_batch_order') FROM v WHERE id = $10::text)
            SELECT n.i FROM n WHERE NOT EXISTS (SELECT FROM ins WHERE ins.tbl = n.t AND ins.key = n.k)
            UNION ALL SELECT -count(*) FROM up
            """
        var places: [String]
        var updates, inserts: Rows
        var ack, id: String

        func makeBindings() -> PostgresBindings {
            var b = PostgresBindings(capacity: 11)
            for rows in [updates, inserts] {
                b.append(rows.tables)
                b.append(rows.keys)
                b.append(rows.fields)
                b.append(rows.deleted)
            }
            b.append(ack)
            b.append(id)
            b.append(places)
            return b
        }
    }

    /// The acknowledgement and the payload's digest stored for batch id `$1`.
    private struct StoredBatch: PreparedRows {
        static let name = "strata_stored_batch"
        static let sql = "SELECT ack, digest FROM strata_batches WHERE id = $1::text"
        var id: String

        func makeBindings() -> PostgresBindings {
            var b = PostgresBindings(capacity: 1)
            b.append(id)
            return b
        }
    }
}

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
    /// 2. lock the rows the batch names (`FOR UPDATE`) and decide every change in memory, field by
    ///    field against the server's values;
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
        let changes = normalize(batch)
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

    /// A change as the server stores it (normalized values), or, in `problem`, why the tables
    /// refuse it.
    struct CheckedChange {
        var change: RowChange
        var problem: String?
    }

    /// Checks every change against the tables before anything is written. A change that
    /// violates them is answered on its own row (`error`, `setAside`, with the reason), as a
    /// child of a missing parent is: refusing the whole batch would hold back every other row
    /// of it, and the client's downloads behind it, for good.
    func normalize(_ batch: Batch) -> [CheckedChange] {
        batch.changes.enumerated().map { i, c in
            do throws(RequestError) {
                return CheckedChange(change: try normalize(c, row: "changes[\(i)]"))
            } catch {
                return CheckedChange(change: c, problem: error.message)
            }
        }
    }

    private func normalize(_ c: RowChange, row: String) throws(RequestError) -> RowChange {
        guard let config = tables[table: c.table] else { throw .bad("\(row): unknown table '\(c.table)'") }
        let table = ServerTable(config)
        var n = c
        n.key = try table.checkKey(c.key, row: row)
        n.values = [:]
        for (f, v) in c.values { n.values[f] = try table.check(v, field: f, row: row) }
        n.originals = [:]
        for (f, v) in c.originals { n.originals[f] = try table.check(v, field: f, row: row) }
        switch c.kind {
        case .insert:
            for (k, v) in zip(table.primaryKey, n.key.values) where (n.values[bytes: k] ?? v) != v {
                throw .bad("\(row): key field '\(k)' is \(n.values[bytes: k]!) but the key says \(v)")
            }
            for f in table.fields where f.nullable != true && f.default == nil && !table.isKeyField(f.name) && n.values[bytes: f.name] == nil {
                throw .bad("\(row): an insert into '\(c.table)' needs field '\(f.name)'")
            }
            guard c.originals.isEmpty else { throw .bad("\(row): an insert has no originals") }
        case .update:
            for k in table.primaryKey where c.values[bytes: k] != nil { throw .bad("\(row): an update cannot change key field '\(k)'") }
        case .delete:
            guard c.values.isEmpty else { throw .bad("\(row): a delete has no values") }
        }
        return n
    }

    /// A field of `fields` that one of `names` names in another Unicode form (equal under
    /// Swift's `==`, other bytes), with that name.
    static func twinField(of fields: [String: Value], in names: [String]) -> (held: String, named: String)? {
        for name in names {
            guard let i = fields.index(forKey: name), !fields[i].key.utf8.elementsEqual(name.utf8) else { continue }
            return (fields[i].key, name)
        }
        return nil
    }

    private struct Stored {
        var fields: [String: Value]
        var deleted: Bool
        var exists: Bool
    }

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
            ?? (ack.results.map { StoredRowID($0.table, Self.keyText($0.key)) } == batch.changes.map { StoredRowID($0.table, Self.keyText($0.key)) })
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

    private func applyOnce(_ batch: Batch, _ digest: String, _ changes: [CheckedChange]) async throws -> BatchAck {
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

    private static func keyText(_ key: RowKey) -> String {
        String(decoding: (try? WireFormat.encode(key.values)) ?? Data(), as: UTF8.self)
    }

    private func decideAndWrite(_ batch: Batch, _ checked: [CheckedChange], on c: PostgresConnection) async throws -> BatchAck {
        // Rows the tables refuse are answered in their place below, and neither read nor written.
        let changes = checked.compactMap { $0.problem == nil ? $0.change : nil }
        // Lock every row the batch names, in one statement, in key order.
        let named = Set(changes.map { StoredRowID($0.table, Self.keyText($0.key)) }).sorted()
        var rows: [StoredRowID: Stored] = [:]
        let locked = try await c.query("""
            SELECT tbl, key, fields, deleted FROM strata_rows
            WHERE (tbl, key) IN (SELECT * FROM unnest(\(named.map(\.table))::text[], \(named.map(\.key))::text[]))
            ORDER BY tbl, key FOR UPDATE
            """, logger: logger)
        for try await (tbl, key, fields, deleted) in locked.decode((String, String, String, Bool).self) {
            rows[StoredRowID(tbl, key)] = Stored(fields: try WireFormat.decode([String: Value].self, from: Data(fields.utf8)), deleted: deleted, exists: true)
        }

        // The parents that children in this batch name, as they are now (shared locks, so that
        // no batch deletes one before this one commits). A parent this batch itself inserts or
        // deletes is judged by the batch's own state below.
        var parentRefs = Set<StoredRowID>()
        for change in changes where change.kind != .delete {
            for a in tables.associations where a.child == change.table {
                if let v = change.values[a.field], !v.isNull { parentRefs.insert(StoredRowID(a.parent, Self.keyText(RowKey([v])))) }
            }
        }
        var liveParents = Set<StoredRowID>()
        if !parentRefs.isEmpty {
            let refs = parentRefs.sorted()
            let found = try await c.query("""
                SELECT tbl, key FROM strata_rows
                WHERE (tbl, key) IN (SELECT * FROM unnest(\(refs.map(\.table))::text[], \(refs.map(\.key))::text[])) AND NOT deleted
                ORDER BY tbl, key FOR SHARE
                """, logger: logger)
            for try await (t, k) in found.decode((String, String).self) { liveParents.insert(StoredRowID(t, k)) }
        }

        var results: [RowResult] = []
        var written: [StoredRowID: Int] = [:]   // row → index of the result that wrote it
        var rekeyed: [String: [Value: Value]] = [:]   // parent table → client key → server key
        for (change, problem) in checked.map({ ($0.change, $0.problem) }) {
            if let problem {
                results.append(RowResult(table: change.table, key: change.key, status: .error, error: RowError(reason: problem, action: .setAside)))
                continue
            }
            guard let table = tables[table: change.table] else { continue }
            var change = change
            // A child naming a parent that this batch re-keyed follows the parent's new key.
            for a in tables.associations where a.child == change.table {
                if let v = change.values[a.field], let new = rekeyed[a.parent]?[v] { change.values[a.field] = new }
            }
            var key = change.key
            var newKey: RowKey?
            if change.kind == .insert, table.serverAssignedKey == true {
                let next = try await c.query("SELECT nextval('strata_keys')", logger: logger).collect()
                let k = Value.int(try next[0].decode(Int64.self))
                newKey = RowKey([k])
                key = RowKey([k])
                change.values[table.primaryKey[0]] = k
                rekeyed[change.table, default: [:]][change.key.values[0]] = k
            }
            // A child must name a parent that exists: otherwise the row is refused and set aside
            // on the client, with the reason, for the app to fix or discard.
            var orphan: String?
            if change.kind != .delete {
                for a in tables.associations where a.child == change.table {
                    guard let v = change.values[bytes: a.field], !v.isNull else { continue }
                    let parent = StoredRowID(a.parent, Self.keyText(RowKey([v])))
                    let live = rows[parent].map { !$0.deleted } ?? liveParents.contains(parent)
                    if !live { orphan = "\(a.field) names \(a.parent) \(v), which does not exist on the server" }
                }
            }
            if let orphan {
                results.append(RowResult(table: change.table, key: change.key, status: .error, error: RowError(reason: orphan, action: .setAside)))
                continue
            }
            let id = StoredRowID(change.table, Self.keyText(key))
            var row = rows[id] ?? Stored(fields: [:], deleted: true, exists: false)
            let live = !row.deleted
            func matches(_ originals: [String: Value]) -> Bool {
                originals.allSatisfy { f, o in (row.fields[bytes: f] ?? .null) == o }
            }
            let nonKey = change.values.filter { !table.isKeyField($0.key) }
            // A row holds one of two field names that Swift's `==` calls equal (its fields are a
            // `[String: Value]`, which has room for one), as a client's store does: a change
            // naming the other form of a field the row holds is set aside, not merged into it.
            if live, let (held, named) = Self.twinField(of: row.fields, in: Array(change.values.keys) + Array(change.originals.keys)) {
                let reason = "row \(change.key) of table '\(change.table)' holds the field '\(held)', which differs from '\(named)' only in Unicode form; field names compare by their bytes, and a row holds one of two such names"
                results.append(RowResult(table: change.table, key: change.key, status: .error, error: RowError(reason: reason, action: .setAside)))
                continue
            }
            switch change.kind {
            case .insert:
                guard !live else { results.append(RowResult(table: change.table, key: change.key, status: .conflict)); continue }
                // A property bag's row inserted over a deleted one lists the old row's fields as
                // null (kept by the delete): a client that never saw the delete gets the two as
                // one upsert, where a field left out means "unchanged", and would keep the old
                // row's values (EndToEndTests trial seed 14939751394073512899).
                var fields: [String: Value] = table.isPropertyBag ? row.fields.mapValues { _ in .null } : [:]
                for f in table.fields where !table.isKeyField(f.name) { fields[f.name] = f.default }
                fields.merge(nonKey) { $1 }
                row = Stored(fields: fields.filter { table.isPropertyBag || !$0.value.isNull }, deleted: false, exists: row.exists)
            case .update:
                guard live, matches(change.originals) else { results.append(RowResult(table: change.table, key: change.key, status: .conflict)); continue }
                // A property bag keeps a cleared field as null, so pulls list it as cleared.
                for (f, v) in nonKey { row.fields[f] = v.isNull && !table.isPropertyBag ? nil : v }
            case .delete:
                guard live else { results.append(.ok(change.table, change.key)); continue }   // already gone
                // A delete changes every field, so it checks the whole row: the originals it
                // names, and that every field it does not name is null here (a client names only
                // its non-null originals). Otherwise a field someone set since the client last
                // saw it null, or one the client never knew, would be deleted unseen.
                let unnamedAreNull = row.fields.allSatisfy { f, v in change.originals[bytes: f] != nil || v.isNull }
                guard matches(change.originals), unnamedAreNull else { results.append(RowResult(table: change.table, key: change.key, status: .conflict)); continue }
                row.deleted = true
                // A property bag keeps the names as null, for an insert over the tombstone (above).
                row.fields = table.isPropertyBag ? row.fields.mapValues { _ in .null } : [:]
            }
            rows[id] = row
            written[id] = results.count
            results.append(.ok(change.table, change.key, newKey: newKey))
        }

        try await c.query("SELECT pg_advisory_xact_lock(\(Self.versionLock))", logger: logger)
        if !written.isEmpty {
            let ids = written.keys.sorted()
            func encoded(_ id: StoredRowID) throws -> String { String(decoding: try WireFormat.encode(rows[id]!.fields), as: UTF8.self) }
            let old = ids.filter { rows[$0]!.exists }
            if !old.isEmpty {
                try await c.query("""
                    UPDATE strata_rows r SET fields = u.f, deleted = u.d, version = nextval('strata_version'), updated_at = now()
                    FROM unnest(\(old.map(\.table))::text[], \(old.map(\.key))::text[], \(try old.map(encoded))::text[], \(old.map { rows[$0]!.deleted })::bool[]) AS u(t, k, f, d)
                    WHERE r.tbl = u.t AND r.key = u.k
                    """, logger: logger)
            }
            let new = ids.filter { !rows[$0]!.exists }
            if !new.isEmpty {
                // A row no transaction had when we locked may have been inserted by a concurrent
                // batch since: that insert wins, and ours is a conflict.
                let inserted = try await c.query("""
                    INSERT INTO strata_rows (tbl, key, fields, deleted, version)
                    SELECT t, k, f, d, nextval('strata_version')
                    FROM unnest(\(new.map(\.table))::text[], \(new.map(\.key))::text[], \(try new.map(encoded))::text[], \(new.map { rows[$0]!.deleted })::bool[]) AS u(t, k, f, d)
                    ON CONFLICT (tbl, key) DO NOTHING RETURNING tbl, key
                    """, logger: logger)
                var done = Set<StoredRowID>()
                for try await (t, k) in inserted.decode((String, String).self) { done.insert(StoredRowID(t, k)) }
                for id in new where !done.contains(id) {
                    let r = results[written[id]!]
                    results[written[id]!] = RowResult(table: r.table, key: r.key, status: .conflict)
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
}

/// A row of the server: its table and its key as stored (the key's wire JSON), as a dictionary
/// key. Compared, hashed and ordered by UTF-8 bytes, as PostgreSQL compares `text` and as
/// clients compare keys: Swift's `String` equality would take a key's NFC and NFD forms for one
/// row, and a batch naming both would write one's change onto the other.
struct StoredRowID: Hashable, Comparable {
    let table: String
    let key: String

    init(_ table: String, _ key: String) {
        self.table = table
        self.key = key
    }

    static func == (a: StoredRowID, b: StoredRowID) -> Bool {
        a.table.utf8.elementsEqual(b.table.utf8) && a.key.utf8.elementsEqual(b.key.utf8)
    }

    func hash(into hasher: inout Hasher) {
        for part in [table, key] {
            hasher.combine(part.utf8.count)
            for byte in part.utf8 { hasher.combine(byte) }
        }
    }

    static func < (a: StoredRowID, b: StoredRowID) -> Bool {
        if !a.table.utf8.elementsEqual(b.table.utf8) { return a.table.utf8.lexicographicallyPrecedes(b.table.utf8) }
        return a.key.utf8.lexicographicallyPrecedes(b.key.utf8)
    }
}

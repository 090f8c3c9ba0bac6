import Foundation
import Strata

/// What a sync server does with a batch, decided in memory: every row's result and the rows to
/// write. `strata-server` and `InMemorySyncServer` (StrataTesting) both decide by these rules, so
/// the test double that most sync tests run against cannot drift from the real server; what
/// differs between them is only where the rows are kept, and the server's locks.
///
/// The rules, per change of a batch, in order:
/// - **refused by the tables**: an unknown table (unless ``UnknownTable/taken(keyFields:)``), a
///   key or value `RowRule` refuses, a key over ``maxStoredKeyBytes``, an insert whose key fields
///   disagree with its key or that lacks a field with no default, an insert with originals, an
///   update of a key field, a delete with values: `error` with `setAside` and the reason. Values
///   are stored normalized (an int for a double field becomes a double).
/// - **server-assigned keys**: an insert into a table with `serverAssignedKey` takes the next of
///   the drawn keys (``Prepared/keysToDraw`` of them), answered as `newKey`; a child later in the
///   batch that names the parent's client key in an association field names the new key
///   (`AckRules.followingKeys`, the rule a client applies to the acknowledgement).
/// - **children of a missing parent**: a change (not a delete) to a declared table whose
///   association field names a parent that is not live, in the stored rows or in the batch so
///   far, is `error`/`setAside`.
/// - **a field in two Unicode forms**: a change naming a field the live row holds in another
///   Unicode form is `error`/`setAside` (a row holds one of two such names).
/// - **insert**: over a live row, `conflict`; otherwise the row is the table's defaults with the
///   values over them.
/// - **update**: of a row that is not live, or whose originals differ from the row's values
///   (field by field, a missing field being null), `conflict`.
/// - **delete**: of a row already gone, `ok` with nothing written; otherwise the originals must
///   match and every field the delete does not name must be null (a delete changes the whole
///   row), else `conflict`.
/// - A null value clears a field, except in a property bag, which keeps it as null so that pulls
///   list it as cleared.
public struct ServerRules: Sendable {
    /// What a change to a table the rules were not given gets.
    public enum UnknownTable: Sendable {
        /// Refused, `error`/`setAside` (`strata-server`).
        case refused
        /// Taken as it comes, unchecked, with these key fields per table (`["id"]` for a table
        /// not listed): `InMemorySyncServer`'s rows of tables it was not given.
        case taken(keyFields: [String: [String]])
    }

    /// A row of the server: its table and its key, compared, hashed and ordered by the UTF-8
    /// bytes of the table name and of the key's wire JSON (``keyText``), as PostgreSQL compares
    /// `text` and clients compare keys. `strata-server` keys its maps of rows by it too.
    public struct RowID: Hashable, Comparable, Sendable {
        /// The table's name.
        public let table: String
        /// The key.
        public let key: RowKey
        /// The key's values as the wire format writes them: how `strata-server` stores the key.
        public let keyText: String

        /// The row `key` of `table`.
        public init(_ table: String, _ key: RowKey) {
            self.table = table
            self.key = key
            self.keyText = Self.text(key)
        }

        /// The key's values as the wire format writes them (`WireFormat.encode(key.values)`, byte
        /// for byte), or the empty string for a key holding a NaN or infinite double, which the
        /// format cannot write.
        ///
        /// Written by the wire codec's own writer: a server names a row's key once or twice per
        /// change it decides.
        public static func text(_ key: RowKey) -> String {
            var w = JSONWriter(capacity: 32)
            do {
                try WireCodec.array(key.values, &w, WireCodec.value)
            } catch {
                return ""
            }
            return String(decoding: w.bytes, as: UTF8.self)
        }

        public static func == (a: RowID, b: RowID) -> Bool {
            a.table.sameBytes(b.table) && a.keyText.sameBytes(b.keyText)
        }

        public func hash(into hasher: inout Hasher) {
            Self.feed(table, &hasher)
            Self.feed(keyText, &hasher)
        }

        /// Feeds `s`'s UTF-8 bytes to `hasher` in one call, after their count (so that
        /// ("ab", "c") and ("a", "bc") feed different streams).
        @inline(__always)
        private static func feed(_ s: String, _ hasher: inout Hasher) {
            hasher.combine(s.utf8.count)
            let fed: Void? = s.utf8.withContiguousStorageIfAvailable { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
            if fed == nil { for byte in s.utf8 { hasher.combine(byte) } }
        }

        public static func < (a: RowID, b: RowID) -> Bool {
            let tables = compareBytes(a.table, b.table)
            return tables != 0 ? tables < 0 : compareBytes(a.keyText, b.keyText) < 0
        }

        /// Negative, zero or positive as `a`'s UTF-8 bytes sort before, with or after `b`'s.
        @inline(__always)
        private static func compareBytes(_ a: String, _ b: String) -> Int {
            let (m, n) = (a.utf8.count, b.utf8.count)
            let order = a.utf8.withContiguousStorageIfAvailable { pa in
                b.utf8.withContiguousStorageIfAvailable { pb in
                    min(m, n) == 0 ? 0 : Int(memcmp(pa.baseAddress!, pb.baseAddress!, min(m, n)))
                }
            }
            if let order, let order { return order != 0 ? order : m - n }
            if a.utf8.elementsEqual(b.utf8) { return 0 }
            return a.utf8.lexicographicallyPrecedes(b.utf8) ? -1 : 1
        }
    }

    /// A stored row: its fields (key fields left out), or a row that was deleted.
    public struct StoredRow: Sendable, Hashable {
        /// The row's fields, key fields left out.
        public var fields: [String: Value]
        /// Whether the row is deleted (a tombstone): not live.
        public var deleted: Bool

        /// A row with these fields, live unless `deleted`.
        public init(fields: [String: Value], deleted: Bool = false) {
            self.fields = fields
            self.deleted = deleted
        }
    }

    /// A batch's changes checked against the tables, with what must be read before deciding it.
    public struct Prepared: Sendable {
        /// The changes, normalized where the tables take them.
        public let changes: [RowChange]
        /// Why the tables refuse each change, or `nil`.
        public let problems: [String?]
        /// The rows the changes the tables take name, sorted: read (and lock) them, with their
        /// tombstones, for ``ServerRules/decide(_:stored:liveParents:drawnKeys:custom:)``.
        public let rows: [RowID]
        /// The parents that those changes name, sorted: which of them are live is an input.
        public let parents: [RowID]
        /// How many keys to draw for inserts into tables with server-assigned keys.
        public let keysToDraw: Int
        /// The row each change names (`nil` for a change the tables refuse): its key text is
        /// written once, here, and `decide` reuses it.
        let ids: [RowID?]
    }

    /// A row to write: its new fields, or `nil` when it is deleted.
    public struct Write: Sendable, Hashable {
        /// The row, under the key it is stored with (a server-assigned one, if drawn).
        public var id: RowID
        /// Its fields after the change (key fields left out), or `nil`: deleted.
        public var fields: [String: Value]?
        /// For a deleted property-bag row: the names of the fields it had, which the tombstone
        /// keeps (as null) so that a row inserted over it lists them as null. A client that
        /// missed the delete gets the two as one upsert, where a field left out means
        /// "unchanged": without them it would keep the old row's values.
        public var tombstoneNames: [String] = []
        /// The index in ``Outcome/results`` of the result of the change that wrote it.
        public var result: Int
    }

    /// A decided batch.
    public struct Outcome: Sendable {
        /// One result per change, in the batch's order.
        public var results: [RowResult]
        /// The rows written, in the order of the changes that wrote them (a row changed twice is
        /// listed twice; the last write holds its state).
        public var writes: [Write]
    }

    /// The tables, by name compared by bytes.
    public let tables: [TablesFile.Table]
    /// The references between tables: which fields name parents.
    public let associations: [Association]
    /// What a change to a table not in ``tables`` gets.
    public let unknownTable: UnknownTable

    /// The rules for `tables` and `associations`; a change to another table gets `unknownTable`.
    public init(tables: [TablesFile.Table], associations: [Association] = [], unknownTable: UnknownTable = .refused) {
        self.tables = tables
        self.associations = associations
        self.unknownTable = unknownTable
        self.schemas = tables.map(\.schema)
    }

    /// Each table's schema, in the order of ``tables``: made once, not for every change.
    private let schemas: [TableSchema]

    /// The rules of a tables file, which refuse changes to tables it does not list.
    public init(_ file: TablesFile) {
        self.init(tables: file.tables, associations: file.associations)
    }

    /// The most bytes a row's table name and key (its JSON, as stored) take together.
    /// PostgreSQL refuses an index entry over about 2,700 bytes (a third of a page), and
    /// `strata-server` indexes rows on (table, key). `RowRule.maxKeyBytes` bounds a key well below
    /// this, except one made mostly of control characters, which JSON writes 6 bytes each.
    public static let maxStoredKeyBytes = 2000

    private func table(_ name: String) -> TablesFile.Table? { tables.first { $0.name.sameBytes(name) } }

    /// The index in ``tables`` of the table called `name` (compared by bytes).
    private func tableIndex(_ name: String) -> Int? { tables.firstIndex { $0.name.sameBytes(name) } }

    /// The key fields of `table`, declared or taken.
    private func keyFields(_ name: String) -> [String] {
        if let t = table(name) { return t.primaryKey }
        if case .taken(let keys) = unknownTable { return keys[exactly: name] ?? ["id"] }
        return []
    }

    /// Checks every change against the tables and lists what to read before deciding.
    public func prepare(_ changes: [RowChange]) -> Prepared {
        var checked: [RowChange] = []
        var problems: [String?] = []
        var ids: [RowID?] = []
        checked.reserveCapacity(changes.count)
        problems.reserveCapacity(changes.count)
        ids.reserveCapacity(changes.count)
        var rows = Set<RowID>(minimumCapacity: changes.count)
        var parents = Set<RowID>()
        var keys = 0
        for (i, c) in changes.enumerated() {
            let t = tableIndex(c.table)
            do throws(StrataError) {
                let (n, id) = try check(c, t)
                checked.append(n)
                problems.append(nil)
                ids.append(id)
                rows.insert(id)
                guard let t else { continue }
                if n.kind == .insert, tables[t].serverAssignedKey == true { keys += 1 }
                if n.kind != .delete {
                    for a in associations where a.child.sameBytes(n.table) {
                        if let v = n.values[exactly: a.field], !v.isNull { parents.insert(RowID(a.parent, RowKey([v]))) }
                    }
                }
            } catch {
                checked.append(c)
                problems.append("changes[\(i)]: \(error.message)")
                ids.append(nil)
            }
        }
        return Prepared(changes: checked, problems: problems, rows: rows.sorted(), parents: parents.sorted(), keysToDraw: keys, ids: ids)
    }

    /// `c` normalized, and the row it names, or why the tables refuse it. `t`: its table's index
    /// in ``tables``.
    private func check(_ c: RowChange, _ t: Int?) throws(StrataError) -> (RowChange, RowID) {
        guard let t else {
            if case .taken = unknownTable { return (c, RowID(c.table, c.key)) }
            throw StrataError(.malformedInput, "unknown table '\(c.table)'")
        }
        let config = tables[t]
        let schema = schemas[t]
        var n = c
        n.key = try RowRule.admit(key: c.key, of: schema)
        let id = RowID(n.table, n.key)
        let size = config.name.utf8.count + id.keyText.utf8.count
        guard size <= Self.maxStoredKeyBytes else {
            throw StrataError(.malformedInput, "the key takes \(size) bytes as the server stores it, with its table name; the server takes at most \(Self.maxStoredKeyBytes)")
        }
        n.values = try Self.admitted(c.values, schema)
        n.originals = try Self.admitted(c.originals, schema)
        let isKey = ExactNames(config.primaryKey)
        switch c.kind {
        case .insert:
            for (k, v) in zip(config.primaryKey, n.key.values) where (n.values[exactly: k] ?? v) != v {
                throw StrataError(.malformedInput, "key field '\(k)' is \(n.values[exactly: k]!) but the key says \(v)")
            }
            for f in config.fields where f.nullable != true && f.default == nil && !isKey.contains(f.name) && n.values[exactly: f.name] == nil {
                throw StrataError(.malformedInput, "an insert into '\(c.table)' needs field '\(f.name)'")
            }
            guard c.originals.isEmpty else { throw StrataError(.malformedInput, "an insert has no originals") }
        case .update:
            for k in config.primaryKey where c.values[exactly: k] != nil {
                throw StrataError(.malformedInput, "an update cannot change key field '\(k)'")
            }
        case .delete:
            guard c.values.isEmpty else { throw StrataError(.malformedInput, "a delete has no values") }
        }
        return (n, id)
    }

    /// `fields`, each value as `RowRule` admits it for its field of `schema` (an int for a double
    /// field becomes a double); the map is copied only when a value changes.
    private static func admitted(_ fields: [String: Value], _ schema: TableSchema) throws(StrataError) -> [String: Value] {
        var out = fields
        do {
            for (f, v) in fields {
                let admitted = try RowRule.admit(v, field: f, of: schema)
                if admitted != v { out[f] = admitted }   // `==` on values is exact: same case, same bits
            }
        } catch {
            // Of two bad fields, the one named is the first in the order of the names' bytes:
            // the same on every server (a dictionary's order differs from process to process).
            for (f, v) in ordered(fields) { _ = try RowRule.admit(v, field: f, of: schema) }
            throw error
        }
        return out
    }

    /// Decides a prepared batch.
    ///
    /// - Parameters:
    ///   - prepared: the batch, as ``prepare(_:)`` checked it.
    ///   - stored: the rows of ``Prepared/rows`` the server has, tombstones included (a row
    ///     missing here was never stored).
    ///   - liveParents: which of ``Prepared/parents`` are live.
    ///   - drawnKeys: ``Prepared/keysToDraw`` fresh keys, used in order.
    ///   - custom: a result to use instead of the rules' own for a change the tables take (a test
    ///     double's hook). An `ok` is applied through the same rules, under its `newKey` and with
    ///     its `serverValues`; if they answer otherwise (a stale original, a taken key), that
    ///     answer is used, since an `ok` would confirm a row never written.
    public func decide(
        _ prepared: Prepared, stored: [RowID: StoredRow], liveParents: Set<RowID>, drawnKeys: [Value],
        custom: ((RowChange) -> RowResult?)? = nil
    ) -> Outcome {
        var state = stored
        var out = Outcome(results: [], writes: [])
        out.results.reserveCapacity(prepared.changes.count)
        out.writes.reserveCapacity(prepared.changes.count)
        var rekeyed: [String: [Value: Value]] = [:]   // parent table → client key → server key
        var drawn = drawnKeys.makeIterator()
        for (i, (sent, problem)) in zip(prepared.changes, prepared.problems).enumerated() {
            if let problem {
                out.results.append(Self.setAside(sent, problem))
                continue
            }
            // A child naming a parent that this batch re-keyed follows the parent's new key.
            var change = AckRules.followingKeys(sent, rekeyed: rekeyed, associations: associations)
            var newKey: RowKey?
            var serverValues: [String: Value] = [:]
            var answer: RowResult?
            let config = tableIndex(change.table).map { tables[$0] }
            if let result = custom?(change) {
                guard result.status == .ok else { out.results.append(result); continue }
                newKey = result.newKey
                serverValues = result.serverValues ?? [:]
                answer = result
            } else if change.kind == .insert, let t = config, t.serverAssignedKey == true, let k = drawn.next() {
                newKey = RowKey([k])
                change.values[t.primaryKey[0]] = k
                answer = .ok(change.table, change.key, newKey: newKey)
            }
            // The row the change names, as `prepare` wrote it, unless it is stored under a new key.
            let id = newKey.map { RowID(change.table, $0) } ?? prepared.ids[i] ?? RowID(change.table, change.key)
            let result = apply(change, config, under: id, serverValues: serverValues, &state, liveParents, &out)
            if result.status == .ok, change.kind == .insert, let k = newKey, k.values.count == 1, change.key.values.count == 1 {
                rekeyed[change.table, default: [:]][change.key.values[0]] = k.values[0]
            }
            out.results.append(result.status == .ok ? answer ?? result : result)
        }
        return out
    }

    /// `fields` sorted by the bytes of their names.
    private static func ordered(_ fields: [String: Value]) -> [(key: String, value: Value)] {
        fields.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
    }

    /// The first name of `change`'s values, then of its originals (each in the order of the
    /// names' bytes), that `fields` holds in another Unicode form, with the form it holds.
    private static func twin(of change: RowChange, in fields: [String: Value]) -> (name: String, held: String)? {
        func held(_ name: String) -> String? {
            // A name held in its own bytes has no other form held beside it (a dictionary holds
            // one of two names `==` calls equal): most names end here, without hashing.
            if fields[exactly: name] != nil { return nil }
            guard let i = fields.index(forKey: name), !fields[i].key.sameBytes(name) else { return nil }
            return fields[i].key
        }
        guard !fields.isEmpty,
              change.values.keys.contains(where: { held($0) != nil }) || change.originals.keys.contains(where: { held($0) != nil })
        else { return nil }
        for (name, _) in ordered(change.values) + ordered(change.originals) {
            if let form = held(name) { return (name, form) }
        }
        return nil
    }

    private static func setAside(_ c: RowChange, _ reason: String) -> RowResult {
        RowResult(table: c.table, key: c.key, status: .error, error: RowError(reason: reason, action: .setAside))
    }

    /// The result of one change the tables take, stored as `id`; an `ok` records its write.
    private func apply(
        _ change: RowChange, _ config: TablesFile.Table?, under id: RowID, serverValues: [String: Value], _ state: inout [RowID: StoredRow],
        _ liveParents: Set<RowID>, _ out: inout Outcome
    ) -> RowResult {
        let conflict = RowResult(table: change.table, key: change.key, status: .conflict)
        // A child must name a parent that exists: otherwise the row is refused and set aside on
        // the client, with the reason, for the app to fix or discard. Only a declared table's
        // rows are checked: rows of a table taken as they come are taken whatever they name.
        if change.kind != .delete, config != nil {
            for a in associations where a.child.sameBytes(change.table) {
                guard let v = change.values[exactly: a.field], !v.isNull else { continue }
                let parent = RowID(a.parent, RowKey([v]))
                let live = state[parent].map { !$0.deleted } ?? liveParents.contains(parent)
                if !live { return Self.setAside(change, "\(a.field) names \(a.parent) \(v), which does not exist on the server") }
            }
        }
        let isKey = ExactNames(config?.primaryKey ?? keyFields(change.table))
        let keepsNull = config?.isPropertyBag == true
        var row = state[id] ?? StoredRow(fields: [:], deleted: true)
        let live = !row.deleted
        // A row holds one of two field names that Swift's `==` calls equal (its fields are a
        // `[String: Value]`, which has room for one), as a client's store does: a change naming
        // the other form of a field the row holds is set aside, not merged into it. An insert
        // over a property bag's tombstone is checked too: the tombstone's names are listed (as
        // null) with the new row, and merging into one of them would store the new value under
        // the old name's bytes.
        if live || change.kind == .insert, let (name, held) = Self.twin(of: change, in: row.fields) {
            let holds = live ? "holds" : "was deleted, and its tombstone keeps"
            return Self.setAside(change, "row \(change.key) of table '\(change.table)' \(holds) the field '\(held)' (\(held.codePoints)), which differs from '\(name)' (\(name.codePoints)) only in Unicode form; field names compare by their bytes, and a row holds one of two such names")
        }
        func matches(_ originals: [String: Value]) -> Bool {
            originals.allSatisfy { f, o in (row.fields[exactly: f] ?? .null) == o }
        }
        switch change.kind {
        case .insert:
            guard !live else { return conflict }
            // A property bag's row inserted over a tombstone lists the old row's fields as null
            // (see `Write.tombstoneNames`).
            var fields: [String: Value] = keepsNull ? row.fields.mapValues { _ in .null } : [:]
            for f in config?.fields ?? [] where !isKey.contains(f.name) { fields[f.name] = f.default }
            for (f, v) in change.values where !isKey.contains(f) { fields[f] = v }
            if !keepsNull && fields.values.contains(where: \.isNull) { fields = fields.filter { !$0.value.isNull } }
            row = StoredRow(fields: fields)
        case .update:
            guard live, matches(change.originals) else { return conflict }
            for (f, v) in change.values where !isKey.contains(f) {
                // Not `fields[f] = … ? nil : v`: `Value` is `ExpressibleByNilLiteral`, so that
                // `nil` would be stored as `.null` rather than remove the field.
                if v.isNull && !keepsNull { row.fields.removeValue(forKey: f) } else { row.fields[f] = v }
            }
        case .delete:
            guard live else { return .ok(change.table, change.key) }   // already gone: nothing written
            // A delete changes every field, so it checks the whole row: the originals it names,
            // and that every field it does not name is null here (a client names only its
            // non-null originals). Otherwise a field someone set since the client last saw it
            // null, or one the client never knew, would be deleted unseen.
            let unnamedAreNull = row.fields.allSatisfy { f, v in change.originals[exactly: f] != nil || v.isNull }
            guard matches(change.originals), unnamedAreNull else { return conflict }
            row = StoredRow(fields: keepsNull ? row.fields.mapValues { _ in .null } : [:], deleted: true)
        }
        if change.kind != .delete && !serverValues.isEmpty { row.fields.merge(serverValues) { $1 } }
        state[id] = row
        var write = Write(id: id, fields: row.deleted ? nil : row.fields, result: out.results.count)
        if row.deleted { write.tombstoneNames = row.fields.keys.sorted() }
        out.writes.append(write)
        return .ok(change.table, change.key)
    }
}

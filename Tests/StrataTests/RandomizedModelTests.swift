import Foundation
import Strata
import StrataWorkload
import Testing

/// A deliberately naive model of the rules (dictionaries of values, no codec, no LMDB), written
/// from the documented behaviour. The store must agree with it after every transaction.
fileprivate struct Model {
    struct ModelRow: Equatable {
        var inserted = false
        var deleted = false
        var current: [String: Value] = [:]
        /// The server's values; meaningless while `inserted`.
        var original: [String: Value] = [:]
    }

    var tables: [String: [RowKey: ModelRow]] = [:]

    static func clean(_ d: [String: Value]) -> [String: Value] { d.filter { !$0.value.isNull } }

    mutating func insert(_ t: String, _ key: RowKey, _ values: [String: Value]) -> StrataError.Code? {
        let vals = Self.clean(values)
        if let old = tables[t]?[key] {
            guard old.deleted else { return .duplicateKey }
            tables[t]![key] = ModelRow(inserted: false, deleted: false, current: vals, original: old.original)
        } else {
            tables[t, default: [:]][key] = ModelRow(inserted: true, current: vals, original: [:])
        }
        return nil
    }

    mutating func update(_ t: String, _ key: RowKey, _ values: [String: Value]) -> StrataError.Code? {
        guard var row = tables[t]?[key], !row.deleted else { return .rowNotFound }
        for (f, v) in values {
            if v.isNull { row.current.removeValue(forKey: f) } else { row.current[f] = v }
        }
        tables[t]![key] = row
        return nil
    }

    mutating func delete(_ t: String, _ key: RowKey) -> StrataError.Code? {
        guard var row = tables[t]?[key], !row.deleted else { return .rowNotFound }
        if row.inserted {
            tables[t]![key] = nil
        } else {
            row.current = row.original
            row.deleted = true
            tables[t]![key] = row
        }
        return nil
    }

    mutating func revertField(_ t: String, _ key: RowKey, _ f: String) -> StrataError.Code? {
        guard var row = tables[t]?[key] else { return .rowNotFound }
        if row.inserted || row.deleted { return .invalidOperation }
        row.current[f] = row.original[f]
        tables[t]![key] = row
        return nil
    }

    mutating func revertRow(_ t: String, _ key: RowKey) -> StrataError.Code? {
        guard var row = tables[t]?[key] else { return .rowNotFound }
        if row.inserted {
            tables[t]![key] = nil
        } else {
            row.current = row.original
            row.deleted = false
            tables[t]![key] = row
        }
        return nil
    }

    mutating func revertAll(_ t: String) {
        for key in tables[t, default: [:]].keys { _ = revertRow(t, key) }
    }

    mutating func acknowledge(_ t: String, _ key: RowKey) -> StrataError.Code? {
        guard var row = tables[t]?[key] else { return .rowNotFound }
        if row.deleted {
            tables[t]![key] = nil
        } else {
            row.inserted = false
            row.original = row.current
            tables[t]![key] = row
        }
        return nil
    }
}

@Suite struct RandomizedModelTests {
    static let bag = TableSchema.propertyBag("notes", key: [.string("name")])
    static let pairs = TableSchema.fixed("pairs", primaryKey: ["a", "b"], fields: [
        .int("a"), .string("b"), .bytes("blob", nullable: true), .timestamp("at", nullable: true), .bool("flag", default: false),
    ])
    static let bagFields = ["color", "size", "weight", "tags", "seen", "owner"]

    struct Generator {
        var rng: SplitMix64
        mutating func below(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }
        mutating func string() -> String { ["S", "L", "O", "x", "", "ünï", "a\u{0}b"][below(7)] }

        mutating func value(for f: FieldDefinition) -> Value {
            if f.isNullable && below(5) == 0 { return .null }
            switch f.type {
            case .int: return .int(Int64(below(4)) - 1)
            case .string: return .string(string())
            case .bool: return .bool(below(2) == 0)
            case .double: return .double([0.5, -0.0, 0.0, 3][below(4)])
            case .bytes: return .bytes(Array(repeating: UInt8(below(3)), count: below(3)))
            case .timestamp: return .timestamp(Date(timeIntervalSince1970: Double(below(3))))
            }
        }

        mutating func anyValue() -> Value {
            switch below(5) {
            case 0: .null
            case 1: .int(Int64(below(3)))
            case 2: .string(string())
            case 3: .double(Double(below(3)))
            default: .bool(below(2) == 0)
            }
        }

        mutating func key(_ table: String) -> RowKey {
            switch table {
            case "tasks": RowKey(.int(Int64(below(25))))
            case "pairs": RowKey([.int(Int64(below(4)) - 2), .string(["", "a", "a\u{0}", "b"][below(4)])])
            default: RowKey(.string(["alpha", "beta", "gamma", "delta", "é", ""][below(6)]))
            }
        }

        /// Field values for an insert (all fields, some by default) or an update (a few).
        mutating func fields(_ schema: TableSchema, key: RowKey, full: Bool) -> [String: Value] {
            var out: [String: Value] = [:]
            if schema.mode == .propertyBag {
                for _ in 0..<(1 + below(3)) { out[RandomizedModelTests.bagFields[below(6)]] = anyValue() }
            } else {
                for f in schema.fields where !schema.primaryKey.contains(f.name) {
                    if full {
                        if f.defaultValue != nil && below(2) == 0 { continue }
                        if f.isNullable && below(3) == 0 { continue }
                        out[f.name] = value(for: f)
                    } else if below(3) == 0 {
                        out[f.name] = value(for: f)
                    }
                }
                if !full && out.isEmpty, let f = schema.fields.first(where: { !schema.primaryKey.contains($0.name) }) {
                    out[f.name] = value(for: f)
                }
            }
            if full { for (i, k) in schema.primaryKey.enumerated() { out[k] = key.values[i] } }
            return out
        }
    }

    /// The model's view of an insert: defaults applied, as the store documents.
    static func withDefaults(_ schema: TableSchema, _ values: [String: Value]) -> [String: Value] {
        var out = values
        for f in schema.fields where out[f.name] == nil { out[f.name] = f.defaultValue ?? .null }
        for k in schema.primaryKey { out[k] = nil }
        return out
    }

    fileprivate static func compare(_ store: Store, _ model: Model, _ schemas: [TableSchema], _ context: String) throws {
        try store.read { snap in
            for schema in schemas {
                let rows = try snap.rows(schema.name, includingDeleted: true)
                let expected = model.tables[schema.name, default: [:]]
                #expect(rows.count == expected.count, "\(context): \(schema.name) has \(rows.count) rows, model \(expected.count)")
                for row in rows {
                    guard let m = expected[row.key] else {
                        Issue.record("\(context): \(schema.name) \(row.key) exists but not in the model")
                        continue
                    }
                    let status: Row.Status = m.inserted ? .inserted : m.deleted ? .deleted : (Model.clean(m.current) != Model.clean(m.original) ? .updated : .unchanged)
                    #expect(row.status == status, "\(context): \(row) status, model \(m)")
                    for name in Set(m.current.keys).union(m.original.keys).union(row.fieldNames) where !schema.primaryKey.contains(name) {
                        #expect(row[name] == (m.current[name] ?? .null), "\(context): \(row) field \(name), model \(m)")
                        let original: Value = m.inserted ? .null : (m.original[name] ?? .null)
                        #expect(row.original(name) == original, "\(context): \(row) original \(name), model \(m)")
                    }
                }
                let pending = try snap.pendingRows(schema.name).map(\.key)
                #expect(pending == rows.filter(\.isPending).map(\.key), "\(context): pending view of \(schema.name)")
            }
        }
    }

    /// With `compacting`, the log is compacted every 25 transactions with a random retention:
    /// the tables, pending state and invariants must not notice. `overlayBudget` runs it with a
    /// checkpoint after every commit (0), one every few commits, and none at all (everything
    /// stays in the overlay).
    @Test(arguments: [false, true], [0, 4096, Int.max])
    func storeAgreesWithTheModel(compacting: Bool, overlayBudget: Int) throws {
        let seed = testSeed("storeAgreesWithTheModel(compacting: \(compacting), overlayBudget: \(overlayBudget))")
        var gen = Generator(rng: SplitMix64(seed: seed))
        var options = StoreOptions()
        options.checkInvariants = true
        options.overlayBudget = overlayBudget
        let schemas = [tasksSchema, Self.pairs, Self.bag]
        try withStore(options) { store, path in
            for s in schemas { try store.createTable(s) }
            var model = Model()
            var edits = 0
            for txnIndex in 0..<400 {
                // Each transaction is applied to a copy of the model, kept only if it commits.
                var next = model
                let abort = gen.below(20) == 0
                struct Abort: Error {}
                do {
                    try store.write { tx in
                        next = model
                        for _ in 0..<(1 + gen.below(15)) {
                            let schema = schemas[gen.below(3)]
                            let t = schema.name
                            let key = gen.key(t)
                            var expected: StrataError.Code?
                            var got: StrataError.Code?
                            do {
                                switch gen.below(10) {
                                case 0, 1, 2:
                                    let f = gen.fields(schema, key: key, full: true)
                                    expected = next.insert(t, key, Self.withDefaults(schema, f))
                                    try tx.insert(t, FieldValues(f))
                                case 3, 4, 5:
                                    let f = gen.fields(schema, key: key, full: false)
                                    expected = next.update(t, key, f)
                                    try tx.update(t, key: key, FieldValues(f))
                                case 6:
                                    expected = next.delete(t, key)
                                    try tx.delete(t, key: key)
                                case 7:
                                    let names = schema.mode == .propertyBag ? Self.bagFields : schema.fields.map(\.name).filter { !schema.primaryKey.contains($0) }
                                    let f = names[gen.below(names.count)]
                                    // A bag field no row has used yet is unknown to the store,
                                    // which checks the field before the row.
                                    if try !tx.snapshot.fieldNames(t).contains(f) {
                                        expected = .fieldNotFound
                                    } else {
                                        expected = next.revertField(t, key, f)
                                    }
                                    try tx.revert(t, key: key, field: f)
                                case 8:
                                    if gen.below(10) == 0 {
                                        next.revertAll(t)
                                        try tx.revertAll(t)
                                    } else {
                                        expected = next.revertRow(t, key)
                                        try tx.revert(t, key: key)
                                    }
                                default:
                                    expected = next.acknowledge(t, key)
                                    try tx.acknowledge(t, key: key)
                                }
                            } catch let e as StrataError {
                                got = e.code
                            }
                            edits += 1
                            #expect(got == expected, "txn \(txnIndex) on \(t) \(key)")
                        }
                        if abort { throw Abort() }
                    }
                    model = next
                } catch is Abort {
                    // Nothing of the aborted transaction may remain.
                }
                if compacting, txnIndex % 25 == 24 {
                    let retention = [Retention(), .operations(gen.below(200)), .after(UInt64(gen.below(Int(try store.read { try $0.lastLSN }) + 1)))][gen.below(3)]
                    let report = try store.compact(retaining: retention)
                    #expect(report.horizon >= report.previousHorizon)
                    try Self.compare(store, model, schemas, "after compaction at txn \(txnIndex)")
                }
                if txnIndex % 50 == 0 { try Self.compare(store, model, schemas, "after txn \(txnIndex)") }
            }
            let horizon = try store.read { try $0.horizon }
            #expect(compacting == (horizon > 0))
            #expect(edits > 2000)
            try Self.compare(store, model, schemas, "end")

            let report = try store.verify()
            #expect(report.isConsistent, "\(report)")
            let folded = try store.rebuild()
            #expect(folded == Int(try store.read { try $0.lastLSN }) - Int(horizon))
            try Self.compare(store, model, schemas, "after rebuild")
            #expect(try store.verify().isConsistent)

            // The log alone reproduces the tables: a replay of its operations through the public
            // decoding gives the same current values. (A compacted log starts from its base.)
            if compacting { return }
            let ops = try store.read { try $0.operations() }
            var replayed: [String: [RowKey: [String: Value]]] = [:]
            for op in ops {
                if op.removesRow { replayed[op.table]?[op.key] = nil; continue }
                var fields = replayed[op.table]?[op.key] ?? [:]
                for c in op.changes {
                    // Not `isNull ? nil : value`: that ternary is a Value, and its nil is Value.null.
                    if c.current.isNull { fields.removeValue(forKey: c.field) } else { fields[c.field] = c.current }
                }
                replayed[op.table, default: [:]][op.key] = fields
            }
            for s in schemas {
                let live = try store.read { try $0.rows(s.name, includingDeleted: true) }
                #expect(live.count == replayed[s.name, default: [:]].count)
                for row in live {
                    let fields = row.values.filter { !$0.value.isNull && !s.primaryKey.contains($0.key) }
                    #expect(fields == replayed[s.name]?[row.key], "replay of \(row)")
                }
            }
        }
    }

    @Test func everythingSurvivesCloseAndReopen() throws {
        let seed = testSeed("everythingSurvivesCloseAndReopen")
        var gen = Generator(rng: SplitMix64(seed: seed))
        let schemas = [tasksSchema, Self.pairs, Self.bag]
        try withTemporaryFolder { path in
            var before: [[Row]] = []
            var ops: [LogEntry] = []
            do {
                let store = try Store(path: path)
                for s in schemas { try store.createTable(s) }
                for _ in 0..<60 {
                    try store.write { tx in
                        for _ in 0..<10 {
                            let s = schemas[gen.below(3)]
                            let key = gen.key(s.name)
                            switch gen.below(5) {
                            case 0, 1: try? tx.insert(s.name, FieldValues(gen.fields(s, key: key, full: true)))
                            case 2: try? tx.update(s.name, key: key, FieldValues(gen.fields(s, key: key, full: false)))
                            case 3: try? tx.delete(s.name, key: key)
                            default: try? tx.acknowledge(s.name, key: key)
                            }
                        }
                    }
                }
                // One row in each pending state, whatever the random history left (some seeds end
                // with no pending delete): keys the generator never draws.
                try store.write { tx in
                    for id in 100...102 { try tx.insert("tasks", ["id": .int(Int64(id)), "title": "fixed"]) }
                    for id in 100...101 { try tx.acknowledge("tasks", key: RowKey(.int(Int64(id)))) }
                    try tx.update("tasks", key: 100, ["title": "edited"])
                    try tx.delete("tasks", key: 101)
                }
                before = try store.read { snap in try schemas.map { try snap.rows($0.name, includingDeleted: true) } }
                ops = try store.read { try $0.operations() }
                #expect(before.joined().contains { $0.status == .updated })
                #expect(before.joined().contains { $0.status == .deleted })
                #expect(before.joined().contains { $0.status == .inserted })
            }
            let reopened = try Store(path: path)
            #expect(try reopened.tables == schemas)
            let bagFields = try reopened.read { try $0.fieldNames("notes") }
            #expect(bagFields.first == "name" && bagFields.count > 1)
            let after = try reopened.read { snap in try schemas.map { try snap.rows($0.name, includingDeleted: true) } }
            #expect(after == before)
            #expect(try reopened.read { try $0.operations() } == ops)
            #expect(try reopened.verify().isConsistent)
        }
    }
}

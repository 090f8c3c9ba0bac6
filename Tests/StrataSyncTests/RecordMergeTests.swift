import Foundation
import Strata
@testable import StrataSync
import StrataWorkload
import Testing

/// The merge decides most rows on their stored records (`Transaction.mergeServerValues`, with
/// `MergeRules.onRecord`): live server rows, clean or pending, under the policies whose
/// resolution does not look at the conflict. Two stores go through the same random history,
/// one merging that way and one building a `RowState` for every row; after every merge they
/// must hold the same rows, report the same, and have logged the same operations with the same
/// audit records, byte for byte.
@Suite struct RecordMergeTests {
    static let bag = TableSchema.propertyBag("bag", key: [.int("id")])
    /// A double field, which the delta sometimes sets with an int of the same value.
    static let readings = TableSchema.fixed("readings", primaryKey: ["id"], fields: [.int("id"), .double("v", nullable: true)])
    static let tables = ["tasks", "bag", "readings"]
    static let titles: [Value] = ["a", "b", "c"]

    @Test func theRecordMergeDecidesAsTheFieldRulesDo() throws {
        let seed = testSeed("theRecordMergeDecidesAsTheFieldRulesDo")
        var rng = SplitMix64(seed: seed)
        try withStore { fast in
            try withStore { slow in
                for store in [fast, slow] {
                    try store.createTable(Self.bag)
                    try store.createTable(Self.readings)
                    try store.write { tx in
                        for id in 1...40 {
                            try tx.insert("tasks", ["id": .int(Int64(id)), "title": "a", "notes": id % 3 == 0 ? .null : "n"])
                            try tx.acknowledge("tasks", key: RowKey(.int(Int64(id))))
                            try tx.insert("bag", ["id": .int(Int64(id)), "f0": .int(Int64(id % 4)), "f1": "s"])
                            try tx.acknowledge("bag", key: RowKey(.int(Int64(id))))
                            try tx.insert("readings", ["id": .int(Int64(id)), "v": .double(Double(id % 3))])
                            try tx.acknowledge("readings", key: RowKey(.int(Int64(id))))
                        }
                    }
                }
                var clean = 0
                var pending = 0
                for round in 0..<12 {
                    // Local edits, the same in both stores.
                    var after = rng
                    for store in [fast, slow] {
                        var r = rng
                        try Self.editLocally(store, &r)
                        after = r
                    }
                    rng = after
                    let delta = try Self.delta(round: round, &rng, absent: { id in
                        let row = try fast.read { try $0.row("tasks", key: RowKey(.int(Int64(id))), includingDeleted: true) }
                        return row == nil || row?.status == .inserted
                    })
                    // The last two policies look at the conflict: their conflicting rows take
                    // the field-by-field merge in both stores. (No server timestamps: last
                    // writer wins gives every conflict to the server.)
                    let policy: ConflictPolicy = [
                        .serverWins, .clientWins, .deferred, .lastWriterWins,
                        .custom { $0.fields.count > 1 ? .merged([:]) : .local },
                    ][rng.below(5)]
                    let before = try fast.read { try $0.lastLSN }
                    let (cleanBefore, pendingBefore) = try Self.liveRows(fast)
                    let fastReport = try SyncClient(store: fast, policy: policy, mergesOnRecords: true).merge(delta)
                    let slowReport = try SyncClient(store: slow, policy: policy, mergesOnRecords: false).merge(delta)
                    #expect(fastReport == slowReport, "round \(round), seed \(seed)")
                    #expect(try Self.state(fast) == Self.state(slow), "round \(round), seed \(seed)")
                    #expect(try Self.log(fast, after: before) == Self.log(slow, after: before), "round \(round), seed \(seed)")
                    for t in delta.tables {
                        clean += t.upserts.count { cleanBefore.contains("\(t.table) \(RowKey($0.fields["id"]!))") }
                        pending += t.upserts.count { pendingBefore.contains("\(t.table) \(RowKey($0.fields["id"]!))") }
                    }
                }
                // Rows of both kinds met the delta, not only rows for the field-by-field merge.
                #expect(clean > 50 && pending >= 5, "clean \(clean), pending \(pending), seed \(seed)")
            }
        }
    }

    /// Random local edits on both tables: updates (pending fields), deletes, inserts of new
    /// keys, acknowledgements and reverts, so that rows of every state meet the delta.
    static func editLocally(_ store: Store, _ rng: inout SplitMix64) throws {
        try store.write { tx in
            for _ in 0..<12 {
                let table = tables[rng.below(3)]
                let key = RowKey(.int(Int64(1 + rng.below(50))))
                let action = rng.below(6)
                let value = rng.next()
                let row = try tx.row(table, key: key, includingDeleted: true)
                switch (row?.status, action) {
                case (nil, _):
                    switch table {
                    case "tasks": try tx.insert("tasks", ["id": key.values[0], "title": titles[Int(value % 3)]])
                    case "bag": try tx.insert("bag", ["id": key.values[0], "f2": .int(Int64(value % 3))])
                    default: try tx.insert("readings", ["id": key.values[0], "v": .double(Double(value % 3))])
                    }
                case (.deleted?, _), (_, 0): try tx.revert(table, key: key)
                case (_, 1): try tx.delete(table, key: key)
                case (_, 2): try tx.acknowledge(table, key: key)
                default:
                    switch table {
                    case "tasks": try tx.update("tasks", key: key, ["title": titles[Int(value % 3)]])
                    case "bag": try tx.update("bag", key: key, ["f\(value % 3)": .int(Int64(value % 5))])
                    default: try tx.update("readings", key: key, ["v": .double(Double(value % 3))])
                    }
                }
            }
        }
    }

    /// A delta over existing, pending and absent rows: values equal to the stored ones, new
    /// values, nulls, and in the bag fields the table has not seen yet.
    /// A task new to the device must come with its title (a required field), so `absent` says
    /// which ids of `tasks` have no server copy: no row, or only a local insert.
    static func delta(round: Int, _ rng: inout SplitMix64, absent: (Int) throws -> Bool) throws -> ServerDelta {
        var tasks: [ServerRow] = []
        var bag: [ServerRow] = []
        var readings: [ServerRow] = []
        var deletes: [RowKey] = []
        for id in Set((0..<30).map { _ in 1 + rng.below(55) }).sorted() {
            switch rng.below(10) {
            case 0:
                deletes.append(RowKey(.int(Int64(id))))
            case 1, 2, 3, 4:
                var fields: [String: Value] = ["id": .int(Int64(id))]
                // Never null: title is required, and a delta clearing it is refused (see ItemValidationTests).
                if rng.below(3) > 0 { _ = rng.below(20); fields["title"] = titles[rng.below(3)] }
                if try absent(id) { fields["title"] = titles[rng.below(3)] }
                if rng.below(2) == 0 { fields["priority"] = .int(Int64(rng.below(3))) }
                if rng.below(3) == 0 { fields["done"] = .bool(rng.below(2) == 0) }
                if rng.below(3) == 0 { fields["notes"] = rng.below(2) == 0 ? .null : "n" }
                tasks.append(ServerRow(fields, version: "v\(round)"))
            case 5, 6:
                // An int for the double field as often as a double: equal values must stay equal.
                let k = rng.below(3)
                let v: Value = [.int(Int64(k)), .double(Double(k)), .null][rng.below(3)]
                readings.append(ServerRow(["id": .int(Int64(id)), "v": v]))
            default:
                var fields: [String: Value] = ["id": .int(Int64(id))]
                for f in 0..<5 where rng.below(3) == 0 {
                    fields["f\(f)"] = [.null, .int(1), .int(2), .string("s")][rng.below(4)]
                }
                if rng.below(10) == 0 { fields["g\(round)"] = .int(Int64(round)) }
                bag.append(ServerRow(fields))
            }
        }
        return ServerDelta(anchor: "r\(round)", tables: [TableDelta("tasks", upserts: tasks, deletes: deletes), TableDelta("bag", upserts: bag), TableDelta("readings", upserts: readings)])
    }

    /// Every row of both tables, deleted ones included, with originals and flags.
    static func state(_ store: Store) throws -> [String] {
        try store.read { snap in
            try tables.flatMap { t in try snap.rows(t, includingDeleted: true).map { "\(t) \($0.description) \($0.status) \($0.isConflicted)" } }
        }
    }

    /// The operations after `lsn`, with everything but their timestamps.
    static func log(_ store: Store, after lsn: UInt64) throws -> [String] {
        var ops: [String] = []
        try store.read { snap in
            try snap.forEachOperation(from: lsn + 1) { e in
                let audit = MergeAudit(e).map { "\($0)" } ?? "no audit"
                ops.append("\(e.lsn) \(e.kind) \(e.origin) \(e.table) \(e.key) \(e.changes) \(e.removesRow) \(e.isPendingInsert) \(e.isPendingDelete) \(e.isConflicted) \(e.annotation) \(audit)")
                return true
            }
        }
        return ops
    }

    /// The live server rows (as "table key"), those with nothing pending and those with
    /// pending fields: the rows merged on their records.
    static func liveRows(_ store: Store) throws -> (clean: Set<String>, pending: Set<String>) {
        try store.read { snap in
            var clean = Set<String>()
            var pending = Set<String>()
            for t in tables {
                for row in try snap.rows(t, includingDeleted: true) where !row.isConflicted {
                    if row.status == .unchanged { clean.insert("\(t) \(row.key)") }
                    if row.status == .updated { pending.insert("\(t) \(row.key)") }
                }
            }
            return (clean, pending)
        }
    }
}

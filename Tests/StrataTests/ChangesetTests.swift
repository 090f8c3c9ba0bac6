import Foundation
import LMDB
@testable import Strata
import StrataWorkload
import Testing

/// A pending changeset holds exactly what the pending rows say, and reads back.
@Suite struct ChangesetTests {
    /// What `pendingRows` says each pending row must carry, in the changeset's terms.
    static func expected(_ rows: [Row], keyFields: Set<String>) -> [Changeset.Change] {
        rows.map { row in
            let kind: Changeset.Change.Kind = row.status == .inserted ? .insert : row.status == .deleted ? .delete : .update
            var fields: [LogEntry.FieldChange] = []
            for f in row.fieldNames where !keyFields.contains(f) {
                switch kind {
                case .insert where !row[f].isNull: fields.append(.init(field: f, original: .null, current: row[f]))
                case .update where row.changedFields.contains(f): fields.append(.init(field: f, original: row.original(f), current: row[f]))
                case .delete where !row.original(f).isNull: fields.append(.init(field: f, original: row.original(f), current: .null))
                default: break
                }
            }
            return Changeset.Change(key: row.key, kind: kind, isConflicted: row.isConflicted, fields: fields)
        }
    }

    @Test func aChangesetHoldsEveryPendingRowCoalesced() throws {
        let seed = testSeed("aChangesetHoldsEveryPendingRowCoalesced")
        var rng = SplitMix64(seed: seed)
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                for id in 0..<40 { try tx.insert("tasks", ["id": .int(Int64(id)), "title": .string("t\(id)"), "notes": "n"]) }
                for id in 0..<40 { try tx.acknowledge("tasks", key: RowKey(.int(Int64(id)))) }
            }
            var kinds = Set<Changeset.Change.Kind>()
            for round in 0..<8 {
                try store.write { tx in
                    for _ in 0..<30 {
                        let key = RowKey(.int(Int64(rng.next() % 80)))
                        let row = try tx.snapshot.row("tasks", key: key, includingDeleted: true)
                        switch (row?.status, rng.next() % 4) {
                        case (nil, _): try tx.insert("tasks", ["id": key.values[0], "title": .string("n\(rng.next() % 9)")])
                        case (.deleted?, _): try tx.revert("tasks", key: key)
                        case (_, 0): try tx.delete("tasks", key: key)
                        case (_, 1): try tx.acknowledge("tasks", key: key)
                        default: try tx.update("tasks", key: key, [["title", "notes"][Int(rng.next() % 2)]: .string("u\(rng.next() % 9)")])
                        }
                    }
                }
                try store.write { tx in try tx.insert("tasks", ["id": .int(Int64(1000 + round)), "title": "x"]); try tx.delete("tasks", key: RowKey(.int(Int64(1000 + round)))) }
                let (pending, changeset) = try store.read { snap in (try snap.pendingRows("tasks"), try snap.pendingChangeset("tasks")) }
                #expect(!pending.isEmpty)
                let changes = try changeset.changes()
                #expect(changes == Self.expected(pending, keyFields: ["id"]), "round \(round)")
                // Inserted then deleted before any sync: in neither.
                #expect(!changes.contains { $0.key == RowKey(.int(Int64(1000 + round))) })
                kinds.formUnion(changes.map(\.kind))
                #expect(try Changeset(bytes: changeset.bytes) == changeset)
                #expect(changeset.table == "tasks")
            }
            #expect(kinds.count == 3)
            // A table with nothing pending has an empty changeset.
            try store.write { tx in for row in try tx.snapshot.pendingRows("tasks") { try tx.acknowledge("tasks", key: row.key) } }
            #expect(try store.read { try $0.pendingChangeset("tasks").changes() }.isEmpty)
        }
    }

    /// Pending rows next to each other, and separated by runs of clean rows of every length
    /// from 1 to 12 (the changeset steps over short runs and seeks over long ones), with
    /// another table's pending rows on both sides of the table's key range.
    @Test func pendingRowsDenseAndSparse() throws {
        try withStore { store, _ in
            try store.createTable(.propertyBag("a", key: [.int("id")]))
            try store.createTable(tasksSchema)
            try store.createTable(.propertyBag("z", key: [.int("id")]))
            var pendingIDs: [Int64] = []
            var id: Int64 = 0, gap = 0
            while id < 300 {
                pendingIDs.append(contentsOf: [id, id + 1, id + 2])
                gap = gap % 12 + 1
                id += 3 + Int64(gap)
            }
            try store.write { tx in
                for table in ["a", "z"] { try tx.insert(table, ["id": 1, "x": "pending"]) }
                for id in 0..<id { try tx.insert("tasks", ["id": .int(id), "title": .string("t\(id)")]) }
                for id in 0..<id { try tx.acknowledge("tasks", key: RowKey(.int(id))) }
                for id in pendingIDs { try tx.update("tasks", key: RowKey(.int(id)), ["notes": .string("n\(id)")]) }
            }
            let changes = try store.read { try $0.pendingChangeset("tasks") }.changes()
            #expect(changes.map(\.key) == pendingIDs.map { RowKey(.int($0)) })
            #expect(changes.allSatisfy { $0.kind == .update && $0.fields.map(\.field) == ["notes"] })
            #expect(changes.map { $0.fields[0].current } == pendingIDs.map { .string("n\($0)") })
        }
    }

    /// Sync code may store any state with `setRowState`, such as a pending delete whose field
    /// has no server value: the changeset still says what `pendingRows` says.
    @Test func statesSetBySyncCode() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                // Required fields (priority, done) must hold a value in any state stored.
                let required: [String: RowState.Field] = ["priority": .clean(0), "done": .clean(false)]
                try tx.setRowState("tasks", key: 1, RowState(fields: required.merging(["title": .clean("t"), "notes": .init(original: .null, current: "x")]) { $1 }, isDeleted: true), kind: .serverChange, origin: .server)
                try tx.setRowState("tasks", key: 2, RowState(fields: required.merging(["title": .init(original: "a", current: "b")]) { $1 }, isConflicted: true), kind: .serverChange, origin: .server)
            }
            let (pending, changeset) = try store.read { snap in (try snap.pendingRows("tasks"), try snap.pendingChangeset("tasks")) }
            let changes = try changeset.changes()
            #expect(changes == Self.expected(pending, keyFields: ["id"]))
            #expect(changes.map(\.kind) == [.delete, .update] && changes.map(\.isConflicted) == [false, true])
        }
    }

    /// A row with 200 fields (entries far longer than a one-byte length) and a two-field key.
    @Test func aRowWithManyFieldsAndACompositeKey() throws {
        try withStore { store, _ in
            try store.createTable(.propertyBag("bag", key: [.string("name"), .int("n")]))
            var fields: [String: Value] = ["name": "a", "n": 1]
            for i in 0..<200 { fields["f\(i)"] = .int(Int64(i)) }
            try store.write { tx in
                try tx.insert("bag", FieldValues(fields.map { ($0.key, $0.value) }))
                try tx.insert("bag", ["name": "b", "n": 2, "f3": "x"])
            }
            let changes = try store.read { try $0.pendingChangeset("bag") }.changes()
            #expect(changes.map(\.key) == [RowKey([.string("a"), .int(1)]), RowKey([.string("b"), .int(2)])])
            #expect(changes[0].fields.count == 200)
            #expect(changes[0].fields.allSatisfy { $0.current == fields[$0.field] && $0.original == .null })
            #expect(changes[1].fields == [.init(field: "f3", original: .null, current: "x")])
        }
    }

    /// A changeset whose header is rewritten with `keyCount` as its key field count, after the
    /// table name; the rest (field names, rows) is the original's.
    static func withKeyCount(_ keyCount: UInt64, _ good: [UInt8]) throws -> [UInt8] {
        let (countAt, countEnd) = try withBytes(good) { (b) throws(StrataError) in
            var r = ByteReader(b, offset: Changeset.magic.count + 1)
            _ = try r.value()
            let at = r.offset
            _ = try r.varint()
            return (at, r.offset)
        }
        var w = ByteWriter()
        w.append(Array(good[..<countAt]))
        w.appendVarint(keyCount)
        w.append(Array(good[countEnd...]))
        return w.bytes
    }

    /// A header claiming 2^62 key fields followed by a row used to pass `Changeset(bytes:)` and
    /// trap in `changes()` (reserving room for that many key values). A key field count of 0 or
    /// more than the field names is refused up front as malformed input, saying what was wrong.
    @Test func aKeyFieldCountTheFieldNamesCannotHoldIsRefused() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a"]) }
            let good = try store.read { try $0.pendingChangeset("tasks") }
            let names = try store.read { try $0.fieldNames("tasks") }.count
            #expect(try Self.withKeyCount(1, good.bytes) == good.bytes)
            for bad: UInt64 in [1 << 40, 1 << 62, UInt64.max, UInt64(names) + 1, 0] {
                let bytes = try Self.withKeyCount(bad, good.bytes)
                let e = #expect(throws: StrataError.self, "key count \(bad)") { try Changeset(bytes: bytes).changes() }
                #expect(e?.code == .malformedInput && e?.message.contains("key field") == true, "key count \(bad): \(String(describing: e))")
            }
        }
    }

    @Test func damagedOrForeignBytesAreRefused() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a", "notes": "n"]) }
            let good = try store.read { try $0.pendingChangeset("tasks") }.bytes
            #expect(throws: StrataError.self) { try Changeset(bytes: Array("nope".utf8)) }
            var newer = good
            newer[4] = 9
            let e = #expect(throws: StrataError.self) { try Changeset(bytes: newer) }
            #expect(e?.code == .formatVersion)
            // Every truncation is refused as malformed input, never misread or crashing.
            var refused = 0
            for n in 0..<good.count {
                do {
                    let c = try Changeset(bytes: Array(good.prefix(n)))
                    let changes = try c.changes()
                    // A cut exactly between rows leaves a valid, shorter changeset.
                    #expect(changes.isEmpty)
                } catch let error as StrataError {
                    #expect(error.code == .malformedInput, "cut at \(n): \(error)")
                    refused += 1
                }
            }
            #expect(refused > good.count / 2)
            let e2 = #expect(throws: StrataError.self) { try store.read { try $0.pendingChangeset("nope") } }
            #expect(e2?.code == .tableNotFound)
        }
    }
}

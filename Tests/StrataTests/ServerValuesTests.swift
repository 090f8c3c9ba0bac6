import Foundation
@testable import Strata
import Testing

/// `Transaction.applyServerValues`: server values written straight onto a row with nothing
/// pending, and refused (nothing written) for every other row.
@Suite struct ServerValuesTests {
    func seeded(_ body: (Store) throws -> Void) throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                for id in 1...3 {
                    try tx.insert("tasks", ["id": .int(Int64(id)), "title": "t", "notes": "n"])
                    try tx.acknowledge("tasks", key: RowKey(.int(Int64(id))))
                }
                try tx.update("tasks", key: 2, ["title": "local"])
                try tx.insert("tasks", ["id": 4, "title": "new"])
            }
            try body(store)
        }
    }

    @Test func aCleanRowTakesTheValuesCleanInOneServerOperation() throws {
        try seeded { store in
            let before = try store.read { try $0.lastLSN }
            var seen: [Transaction.ReplacedValue] = []
            let result = try store.write { tx in
                try tx.applyServerValues("tasks", key: 1, ["id": 1, "title": "t", "priority": 5, "updated": 2, "notes": .null], kind: .serverChange) {
                    seen = $0
                    return [42]
                }
            }
            // Field order; the int given for a double field is stored as a double.
            let expected = [
                Transaction.ReplacedValue(field: "priority", old: 0, new: 5),
                Transaction.ReplacedValue(field: "notes", old: "n", new: .null),
                Transaction.ReplacedValue(field: "updated", old: .null, new: 2.0),
            ]
            #expect(result == .applied(expected))
            #expect(seen == expected)
            let row = try #require(try store.read { try $0.row("tasks", key: 1) })
            #expect(row.status == .unchanged && row.changedFields.isEmpty)
            #expect(row["priority"] == 5 && row["notes"] == .null && row["updated"] == 2.0 && row["title"] == "t")
            let ops = try store.read { try $0.history("tasks", key: 1) }
            let op = try #require(ops.last)
            #expect(op.lsn == before + 1 && op.origin == .server && op.kind == .serverChange && op.annotation == [42])
            #expect(op.changes.map(\.field) == ["priority", "notes", "updated"])
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func nothingIsWrittenForTheSameValuesOrARowThatNeedsAMerge() throws {
        try seeded { store in
            let before = try store.read { try $0.lastLSN }
            let results = try store.write { tx in
                [
                    try tx.applyServerValues("tasks", key: 1, ["title": "t", "notes": "n", "updated": .null], kind: .serverChange) { _ in [1] },
                    try tx.applyServerValues("tasks", key: 2, ["priority": 1], kind: .serverChange) { _ in [1] },  // a pending field
                    try tx.applyServerValues("tasks", key: 4, ["priority": 1], kind: .serverChange) { _ in [1] },  // a local insert
                    try tx.applyServerValues("tasks", key: 9, ["priority": 1], kind: .serverChange) { _ in [1] },  // no row
                    try tx.applyServerValues("tasks", key: 3, ["colour": 1], kind: .serverChange) { _ in [1] },  // no such field
                ]
            }
            #expect(results == [.unchanged, .needsMerge, .needsMerge, .needsMerge, .needsMerge])
            try store.write { tx in try tx.delete("tasks", key: 3) }
            #expect(try store.write { tx in try tx.applyServerValues("tasks", key: 3, ["priority": 1], kind: .serverChange) { _ in [] } } == .needsMerge)
            #expect(try store.read { try $0.lastLSN } == before + 1)
        }
    }

    @Test func badValuesAndAThrowingAnnotationLeaveTheRowAsItWas() throws {
        try seeded { store in
            let before = try store.read { try $0.lastLSN }
            struct Refused: Error {}
            try store.write { tx in
                #expect(throws: StrataError.self) {
                    try tx.applyServerValues("tasks", key: 1, ["priority": "high"], kind: .serverChange) { _ in [] }
                }
                #expect(throws: Refused.self) {
                    try tx.applyServerValues("tasks", key: 1, ["priority": 7], kind: .serverChange) { _ in throw Refused() }
                }
                #expect(throws: StrataError.self) {
                    try tx.applyServerValues("lists", key: 1, ["priority": 7], kind: .serverChange) { _ in [] }
                }
            }
            #expect(try store.read { try $0.lastLSN } == before)
            #expect(try store.read { try $0.row("tasks", key: 1)?["priority"] } == 0)
        }
    }
}

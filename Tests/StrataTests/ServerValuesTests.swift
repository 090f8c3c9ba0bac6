import Foundation
@testable import Strata
import Testing

/// `Transaction.mergeServerValues`: server values merged straight into a stored live row, as
/// the caller's decisions say, and refused (nothing written) for every row it does not handle.
/// The merge rules themselves are StrataSync's (`RecordMergeTests` holds them to the
/// field-by-field merge); here `decide` is written out per test.
@Suite struct ServerValuesTests {
    typealias Decision = (action: Transaction.ServerFieldAction, tag: UInt8)

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

    /// Take what the server changed, record it with tag 1.
    static func takeChanges(_ sides: Transaction.ServerFieldSides) -> Decision? { sides.serverChanged ? (.takeServer, 1) : (.keep, 0) }

    /// A recorded decision with its values decoded.
    struct Seen: Equatable {
        var field: String
        var base: Value
        var local: Value
        var server: Value
        var action: Transaction.ServerFieldAction
        var tag: UInt8
        var decision: Transaction.ServerFieldDecision { Transaction.ServerFieldDecision(field: field, action: action, tag: tag) }
    }

    static func seen(_ values: Transaction.ServerFieldValues) throws -> [Seen] {
        try values.decisions.indices.map { i in
            let (b, l, s) = try values.decoded(i)
            let d = values.decisions[i]
            return Seen(field: d.field, base: b, local: l, server: s, action: d.action, tag: d.tag)
        }
    }

    @Test func aCleanRowTakesTheValuesCleanInOneServerOperation() throws {
        try seeded { store in
            let before = try store.read { try $0.lastLSN }
            var seen: [Seen] = []
            let result = try store.write { tx in
                try tx.mergeServerValues("tasks", key: 1, ["id": 1, "title": "t", "priority": 5, "updated": 2, "notes": .null], kind: .serverChange, decide: Self.takeChanges) { values, audit in
                    seen = try Self.seen(values)
                    audit.append(42)
                }
            }
            // Field order; the int given for a double field is stored as a double.
            let expected = [
                Seen(field: "priority", base: 0, local: 0, server: 5, action: .takeServer, tag: 1),
                Seen(field: "notes", base: "n", local: "n", server: .null, action: .takeServer, tag: 1),
                Seen(field: "updated", base: .null, local: .null, server: 2.0, action: .takeServer, tag: 1),
            ]
            #expect(result == .merged(expected.map(\.decision), logged: true))
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

    @Test func eachActionOnAPendingFieldWritesItsState() throws {
        // Row 2's title is "local" over the server's "t"; the server now sends "s".
        let cases: [(Transaction.ServerFieldAction, original: Value, current: Value, status: Row.Status, conflicted: Bool)] = [
            (.takeServer, "s", "s", .unchanged, false),
            (.rebase, "s", "local", .updated, false),
            (.conflict, "s", "local", .updated, true),
            (.keep, "t", "local", .updated, false),
        ]
        for c in cases {
            try seeded { store in
                var sides: [Transaction.ServerFieldSides] = []
                var seen: [Seen] = []
                let result = try store.write { tx in
                    try tx.mergeServerValues("tasks", key: 2, ["title": "s", "priority": 0], kind: .serverChange) { s in
                        sides.append(s)
                        return (c.0, 7)
                    } annotation: { values, audit in
                        seen = try Self.seen(values)
                        audit.append(1)
                    }
                }
                // Field order: title, then priority (unchanged on both sides).
                #expect(sides == [
                    Transaction.ServerFieldSides(localChanged: true, serverChanged: true, serverIsLocal: false),
                    Transaction.ServerFieldSides(localChanged: false, serverChanged: false, serverIsLocal: true),
                ])
                guard case .merged(let decisions, let logged) = result else {
                    Issue.record("\(c.0): \(result)")
                    return
                }
                #expect(decisions.map(\.field) == ["title", "priority"], "\(c.0)")
                #expect(decisions.first == Transaction.ServerFieldDecision(field: "title", action: c.0, tag: 7))
                #expect(logged == (c.0 != .keep), "\(c.0)")
                // The annotation sees the values before the merge, only when something changed.
                #expect(seen.first == (logged ? Seen(field: "title", base: "t", local: "local", server: "s", action: c.0, tag: 7) : nil), "\(c.0)")
                let row = try #require(try store.read { try $0.row("tasks", key: 2) })
                #expect(row.original("title") == c.original && row["title"] == c.current, "\(c.0)")
                #expect(row.status == c.status && row.isConflicted == c.conflicted, "\(c.0)")
                #expect(row.conflictingFields == (c.conflicted ? ["title"] : []), "\(c.0)")
                #expect(try store.read { try $0.pendingRows("tasks").map(\.key) } == (c.status == .updated ? [2, 4] : [4]), "\(c.0)")
                #expect(try store.verify().isConsistent)
            }
        }
    }

    @Test func nothingIsWrittenForTheSameValuesOrARowThatNeedsAMerge() throws {
        try seeded { store in
            let before = try store.read { try $0.lastLSN }
            let results = try store.write { tx in
                [
                    try tx.mergeServerValues("tasks", key: 1, ["title": "t", "notes": "n", "updated": .null], kind: .serverChange, decide: Self.takeChanges) { _, audit in audit.append(1) },
                    try tx.mergeServerValues("tasks", key: 4, ["priority": 1], kind: .serverChange, decide: Self.takeChanges) { _, audit in audit.append(1) },  // a local insert
                    try tx.mergeServerValues("tasks", key: 9, ["priority": 1], kind: .serverChange, decide: Self.takeChanges) { _, audit in audit.append(1) },  // no row
                    try tx.mergeServerValues("tasks", key: 3, ["colour": 1], kind: .serverChange, decide: Self.takeChanges) { _, audit in audit.append(1) },  // no such field
                    try tx.mergeServerValues("tasks", key: 3, ["priority": 1], kind: .serverChange, decide: { _ in nil }) { _, audit in audit.append(1) },  // left to the caller
                    // A pending required field the server clears: taking it would leave it null.
                    try tx.mergeServerValues("tasks", key: 2, ["title": .null, "priority": 3], kind: .serverChange, decide: { _ in (.takeServer, 1) }) { _, audit in audit.append(1) },
                ]
            }
            #expect(results == [.merged([], logged: false), .needsMerge, .needsMerge, .needsMerge, .needsMerge, .needsMerge])
            try store.write { tx in try tx.delete("tasks", key: 3) }
            #expect(try store.write { tx in try tx.mergeServerValues("tasks", key: 3, ["priority": 1], kind: .serverChange, decide: Self.takeChanges) { _, _ in } } == .needsMerge)
            #expect(try store.read { try $0.lastLSN } == before + 1)
            #expect(try store.read { try $0.row("tasks", key: 2)?["priority"] } == 0)
        }
    }

    @Test func badValuesAndAThrowingAnnotationLeaveTheRowAsItWas() throws {
        try seeded { store in
            let before = try store.read { try $0.lastLSN }
            struct Refused: Error {}
            try store.write { tx in
                #expect(throws: StrataError.self) {
                    try tx.mergeServerValues("tasks", key: 1, ["priority": "high"], kind: .serverChange, decide: Self.takeChanges) { _, _ in }
                }
                // A null for a required field of a row with nothing pending.
                let e = #expect(throws: StrataError.self) {
                    try tx.mergeServerValues("tasks", key: 1, ["title": .null], kind: .serverChange, decide: Self.takeChanges) { _, _ in }
                }
                #expect(e?.code == .nullNotAllowed)
                #expect(throws: Refused.self) {
                    try tx.mergeServerValues("tasks", key: 1, ["priority": 7], kind: .serverChange, decide: Self.takeChanges) { _, _ in throw Refused() }
                }
                #expect(throws: StrataError.self) {
                    try tx.mergeServerValues("lists", key: 1, ["priority": 7], kind: .serverChange, decide: Self.takeChanges) { _, _ in }
                }
            }
            #expect(try store.read { try $0.lastLSN } == before)
            #expect(try store.read { try $0.row("tasks", key: 1)?["priority"] } == 0)
        }
    }
}

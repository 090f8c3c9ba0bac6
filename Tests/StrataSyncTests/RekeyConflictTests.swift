import Foundation
import Strata
import StrataSync
import Testing

/// A row the server gives a new key (`rekey`) rewrites the children that name it. A child in an
/// unresolved conflict is held back from uploads, so it is still pending when its parent is
/// acknowledged: the rewrite must change the parent's key in it and nothing else — the row's
/// conflict flag, each field's conflict mark (the key field's own included), its originals,
/// its other currents and its pending state stay.
@Suite struct RekeyConflictTests {
    /// A child table with a field the tests change on this device only.
    static let items = TableSchema.fixed("items", primaryKey: ["id"], fields: [
        .int("id"), .string("title"), .int("priority", nullable: true), .string("notes", nullable: true),
    ])
    static let itemPriority = Association(child: "items", field: "priority", parent: "priorities")

    /// Everything about a row but its key.
    struct Facts: Equatable, CustomStringConvertible {
        var status: Row.Status
        var isConflicted: Bool
        var conflictingFields: [String]
        var recordsConflictingFields: Bool
        var originals: [String: Value]
        var currents: [String: Value]
        init(_ row: Row) {
            status = row.status
            isConflicted = row.isConflicted
            conflictingFields = row.conflictingFields
            recordsConflictingFields = row.recordsConflictingFields
            originals = row.originalValues
            currents = row.values
        }
        var description: String {
            "\(status) conflicted \(isConflicted) \(conflictingFields) recorded \(recordsConflictingFields) originals \(originals.sorted { $0.key < $1.key }) currents \(currents.sorted { $0.key < $1.key })"
        }
    }

    /// A store with `priorities` and `items`, a client with the deferred policy, and the server
    /// rows priority 5 and item 2 (title "base", priority 5, notes "n") merged.
    func withClient(_ body: (Store, SyncClient) throws -> Void) throws {
        try withStore { store in
            try store.createTable(priorities)
            try store.createTable(Self.items)
            let sync = SyncClient(store: store, policy: .deferred, associations: [Self.itemPriority])
            try sync.merge(ServerDelta(anchor: "a1", tables: [
                TableDelta("priorities", upserts: [ServerRow(["id": 5, "name": "low"])]),
                TableDelta("items", upserts: [ServerRow(["id": 2, "title": "base", "priority": 5, "notes": "n"])]),
            ]))
            try body(store, sync)
        }
    }

    func item(_ store: Store) throws -> Row {
        try #require(try store.read { try $0.row("items", key: 2, includingDeleted: true) })
    }

    /// Freezes the batch, which must carry only the new parent -1, and acknowledges it with
    /// the server key 100.
    func acknowledgeParent(_ sync: SyncClient) throws {
        let batch = try #require(try sync.nextBatch())
        #expect(batch.changes.map(\.table) == ["priorities"] && batch.changes.map(\.key) == [-1], "\(batch.changes)")
        let report = try sync.acknowledge(BatchAck(batchID: batch.id, results: [.ok("priorities", -1, newKey: 100)]))
        #expect(report.acknowledged == 1 && report.rekeyed == 1)
    }

    /// The child's key field in conflict (changed here and on the server), alone or with
    /// another field; a third field changed here only.
    @Test(arguments: [false, true])
    func aChildInAFieldConflictKeepsItWhenItsParentIsRekeyed(titleInConflict: Bool) throws {
        let title: Value = titleInConflict ? "theirs" : "base"
        let fields = titleInConflict ? ["title", "priority"] : ["priority"]
        try withClient { store, sync in
            try store.write { tx in
                try tx.insert("priorities", ["id": -1, "name": "urgent"])
                try tx.update("items", key: 2, ["title": titleInConflict ? "mine" : "base", "priority": -1, "notes": "local"])
            }
            try sync.merge(ServerDelta(anchor: "a2", tables: [
                TableDelta("items", upserts: [ServerRow(["id": 2, "title": title, "priority": 7, "notes": "n"])]),
            ]))
            let before = Facts(try item(store))
            #expect(before.conflictingFields == fields && before.status == .updated, "\(before)")

            try acknowledgeParent(sync)

            // Only the parent's key changed, in the current value; the original is the server's.
            var expected = before
            expected.currents["priority"] = 100
            let after = try item(store)
            #expect(Facts(after) == expected)
            #expect(after.original("priority") == 7 && after.original("title") == title && after.original("notes") == "n")
            let conflicts = try sync.conflicts()
            #expect(conflicts.count == 1 && conflicts.first?.table == "items" && conflicts.first?.key == 2)
            #expect(conflicts.first?.fields == fields)
            #expect(conflicts.first?.local == (titleInConflict ? ["title": "mine", "priority": 100] : ["priority": 100]))
            #expect(conflicts.first?.server == (titleInConflict ? ["title": "theirs", "priority": 7] : ["priority": 7]))
            // Still held back.
            #expect(try sync.pendingChanges().isEmpty)
            #expect(try sync.nextBatch() == nil)
            #expect(try store.verify().isConsistent)

            // Resolved, it goes up naming the parent by its server key.
            try sync.resolve("items", key: 2, with: .local)
            let change = try #require(try sync.nextBatch()?.changes.first)
            #expect(change.values == (titleInConflict ? ["title": "mine", "priority": 100, "notes": "local"] : ["priority": 100, "notes": "local"]))
            #expect(change.originals == (titleInConflict ? ["title": "theirs", "priority": 7, "notes": "n"] : ["priority": 7, "notes": "n"]))
        }
    }

    /// The server deleted the child while it was edited here: it is an insert in conflict
    /// (server values null), and stays one.
    @Test func aChildTheServerDeletedKeepsItsConflictWhenItsParentIsRekeyed() throws {
        try withClient { store, sync in
            try store.write { tx in
                try tx.insert("priorities", ["id": -1, "name": "urgent"])
                try tx.update("items", key: 2, ["title": "mine", "priority": -1])
            }
            try sync.merge(ServerDelta(anchor: "a2", tables: [TableDelta("items", deletes: [2])]))
            let before = Facts(try item(store))
            #expect(before.conflictingFields == ["title", "priority"] && before.status == .inserted, "\(before)")

            try acknowledgeParent(sync)

            var expected = before
            expected.currents["priority"] = 100
            #expect(Facts(try item(store)) == expected)
            let conflict = try #require(try sync.conflicts().first)
            #expect(conflict.isDeletedOnServer && conflict.fields == ["title", "priority"])
            #expect(conflict.local == ["title": "mine", "priority": 100])
            #expect(conflict.server == ["title": .null, "priority": .null])
            #expect(try sync.nextBatch() == nil)
            #expect(try store.verify().isConsistent)
        }
    }

    /// The server had already moved the child to the parent's new key (the app merged between
    /// `nextBatch()` and `acknowledge(_:)`): once the child names the new key too, the two sides
    /// of that field agree and it is no longer in conflict, as a merge would settle it. A
    /// conflict on another field stays; with none, the row is no longer conflicted.
    @Test(arguments: [false, true])
    func aKeyFieldConflictTheRekeySettlesIsDropped(titleInConflict: Bool) throws {
        let fields = titleInConflict ? ["title", "priority"] : ["priority"]
        try withClient { store, sync in
            try store.write { try $0.insert("priorities", ["id": -1, "name": "urgent"]) }
            let batch = try #require(try sync.nextBatch())
            #expect(batch.changes.map(\.table) == ["priorities"])
            // Edited after the freeze: not in the batch.
            try store.write { try $0.update("items", key: 2, ["title": titleInConflict ? "mine" : "base", "priority": -1]) }
            // The server applied the batch; another client moved item 2 to the new priority.
            try sync.merge(ServerDelta(anchor: "a2", tables: [
                TableDelta("priorities", upserts: [ServerRow(["id": 100, "name": "urgent"])]),
                TableDelta("items", upserts: [ServerRow(["id": 2, "title": titleInConflict ? "theirs" : "base", "priority": 100, "notes": "n"])]),
            ]))
            #expect(try item(store).conflictingFields == fields)
            let report = try sync.acknowledge(BatchAck(batchID: batch.id, results: [.ok("priorities", -1, newKey: 100)]))
            #expect(report.rekeyed == 1)

            let row = try item(store)
            #expect(row.isConflicted == titleInConflict && row.conflictingFields == (titleInConflict ? ["title"] : []), "\(row)")
            #expect(row.recordsConflictingFields == titleInConflict)
            #expect(row["priority"] == 100 && row.original("priority") == 100 && !row.isChanged("priority"))
            #expect(row.isPending == titleInConflict, "\(row)")
            #expect(try sync.conflicts().map(\.fields) == (titleInConflict ? [["title"]] : []))
            #expect(try sync.nextBatch() == nil)
            #expect(try store.verify().isConsistent)
        }
    }

    /// A parent holds its conflict through the acknowledgement too. A row in conflict is never
    /// in a batch, and one a merge changes after the freeze is superseded rather than rekeyed,
    /// so the conflict a parent can hold is on the row a merge brought under the server key
    /// (the app pulled before acknowledging): that row stands, conflict and all.
    @Test func aParentInConflictUnderItsServerKeyKeepsIt() throws {
        try withClient { store, sync in
            try store.write { tx in
                try tx.insert("priorities", ["id": -1, "name": "urgent"])
                try tx.insert("items", ["id": 3, "title": "new", "priority": -1])
            }
            let batch = try #require(try sync.nextBatch(maxRows: 1))
            #expect(batch.changes.map(\.table) == ["priorities"])
            try sync.merge(ServerDelta(anchor: "a2", tables: [TableDelta("priorities", upserts: [ServerRow(["id": 100, "name": "urgent"])])]))
            try store.write { try $0.update("priorities", key: 100, ["name": "mine"]) }
            try sync.merge(ServerDelta(anchor: "a3", tables: [TableDelta("priorities", upserts: [ServerRow(["id": 100, "name": "theirs"])])]))
            let before = Facts(try #require(try store.read { try $0.row("priorities", key: 100) }))
            #expect(before.conflictingFields == ["name"])

            try sync.acknowledge(BatchAck(batchID: batch.id, results: [.ok("priorities", -1, newKey: 100)]))

            #expect(try store.read { try $0.row("priorities", key: -1, includingDeleted: true) } == nil)
            #expect(Facts(try #require(try store.read { try $0.row("priorities", key: 100) })) == before)
            let conflict = try #require(try sync.conflicts().first)
            #expect(conflict.table == "priorities" && conflict.key == 100 && conflict.fields == ["name"])
            #expect(conflict.local == ["name": "mine"] && conflict.server == ["name": "theirs"])
            // The new child follows the parent.
            #expect(try store.read { try $0.row("items", key: 3) }?["priority"] == 100)
            #expect(try store.verify().isConsistent)
        }
    }
}

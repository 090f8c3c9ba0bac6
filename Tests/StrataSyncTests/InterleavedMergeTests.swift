import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// An app that runs the steps of a sync round itself may merge a delta between `nextBatch()` and
/// `acknowledge(_:)` — for example after a lost response: it pulls, then pushes the batch again
/// and gets the server's cached answer. `sync()` never does this (it settles a batch in flight
/// before it pulls), so these tests call the steps one by one.
@Suite struct InterleavedMergeTests {
    // MARK: A merge that brought the row the acknowledgement renames

    /// What happens between freezing the batch (priority -1 and its child, task 1) and
    /// acknowledging it, in the order listed; the server gives the new priority the key 100.
    struct Step: Sendable {
        let name: String
        let run: @Sendable (Store, InMemorySyncServer, SyncClient) async throws -> Void

        static func local(_ name: String, _ edit: @escaping @Sendable (Transaction) throws -> Void) -> Step {
            Step(name: name) { store, _, _ in try await store.write { try edit($0) } }
        }
        static func server(_ name: String, _ fields: [String: Value]?) -> Step {
            Step(name: name) { _, server, _ in server.write("priorities", key: 100, fields) }
        }
        static let push = Step(name: "push (the response is lost)") { _, server, sync in
            _ = try await server.push(try #require(try sync.inFlightBatch()).batch)
        }
        static let merge = Step(name: "pull and merge") { _, server, sync in
            try sync.merge(try await server.pull(since: try sync.anchor()))
        }
    }

    /// Runs `steps` between freezing and acknowledging, then checks the acknowledgement goes
    /// through, `check` on priority 100, and that one `sync()` leaves client and server equal.
    func interleaved(
        _ name: String, policy: ConflictPolicy = .serverWins, _ steps: [Step],
        check: @Sendable (Row?) -> Void
    ) async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(assigned)
            try store.createTable(priorities)
            let server = InMemorySyncServer(associations: [taskPriority]) { c in
                c.table == "priorities" && c.kind == .insert ? .ok(c.table, c.key, newKey: 100) : nil
            }
            let sync = SyncClient(store: store, policy: policy, associations: [taskPriority])
            _ = try await sync.sync(with: server)
            try await store.write { tx in
                try tx.insert("priorities", ["id": -1, "name": "urgent"])
                try tx.insert("assigned", ["id": 1, "title": "t", "priority": -1])
            }
            let batch = try #require(try sync.nextBatch())
            for step in [Step.push] + steps { try await step.run(store, server, sync) }

            // The server's answer to the batch, as it cached it.
            let report = try sync.acknowledge(try await server.push(batch))
            #expect(report.rekeyed == 1, "\(name)")
            #expect(try sync.inFlightBatch() == nil, "\(name): the batch is still in flight")
            #expect(try await store.read { try $0.row("priorities", key: -1, includingDeleted: true) } == nil, "\(name)")
            let child = try await store.read { try $0.row("assigned", key: 1) }
            #expect(child?["priority"] == 100 && child?.isPending == false, "\(name): \(String(describing: child))")
            check(try await store.read { try $0.row("priorities", key: 100, includingDeleted: true) })
            #expect(try store.verify().isConsistent, "\(name)")

            _ = try await sync.sync(with: server)
            #expect(try await store.read { try $0.pendingRows() }.isEmpty, "\(name)")
            for table in ["priorities", "assigned"] {
                #expect(serverRows(server, table) == (try clientRows(store, table)), "\(name): \(table)")
            }
        }
    }

    /// The row under the server's key came with a merge; the acknowledgement must not refuse it
    /// (which left the batch in flight for ever) but bring the two together: the server's values
    /// where only the server changed a field, the edits made since the freeze kept pending, a
    /// field both changed settled by the policy — the merge rules, as if the acknowledgement had
    /// come before the merge.
    @Test func anAcknowledgementRenamesARowAMergeAlreadyBrought() async throws {
        let edit = Step.local("a local edit since the freeze") { try $0.update("priorities", key: -1, ["name": "mine"]) }
        let theirs = Step.server("a server edit since the batch", ["name": "theirs"])

        try await interleaved("nothing else", [.merge]) { row in
            #expect(row?["name"] == "urgent" && row?.isPending == false)
        }
        try await interleaved("a local edit", [edit, .merge]) { row in
            #expect(row?["name"] == "mine" && row?.original("name") == "urgent" && row?.status == .updated)
        }
        try await interleaved("a local edit after the merge", [.merge, edit]) { row in
            #expect(row?["name"] == "mine" && row?.original("name") == "urgent" && row?.status == .updated)
        }
        try await interleaved("a server edit", [theirs, .merge]) { row in
            #expect(row?["name"] == "theirs" && row?.isPending == false)
        }
        try await interleaved("both, server wins", [edit, theirs, .merge]) { row in
            #expect(row?["name"] == "theirs" && row?.isPending == false)
        }
        try await interleaved("both, client wins", policy: .clientWins, [edit, theirs, .merge]) { row in
            #expect(row?["name"] == "mine" && row?.original("name") == "theirs" && row?.status == .updated)
        }
        try await interleaved("deleted here since the freeze", [.local("delete") { try $0.delete("priorities", key: -1) }, .merge]) { row in
            #expect(row?.status == .deleted && row?.original("name") == "urgent")
        }
        try await interleaved("deleted by the server after a first merge brought it", [.merge, .server("deleted there", nil), .merge]) { row in
            #expect(row == nil)
        }
        try await interleaved("the merged row edited, the client's not", [.merge, .local("edit 100") { try $0.update("priorities", key: 100, ["name": "edited there"]) }]) { row in
            #expect(row?["name"] == "edited there" && row?.original("name") == "urgent" && row?.status == .updated)
        }
    }

    /// The audit of that reconciliation is in the row's history, like a merge's.
    @Test func theReconciliationIsAudited() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(priorities)
            let server = InMemorySyncServer { c in c.kind == .insert ? .ok(c.table, c.key, newKey: 100) : nil }
            let sync = SyncClient(store: store)
            _ = try await sync.sync(with: server)
            try await store.write { try $0.insert("priorities", ["id": -1, "name": "urgent"]) }
            let batch = try #require(try sync.nextBatch())
            let ack = try await server.push(batch)
            try await store.write { try $0.update("priorities", key: -1, ["name": "mine"]) }
            server.write("priorities", key: 100, ["name": "theirs"])
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try sync.acknowledge(ack)
            let audit = try #require(try await store.read { try $0.history("priorities", key: 100) }.last.flatMap(MergeAudit.init))
            #expect(audit.conflict == .fields && audit.resolution == .server && audit.policy == .serverWins)
            #expect(audit.decisions.map(\.field) == ["name"] && audit.decisions.first?.local == "mine" && audit.decisions.first?.server == "theirs")
        }
    }

    /// Both rows hold local edits: no merge rule chooses between two local edits, so the
    /// acknowledgement refuses, changes nothing and leaves the batch in flight; once the app
    /// has settled the duplicate (here: reverted the row under the server's key), it goes through.
    @Test func twoEditedCopiesAreRefusedUntilTheAppSettlesThem() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(priorities)
            let server = InMemorySyncServer { c in c.kind == .insert ? .ok(c.table, c.key, newKey: 100) : nil }
            let sync = SyncClient(store: store)
            _ = try await sync.sync(with: server)
            try await store.write { try $0.insert("priorities", ["id": -1, "name": "urgent"]) }
            let batch = try #require(try sync.nextBatch())
            let ack = try await server.push(batch)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try await store.write { tx in
                try tx.update("priorities", key: -1, ["name": "here"])
                try tx.update("priorities", key: 100, ["name": "there"])
            }
            let before = try await store.read { snap in try snap.rows("priorities", includingDeleted: true).map(\.description) + ["\(try snap.lastLSN)"] }
            let e = #expect(throws: StrataError.self) { try sync.acknowledge(ack) }
            #expect(e?.code == .invalidOperation)
            #expect(e?.message.contains("revert") == true, "\(String(describing: e))")
            #expect(try await store.read { snap in try snap.rows("priorities", includingDeleted: true).map(\.description) + ["\(try snap.lastLSN)"] } == before)
            #expect(try sync.inFlightBatch()?.batch == batch)

            try await store.write { try $0.revert("priorities", key: 100) }
            #expect(try sync.acknowledge(ack).rekeyed == 1)
            let row = try #require(try await store.read { try $0.row("priorities", key: 100) })
            #expect(row["name"] == "here" && row.original("name") == "urgent")
            _ = try await sync.sync(with: server)
            #expect(serverRows(server, "priorities") == (try clientRows(store, "priorities")))
        }
    }

    // MARK: A merge that touched an accepted row before the push

    /// The merge came before the server applied the batch: the acknowledgement is not newer than
    /// the merged row, but the merge leaves it holding what it sent, still pending, so skipping the
    /// `ok` (counted as superseded) loses nothing — the next pull settles it, or, if the server
    /// changed the sent field, the server answers `conflict` and the policy decides as usual.
    @Test func anAcceptedRowAMergeTouchedBeforeThePushIsSettledByTheNextPull() async throws {
        typealias Case = (name: String, policy: ConflictPolicy, server: [String: Value], superseded: Int, title: Value)
        let cases: [Case] = [
            ("another field changed there", .serverWins, ["title": "a", "priority": 5], 1, "mine"),
            ("the sent field changed there, server wins", .serverWins, ["title": "theirs", "priority": 0], 0, "theirs"),
            ("the sent field changed there, client wins", .clientWins, ["title": "theirs", "priority": 0], 0, "mine"),
        ]
        for c in cases {
            try await withStoreAsync { store in
                let server = InMemorySyncServer()
                server.write("tasks", key: 1, ["title": "a", "priority": 0, "done": false, "notes": nil])
                let sync = SyncClient(store: store, policy: c.policy)
                _ = try await sync.sync(with: server)
                try await store.write { try $0.update("tasks", key: 1, ["title": "mine"]) }
                let batch = try #require(try sync.nextBatch())
                server.write("tasks", key: 1, c.server.merging(["done": false, "notes": nil]) { a, _ in a })
                try sync.merge(try await server.pull(since: try sync.anchor()))
                let report = try sync.acknowledge(try await server.push(batch))
                #expect(report.superseded == c.superseded, "\(c.name)")
                _ = try await sync.sync(with: server)
                _ = try await sync.sync(with: server)  // a conflict answer goes up again after a pull
                #expect(server.rows("tasks")[1]?["title"] == c.title, "\(c.name)")
                #expect(try await store.read { try $0.pendingRows() }.isEmpty, "\(c.name)")
                #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")), "\(c.name)")
            }
        }
    }

    // MARK: A merge that listed an accepted row without changing it

    /// Found by `ManualStepConvergenceTests`. The push is applied, then another writer sets the
    /// sent field back to its value before the batch, then the app pulls and acknowledges. The
    /// delta lists the row with the very originals the device holds, so the merge changes
    /// nothing, and before, the `ok` then marked the sent value as the server's: the device kept
    /// "mine" and the server the other writer's "a", for good. Now the acknowledgement clears
    /// the anchor (`AckRules.awaitsSnapshot`) and the next pull, a snapshot, brings the later
    /// value. A delta pulled before the push (a server write of the same values) looks the
    /// same to the device; the snapshot then keeps what the batch sent.
    ///
    /// Found by a review of `AckRules.superseded`: the same set-back after the push, but the app
    /// pulled before the push, while another writer changed another field, so the merge changed
    /// the row and the `ok` was skipped; the title stayed pending, went up again, and "mine"
    /// overwrote the later "a" on the server, under every policy. Now the title, which the merge
    /// did not show, is acknowledged and the anchor cleared (`AckRules.unseenSent`).
    @Test func aLaterChangeBackToTheOriginalsIsNotLost() async throws {
        typealias Case = (name: String, pullBeforeThePush: Bool, otherFieldChanged: Bool, setBack: Bool, superseded: Int, title: Value)
        let cases: [Case] = [
            ("pulled after the push and the set-back", false, false, true, 0, "a"),
            ("pulled before the push, a write of the same values", true, false, false, 0, "mine"),
            ("pulled before the push, another field changed, set back after the push", true, true, true, 1, "a"),
            ("pulled before the push, another field changed, nothing after the push", true, true, false, 1, "mine"),
        ]
        for c in cases {
            for policy in [ConflictPolicy.serverWins, .clientWins] {
                let label = "\(c.name), \(policy.kind)"
                try await withStoreAsync { store in
                    let server = InMemorySyncServer()
                    let original: [String: Value] = ["title": "a", "priority": 0, "done": false, "notes": nil]
                    server.write("tasks", key: 1, original)
                    let sync = SyncClient(store: store, policy: policy)
                    _ = try await sync.sync(with: server)
                    try await store.write { try $0.update("tasks", key: 1, ["title": "mine"]) }
                    let batch = try #require(try sync.nextBatch())
                    // Another writer sets fields of the row, leaving the others as the server holds them.
                    func otherWriter(_ fields: [String: Value]) {
                        server.write("tasks", key: 1, (server.rows("tasks")[1] ?? [:]).merging(fields) { _, new in new })
                    }
                    otherWriter(c.otherFieldChanged ? ["notes": "theirs"] : [:])
                    var ack: BatchAck? = nil
                    if !c.pullBeforeThePush { ack = try await server.push(batch) }
                    if c.setBack { otherWriter(["title": "a"]) }
                    let delta = try await server.pull(since: try sync.anchor())
                    #expect(delta.tables.first?.upserts.count == 1, "\(label)")
                    try sync.merge(delta)
                    if c.pullBeforeThePush {
                        ack = try await server.push(batch)
                        if c.setBack { otherWriter(["title": "a"]) }
                    }
                    let report = try sync.acknowledge(try #require(ack))
                    #expect(report.anchorCleared && report.superseded == c.superseded, "\(label): \(report)")
                    #expect(try sync.anchor() == nil, "\(label)")
                    _ = try await sync.sync(with: server)
                    #expect(server.rows("tasks")[1]?["title"] == c.title, "\(label)")
                    #expect(try await store.read { try $0.pendingRows() }.isEmpty, "\(label)")
                    #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")), "\(label)")
                }
            }
        }
    }

    // MARK: A merge that met a sent field another writer changed after the push

    /// The server applied the batch ("mine" for the title; the response was lost, say), another
    /// writer then set the title to "theirs", and the app pulled before acknowledging. The merge
    /// meets "mine" as a pending edit (the device does not know yet that the server took it)
    /// against "theirs": a conflict. Client wins kept "mine", and deferred kept the conflict
    /// past the acknowledgement (resolved `.local` there); the acknowledgement skipped the `ok`
    /// (superseded: the merge changed the row), and the next upload put "mine" back over the
    /// later "theirs". Now the acknowledgement confirms the sent value the merge kept and clears
    /// the anchor (`AckRules.unseenSent`): the next pull, a snapshot, brings "theirs", as when
    /// the acknowledgement comes before the merge (as `sync(with:)` does). Found by
    /// `ManualStepConvergenceTests` ("no value put back").
    @Test func aSentValueAMergeKeptIsNotPutBackOverALaterOne() async throws {
        for policy in [ConflictPolicy.serverWins, .clientWins, .deferred] {
            for acknowledgedFirst in [true, false] {
                let label = "\(policy.kind), acknowledged \(acknowledgedFirst ? "before" : "after") the merge"
                try await withStoreAsync { store in
                    let server = InMemorySyncServer()
                    server.write("tasks", key: 1, ["title": "a", "priority": 0, "done": false, "notes": nil])
                    let sync = SyncClient(store: store, policy: policy)
                    _ = try await sync.sync(with: server)
                    try await store.write { try $0.update("tasks", key: 1, ["title": "mine"]) }
                    let ack = try await server.push(try #require(try sync.nextBatch()))
                    server.write("tasks", key: 1, ["title": "theirs", "priority": 0, "done": false, "notes": nil])
                    if acknowledgedFirst { try sync.acknowledge(ack) }
                    try sync.merge(try await server.pull(since: try sync.anchor()))
                    if !acknowledgedFirst { try sync.acknowledge(ack) }
                    for c in try sync.conflicts() { try sync.resolve(c.table, key: c.key, with: .local) }
                    _ = try await sync.sync(with: server)
                    #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")), "\(label)")
                    #expect(server.rows("tasks")[1]?["title"] == "theirs", "\(label)")
                }
            }
        }
    }

    /// A merge before the push leaves a sent field holding the server's value of then, the
    /// batch's base: the device had deleted the row since the freeze and server wins restored it
    /// (another writer changed another field), or the server's writer changed the field and set
    /// it back, and the device merged both. The push goes through (the server still held the
    /// base) and the acknowledgement is skipped as superseded. `AckRules.unseenSent` took the
    /// sent "mine" as the title's original and kept the current, "a", which only the merge put
    /// there: an edit back to "a" that nobody made, which the next upload put over "mine". The
    /// current is now the sent value again unless the app set it since the freeze. Found by
    /// `ManualStepConvergenceTests` ("no value put back").
    ///
    /// The same when the app edited the title again before deleting the row (trial seed
    /// 4806652833793780520): the delete put the title's current back to its original, and the
    /// restore changed nothing in it, so the app's edit before the delete was still taken for the
    /// last word on the field, and "a" went up over "mine". The delete's reset counts now, and it
    /// is no edit.
    @Test func aFieldAMergeSetToTheBaseIsNotTakenForAnEdit() async throws {
        for (restored, editedBeforeDelete) in [(true, false), (true, true), (false, false)] {
            let label = restored ? "a deleted row restored\(editedBeforeDelete ? ", edited before the delete" : "")" : "the title set back"
            try await withStoreAsync { store in
                let server = InMemorySyncServer()
                let original: [String: Value] = ["title": "a", "priority": 0, "done": false, "notes": nil]
                server.write("tasks", key: 1, original)
                let sync = SyncClient(store: store, policy: .serverWins)
                _ = try await sync.sync(with: server)
                try await store.write { try $0.update("tasks", key: 1, ["title": "mine"]) }
                let batch = try #require(try sync.nextBatch())
                if restored {
                    if editedBeforeDelete { try await store.write { try $0.update("tasks", key: 1, ["title": "later"]) } }
                    try await store.write { try $0.delete("tasks", key: 1) }
                    server.write("tasks", key: 1, original.merging(["priority": 5]) { _, new in new })
                    try sync.merge(try await server.pull(since: try sync.anchor()))
                } else {
                    server.write("tasks", key: 1, original.merging(["title": "b"]) { _, new in new })
                    try sync.merge(try await server.pull(since: try sync.anchor()))
                    server.write("tasks", key: 1, original)
                    try sync.merge(try await server.pull(since: try sync.anchor()))
                }
                let ack = try await server.push(batch)
                #expect(ack.results.first?.status == .ok, "\(label)")
                try sync.acknowledge(ack)
                _ = try await sync.sync(with: server)
                #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")), "\(label)")
                #expect(server.rows("tasks")[1]?["title"] == "mine", "\(label)")
            }
        }
    }
}

import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// An app that runs the sync steps itself pushes a batch holding an insert, and before it
/// acknowledges the batch the server deletes the row it created (another client, a back office),
/// and the app pulls that delete. The delta names a row this device does not hold as a server
/// row — under the server's key it holds nothing yet, under its own key a local insert, which a
/// server delete leaves alone — so the merge changes nothing. The late acknowledgement must still
/// end with the row the server no longer has gone here (or, with local edits since the freeze, in
/// the conflict a server delete of an edited row is); storing it as a clean server row left client
/// and server apart for good, since no later delta names the row again.
@Suite struct LateAckTests {
    /// What the app does between freezing the batch (an insert of priority `clientKey`, named
    /// "urgent") and acknowledging it.
    enum Order: String, CaseIterable, Sendable {
        /// Push, the server deletes the row, pull and merge, then acknowledge.
        case mergeThenAck = "merge, then acknowledge"
        /// Push, acknowledge, the server deletes the row, then pull and merge.
        case ackThenMerge = "acknowledge, then merge"
    }

    /// Runs one case and returns the row under the server's key right after the acknowledgement
    /// (and the merge, for `ackThenMerge`), for `check`; then syncs once and expects client and
    /// server equal, unless `converges` is false (a conflict the app has to resolve first).
    func lateAck(
        _ name: String, serverKey: Int64?, order: Order = .mergeThenAck, policy: ConflictPolicy = .serverWins,
        afterFreeze: (@Sendable (Transaction, RowKey) throws -> Void)? = nil,
        converges: Bool = true, check: (Row?, SyncClient) throws -> Void = { row, _ in #expect(row == nil) }
    ) async throws {
        let clientKey: Int64 = serverKey == nil ? 7 : -1
        let label = "\(name) (\(serverKey == nil ? "the client's key kept" : "rekeyed"), \(order.rawValue), \(policy.kind))"
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(priorities)
            let server = InMemorySyncServer { c in
                if let serverKey, c.kind == .insert { return .ok(c.table, c.key, newKey: RowKey(.int(serverKey))) }
                return nil
            }
            let sync = SyncClient(store: store, policy: policy)
            _ = try await sync.sync(with: server)
            try await store.write { try $0.insert("priorities", ["id": .int(clientKey), "name": "urgent"]) }
            let batch = try #require(try sync.nextBatch())
            if let afterFreeze { try await store.write { try afterFreeze($0, RowKey(.int(clientKey))) } }
            let ack = try await server.push(batch)
            let finalKey = RowKey(.int(serverKey ?? clientKey))
            #expect(server.rows("priorities")[finalKey]?["name"] == "urgent", "\(label): the server did not create the row")

            switch order {
            case .mergeThenAck:
                server.write("priorities", key: finalKey, nil)
                try sync.merge(try await server.pull(since: try sync.anchor()))
                try sync.acknowledge(ack)
            case .ackThenMerge:
                try sync.acknowledge(ack)
                server.write("priorities", key: finalKey, nil)
                try sync.merge(try await server.pull(since: try sync.anchor()))
            }
            #expect(try sync.inFlightBatch() == nil, "\(label): the batch is still in flight")
            // The note of the server's delete ends with the batch.
            #expect(try await store.read { try SyncClient.inFlightRecord($0) } == nil, "\(label)")
            if serverKey != nil {
                #expect(try await store.read { try $0.row("priorities", key: RowKey(.int(clientKey)), includingDeleted: true) } == nil, "\(label)")
            }
            try check(try await store.read { try $0.row("priorities", key: finalKey, includingDeleted: true) }, sync)
            #expect(try store.verify().isConsistent, "\(label)")
            guard converges else { return }

            _ = try await sync.sync(with: server)
            #expect(try await store.read { try $0.pendingRows() }.isEmpty, "\(label)")
            #expect(serverRows(server, "priorities") == (try clientRows(store, "priorities")), "\(label): client and server differ")
        }
    }

    /// The reported sequence: pushed, created, deleted on the server, pulled, then acknowledged.
    /// Both ways round, under the server's key and under the client's.
    @Test(arguments: [Int64(100), nil])
    func aRowTheServerDeletedBeforeTheLateAckIsGone(serverKey: Int64?) async throws {
        for order in Order.allCases {
            try await lateAck("nothing else", serverKey: serverKey, order: order)
        }
    }

    /// Deleted on this device too, since the freeze: both sides agree, nothing is left to upload.
    @Test(arguments: [Int64(100), nil])
    func deletedHereAndThere(serverKey: Int64?) async throws {
        try await lateAck("deleted here since the freeze", serverKey: serverKey, afterFreeze: { tx, key in
            try tx.delete("priorities", key: key)
        })
    }

    /// Edited on this device since the freeze: the server deleted a row holding a local edit,
    /// which the merge rules settle by the policy (`localUpdateServerDelete`): server wins
    /// removes it, client wins uploads it again as an insert, deferred keeps it in conflict.
    @Test(arguments: [Int64(100), nil])
    func editedHereSinceTheFreeze(serverKey: Int64?) async throws {
        let edit: @Sendable (Transaction, RowKey) throws -> Void = { tx, key in try tx.update("priorities", key: key, ["name": "mine"]) }
        try await lateAck("edited here, server wins", serverKey: serverKey, policy: .serverWins, afterFreeze: edit)
        try await lateAck("edited here, client wins", serverKey: serverKey, policy: .clientWins, afterFreeze: edit) { row, _ in
            #expect(row?["name"] == "mine" && row?.status == .inserted, "\(String(describing: row))")
        }
        try await lateAck("edited here, deferred", serverKey: serverKey, policy: .deferred, afterFreeze: edit, converges: false) { row, sync in
            #expect(row?["name"] == "mine" && row?.isConflicted == true, "\(String(describing: row))")
            let conflicts = try sync.conflicts()
            #expect(conflicts.count == 1 && conflicts.first?.isDeletedOnServer == true && conflicts.first?.fields == ["name"], "\(conflicts)")
        }
        // Ack first: the acknowledged row meets the delete in the merge, by the same rule.
        try await lateAck("edited here, client wins", serverKey: serverKey, order: .ackThenMerge, policy: .clientWins, afterFreeze: edit) { row, _ in
            #expect(row?["name"] == "mine" && row?.status == .inserted, "\(String(describing: row))")
        }
    }

    /// The server deleted the row and another client inserted one under the same key before the
    /// pull: the delta carries the new row, which the acknowledgement meets as before.
    @Test func aDeleteThenARowUnderTheSameKey() async throws {
        try await withPushedInsert { store, server, sync, ack in
            server.write("priorities", key: 7, nil)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            server.write("priorities", key: 7, ["name": "theirs"])
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try sync.acknowledge(ack)
            let row = try #require(try await store.read { try $0.row("priorities", key: 7) })
            #expect(row["name"] == "theirs" && !row.isPending)
            _ = try await sync.sync(with: server)
            #expect(serverRows(server, "priorities") == (try clientRows(store, "priorities")))
        }
    }

    /// Found by `ManualStepConvergenceTests`: the same, but the app's first pull comes after the
    /// push, so it is a snapshot, which lists no deletes. The snapshot leaves the row out, and
    /// the device cannot tell whether the server had not created it yet or had deleted it: the
    /// acknowledgement stores it as the server's row and clears the anchor, and the next pull, a
    /// snapshot, removes it (`AckRules.awaitsSnapshot`). Before, the row stayed here for good,
    /// and an edit of it was answered `conflict` for ever. The same late acknowledgement after a
    /// snapshot taken before the push keeps the row, which the server then created and holds:
    /// nothing is lost by taking the row as uncertain. Both ways to key a new row: the server's
    /// key and the client's own.
    @Test func aSnapshotLeavesOutARowTheServerDeletedBeforeTheLateAck() async throws {
        for serverKey in [true, false] {
            for snapshotBeforeThePush in [false, true] {
                let label = "server key: \(serverKey), snapshot before the push: \(snapshotBeforeThePush)"
                try await withTemporaryFolderAsync { path in
                    let store = try Store(path: path)
                    try store.createTable(priorities)
                    let server = InMemorySyncServer { c in c.kind == .insert && serverKey ? .ok(c.table, c.key, newKey: 100) : nil }
                    let sync = SyncClient(store: store)
                    try await store.write { try $0.insert("priorities", ["id": serverKey ? -1 : 100, "name": "urgent"]) }
                    let batch = try #require(try sync.nextBatch())
                    var ack: BatchAck? = nil
                    if !snapshotBeforeThePush {
                        ack = try await server.push(batch)
                        server.write("priorities", key: 100, nil)
                    }
                    try sync.merge(try await server.pull(since: nil))
                    if snapshotBeforeThePush { ack = try await server.push(batch) }
                    let report = try sync.acknowledge(try #require(ack))
                    #expect(report.anchorCleared, "\(label)")
                    #expect(try sync.anchor() == nil)
                    _ = try await sync.sync(with: server)
                    let row = try await store.read { try $0.row("priorities", key: 100) }
                    if snapshotBeforeThePush {
                        #expect(row?["name"] == "urgent" && row?.isPending == false, "\(label)")
                    } else {
                        #expect(row == nil, "\(label)")
                    }
                    #expect(serverRows(server, "priorities") == (try clientRows(store, "priorities")), "\(label)")
                    #expect(try sync.anchor() != nil)
                }
            }
        }
    }

    /// Runs `body` on a synced store whose insert of priority 7 is frozen in a batch the server
    /// has applied, with the server's acknowledgement not applied yet.
    func withPushedInsert(_ body: (Store, InMemorySyncServer, SyncClient, BatchAck) async throws -> Void) async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(priorities)
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store)
            _ = try await sync.sync(with: server)
            try await store.write { try $0.insert("priorities", ["id": 7, "name": "urgent"]) }
            let batch = try #require(try sync.nextBatch())
            try await body(store, server, sync, try await server.push(batch))
        }
    }

    /// The anchor stays when nothing is uncertain: a snapshot that brought the inserted row
    /// back (taken after the server applied the batch), or an incremental delta, which lists
    /// the server's deletes.
    @Test func theAnchorStaysWhenTheAcknowledgedRowIsCertain() async throws {
        for snapshot in [true, false] {
            try await withPushedInsert { store, server, sync, ack in
                try sync.merge(try await server.pull(since: snapshot ? nil : try sync.anchor()))
                let report = try sync.acknowledge(ack)
                #expect(!report.anchorCleared, "snapshot: \(snapshot)")
                #expect(try sync.anchor() != nil)
                #expect(serverRows(server, "priorities") == (try clientRows(store, "priorities")))
            }
        }
    }
}

extension LateAckTests {
    /// A key used again: the device deletes a row, syncs, inserts a row under the same key,
    /// freezes the batch, then pulls before it pushes — so the delta lists the old row's delete,
    /// the device's own. That delete must not be taken for one of the new row: the
    /// acknowledgement removed the new row here while the server kept it, for good. A key with
    /// earlier operations on this device is never noted (`AckRules.remembersDelete`).
    @Test func aKeyUsedAgainIsNotDeletedByTheOldRowsDelete() async throws {
        for editSinceFreeze in [false, true] {
            try await withTemporaryFolderAsync { path in
                let store = try Store(path: path)
                try store.createTable(priorities)
                let server = InMemorySyncServer()
                let sync = SyncClient(store: store, policy: .serverWins)
                try await store.write { try $0.insert("priorities", ["id": 7, "name": "old"]) }
                _ = try await sync.sync(with: server)
                try await store.write { try $0.delete("priorities", key: 7) }
                _ = try await sync.sync(with: server)
                #expect(server.rows("priorities")[7] == nil)
                try await store.write { try $0.insert("priorities", ["id": 7, "name": "new"]) }
                let batch = try #require(try sync.nextBatch())
                if editSinceFreeze { try await store.write { try $0.update("priorities", key: 7, ["name": "newer"]) } }
                try sync.merge(try await server.pull(since: try sync.anchor()))
                try sync.acknowledge(try await server.push(batch))
                let row = try await store.read { try $0.row("priorities", key: 7) }
                #expect(row?["name"] == (editSinceFreeze ? "newer" : "new"), "edited since the freeze: \(editSinceFreeze); the old row's delete removed the new row")
                _ = try await sync.sync(with: server)
                #expect(server.rows("priorities")[7]?["name"] == (editSinceFreeze ? "newer" : "new"))
                #expect(serverRows(server, "priorities") == (try clientRows(store, "priorities")))
            }
        }
    }
}

extension LateAckTests {
    /// Pushes an insert of row 7 ("new") that `before` set up, lets the server delete the row it
    /// created, pulls and merges, then acknowledges: the row must be gone here as it is on the
    /// server, and stay so through a sync.
    func deletedBeforeTheLateAck(
        _ label: String, policy: ConflictPolicy,
        before: (Store, SyncClient, InMemorySyncServer) async throws -> Void
    ) async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(priorities)
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store, policy: policy)
            try await before(store, sync, server)
            let batch = try #require(try sync.nextBatch())
            #expect(batch.changes.map(\.kind) == [.insert], "\(label): \(batch.changes)")
            let ack = try await server.push(batch)
            #expect(server.rows("priorities")[7]?["name"] == "new", "\(label): the server did not create the row")
            server.write("priorities", key: 7, nil)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try sync.acknowledge(ack)
            #expect(try await store.read { try $0.row("priorities", key: 7, includingDeleted: true) } == nil, "\(label): the row the server deleted stays here")
            _ = try await sync.sync(with: server)
            #expect(try await store.read { try $0.pendingRows() }.isEmpty, "\(label)")
            #expect(serverRows(server, "priorities") == (try clientRows(store, "priorities")), "\(label): client and server differ")
        }
    }

    /// Found by `ManualStepConvergenceTests` once clients used their keys again: the device had
    /// inserted and deleted a row under the key before, locally only, never uploaded. No row of
    /// the device's was ever on the server under the key, so the delete the delta lists is of the
    /// new row; taken for one of the earlier row, it was not noted, and the acknowledgement
    /// stored the row as a clean server row the server no longer has, for good.
    @Test func aKeyUsedBeforeOnlyLocallyIsNoted() async throws {
        try await deletedBeforeTheLateAck("used before locally", policy: .serverWins) { store, sync, server in
            _ = try await sync.sync(with: server)
            try await store.write { try $0.insert("priorities", ["id": 7, "name": "first"]) }
            try await store.write { try $0.delete("priorities", key: 7) }
            try await store.write { try $0.insert("priorities", ["id": 7, "name": "new"]) }
        }
    }

    /// Found by `ManualStepConvergenceTests`: the device held a server row, edited it, and merged
    /// the server's delete of it, which it kept and uploads again as an insert (client wins). That
    /// merge took in the earlier row's delete, so a later delta's delete of the key is of the row
    /// the insert created; not noted, the acknowledgement kept it here for good.
    @Test func aKeyWhoseEarlierRowsDeleteWasMergedIsNoted() async throws {
        try await deletedBeforeTheLateAck("the earlier row's delete merged", policy: .clientWins) { store, sync, server in
            server.write("priorities", key: 7, ["name": "theirs"])
            _ = try await sync.sync(with: server)
            try await store.write { try $0.update("priorities", key: 7, ["name": "new"]) }
            server.write("priorities", key: 7, nil)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            #expect(try await store.read { try $0.row("priorities", key: 7)?.status } == .inserted)
        }
    }
}

extension LateAckTests {
    /// Found by `ManualStepConvergenceTests` (trial seed 18323979053735142098): a child inserted
    /// while its new parent's batch was in flight is moved to the parent's server key by that
    /// batch's acknowledgement — an operation from the server on the child's key, which stays a
    /// local insert. It shows no row of the child's on the server, so the server's delete of the
    /// row the child's own batch created is still noted.
    @Test func aChildMovedToItsParentsNewKeyIsNoted() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(stepParents)
            try store.createTable(stepChildren)
            let server = InMemorySyncServer(associations: [stepLink]) { c in
                guard c.table == "sparents", c.kind == .insert else { return nil }
                return .ok(c.table, c.key, newKey: 100)
            }
            let sync = SyncClient(store: store, associations: [stepLink])
            _ = try await sync.sync(with: server)
            try await store.write { try $0.insert("sparents", ["id": -1, "name": "parent"]) }
            let parents = try #require(try sync.nextBatch())
            try await store.write { try $0.insert("schildren", ["id": 7, "title": "child", "parent": -1]) }
            try sync.acknowledge(try await server.push(parents))
            #expect(try await store.read { try $0.row("schildren", key: 7) }?["parent"] == 100)
            let batch = try #require(try sync.nextBatch())
            let ack = try await server.push(batch)
            #expect(server.rows("schildren")[7] != nil, "the server did not create the child")
            server.write("schildren", key: 7, nil)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try sync.acknowledge(ack)
            #expect(try await store.read { try $0.row("schildren", key: 7, includingDeleted: true) } == nil, "the child the server deleted stays here")
            _ = try await sync.sync(with: server)
            #expect(serverRows(server, "schildren") == (try clientRows(store, "schildren")))
        }
    }
}

/// Found by `ManualStepConvergenceTests`: the server kept the client's key for an insert, the app
/// edited or deleted the row after freezing the batch, then pulled before acknowledging, and the
/// delta brought the row the server created from the batch. Acknowledging first, the edit stays
/// pending against the sent values and the delete goes up; merging first must end the same.
///
/// Merged first, the row has no base: a delete made since the freeze left no row, so the merge
/// stored the server's as new and clean; an edit made since was an insert-insert conflict with its
/// own sent values, which server wins and last writer wins settled by dropping the edit. The
/// acknowledgement then skipped the row as superseded, and the delete or edit was lost for good.
/// The merge cannot tell the row the batch created from another writer's under the same key, so
/// it notes what the device held, and the acknowledgement decides (`AckRules.echoed`).
@Suite struct EchoBeforeAckTests {
    /// Every policy: with the in-memory server's rows, which carry no timestamp, last writer wins
    /// gives every conflict to the server; the custom resolver does too, by its own choice.
    static let everyPolicy: [ConflictPolicy] = [.serverWins, .clientWins, .lastWriterWins, .deferred, .custom { _ in .server }]

    /// Pushes an insert of task 7 (title "urgent"), lets another writer change the server's row 7
    /// at once (`otherWriterBeforePull`), runs `afterFreeze` (after the push), pulls and
    /// merges, runs `afterMerge` (the app's edits after the merge), lets another writer change
    /// the server's row 7 (`otherWriter`) and merges that too, then acknowledges — or
    /// acknowledges before the first merge (`ackFirst`). Then `settle` (to resolve the conflicts
    /// a deferred policy keeps), a sync, and the checks that nothing is pending and that client
    /// and server agree. Returns the server's row 7.
    func echo(
        policy: ConflictPolicy, ackFirst: Bool,
        _ afterFreeze: @escaping @Sendable (Transaction) throws -> Void,
        afterMerge: (@Sendable (Transaction) throws -> Void)? = nil,
        otherWriterBeforePull: (@Sendable (inout [String: Value]) -> Void)? = nil,
        otherWriter: (@Sendable (inout [String: Value]) -> Void)? = nil,
        settle: ((SyncClient) throws -> Void)? = nil
    ) async throws -> [String: Value]? {
        try await withFrozenInsert(policy: policy) { store, server, sync, batch in
            let ack = try await server.push(batch)
            if let otherWriterBeforePull {
                var row = try #require(server.rows("tasks")[7])
                otherWriterBeforePull(&row)
                server.write("tasks", key: 7, row)
            }
            try await store.write { try afterFreeze($0) }
            if ackFirst { try sync.acknowledge(ack) }
            try sync.merge(try await server.pull(since: try sync.anchor()))
            if let afterMerge { try await store.write { try afterMerge($0) } }
            if let otherWriter {
                var row = try #require(server.rows("tasks")[7])
                otherWriter(&row)
                server.write("tasks", key: 7, row)
                try sync.merge(try await server.pull(since: try sync.anchor()))
            }
            if !ackFirst { try sync.acknowledge(ack) }
            try settle?(sync)
            _ = try await sync.sync(with: server)
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")))
            return server.rows("tasks")[7]
        }
    }

    /// "Acknowledged before the merge" or "after", for the messages.
    func order(_ ackFirst: Bool) -> String { "acknowledged \(ackFirst ? "before" : "after") the merge" }

    /// A store synced with a new server and holding an insert of task 7 (title "urgent"), frozen
    /// into the batch in flight and not pushed yet: `body` goes on from there.
    func withFrozenInsert<R>(policy: ConflictPolicy, _ body: (Store, InMemorySyncServer, SyncClient, Batch) async throws -> R) async throws -> R {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store, policy: policy)
            _ = try await sync.sync(with: server)
            try await store.write { try $0.insert("tasks", ["id": 7, "title": "urgent"]) }
            return try await body(store, server, sync, try #require(try sync.nextBatch()))
        }
    }

    /// The seed's sequence, shrunk: insert, freeze, push, delete here, pull and merge, acknowledge.
    @Test func aDeleteSinceTheFreezeIsNotLostToTheEcho() async throws {
        for ackFirst in [true, false] {
            let row = try await echo(policy: .serverWins, ackFirst: ackFirst) { try $0.delete("tasks", key: 7) }
            #expect(row == nil, "\(order(ackFirst)): the delete made since the freeze was lost")
        }
    }

    /// The same with an edit: the server's row is the sent values, which the edit came after, so
    /// there is no conflict whatever the policy (a deferred one included: the conflict the merge
    /// found without a base is not one).
    @Test(arguments: everyPolicy)
    func anEditSinceTheFreezeIsNotLostToTheEcho(policy: ConflictPolicy) async throws {
        for ackFirst in [true, false] {
            let row = try await echo(policy: policy, ackFirst: ackFirst) { try $0.update("tasks", key: 7, ["title": "mine"]) }
            #expect(row?["title"] == "mine", "\(policy.kind), \(order(ackFirst)): the edit made since the freeze was lost")
        }
    }

    /// Found by a review: an edit before the merge, and another after it. The merge (server wins)
    /// set the first back to the server's value, the second made the row pending again, and the
    /// acknowledgement let the row stand as it was: the first edit was lost. Both are kept, as
    /// acknowledging first keeps them, whatever the policy.
    @Test(arguments: everyPolicy)
    func anEditBeforeTheEchoAndAnotherAfterItAreBothKept(policy: ConflictPolicy) async throws {
        for ackFirst in [true, false] {
            let row = try await echo(policy: policy, ackFirst: ackFirst, { try $0.update("tasks", key: 7, ["title": "mine"]) },
                                     afterMerge: { try $0.update("tasks", key: 7, ["priority": 5]) })
            #expect(row?["title"] == "mine" && row?["priority"] == 5, "\(policy.kind), \(order(ackFirst)): \(String(describing: row))")
        }
    }

    /// An edit after the merge of a field edited before it: the later edit wins, and the other
    /// field edited before the merge is kept.
    @Test(arguments: everyPolicy)
    func aLaterEditOfTheSameFieldWins(policy: ConflictPolicy) async throws {
        for ackFirst in [true, false] {
            let row = try await echo(policy: policy, ackFirst: ackFirst, { try $0.update("tasks", key: 7, ["title": "mine", "priority": 3]) },
                                     afterMerge: { try $0.update("tasks", key: 7, ["title": "later"]) })
            #expect(row?["title"] == "later" && row?["priority"] == 3, "\(policy.kind), \(order(ackFirst)): \(String(describing: row))")
        }
    }

    /// A delete after the merge of a row edited before it: the delete goes up (under a deferred
    /// policy, the conflict the merge found without a base does not hold it back).
    @Test(arguments: everyPolicy)
    func aDeleteAfterTheEchoGoesUp(policy: ConflictPolicy) async throws {
        for ackFirst in [true, false] {
            let row = try await echo(policy: policy, ackFirst: ackFirst, { try $0.update("tasks", key: 7, ["title": "mine"]) },
                                     afterMerge: { try $0.delete("tasks", key: 7) })
            #expect(row == nil, "\(policy.kind), \(order(ackFirst)): \(String(describing: row))")
        }
    }

    /// Another writer changed a field between the push and the pull that the device had not
    /// touched. Merged without a base, client wins put the sent value back over theirs; server
    /// wins dropped the device's edit. Acknowledged first, the other writer's change is simply
    /// taken, and the device's edits stay pending.
    @Test(arguments: everyPolicy)
    func anotherWritersChangeBeforeTheEchoIsKept(policy: ConflictPolicy) async throws {
        for ackFirst in [true, false] {
            let row = try await echo(
                policy: policy, ackFirst: ackFirst, { try $0.update("tasks", key: 7, ["title": "mine"]) },
                afterMerge: { try $0.update("tasks", key: 7, ["notes": "later"]) },
                otherWriterBeforePull: { $0["priority"] = 9 }
            )
            #expect(row?["title"] == "mine" && row?["priority"] == 9 && row?["notes"] == "later",
                    "\(policy.kind), \(order(ackFirst)): \(String(describing: row))")
        }
    }

    /// Another merge between the first and the acknowledgement: another writer set the priority,
    /// which is taken, and the notes, which the device had also set before the first merge: a
    /// real conflict, settled by the policy (a deferred one keeps it, and the app takes its own
    /// side). The title edited before the first merge and the field edited after it are kept.
    @Test(arguments: everyPolicy)
    func aLaterMergeBeforeTheAcknowledgement(policy: ConflictPolicy) async throws {
        let deviceWins = policy.kind == .clientWins || policy.kind == .deferred
        for ackFirst in [true, false] {
            let row = try await echo(
                policy: policy, ackFirst: ackFirst, { try $0.update("tasks", key: 7, ["title": "mine", "notes": "ours"]) },
                afterMerge: { try $0.update("tasks", key: 7, ["done": true]) },
                otherWriter: { $0["priority"] = 9; $0["notes"] = "theirs" },
                settle: { sync in
                    let conflicts = try sync.conflicts()
                    if policy.kind == .deferred {
                        #expect(conflicts.map(\.fields) == [["notes"]], "\(order(ackFirst)): \(conflicts)")
                        try sync.resolve("tasks", key: 7, with: .local)
                    } else {
                        #expect(conflicts.isEmpty, "\(policy.kind), \(order(ackFirst)): \(conflicts)")
                    }
                }
            )
            #expect(row?["title"] == "mine" && row?["priority"] == 9 && row?["done"] == true, "\(policy.kind), \(order(ackFirst)): \(String(describing: row))")
            #expect(row?["notes"] == (deviceWins ? "ours" : "theirs"), "\(policy.kind), \(order(ackFirst)): \(String(describing: row))")
        }
    }

    /// The device deleted the insert before the merge, which brought the row back as new; the app
    /// then edited that row. Its latest action is an edit of a row it saw, so the row stays, with
    /// the edit, rather than the earlier delete going up — even when the app has reverted the
    /// edit since. (Acknowledged first, the row stays deleted through the merge and the app has no
    /// row to edit: there is no other order to compare.)
    @Test(arguments: everyPolicy)
    func aDeleteBeforeTheEchoAndAnEditAfterIt(policy: ConflictPolicy) async throws {
        let row = try await echo(policy: policy, ackFirst: false, { try $0.delete("tasks", key: 7) },
                                 afterMerge: { try $0.update("tasks", key: 7, ["priority": 5]) })
        #expect(row?["title"] == "urgent" && row?["priority"] == 5, "\(policy.kind): \(String(describing: row))")
        let reverted = try await echo(policy: policy, ackFirst: false, { try $0.delete("tasks", key: 7) }, afterMerge: { tx in
            try tx.update("tasks", key: 7, ["priority": 5])
            try tx.revert("tasks", key: 7)
        })
        #expect(reverted?["title"] == "urgent" && reverted?["priority"] == 0, "\(policy.kind), the edit reverted: \(String(describing: reverted))")
    }

    /// Found by `ManualStepConvergenceTests` (trial seed 11589300365223785464): another writer's
    /// row under the key of the insert in flight, merged before the push, is taken for the insert
    /// coming back (`AckRules.notesEcho`); the server deletes that row, and a merge shows it; the
    /// app deletes its row; only then does the push come, and the server, its key free again,
    /// creates the row from the batch. The acknowledgement had read "no row here" as the server's
    /// delete, so the app's delete never went up and the server kept the row. The app's delete
    /// came after the freeze, so it goes up as a delete of the row the batch created, whatever
    /// the order of the push and the server's delete (a delete of a row the server no longer
    /// has is answered `ok`).
    @Test(arguments: everyPolicy)
    func aDeleteAfterAnotherWritersRowWasMergedAndDeletedGoesUp(policy: ConflictPolicy) async throws {
        try await withFrozenInsert(policy: policy) { store, server, sync, batch in
            server.write("tasks", key: 7, ["title": "theirs", "priority": 0, "done": false, "notes": .null])
            try sync.merge(try await server.pull(since: try sync.anchor()))
            server.write("tasks", key: 7, nil)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            for conflict in try sync.conflicts() { try sync.resolve(conflict.table, key: conflict.key, with: .local) }
            // Under server wins, the server's delete took the row: the app has nothing to delete.
            let held = try await store.read { try $0.row("tasks", key: 7) } != nil
            if held { try await store.write { try $0.delete("tasks", key: 7) } }
            let ack = try await server.push(batch)
            #expect(ack.results.map(\.status) == [.ok])
            try sync.acknowledge(ack)
            _ = try await sync.sync(with: server)
            if held {
                #expect(server.rows("tasks")[7] == nil, "\(policy.kind): the app's delete of row 7 never reached the server")
            }
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")), "\(policy.kind)")
        }
    }

    /// The other order of the test above, and an insert after it. The push comes first, the
    /// merge brings the row back (the batch's own), the app edits it, the server deletes it, and
    /// the merge keeps the app's edit as a local insert (client wins); the app deletes that. The
    /// delete goes up, as above, though the server no longer has the row. Found by
    /// `ManualStepConvergenceTests` (trial seed 7330045786470116942, with an earlier form of the
    /// rule): the app inserted under the key again before the delete went up, which made the
    /// row an update of a row the server lacks, answered `conflict` for ever. The
    /// acknowledgement clears the anchor, and the snapshot the next pull brings shows the row
    /// gone, so the insert goes up as one.
    @Test func anInsertUnderTheKeyAfterThatDeleteGoesUp() async throws {
        try await withFrozenInsert(policy: .clientWins) { store, server, sync, batch in
            let ack = try await server.push(batch)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try await store.write { try $0.update("tasks", key: 7, ["title": "mine"]) }
            server.write("tasks", key: 7, nil)
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try await store.write { try $0.delete("tasks", key: 7) }
            let report = try sync.acknowledge(ack)
            #expect(report.anchorCleared)
            try await store.write { try $0.insert("tasks", ["id": 7, "title": "again"]) }
            for _ in 0..<3 { _ = try await sync.sync(with: server) }
            #expect(server.rows("tasks")[7]?["title"] == "again")
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")))
        }
    }

    /// Another writer's row under the same key, merged before the push: the server answers the
    /// insert `conflict`, so the note the merge made is not used, and the merge's insert-insert
    /// conflict stands (here for the client: its values go up against the other row's).
    @Test func anotherWritersRowUnderTheKeyStaysAConflict() async throws {
        try await withFrozenInsert(policy: .clientWins) { store, server, sync, batch in
            server.write("tasks", key: 7, ["title": "theirs", "priority": 0, "done": false, "notes": .null])
            try sync.merge(try await server.pull(since: try sync.anchor()))
            let report = try sync.acknowledge(try await server.push(batch))
            #expect(report.conflicts == 1)
            let row = try #require(try await store.read { try $0.row("tasks", key: 7) })
            #expect(row["title"] == "urgent" && row.original("title") == "theirs" && row.status == .updated, "\(row)")
            _ = try await sync.sync(with: server)
            #expect(server.rows("tasks")[7]?["title"] == "urgent")
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")))
        }
    }
}

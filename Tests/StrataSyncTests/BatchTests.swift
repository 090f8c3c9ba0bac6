import Foundation
import Strata
@testable import StrataSync
import StrataTesting
import Synchronization
import StrataWorkload
import Testing

let priorities = TableSchema.fixed("priorities", primaryKey: ["id"], fields: [.int("id"), .string("name")])
let assigned = TableSchema.fixed("assigned", primaryKey: ["id"], fields: [.int("id"), .string("title"), .int("priority", nullable: true)])
let taskPriority = Association(child: "assigned", field: "priority", parent: "priorities")

/// Server rows of a table as sorted strings, to compare with a client's.
func serverRows(_ server: InMemorySyncServer, _ table: String) -> [String] {
    server.rows(table).map { key, f in "\(key) \(f.sorted { $0.key < $1.key })" }.sorted()
}

func clientRows(_ store: Store, _ table: String) throws -> [String] {
    try store.read { try $0.rows(table) }.map { row in
        "\(row.key) \(row.values.filter { !row.keyFieldNames.contains($0.key) && !$0.value.isNull }.sorted { $0.key < $1.key })"
    }.sorted()
}

@Suite struct CoalescingTests {
    @Test func aBatchHasTheNetEffectOfEveryEdit() async throws {
        let seed = testSeed("aBatchHasTheNetEffectOfEveryEdit")
        var g = SplitMix64(seed: seed)
        for round in 0..<20 {
            try await withTemporaryFolderAsync { path in
                let store = try Store(path: path)
                try store.createTable(tasks)
                let server = InMemorySyncServer()
                for i in 1...6 { server.write("tasks", key: RowKey(.int(Int64(i))), ["title": .string("s\(i)"), "priority": 0, "done": false, "notes": .null]) }
                let sync = SyncClient(store: store)
                _ = try await sync.sync(with: server)
                // Random edits, several per row: inserts, updates (also back to the original), deletes, revives.
                for _ in 0..<40 {
                    let key = RowKey(.int(Int64(1 + g.below(9))))
                    let (op, a, b) = (g.below(6), g.below(3), g.below(2))
                    try await store.write { tx in
                        switch op {
                        case 0: try? tx.insert("tasks", ["id": key.values[0], "title": .string("n\(a)")])
                        case 1, 2: try? tx.update("tasks", key: key, ["title": .string(["s1", "x", "y"][a])])
                        case 3: try? tx.update("tasks", key: key, ["priority": .int(Int64(b))])
                        case 4: try? tx.delete("tasks", key: key)
                        default: try? tx.update("tasks", key: key, ["notes": b == 0 ? .null : "n"])
                        }
                    }
                }
                // Every update carries only changed fields, each with its original.
                if let batch = try sync.nextBatch() {
                    for c in batch.changes where c.kind == .update {
                        #expect(!c.values.isEmpty && Set(c.values.keys) == Set(c.originals.keys), "round \(round): \(c)")
                        for (f, v) in c.values { #expect(v != c.originals[f], "round \(round): unchanged field \(f) sent") }
                    }
                }
                _ = try await sync.sync(with: server)
                #expect(try await store.read { try $0.pendingRows() }.isEmpty)
                #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")), "round \(round)")
            }
        }
    }
}

@Suite struct OrderingTests {
    @Test func parentsGoFirstAndChildrenAreDeletedFirstAcrossBatches() throws {
        let seed = testSeed("parentsGoFirst")
        var g = SplitMix64(seed: seed)
        try withTemporaryFolder { path in
            let store = try Store(path: path)
            try store.createTable(assigned)
            try store.createTable(priorities)
            let sync = SyncClient(store: store, associations: [taskPriority])
            try store.write { tx in
                for p in 1...5 { try tx.insert("priorities", ["id": .int(Int64(p)), "name": "p"]) }
                for t in 1...20 { try tx.insert("assigned", ["id": .int(Int64(t)), "title": "t", "priority": .int(Int64(1 + g.below(5)))]) }
            }
            var sequence: [RowChange] = []
            while let batch = try sync.nextBatch(maxRows: 3) {
                #expect(batch.changes.count <= 3)
                sequence += batch.changes
                try sync.acknowledge(BatchAck(batchID: batch.id, results: batch.changes.map { .ok($0.table, $0.key) }))
            }
            #expect(sequence.count == 25)
            let firstChild = sequence.firstIndex { $0.table == "assigned" }!
            #expect(sequence[..<firstChild].allSatisfy { $0.table == "priorities" }, "a child was inserted before a parent")
            try store.write { tx in
                for p in 1...5 { try tx.delete("priorities", key: .init(.int(Int64(p)))) }
                for t in 1...20 { try tx.delete("assigned", key: .init(.int(Int64(t)))) }
            }
            sequence = []
            while let batch = try sync.nextBatch(maxRows: 4) {
                sequence += batch.changes
                try sync.acknowledge(BatchAck(batchID: batch.id, results: batch.changes.map { .ok($0.table, $0.key) }))
            }
            let firstParent = sequence.firstIndex { $0.table == "priorities" }!
            #expect(sequence.count == 25 && sequence[..<firstParent].allSatisfy { $0.table == "assigned" }, "a parent was deleted before its children")
            #expect(try store.read { try $0.count("assigned", includingDeleted: true) } == 0)
        }
    }

    @Test func aCycleOfAssociationsIsReported() throws {
        try withTemporaryFolder { path in
            let store = try Store(path: path)
            try store.createTable(assigned)
            try store.createTable(priorities)
            try store.write { try $0.insert("assigned", ["id": 1, "title": "t"]) }
            let sync = SyncClient(store: store, associations: [taskPriority, Association(child: "priorities", field: "name", parent: "assigned")])
            let e = #expect(throws: StrataError.self) { try sync.nextBatch() }
            #expect(e?.code == .invalidSchema && e?.message.contains("cycle") == true)
        }
    }
}

@Suite struct LifecycleTests {
    /// The batch state is kept in the in-flight record; a store with a batch in flight from a
    /// version before the record kept it as the strings "pending" and "sent" in a property of
    /// its own, which still reads; anything else there is damage.
    @Test func theInFlightBatchStateReadsAsStoredByEveryVersion() throws {
        try withTemporaryFolder { path in
            let store = try Store(path: path)
            defer { store.close() }
            try store.createTable(tasks)
            try store.write { try $0.insert("tasks", ["id": 1, "title": "a"]) }
            let sync = SyncClient(store: store)
            let batch = try #require(try sync.nextBatch())
            #expect(try sync.inFlightBatch()?.state == .pending)
            try sync.markSent(batch)
            #expect(try sync.inFlightBatch()?.state == .sent)
            // As an older version left it: the batch alone in its record, the state as a
            // string beside it, or no state at all (read as pending).
            let stateProperty = SyncClient.LegacyInFlight.state
            try store.write { try $0.setStrataProperty(SyncClient.inFlightProperty, .bytes(BatchRecord.encode(batch))) }
            try store.write { try $0.setStrataProperty(stateProperty, "sent") }
            #expect(try sync.inFlightBatch()?.batch == batch && sync.inFlightBatch()?.state == .sent)
            try store.write { try $0.setStrataProperty(stateProperty, nil) }
            #expect(try sync.inFlightBatch()?.state == .pending)
            // A state no version writes is reported, not taken for one.
            try store.write { try $0.setStrataProperty(stateProperty, "lost") }
            let e = #expect(throws: StrataError.self) { try sync.inFlightBatch() }
            #expect(e?.code == .corruptRecord && e?.message.contains("lost") == true, "\(String(describing: e))")
        }
    }

    @Test func theBatchInFlightIsResentUnchangedAndLaterEditsWaitForTheNext() throws {
        try withTemporaryFolder { path in
            var first: Batch?
            do {
                let store = try Store(path: path)
                try store.createTable(tasks)
                try store.write { try $0.insert("tasks", ["id": 1, "title": "a"]) }
                let sync = SyncClient(store: store)
                first = try sync.nextBatch()
                try sync.markSent(first!)
                // Edited while in flight: the batch does not change.
                try store.write { try $0.update("tasks", key: 1, ["title": "b"]) }
                #expect(try sync.nextBatch() == first)
            }
            // After a crash (reopen), the same batch comes back, marked sent.
            let store = try Store(path: path)
            let sync = SyncClient(store: store)
            #expect(try sync.inFlightBatch()?.batch == first && sync.inFlightBatch()?.state == .sent)
            #expect(try sync.nextBatch() == first)
            try sync.acknowledge(BatchAck(batchID: first!.id, results: [.ok("tasks", 1)]))
            // The server has "a"; the later edit "b" is pending against it.
            let row = try #require(try store.read { try $0.row("tasks", key: 1) })
            #expect(row.status == .updated && row.original("title") == "a" && row["title"] == "b")
            let second = try #require(try sync.nextBatch())
            #expect(second.number == first!.number + 1 && second.id != first!.id)
            #expect(second.changes == [RowChange(table: "tasks", key: 1, kind: .update, values: ["title": "b"], originals: ["title": "a"])])
            // A repeated acknowledgement of the first batch is recognised and ignored.
            #expect(try sync.acknowledge(BatchAck(batchID: first!.id, results: [.ok("tasks", 1)])).duplicate)
        }
    }
}

@Suite struct AckTests {
    func prepared(_ body: (Store, SyncClient, Batch) throws -> Void) throws {
        try withTemporaryFolder { path in
            let store = try Store(path: path)
            try store.createTable(tasks)
            try store.write { tx in
                for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "server"]) }
                for i in 1...3 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
                try tx.insert("tasks", ["id": 10, "title": "new"])
                try tx.update("tasks", key: 1, ["title": "changed"])
                try tx.delete("tasks", key: 2)
            }
            let sync = SyncClient(store: store)
            try body(store, sync, try #require(try sync.nextBatch()))
        }
    }

    static func error(_ t: String, _ k: RowKey, _ action: RowError.Action) -> RowResult {
        RowResult(table: t, key: k, status: .error, error: RowError(reason: "no", action: action))
    }

    @Test func everyErrorActionDoesWhatItSays() throws {
        // insert 10, update 1, delete 2: each answered with each applicable action.
        let cases: [(RowResult, RowResult, RowResult, (Store, SyncClient) throws -> Void)] = [
            (Self.error("tasks", 10, .drop), Self.error("tasks", 1, .rollback), Self.error("tasks", 2, .retry), { store, sync throws in
                #expect(try store.read { try $0.row("tasks", key: 10, includingDeleted: true) } == nil)
                let r1 = try #require(try store.read { try $0.row("tasks", key: 1) })
                #expect(r1["title"] == "server" && !r1.isPending)
                #expect(try store.read { try $0.row("tasks", key: 2, includingDeleted: true) }?.status == .deleted)
                #expect(try sync.nextBatch()?.changes.map(\.key) == [2])
            }),
            (Self.error("tasks", 10, .recreate), RowResult(table: "tasks", key: 1, status: .error, serverValues: ["title": "theirs"], error: RowError(reason: "stale", action: .rollback)), Self.error("tasks", 2, .setAside), { store, sync throws in
                #expect(try store.read { try $0.row("tasks", key: 10) }?.status == .inserted)
                #expect(try store.read { try $0.row("tasks", key: 1) }?["title"] == "theirs")
                #expect(try sync.rejectedRows().map(\.key) == [2])
                // The rejected row does not block the queue: the next batch carries the insert only.
                #expect(try sync.nextBatch()?.changes.map(\.key) == [10])
            }),
            (Self.error("tasks", 10, .setAside), Self.error("tasks", 1, .setAside), Self.error("tasks", 2, .setAside), { store, sync throws in
                #expect(try sync.rejectedRows().count == 3)
                #expect(try sync.nextBatch() == nil)
                try sync.retryRejected("tasks", key: 1)
                try sync.discardRejected("tasks", key: 2)
                #expect(try store.read { try $0.row("tasks", key: 2) }?.status == .unchanged)
                #expect(try sync.nextBatch()?.changes.map(\.key) == [1])
                #expect(try sync.rejectedRows().map(\.key) == [10])
            }),
        ]
        for (insert, update, delete, check) in cases {
            try prepared { store, sync, batch in
                #expect(batch.changes.map(\.key) == [1, 10, 2])
                try sync.acknowledge(BatchAck(batchID: batch.id, results: [insert, update, delete]))
                try check(store, sync)
                #expect(try store.verify().isConsistent)
            }
        }
    }

    /// A rollback undoes what the refused update sent, and nothing the app did after the batch
    /// was frozen: a later edit of the sent field, of another field, or a delete stays pending.
    @Test func aRollbackKeepsEditsMadeWhileTheBatchWasInFlight() throws {
        typealias Case = (name: String, edit: (Transaction) throws -> Void, serverValues: [String: Value]?, check: (Row?) -> Void)
        let cases: [Case] = [
            ("no later edit", { _ in }, nil, { row in
                #expect(row?["title"] == "server" && row?.isPending == false)
            }),
            ("the sent field edited again", { try $0.update("tasks", key: 1, ["title": "later"]) }, nil, { row in
                #expect(row?["title"] == "later" && row?.original("title") == "server" && row?.status == .updated)
            }),
            ("another field edited", { try $0.update("tasks", key: 1, ["notes": "later"]) }, nil, { row in
                #expect(row?["title"] == "server" && row?["notes"] == "later" && row?.changedFields == ["notes"])
            }),
            ("another field edited, the server's values given", { try $0.update("tasks", key: 1, ["notes": "later"]) }, ["title": "theirs", "priority": 5], { row in
                #expect(row?["title"] == "theirs" && row?["priority"] == 5 && row?["notes"] == "later" && row?.changedFields == ["notes"])
            }),
            ("the row deleted", { try $0.delete("tasks", key: 1) }, nil, { row in
                #expect(row?.status == .deleted && row?.original("title") == "server")
            }),
        ]
        for c in cases {
            try prepared { store, sync, batch in
                try sync.markSent(batch)
                try store.write { try c.edit($0) }
                let rollback = RowResult(table: "tasks", key: 1, status: .error, serverValues: c.serverValues, error: RowError(reason: "refused", action: .rollback))
                try sync.acknowledge(BatchAck(batchID: batch.id, results: [rollback, .ok("tasks", 10), .ok("tasks", 2)]))
                let row = try store.read { try $0.row("tasks", key: 1, includingDeleted: true) }
                c.check(row)
                #expect(try store.verify().isConsistent, "\(c.name)")
                // What stays pending goes up in the next batch.
                let next = try sync.nextBatch()?.changes.filter { $0.key == 1 }
                #expect((next?.isEmpty ?? true) == !(row?.isPending ?? false), "\(c.name)")
            }
        }
    }

    @Test func malformedAcknowledgementsChangeNothing() throws {
        let bad: [(String, (Batch) -> BatchAck)] = [
            ("another batch", { BatchAck(batchID: $0.id + "x", results: []) }),
            ("a missing result", { BatchAck(batchID: $0.id, results: [.ok("tasks", 1), .ok("tasks", 10)]) }),
            ("an extra result", { BatchAck(batchID: $0.id, results: [.ok("tasks", 1), .ok("tasks", 10), .ok("tasks", 2), .ok("tasks", 3)]) }),
            ("a repeated result", { BatchAck(batchID: $0.id, results: [.ok("tasks", 1), .ok("tasks", 1), .ok("tasks", 10), .ok("tasks", 2)]) }),
            ("an action that does not fit", { BatchAck(batchID: $0.id, results: [.ok("tasks", 1), Self.error("tasks", 10, .rollback), .ok("tasks", 2)]) }),
            ("a new key for an update", { BatchAck(batchID: $0.id, results: [.ok("tasks", 1, newKey: 5), .ok("tasks", 10), .ok("tasks", 2)]) }),
            ("an error without a reason", { BatchAck(batchID: $0.id, results: [RowResult(table: "tasks", key: 1, status: .error, error: RowError(reason: "", action: .retry)), .ok("tasks", 10), .ok("tasks", 2)]) }),
        ]
        for (name, make) in bad {
            try prepared { store, sync, batch in
                let before = try observable(store)
                let inFlight = try sync.inFlightBatch()
                let e = #expect(throws: StrataError.self, "\(name)") { try sync.acknowledge(make(batch)) }
                #expect(e?.code == .invalidOperation, "\(name)")
                #expect(try observable(store) == before, "\(name) changed the rows")
                #expect(try sync.inFlightBatch()?.batch == inFlight?.batch && sync.inFlightBatch()?.state == inFlight?.state, "\(name) ended the batch")
            }
        }
    }

    @Test func aServerKeyReplacesTheClientKeyEverywhere() throws {
        try withTemporaryFolder { path in
            let store = try Store(path: path)
            try store.createTable(assigned)
            try store.createTable(priorities)
            try store.write { tx in
                try tx.insert("priorities", ["id": -1, "name": "urgent"])
                try tx.insert("assigned", ["id": 1, "title": "t", "priority": -1])
            }
            let sync = SyncClient(store: store, associations: [taskPriority])
            let batch = try #require(try sync.nextBatch(maxRows: 1))
            #expect(batch.changes.map(\.table) == ["priorities"])
            try sync.acknowledge(BatchAck(batchID: batch.id, results: [.ok("priorities", -1, serverValues: ["name": "URGENT"], newKey: 100)]))
            #expect(try store.read { try $0.row("priorities", key: -1, includingDeleted: true) } == nil)
            let p = try #require(try store.read { try $0.row("priorities", key: 100) })
            #expect(p["name"] == "URGENT" && !p.isPending)
            let t = try #require(try store.read { try $0.row("assigned", key: 1) })
            #expect(t["priority"] == 100 && t.status == .inserted)
            #expect(try sync.nextBatch()?.changes.first?.values["priority"] == 100)
            #expect(try store.verify().isConsistent)
        }
    }

    /// The parent and its children in one batch: the server stores the children with the key it
    /// gave the parent, and so does the client — nothing is left pending.
    @Test func aChildInTheSameBatchAsItsRekeyedParentIsNotLeftPending() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(assigned)
            try store.createTable(priorities)
            let server = InMemorySyncServer(associations: [taskPriority]) { c in
                c.table == "priorities" && c.kind == .insert ? .ok(c.table, c.key, newKey: 100) : nil
            }
            server.write("assigned", key: 2, ["title": "old", "priority": .null])
            let sync = SyncClient(store: store, associations: [taskPriority])
            _ = try await sync.sync(with: server)
            try await store.write { tx in
                try tx.insert("priorities", ["id": -1, "name": "urgent"])
                try tx.insert("assigned", ["id": 1, "title": "new", "priority": -1])   // a new child
                try tx.update("assigned", key: 2, ["priority": -1])                   // an old row re-parented
            }
            let batch = try #require(try sync.nextBatch())
            #expect(batch.changes.map(\.table) == ["priorities", "assigned", "assigned"])
            let report = try sync.acknowledge(try await server.push(batch))
            #expect(report.acknowledged == 3 && report.rekeyed == 1)
            for key: RowKey in [1, 2] {
                #expect(server.rows("assigned")[key]?["priority"] == 100, "server row \(key)")
                let row = try #require(try await store.read { try $0.row("assigned", key: key) })
                #expect(row["priority"] == 100 && !row.isPending, "client row \(key): \(row)")
            }
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            #expect(try sync.nextBatch() == nil)
            #expect(serverRows(server, "assigned") == (try clientRows(store, "assigned")))
            #expect(try store.verify().isConsistent)
        }
    }
}

/// A transport that loses requests and responses, repeats them and fails, at random.
final class FlakyTransport: SyncTransport {
    let server: InMemorySyncServer
    let rng: Locked<SplitMix64>
    init(_ server: InMemorySyncServer, seed: UInt64) {
        self.server = server
        rng = Locked(SplitMix64(seed: seed))
    }
    struct Lost: Error {}
    /// How many requests were lost, half-delivered or repeated.
    let faults = Locked(0)
    func roll() -> Int {
        let r = rng.withLock { $0.below(10) }
        if r < 3 { faults.withLock { $0 += 1 } }
        return r
    }

    func pull(since anchor: String?) async throws -> ServerDelta {
        if roll() == 0 { throw Lost() }
        return try await server.pull(since: anchor)
    }

    func push(_ batch: Batch) async throws -> BatchAck {
        switch roll() {
        case 0: throw Lost()  // the request is lost
        case 1:
            _ = try await server.push(batch)  // the response is lost
            throw Lost()
        case 2:
            _ = try await server.push(batch)  // delivered twice
            return try await server.push(batch)
        default:
            return try await server.push(batch)
        }
    }
}

@Suite struct UnreliableTransportTests {
    @Test func syncEndsIdenticalWithNothingLostOrAppliedTwice() async throws {
        let seed = testSeed("syncEndsIdentical")
        var g = SplitMix64(seed: seed)
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(tasks)
            let server = InMemorySyncServer()
            let transport = FlakyTransport(server, seed: seed)
            let sync = SyncClient(store: store, policy: .clientWins)
            var failures = 0
            for round in 0..<30 {
                for _ in 0..<g.below(6) {
                    let key = RowKey(.int(Int64(1 + g.below(12))))
                    let (op, p) = (g.below(4), g.below(3))
                    try await store.write { tx in
                        switch op {
                        case 0: try? tx.insert("tasks", ["id": key.values[0], "title": .string("r\(round)")])
                        case 1, 2: try? tx.update("tasks", key: key, ["title": .string("u\(round)"), "priority": .int(Int64(p))])
                        default: try? tx.delete("tasks", key: key)
                        }
                    }
                }
                if g.below(3) == 0 { server.write("tasks", key: RowKey(.int(Int64(1 + g.below(12)))), ["title": .string("server\(round)"), "priority": 0, "done": false, "notes": .null]) }
                do { _ = try await sync.sync(with: transport, maxAttempts: 2, backoff: .milliseconds(1)) } catch { failures += 1 }
            }
            for _ in 0..<20 {
                if try await store.read({ try $0.pendingRows().isEmpty }), try sync.inFlightBatch() == nil { break }
                _ = try? await sync.sync(with: transport, maxAttempts: 10, backoff: .milliseconds(1))
            }
            _ = try await sync.sync(with: server)
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            #expect(serverRows(server, "tasks") == (try clientRows(store, "tasks")))
            let applied = server.appliedBatches
            #expect(Set(applied).count == applied.count, "a batch was applied twice")
            #expect(transport.faults.withLock { $0 } > 5, "the transport hardly failed: the test proved nothing")
            print("syncEndsIdentical: \(transport.faults.withLock { $0 }) transport faults, \(failures) sync calls gave up, \(applied.count) batches applied")
        }
    }

    @Test func progressReportsEveryPhase() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(tasks)
            try await store.write { tx in for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
            let seen = Locked<[SyncProgress]>([])
            _ = try await SyncClient(store: store).sync(with: InMemorySyncServer()) { p in seen.withLock { $0.append(p) } }
            let events = seen.withLock { $0 }
            #expect(events.first?.phase == .pull && events.last?.phase == .push && events.last?.status == .complete)
            #expect(events.last?.total["tasks"] == 3 && events.last?.processed["tasks"] == 3 && events.last?.remaining["tasks"] == 0)
        }
    }
}

func withTemporaryFolderAsync<R>(_ body: (String) async throws -> R) async throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-sync-test-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try await body(path)
}

@Suite struct StaleAckTests {
    /// The batch was applied but its response lost; the server then changed the row again and
    /// the client merged that. The repeated (cached) ok must not let the older sent value
    /// overwrite the newer one: the merge kept "mine" (client wins) against "back office", but
    /// "back office" was written after the server took "mine", so there was no conflict to win.
    /// The acknowledgement confirms "mine" and clears the anchor; the next pull, a snapshot,
    /// brings "back office" (`AckRules.unseenSent`). Formerly "mine" stayed pending
    /// against "back office" and went up again over it.
    @Test func anAckOlderThanAMergeDoesNotOverwriteIt() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            server.write("tasks", key: 2, ["title": "r2", "priority": 0, "done": false, "notes": nil])
            let sync = SyncClient(store: store, policy: .clientWins)
            _ = try await sync.sync(with: server)
            try await store.write { try $0.update("tasks", key: 2, ["title": "mine"]) }
            let batch = try #require(try sync.nextBatch())
            _ = try await server.push(batch)  // applied; the response is lost
            server.write("tasks", key: 2, ["title": "back office", "priority": 0, "done": false, "notes": nil])
            try sync.merge(try await server.pull(since: try sync.anchor()))
            let report = try sync.acknowledge(try await server.push(batch))  // the cached ok
            #expect(report.superseded == 1 && report.anchorCleared)
            let row = try #require(try await store.read { try $0.row("tasks", key: 2) })
            #expect(row["title"] == "mine" && row.original("title") == "mine" && row.status == .unchanged)
            _ = try await sync.sync(with: server)
            #expect(server.rows("tasks")[2]?["title"] == "back office")
            #expect(try await store.read { try $0.row("tasks", key: 2) }?["title"] == "back office")
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
        }
    }
}

extension StaleAckTests {
    /// As above with the server winning, so that after the merge no row is pending: compaction
    /// could then fold the merge away, and the cached ok would look current. The in-flight batch
    /// pins the log after its freeze point, so the merge stays visible to the acknowledgement.
    @Test func compactionKeepsWhatAnInFlightBatchsAckMustSee() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            server.write("tasks", key: 2, ["title": "r2", "priority": 0, "done": false, "notes": nil])
            let sync = SyncClient(store: store, policy: .serverWins)
            _ = try await sync.sync(with: server)
            try await store.write { try $0.update("tasks", key: 2, ["title": "mine"]) }
            let batch = try #require(try sync.nextBatch())
            let frozenAt = try await store.read { try $0.lastLSN }
            #expect(try await store.read { try $0.logPins }.values.contains(frozenAt))
            _ = try await server.push(batch)  // applied; the response is lost
            server.write("tasks", key: 2, ["title": "back office", "priority": 0, "done": false, "notes": nil])
            try sync.merge(try await server.pull(since: try sync.anchor()))
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            let compaction = try store.compact()
            #expect(compaction.horizon == frozenAt && compaction.heldBy.map { if case .pin = $0 { true } else { false } } == true)
            let report = try sync.acknowledge(try await server.push(batch))  // the cached ok
            #expect(report.superseded == 1)
            let row = try #require(try await store.read { try $0.row("tasks", key: 2) })
            #expect(row["title"] == "back office" && row.status == .unchanged)
            // Acknowledged: the pin is gone and everything folds.
            #expect(try await store.read { try $0.logPins }.isEmpty)
            #expect(try store.compact().horizon == (try await store.read { try $0.lastLSN }))
            #expect(try store.verify().isConsistent)
        }
    }
}

@Suite struct BatchSizeTests {
    @Test func batchesRespectTheByteLimitAndCarryEverythingOnce() throws {
        try withTemporaryFolder { path in
            let store = try Store(path: path)
            try store.createTable(tasks)
            try store.write { tx in
                for i in 1...30 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string(String(repeating: "x", count: i * 20))]) }
            }
            let sync = SyncClient(store: store)
            var seen: [RowKey] = []
            while let batch = try sync.nextBatch(maxRows: 100, maxBytes: 1500) {
                let bytes = try WireFormat.encode(batch).count
                #expect(bytes <= 1500 || batch.changes.count == 1, "batch \(batch.number) is \(bytes) bytes")
                seen += batch.changes.map(\.key)
                try sync.acknowledge(BatchAck(batchID: batch.id, results: batch.changes.map { .ok($0.table, $0.key) }))
            }
            #expect(seen == (1...30).map { RowKey(.int(Int64($0))) })
        }
    }
}

@Suite struct DeleteOriginalsTests {
    /// A delete names only its row's non-null originals. A field another client set since this
    /// one last saw it null — or a property-bag field this one never knew — must still stop the
    /// delete: it is a conflict, the value stays on the server, and the merge that follows
    /// decides (here the server's: the row comes back with the other client's value).
    @Test func aDeleteDoesNotRemoveAValueSetSinceItsOriginalsWereNull() async throws {
        for unknownField in [false, true] {
            try await withStoreAsync { store in
                try store.createTable(tasks)
                try store.createTable(.propertyBag("bag", key: [.int("id")]))
                let server = InMemorySyncServer()
                server.write("tasks", key: 1, ["title": "t", "priority": 0, "done": false, "notes": .null])
                server.write("bag", key: 1, ["color": "red"])
                let sync = SyncClient(store: store)
                _ = try await sync.sync(with: server)
                let table = unknownField ? "bag" : "tasks"
                try await store.write { try $0.delete(table, key: 1) }
                // Another client, meanwhile: a value where this one saw null (or no field).
                if unknownField {
                    server.write("bag", key: 1, ["color": "red", "size": "large"])
                } else {
                    server.write("tasks", key: 1, ["title": "t", "priority": 0, "done": false, "notes": "important"])
                }
                let batch = try #require(try sync.nextBatch())
                #expect(batch.changes.map(\.kind) == [.delete])
                try sync.markSent(batch)
                let ack = try await server.push(batch)
                #expect(ack.results.map(\.status) == [.conflict], "table \(table): the delete applied over a value it never saw")
                try sync.acknowledge(ack)
                _ = try await sync.sync(with: server)
                let kept = unknownField ? ("size", Value.string("large")) : ("notes", Value.string("important"))
                #expect(server.rows(table)[RowKey(1)]?[kept.0] == kept.1, "table \(table): the other client's value is gone from the server")
                #expect(try await store.read { try $0.row(table, key: 1)?[kept.0] } == kept.1)
            }
        }
    }
}

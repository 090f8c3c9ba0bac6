import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// Batches the server refuses as a whole (`BatchRefused`): a reused batch id never gets another
/// batch's acknowledgement, and `sync` settles each refusal instead of failing for ever.
@Suite struct RefusedBatchTests {
    static func update(_ id: Int64, _ title: String, from old: String) -> RowChange {
        RowChange(table: "tasks", key: RowKey(.int(id)), kind: .update, values: ["title": .string(title)], originals: ["title": .string(old)])
    }

    @Test func theInMemoryServerAnswersAReusedIdOnlyForTheSameChanges() async throws {
        let server = InMemorySyncServer()
        server.write("tasks", key: 1, ["title": "a"])
        let first = Batch(id: "c-7", clientID: "c", number: 7, changes: [Self.update(1, "b", from: "a")])
        let ack = try await server.push(first)
        #expect(ack.results.map(\.status) == [.ok])
        _ = try await server.push(Batch(id: "other-9", clientID: "other", number: 9, changes: []))
        // The same batch again: the stored answer, nothing applied twice.
        #expect(try await server.push(first) == ack)
        #expect(server.appliedBatches == ["c-7", "other-9"])
        // The same id with other changes: refused, with this client's highest number.
        let reused = Batch(id: "c-7", clientID: "c", number: 7, changes: [Self.update(1, "c", from: "b")])
        await #expect(throws: BatchRefused(.idReused, message: "batch c-7 was applied before with other changes", highestBatchNumber: 7)) {
            try await server.push(reused)
        }
        #expect(server.rows("tasks")[1]?["title"] == "b")
    }

    /// Syncs batch 1 (row 1 inserted as "zero") and batch 2 (its title "first"), then takes the
    /// store back to a briefcase exported between them, properties included, so that its batch
    /// counter says 1 again, and edits the title to "second": the next batch is numbered 2 again,
    /// with other changes than the batch 2 the server applied.
    static func takeTheBatchCounterBack(_ store: Store, _ sync: SyncClient, _ server: InMemorySyncServer) async throws {
        try await store.write { try $0.insert("tasks", ["id": 1, "title": "zero"]) }
        _ = try await sync.sync(with: server)
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("bc-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        try store.exportBriefcase(to: file)
        try await store.write { try $0.update("tasks", key: 1, ["title": "first"]) }
        _ = try await sync.sync(with: server)
        #expect(server.appliedBatches == ["\(store.clientID)-1", "\(store.clientID)-2"])
        try store.importBriefcase(from: file, restoringProperties: true)
        try await store.write { try $0.update("tasks", key: 1, ["title": "second"]) }
    }

    /// The store goes back to a briefcase exported after batch 1: its batch counter goes back
    /// with it, and the next batch is numbered 2 again, with other changes than the batch 2 the
    /// server applied. Before, the server answered with that batch's `ok`, and the client marked
    /// its new title as confirmed while the server kept the old one.
    @Test func aStoreWhoseBatchCounterWentBackDoesNotTakeAnotherBatchsAck() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store, policy: .clientWins)
            try await Self.takeTheBatchCounterBack(store, sync, server)
            let report = try await sync.sync(with: server)
            #expect(server.rows("tasks")[1]?["title"] == "second", "the edit reached the server")
            #expect(server.appliedBatches == ["\(store.clientID)-1", "\(store.clientID)-2", "\(store.clientID)-3"])
            #expect(report.acks.map(\.acknowledged) == [1])
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            #expect(try await store.read { try $0.row("tasks", key: 1)?["title"] } == "second")
            // The counter stays past the server's: the next batch is 4.
            try await store.write { try $0.update("tasks", key: 1, ["title": "third"]) }
            #expect(try sync.nextBatch()?.id == "\(store.clientID)-4")
        }
    }

    /// A server that refuses a reused id without saying its highest number: the client cannot
    /// know a free id, so `sync` throws the refusal and keeps the batch in flight.
    @Test func aReusedIdWithoutTheServersHighestNumberFailsLoudly() async throws {
        try await withStoreAsync { store in
            try await store.write { try $0.insert("tasks", ["id": 1, "title": "t"]) }
            let sync = SyncClient(store: store)
            let refusing = RefusingTransport(InMemorySyncServer()) { _ in BatchRefused(.idReused, message: "seen before") }
            await #expect(throws: BatchRefused(.idReused, message: "seen before")) { try await sync.sync(with: refusing) }
            #expect(try sync.inFlightBatch()?.batch.id == "\(store.clientID)-1")
            #expect(try await store.read { try $0.pendingRows() }.count == 1)
        }
    }

    /// A batch the server cannot take, naming no row (an older server refusing it whole for one
    /// bad row, say): its rows are set aside with the server's message, and the sync goes on —
    /// downloads too. Before, the transport's error was retried and thrown by every sync, since
    /// the batch in flight goes first.
    @Test func aBatchTheServerCannotTakeIsSetAsideAndTheSyncGoesOn() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let transport = RefusingTransport(server) { batch in
                batch.changes.contains { $0.key == 2 } ? BatchRefused(.invalid, message: "changes[1]: field 'title' is bad") : nil
            }
            let sync = SyncClient(store: store)
            try await store.write { tx in for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t\(i)"]) } }
            let report = try await sync.sync(with: transport)
            #expect(report.acks.map(\.setAside) == [3])
            let rejected = try sync.rejectedRows()
            #expect(rejected.map(\.key) == [1, 2, 3])
            #expect(rejected.allSatisfy { $0.reason == "the server refused the batch that carried this row: changes[1]: field 'title' is bad" })
            // The next sync downloads; the rows set aside keep their edits and wait for the app.
            server.write("tasks", key: 9, ["title": "from the server"])
            _ = try await sync.sync(with: transport)
            #expect(try await store.read { try $0.row("tasks", key: 9)?["title"] } == "from the server")
            #expect(try await store.read { try $0.pendingRows() }.count == 3)
            try sync.retryRejected("tasks", key: 1)
            try sync.retryRejected("tasks", key: 3)
            _ = try await sync.sync(with: transport)
            #expect(Set(server.rows("tasks").keys) == [1, 3, 9])
            #expect(try sync.rejectedRows().map(\.key) == [2])
        }
    }

    /// A server that takes at most 2,000 bytes a batch: the rows go up in smaller batches, and
    /// the one row larger than that by itself is set aside with the server's message. Before,
    /// the refusal was retried and thrown by every sync.
    @Test func aBatchTooLargeForTheServerIsSplitAndARowTooLargeAloneIsSetAside() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let transport = RefusingTransport(server) { batch in
                (try? WireFormat.encode(batch).count).map { $0 > 2000 } == true ? BatchRefused(.tooLarge, message: "over 2000 bytes") : nil
            }
            let sync = SyncClient(store: store)
            try await store.write { tx in
                for i in 1...30 {
                    try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string(String(repeating: "x", count: i == 7 ? 3000 : 60))])
                }
            }
            let report = try await sync.sync(with: transport)
            #expect(server.rows("tasks").count == 29 && server.rows("tasks")[7] == nil)
            #expect(report.acks.map(\.acknowledged).reduce(0, +) == 29 && report.acks.map(\.setAside).reduce(0, +) == 1)
            let rejected = try sync.rejectedRows()
            #expect(rejected.map(\.key) == [7] && rejected.first?.reason == "the server refuses this row as too large: over 2000 bytes")
            #expect(try await store.read { try $0.pendingRows() }.map(\.key) == [7])
        }
    }

    // An app that runs the steps itself (`nextBatch`, its own upload, `acknowledge`) settles a
    // refusal with `settleRefusal`, as `sync` does.

    @Test func anAppsOwnUploadSettlesAReusedIdAndItsEditReachesTheServer() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store, policy: .clientWins)
            try await Self.takeTheBatchCounterBack(store, sync, server)

            let reused = try #require(try sync.nextBatch())
            #expect(reused.id == "\(store.clientID)-2")
            var refusal: BatchRefused? = nil
            do { _ = try await server.push(reused) } catch let r as BatchRefused { refusal = r }
            let refused = try #require(refusal)
            #expect(try sync.settleRefusal(refused, of: reused) == .refreeze(maxBytes: nil))
            #expect(try sync.inFlightBatch() == nil)
            // The restored store's originals are older than the server's row: pull first, as
            // `sync` does, so that the update goes up against the server's values.
            _ = try sync.merge(try await server.pull(since: try sync.anchor()))
            let batch = try #require(try sync.nextBatch())
            #expect(batch.id == "\(store.clientID)-3")
            let report = try sync.acknowledge(try await server.push(batch))
            #expect(report.acknowledged == 1)
            #expect(server.rows("tasks")[1]?["title"] == "second")
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
        }
    }

    @Test func anAppsOwnUploadSettlesAnInvalidBatchBySettingItsRowsAside() async throws {
        try await withStoreAsync { store in
            let sync = SyncClient(store: store)
            try await store.write { tx in for i in 1...2 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t\(i)"]) } }
            let batch = try #require(try sync.nextBatch())
            let outcome = try sync.settleRefusal(BatchRefused(.invalid, message: "bad batch"), of: batch)
            guard case .setAside(let report) = outcome else { Issue.record("\(outcome)"); return }
            #expect(report.setAside == 2)
            #expect(try sync.inFlightBatch() == nil)
            #expect(try sync.rejectedRows().map(\.key) == [1, 2])
            #expect(try sync.rejectedRows().allSatisfy { $0.reason == "the server refused the batch that carried this row: bad batch" })
            // Set aside, not lost: the rows keep their edits.
            #expect(try await store.read { try $0.pendingRows() }.count == 2)
            #expect(try sync.nextBatch() == nil)
        }
    }

    @Test func anAppsOwnUploadSettlesABatchTooLargeByFreezingItSmaller() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store)
            try await store.write { tx in
                for i in 1...20 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string(String(repeating: "x", count: 100))]) }
            }
            let whole = try #require(try sync.nextBatch())
            let size = try WireFormat.encode(whole).count
            #expect(try sync.settleRefusal(BatchRefused(.tooLarge, message: "too big"), of: whole) == .refreeze(maxBytes: size / 2))
            var acknowledged = 0
            var batches = 0
            while let batch = try sync.nextBatch(maxBytes: size / 2) {
                #expect(try WireFormat.encode(batch).count <= size / 2)
                acknowledged += try sync.acknowledge(try await server.push(batch)).acknowledged
                batches += 1
            }
            #expect(batches >= 2 && acknowledged == 20)
            #expect(server.rows("tasks").count == 20)
        }
    }

    @Test func aRefusalOfABatchNotInFlightIsRefusedAndChangesNothing() async throws {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store)
            try await store.write { try $0.insert("tasks", ["id": 1, "title": "t"]) }
            let batch = try #require(try sync.nextBatch())
            _ = try sync.acknowledge(try await server.push(batch))
            try await store.write { try $0.insert("tasks", ["id": 2, "title": "u"]) }
            let next = try #require(try sync.nextBatch())
            #expect(throws: StrataError.self) { try sync.settleRefusal(BatchRefused(.invalid, message: "late"), of: batch) }
            #expect(try sync.inFlightBatch()?.batch == next)
            #expect(try sync.rejectedRows().isEmpty)
            // A reused id without the server's highest number: nothing to settle it with.
            #expect(throws: StrataError.self) { try sync.settleRefusal(BatchRefused(.idReused, message: "seen"), of: next) }
            #expect(try sync.inFlightBatch()?.batch == next)
            #expect(try await store.read { try $0.pendingRows() }.map(\.key) == [2])
        }
    }
}

/// Passes pulls and pushes on to an ``InMemorySyncServer``, but throws the refusal `refuse`
/// returns for a batch instead of pushing it.
struct RefusingTransport: SyncTransport {
    let server: InMemorySyncServer
    let refuse: @Sendable (Batch) -> BatchRefused?
    init(_ server: InMemorySyncServer, refuse: @escaping @Sendable (Batch) -> BatchRefused?) {
        self.server = server
        self.refuse = refuse
    }
    func pull(since anchor: String?) async throws -> ServerDelta { try await server.pull(since: anchor) }
    func push(_ batch: Batch) async throws -> BatchAck {
        if let refusal = refuse(batch) { throw refusal }
        return try await server.push(batch)
    }
}

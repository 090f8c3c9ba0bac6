import Foundation
import Strata
@testable import StrataSync
import StrataTesting
import StrataWorkload
import Testing

/// The batch in flight as one record (`InFlightRecord`, `BatchRecord` version 2), and stores
/// whose batch in flight an earlier version kept in properties of their own.
@Suite struct InFlightRecordTests {
    static func randomRecord(_ g: inout SplitMix64) -> InFlightRecord {
        func changes() -> [RowChange] { (0..<g.below(4)).map { _ in BatchRecordTests.randomChange(&g) } }
        let number = [1, 9, UInt64.max, g.next()][g.below(4)]
        var r = InFlightRecord(
            batch: Batch(id: "c-\(number)", clientID: "c", number: number, changes: changes()),
            state: g.below(2) == 0 ? .pending : .sent, frozenAt: [0, 1, UInt64.max, g.next()][g.below(4)]
        )
        r.serverDeletes = changes()
        r.echoes = changes()
        r.listed = changes()
        r.snapshotMerged = g.below(2) == 0
        return r
    }

    @Test func aRecordReadsBackAsTheSameRecord() throws {
        let seed = testSeed("aRecordReadsBackAsTheSameRecord")
        var g = SplitMix64(seed: seed)
        for i in 0..<500 {
            let r = Self.randomRecord(&g)
            let bytes = BatchRecord.encode(r)
            guard case .record(let back) = try BatchRecord.decodeAny(bytes, property: "p") else {
                Issue.record("record \(i) (seed \(seed)) read back as a batch alone")
                continue
            }
            #expect(back == r, "record \(i) (seed \(seed))")
            #expect(try BatchRecord.decode(bytes, property: "p") == r.batch, "record \(i) (seed \(seed))")
        }
    }

    @Test func aDamagedRecordIsReportedNotGuessed() throws {
        var g = SplitMix64(seed: 11)
        var r = Self.randomRecord(&g)
        r.serverDeletes = [BatchRecordTests.randomChange(&g)]
        let record = BatchRecord.encode(r)
        var damaged: [[UInt8]] = (0..<record.count).map { Array(record.prefix($0)) }
        damaged.append(record + [0])
        var badState = record
        badState[1] = 2
        damaged.append(badState)
        for bytes in damaged {
            let e = #expect(throws: StrataError.self) { try BatchRecord.decodeAny(bytes, property: SyncClient.inFlightProperty) }
            #expect(e?.code == .corruptRecord && e?.message.contains(SyncClient.inFlightProperty) == true, "\(bytes.count) bytes: \(String(describing: e))")
        }
    }

    /// Writes `record` as every version before the record did (up to commit 47c39d0): the batch
    /// alone as a version-1 record, and beside it the state as a string, the freeze LSN as an
    /// integer, each list of notes (when not empty) as `WireFormat` JSON, and the snapshot mark
    /// as a boolean. The names are spelled out: they are the old format, not today's constants.
    static func writeAsBefore(_ record: InFlightRecord, _ tx: Transaction) throws {
        try tx.setStrataProperty("strata.sync.batch.inflight", .bytes(BatchRecord.encode(record.batch)))
        try tx.setStrataProperty("strata.sync.batch.state", .string(record.state.rawValue))
        try tx.setStrataProperty("strata.sync.batch.frozenAt", .int(Int64(record.frozenAt)))
        let notes = [
            ("strata.sync.batch.serverDeletes", record.serverDeletes), ("strata.sync.batch.echoes", record.echoes),
            ("strata.sync.batch.listed", record.listed),
        ]
        for (name, changes) in notes where !changes.isEmpty {
            try tx.setStrataProperty(name, .bytes(Array(try WireFormat.encoder.encode(changes))))
        }
        if record.snapshotMerged { try tx.setStrataProperty("strata.sync.batch.snapshotMerged", .bool(true)) }
    }

    static let oldNames: Set<String> = [
        "strata.sync.batch.state", "strata.sync.batch.frozenAt", "strata.sync.batch.serverDeletes",
        "strata.sync.batch.echoes", "strata.sync.batch.listed", "strata.sync.batch.snapshotMerged",
    ]

    /// A batch in flight with every kind of note: sent, its response lost, the server's writer
    /// deletes one of its inserts, and the app pulls a delta and then a snapshot before the
    /// next sync. With `asBefore`, the store then holds it as an earlier version left it. The
    /// next sync sends the very same batch and settles everything; returns what the store holds
    /// then, which must not depend on how the batch was kept.
    func lateSync(asBefore: Bool) async throws -> [String] {
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            for k: Int64 in [10, 11] { server.write("tasks", key: RowKey(.int(k)), ["title": .string("t\(k)"), "priority": 0, "done": false]) }
            let sync = SyncClient(store: store)
            _ = try await sync.sync(with: server)
            try await store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "one"])
                try tx.insert("tasks", ["id": 2, "title": "two"])
                try tx.update("tasks", key: 10, ["title": "ten"])
            }
            let batch = try #require(try sync.nextBatch())
            try sync.markSent(batch)
            _ = try await server.push(batch)
            server.write("tasks", key: 2, nil)
            server.write("tasks", key: 11, ["title": "eleven", "priority": 1, "done": false])
            try sync.merge(try await server.pull(since: try sync.anchor()))
            try sync.merge(try await server.pull(since: nil))
            let record = try #require(try await store.read { try SyncClient.inFlightRecord($0) })
            #expect(record.batch == batch && record.state == .sent)
            #expect(!record.serverDeletes.isEmpty && !record.echoes.isEmpty && !record.listed.isEmpty && record.snapshotMerged, "\(record)")
            if asBefore {
                try await store.write { tx in try Self.writeAsBefore(record, tx) }
                #expect(Self.oldNames.isSubset(of: try await store.read { try Set($0.properties().keys) }))
                #expect(try await store.read { try SyncClient.inFlightRecord($0) } == record)
            }
            #expect(try sync.inFlightBatch()?.batch == batch && sync.nextBatch() == batch)
            let applied = server.appliedBatches
            _ = try await sync.sync(with: server)
            // The server took the batch as the one it applied: the same id, the same changes.
            #expect(server.appliedBatches == applied)
            #expect(try sync.inFlightBatch() == nil && sync.pendingChanges().isEmpty)
            #expect(try await store.read { try Set($0.properties().keys) }.isDisjoint(with: Self.oldNames))
            var rows: [RowKey: [String: Value]] = [:]
            for row in try await store.read({ try $0.rows("tasks") }) {
                rows[row.key] = row.values.filter { $0.key != "id" && !$0.value.isNull }
            }
            #expect(rows == server.rows("tasks").mapValues { $0.filter { !$0.value.isNull } })
            return try observable(store)
        }
    }

    @Test func aBatchInFlightKeptAsBeforeIsSentAgainAndSettlesAlike() async throws {
        let now = try await lateSync(asBefore: false)
        let before = try await lateSync(asBefore: true)
        #expect(before == now)
    }

    /// A save over a record an earlier version wrote removes the properties it kept beside it,
    /// in the same transaction; reads leave the store as it is.
    @Test func theFirstSaveMigratesTheStoreInPlace() throws {
        try withStore { store in
            try store.write { try $0.insert("tasks", ["id": 1, "title": "one"]) }
            let sync = SyncClient(store: store)
            let batch = try #require(try sync.nextBatch())
            var record = try #require(try store.read { try SyncClient.inFlightRecord($0) })
            record.listed = [RowChange(table: "tasks", key: 1, kind: .update)]
            try store.write { try Self.writeAsBefore(record, $0) }
            #expect(try sync.inFlightBatch()?.batch == batch)
            #expect(Self.oldNames.subtracting(["strata.sync.batch.serverDeletes", "strata.sync.batch.echoes", "strata.sync.batch.snapshotMerged"])
                .isSubset(of: try store.read { try Set($0.properties().keys) }))
            try sync.markSent(batch)
            record.state = .sent
            #expect(try store.read { try SyncClient.inFlightRecord($0) } == record)
            #expect(try store.read { try Set($0.properties().keys) }.isDisjoint(with: Self.oldNames))
            let stored = try #require(try store.read { try $0.property(SyncClient.inFlightProperty)?.bytesValue })
            #expect(stored.first == BatchRecord.inFlightVersion)
        }
    }
}

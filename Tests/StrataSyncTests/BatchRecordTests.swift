import Foundation
import Strata
@testable import StrataSync
import StrataTesting
import StrataWorkload
import Testing

/// The in-flight batch's binary record and the one-pass size meter that cuts batches.
@Suite struct BatchRecordTests {
    /// Random changes with every kind of value, and strings that need every kind of escaping.
    static func randomChange(_ g: inout SplitMix64) -> RowChange {
        let alphabet: [String] = ["a", "Z", "é", "日", "😀", "\"", "\\", "/", "\n", "\t", "\u{8}", "\u{c}", "\r", "\u{1}", "\u{1f}", "\u{7f}", "\u{2028}", " ", "{", "0"]
        func string() -> String { (0..<g.below(12)).map { _ in alphabet[g.below(alphabet.count)] }.joined() }
        func value() -> Value {
            switch g.below(8) {
            case 0: return .null
            case 1: return .bool(g.below(2) == 0)
            case 2: return .int([0, 1, -1, 9, 10, -10, Int64.max, Int64.min, Int64(bitPattern: g.next())][g.below(9)])
            case 3:
                // Any finite double: random bit patterns cover the exponent forms, plus the round ones.
                var d = Double(bitPattern: g.next())
                if !d.isFinite { d = 0 }
                return .double([d, 1, -0.0, 100, 1e15, 1e16, 0.1, .leastNonzeroMagnitude, Double(g.below(1000)) / 8][g.below(9)])
            case 4: return .string(string())
            case 5: return .bytes((0..<g.below(40)).map { _ in UInt8(truncatingIfNeeded: g.next()) })
            case 6: return .timestamp(Date(timeIntervalSince1970: [0, 1.5, -978307198.5, Double(Int32(truncatingIfNeeded: g.next()))][g.below(4)]))
            default: return .string("")
            }
        }
        func fields() -> [String: Value] {
            var f: [String: Value] = [:]
            for _ in 0..<g.below(5) { f[string()] = value() }
            return f
        }
        let kind: RowChange.Kind = [.insert, .update, .delete][g.below(3)]
        let key = RowKey((0..<(1 + g.below(3))).map { _ in value() })
        return RowChange(table: string(), key: key, kind: kind, values: fields(), originals: fields())
    }

    @Test func theSizeMeterAgreesWithTheEncoderByteForByte() throws {
        let seed = testSeed("theSizeMeterAgreesWithTheEncoderByteForByte")
        var g = SplitMix64(seed: seed)
        for i in 0..<3_000 {
            let c = Self.randomChange(&g)
            let encoded = try WireFormat.encode(c)
            #expect(WireSize.change(c) == encoded.count, "change \(i) (seed \(seed)): \(String(decoding: encoded, as: UTF8.self))")
        }
        for i in 0..<200 {
            let changes = (0..<g.below(4)).map { _ in Self.randomChange(&g) }
            let clientID = String(Self.randomChange(&g).table)
            let number = [1, 9, 10, UInt64.max, g.next()][g.below(5)]
            let batch = Batch(id: "\(clientID)-\(number)", clientID: clientID, number: number, changes: changes)
            let measured = WireSize.batchEnvelope(id: batch.id, clientID: clientID, number: number)
                + changes.map(WireSize.change).reduce(0, +) + max(0, changes.count - 1)
            #expect(measured == (try WireFormat.encode(batch).count), "batch \(i) (seed \(seed))")
        }
    }

    @Test func aBatchRecordReadsBackAsTheSameBatch() throws {
        let seed = testSeed("aBatchRecordReadsBackAsTheSameBatch")
        var g = SplitMix64(seed: seed)
        for i in 0..<300 {
            let changes = (0..<g.below(6)).map { _ in Self.randomChange(&g) }
            let batch = Batch(id: "c-\(i)", clientID: "c", number: g.next(), changes: changes)
            let record = BatchRecord.encode(batch)
            #expect(try BatchRecord.decode(record, property: "p") == batch, "batch \(i) (seed \(seed))")
            #expect(BatchRecord.encode(batch) == record, "one batch, one record")
            // The JSON form earlier versions stored still reads.
            #expect(try BatchRecord.decode(Array(WireFormat.encode(batch)), property: "p") == batch)
        }
    }

    /// Every prefix of a record, a newer version byte, and trailing bytes are damage, reported
    /// with the property's name; none is taken for a batch.
    @Test func aDamagedRecordIsReportedNotGuessed() throws {
        var g = SplitMix64(seed: 7)
        let batch = Batch(id: "c-1", clientID: "c", number: 1, changes: (0..<3).map { _ in Self.randomChange(&g) })
        let record = BatchRecord.encode(batch)
        var damaged: [[UInt8]] = (0..<record.count).map { Array(record.prefix($0)) }
        // A version no Strata writes yet.
        damaged.append([3] + record.dropFirst())
        damaged.append(record + [0])
        damaged.append(Array("{\"id\":".utf8))
        for bytes in damaged {
            let e = #expect(throws: StrataError.self) { try BatchRecord.decode(bytes, property: "strata.sync.batch.inflight") }
            #expect(e?.code == .corruptRecord && e?.message.contains("strata.sync.batch.inflight") == true, "\(bytes.count) bytes: \(String(describing: e))")
        }
    }

    /// A store whose batch in flight was stored as JSON by an earlier version resends the same
    /// batch and takes its acknowledgement.
    @Test func aBatchInFlightFromAnEarlierVersionIsResentAndAcknowledged() throws {
        try withStore { store in
            try store.write { tx in
                for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t\(i)"]) }
            }
            let sync = SyncClient(store: store)
            let batch = try #require(try sync.nextBatch())
            try store.write { try $0.setStrataProperty(SyncClient.inFlightProperty, .bytes(Array(try WireFormat.encode(batch)))) }
            try store.write { try $0.insert("tasks", ["id": 4, "title": "later"]) }
            #expect(try sync.nextBatch() == batch)
            try sync.acknowledge(BatchAck(batchID: batch.id, results: batch.changes.map { .ok($0.table, $0.key) }))
            #expect(try sync.inFlightBatch() == nil)
            #expect(try sync.nextBatch()?.changes.map(\.key) == [4])
        }
    }

    /// Batches cut by the meter are as full as the byte limit allows: the payload fits, and one
    /// more change would not have.
    @Test func batchesAreCutAtTheByteLimitExactly() throws {
        let seed = testSeed("batchesAreCutAtTheByteLimitExactly")
        var g = SplitMix64(seed: seed)
        try withStore { store in
            try store.write { tx in
                for i in 1...60 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string(String(repeating: "é/\"", count: g.below(60)))]) }
            }
            let sync = SyncClient(store: store)
            let limit = 600 + g.below(1500)
            var pending = try sync.pendingChanges()
            while let batch = try sync.nextBatch(maxRows: 1_000, maxBytes: limit) {
                let size = try WireFormat.encode(batch).count
                #expect(size <= limit || batch.changes.count == 1, "batch \(batch.number) is \(size) bytes over a limit of \(limit) (seed \(seed))")
                #expect(Array(pending.prefix(batch.changes.count)) == batch.changes)
                pending.removeFirst(batch.changes.count)
                if let next = pending.first {
                    var fuller = batch
                    fuller.changes.append(next)
                    #expect(try WireFormat.encode(fuller).count > limit, "batch \(batch.number) had room for one more (seed \(seed))")
                }
                try sync.acknowledge(BatchAck(batchID: batch.id, results: batch.changes.map { .ok($0.table, $0.key) }))
            }
            #expect(pending.isEmpty)
        }
    }
}

import Foundation
import Strata
import StrataSync
import StrataWorkload
import Testing

@Suite struct WireFormatTests {
    static let examples = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../Sources/StrataSync/Wire/examples").standardized

    static func example(_ name: String) throws -> Data {
        try Data(contentsOf: examples.appendingPathComponent(name))
    }

    @Test func theExamplesDecodeAndRoundTrip() throws {
        let delta = try WireFormat.decode(ServerDelta.self, from: try Self.example("delta.json"))
        #expect(delta.since == "v41" && delta.tables[0].upserts[0].fields["title"] == "Buy oat milk" && delta.tables[0].deletes == [8])
        #expect(delta.tables[0].upserts[0].fields["notes"] == .null)
        let batch = try WireFormat.decode(Batch.self, from: try Self.example("batch.json"))
        #expect(batch.number == 12 && batch.changes.map(\.kind) == [.insert, .update, .delete])
        let ack = try WireFormat.decode(BatchAck.self, from: try Self.example("ack.json"))
        #expect(ack.results[0].newKey == 1009 && ack.results[2].error?.action == .retry)
        #expect(try WireFormat.decode(ServerDelta.self, from: WireFormat.encode(delta)) == delta)
        #expect(try WireFormat.decode(Batch.self, from: WireFormat.encode(batch)) == batch)
        #expect(try WireFormat.decode(BatchAck.self, from: WireFormat.encode(ack)) == ack)
    }

    static let broken: [(String, String, String)] = [
        ("unknown field", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{},"colour":1}]}]}"#, "tables[0].upserts[0].colour"),
        ("missing anchor", #"{"tables":[]}"#, "anchor"),
        ("value of the wrong shape", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"title":"plain"}}]}]}"#, "tables[0].upserts[0].fields.title"),
        ("two types in one value", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"int":1,"string":"x"}}}]}]}"#, "tables[0].upserts[0].fields.n"),
        ("bad mode", #"{"anchor":"a","mode":"everything","tables":[]}"#, "mode"),
        ("key not an array", #"{"anchor":"a","tables":[{"table":"t","deletes":[{"int":1}]}]}"#, "tables[0].deletes[0]"),
    ]

    @Test(arguments: broken.indices)
    func errorsPointAtTheOffendingField(_ i: Int) throws {
        let (name, json, path) = Self.broken[i]
        let e = #expect(throws: StrataError.self, "\(name)") { try WireFormat.decode(ServerDelta.self, from: Data(json.utf8)) }
        #expect(e?.code == .malformedInput)
        #expect(e?.message.contains(path) == true, "\(name): \(e?.message ?? "-")")
    }

    @Test func anAckRefusingARowMustSayWhy() throws {
        let json = #"{"batchID":"b","results":[{"table":"t","key":[{"int":1}],"status":"error"}]}"#
        let e = #expect(throws: StrataError.self) { try WireFormat.decode(BatchAck.self, from: Data(json.utf8)) }
        #expect(e?.message.contains("results[0].error") == true, "\(e?.message ?? "-")")
    }

    @Test func truncatedPayloadsAreErrors() throws {
        let data = try Self.example("batch.json")
        for cut in stride(from: 1, to: data.count - 2, by: 11) {
            #expect(throws: StrataError.self) { try WireFormat.decode(Batch.self, from: data.prefix(cut)) }
        }
    }
}

@Suite struct WireFuzzTests {
    /// Mutated payloads either decode or throw a `StrataError`; none crashes the process.
    @Test func mutatedPayloadsNeverCrash() throws {
        var g = SplitMix64(seed: testSeed("mutatedPayloads"))
        let examples = try ["delta.json", "batch.json", "ack.json"].map { Array(try WireFormatTests.example($0)) }
        var refused = 0
        for i in 0..<6000 {
            var b = examples[i % 3]
            let noise = Array("{}[]\":,0-9ex\\".utf8)
            for _ in 0..<(1 + g.next() % 3) where !b.isEmpty {
                let at = Int(g.next() % UInt64(b.count))
                switch g.next() % 3 {
                case 0: b[at] = noise[Int(g.next() % UInt64(noise.count))]
                case 1: b.remove(at: at)
                default: b = Array(b.prefix(at))
                }
            }
            do {
                switch i % 3 {
                case 0: _ = try WireFormat.decode(ServerDelta.self, from: Data(b))
                case 1: _ = try WireFormat.decode(Batch.self, from: Data(b))
                default: _ = try WireFormat.decode(BatchAck.self, from: Data(b))
                }
            } catch {
                #expect(error.code == .malformedInput)
                refused += 1
            }
        }
        #expect(refused > 3000)
    }
}

import Foundation
import Strata
import StrataSync
import StrataWorkload
import Testing

/// A page written from stored wire JSON (`DeltaPageWriter`, the server's pull path) reads as the
/// `ServerDelta` built from the decoded rows: key fields from the key, declared fields the
/// stored row leaves out listed as null, every table of a snapshot listed.
@Suite struct DeltaPageWriterTests {
    static let tables = [
        DeltaPageWriter.Table(name: "tasks", keyFields: ["id"], fields: ["done", "notes", "title"]),
        DeltaPageWriter.Table(name: "pairs", keyFields: ["a", "b"], fields: ["v"]),
        DeltaPageWriter.Table(name: "bag", keyFields: ["name"], fields: []),
        // More declared fields than the writer keeps in its bit set, and names that need escapes.
        DeltaPageWriter.Table(name: "wide", keyFields: ["k\"ey"], fields: (0..<70).map { "f\($0)" } + ["a/b", "é"]),
    ]

    static func value(_ random: inout SplitMix64) -> Value {
        switch random.below(7) {
        case 0: .null
        case 1: .bool(random.below(2) == 0)
        case 2: .int(Int64(bitPattern: random.next()))
        case 3: .double(Double(Int64(bitPattern: random.next() >> 12)) / 1024)
        case 4: .string(["", "x", "é\u{301}", "a/b\"c\\\n", "🙂", "\u{1}"][random.below(6)])
        case 5: .bytes([UInt8](repeating: UInt8(random.below(256)), count: random.below(5)))
        default: .timestamp(Date(timeIntervalSince1970: Double(random.below(2_000_000_000))))
        }
    }

    @Test func aPageFromStoredJSONReadsAsTheDeltaOfItsRows() throws {
        var random = SplitMix64(seed: testSeed("aPageFromStoredJSONReadsAsTheDeltaOfItsRows"))
        for trial in 0..<300 {
            let snapshot = random.below(2) == 0
            var writer = DeltaPageWriter(tables: Self.tables)
            var expected: [String: TableDelta] = [:]
            for _ in 0..<random.below(12) {
                let ti = random.below(Self.tables.count)
                let t = Self.tables[ti]
                let key = t.keyFields.map { _ in Self.value(&random) }.map { $0.isNull ? Value.int(1) : $0 }
                let keyJSON = String(decoding: try WireFormat.encode(key), as: UTF8.self)
                if !snapshot && random.below(4) == 0 {
                    if random.below(2) == 0 {
                        try writer.delete(table: ti, key: keyJSON)
                    } else {
                        try Array(keyJSON.utf8).withUnsafeBytes { try writer.delete(table: ti, key: $0) }
                    }
                    expected[t.name, default: TableDelta(t.name)].deletes.append(RowKey(key))
                    continue
                }
                // Stored fields: some declared ones (or any, in the bag), sometimes a key field too.
                var stored: [String: Value] = [:]
                for f in t.fields where random.below(3) != 0 { stored[f] = Self.value(&random) }
                if t.fields.isEmpty { for _ in 0..<random.below(4) { stored["p\(random.below(9))"] = Self.value(&random) } }
                if random.below(5) == 0 { stored[t.keyFields[0]] = .string("stale key copy") }
                let version = Int64(random.below(1_000_000))
                let stamp = Double(random.below(2_000_000_000)) + 0.25
                let fieldsJSON = try WireFormat.encode(stored)
                if random.below(2) == 0 {
                    try writer.upsert(table: ti, key: keyJSON, fields: String(decoding: fieldsJSON, as: UTF8.self), version: version, timestamp: stamp)
                } else {
                    // The bytes a server hands over from its result rows.
                    try Array(keyJSON.utf8).withUnsafeBytes { k in
                        try fieldsJSON.withUnsafeBytes { f in try writer.upsert(table: ti, key: k, fields: f, version: version, timestamp: stamp) }
                    }
                }
                var fields = stored
                for f in t.fields where fields[f] == nil { fields[f] = .null }
                for (k, v) in zip(t.keyFields, key) { fields[k] = v }
                expected[t.name, default: TableDelta(t.name)].upserts.append(ServerRow(fields, version: String(version), timestamp: Date(timeIntervalSince1970: stamp)))
            }
            let body = writer.finish(since: snapshot ? nil : "5", anchor: "9", mode: snapshot ? .snapshot : .incremental, listingEveryTable: snapshot)
            let page = try WireFormat.decode(ServerDelta.self, from: Data(body))
            let listed = Self.tables.compactMap { t in snapshot ? (expected[t.name] ?? TableDelta(t.name)) : expected[t.name] }
            #expect(page == ServerDelta(since: snapshot ? nil : "5", anchor: "9", mode: snapshot ? .snapshot : .incremental, tables: listed), "trial \(trial)")
        }
    }

    @Test func storedJSONThatIsNotAWireRowIsAnError() throws {
        var writer = DeltaPageWriter(tables: Self.tables)
        var good = DeltaPageWriter(tables: Self.tables)
        try writer.upsert(table: 0, key: #"[{"int":7}]"#, fields: #"{"title":{"string":"kept"}}"#, version: 3, timestamp: 1)
        try good.upsert(table: 0, key: #"[{"int":7}]"#, fields: #"{"title":{"string":"kept"}}"#, version: 3, timestamp: 1)
        for (key, fields) in [("[1", "{}"), (#"[{"int":1},{"int":2}]"#, "{}"), (#"[{"int":1}]"#, #"{"title":}"#), (#"[{"int":1}]"#, "[]"), (#"[{"int":1}]"#, #"{"title":{"string":"x"},"#)] {
            #expect(throws: StrataError.self, "\(key) \(fields)") { try writer.upsert(table: 0, key: key, fields: fields, version: 1, timestamp: 0) }
            #expect(throws: StrataError.self, "\(key) \(fields), as bytes") {
                try Array(key.utf8).withUnsafeBytes { k in try Array(fields.utf8).withUnsafeBytes { f in try writer.upsert(table: 0, key: k, fields: f, version: 1, timestamp: 0) } }
            }
        }
        #expect(throws: StrataError.self) { try writer.delete(table: 0, key: "{}") }
        // Nothing of the refused rows was written: the page holds the row written before them.
        #expect(writer.finish(since: nil, anchor: "1", mode: .incremental) == good.finish(since: nil, anchor: "1", mode: .incremental))
    }
}

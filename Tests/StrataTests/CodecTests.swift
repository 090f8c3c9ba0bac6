import Foundation
@testable import Strata
import StrataWorkload
import Testing

@Suite struct CodecTests {
    static func randomValue(_ g: inout SplitMix64) -> Value {
        switch g.next() % 7 {
        case 0: .null
        case 1: .bool(g.next() % 2 == 0)
        case 2: .int(Int64(bitPattern: g.next()) >> (g.next() % 64))
        case 3: .double([Double(bitPattern: g.next()), -0.0, 0.0, .infinity, -.infinity, .nan, Double(Int64(bitPattern: g.next() % 1000))][Int(g.next() % 7)])
        case 4: .string(String((0..<(g.next() % 20)).map { _ in ["a", "z", "é", "\u{0}", "🙂", " "][Int(g.next() % 6)] }))
        case 5: .bytes((0..<(g.next() % 20)).map { _ in UInt8(truncatingIfNeeded: g.next() % 3 == 0 ? 0 : g.next()) })
        default: .timestamp(Date(timeIntervalSince1970: Double(Int64(bitPattern: g.next() % 4_000_000_000)) / 1000))
        }
    }

    @Test func valuesRoundTripAndEncodeCanonically() throws {
        var g = SplitMix64(seed: testSeed("valuesRoundTrip"))
        for _ in 0..<5000 {
            let v = Self.randomValue(&g)
            let bytes = v.encoded
            let back = try bytes.withUnsafeBytes { try Value(decoding: $0) }
            #expect(back == v)
            #expect(back.encoded == bytes)
            let skipped = try bytes.withUnsafeBytes { b in
                var r = ByteReader(b)
                return try r.skipValue()
            }
            #expect(skipped == 0..<bytes.count)
        }
    }

    @Test func truncatedValuesAreReportedNotMisread() throws {
        var g = SplitMix64(seed: testSeed("truncatedValues"))
        for _ in 0..<2000 {
            let bytes = Self.randomValue(&g).encoded
            guard bytes.count > 1 else { continue }
            let cut = Array(bytes.prefix(Int(g.next() % UInt64(bytes.count))))
            let error = #expect(throws: StrataError.self) { try cut.withUnsafeBytes { try Value(decoding: $0) } }
            #expect(error?.code == .corruptRecord)
        }
    }

    /// Natural order within one type; across types, the key tag order.
    static func precedes(_ a: Value, _ b: Value) -> Bool {
        switch (a, b) {
        case (.int(let x), .int(let y)): x < y
        case (.double(let x), .double(let y)): x < y || (x == 0 && y == 0 && x.sign == .minus && y.sign == .plus)
        case (.string(let x), .string(let y)): Array(x.utf8).lexicographicallyPrecedes(y.utf8)
        case (.bytes(let x), .bytes(let y)): x.lexicographicallyPrecedes(y)
        default: false
        }
    }

    @Test(arguments: ["int", "double", "string", "bytes"])
    func keyEncodingPreservesOrder(_ kind: String) throws {
        var g = SplitMix64(seed: testSeed("keyEncodingPreservesOrder-\(kind)"))
        func make() -> Value {
            switch kind {
            case "int": .int(Int64(bitPattern: g.next()) >> (g.next() % 64))
            case "double": .double([Double(Int64(bitPattern: g.next())) / 1e6, -0.0, 0.0, -.infinity, .infinity, 1e-300, -1e-300][Int(g.next() % 7)])
            case "string": .string(String((0..<(g.next() % 5)).map { _ in ["a", "b", "\u{0}", "é"][Int(g.next() % 4)] }))
            default: .bytes((0..<(g.next() % 5)).map { _ in [0, 1, 0xFF][Int(g.next() % 3)] })
            }
        }
        for _ in 0..<3000 {
            // Composite keys: (value, int) pairs, so a component boundary is exercised too.
            let a = [make(), Value.int(Int64(g.next() % 3))]
            let b = [make(), Value.int(Int64(g.next() % 3))]
            func enc(_ k: [Value]) -> [UInt8] {
                var w = ByteWriter()
                for v in k { KeyCodec.append(v, to: &w) }
                return w.bytes
            }
            let expected = Self.precedes(a[0], b[0]) || (a[0] == b[0] && Self.precedes(a[1], b[1]))
            #expect(enc(a).lexicographicallyPrecedes(enc(b)) == expected, "\(a) vs \(b)")
            let decoded = try enc(a).withUnsafeBytes { b in
                var r = ByteReader(b)
                return try KeyCodec.readKey(&r, count: 2)
            }
            #expect(decoded.values == a)
        }
    }

    @Test func rowsComeBackInKeyOrder() throws {
        try withStore { store, _ in
            try store.createTable(.fixed("words", primaryKey: ["w", "n"], fields: [.string("w"), .int("n")]))
            let keys: [RowKey] = [["b", 1], ["a", -5], ["a\u{0}", 0], ["", 3], ["a", 2], ["ab", -1]]
            try store.write { tx in for k in keys { try tx.insert("words", ["w": k.values[0], "n": k.values[1]]) } }
            let read = try store.read { try $0.rows("words").map(\.key) }
            #expect(read == [["", 3], ["a", -5], ["a", 2], ["a\u{0}", 0], ["ab", -1], ["b", 1]])
        }
    }
}

import Foundation
import Strata
import StrataSync
import StrataWorkload
import Testing

/// The wire codec against the `Codable` path (`JSONDecoder`, `JSONEncoder` with sorted keys):
/// the same documents accepted, with equal values; the same documents refused, with the same
/// message when a document has one fault; the same bytes written. The codec's few extra
/// refusals are checked one by one.
@Suite struct WireCodecTests {
    // MARK: Both paths

    enum Outcome<T: Equatable>: Equatable {
        case value(T)
        case refused(String)

        var message: String? { if case .refused(let m) = self { m } else { nil } }
    }

    static func codec<T: Decodable & Equatable>(_ type: T.Type, _ bytes: [UInt8]) -> Outcome<T> {
        do { return .value(try WireFormat.decode(T.self, from: Data(bytes))) } catch {
            #expect(error.code == .malformedInput)
            return .refused(error.message)
        }
    }

    static func foundation<T: Decodable & Equatable>(_ type: T.Type, _ bytes: [UInt8]) -> Outcome<T> {
        do { return .value(try WireFormat.decodeWithFoundation(T.self, from: Data(bytes))) } catch {
            return .refused(error.message)
        }
    }

    /// The messages of the codec's refusals that the `Codable` path does not make.
    static let extraRefusals = [
        "duplicate key '", "a byte-order mark starts the document", "invalid JSON: a comma before",
        "is not an integer: an integer is written without a fraction or an exponent",
    ]

    static func isExtraRefusal(_ message: String) -> Bool {
        extraRefusals.contains { message.contains($0) }
    }

    /// Decodes `bytes` both ways and checks that they agree; returns whether the codec refused.
    @discardableResult
    static func agree<T: Decodable & Equatable>(_ type: T.Type, _ bytes: [UInt8], sameMessage: Bool = false, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        let mine = codec(T.self, bytes)
        let theirs = foundation(T.self, bytes)
        let doc = String(decoding: bytes, as: UTF8.self)
        switch (mine, theirs) {
        case (.value(let a), .value(let b)):
            #expect(a == b, "values differ for \(doc)", sourceLocation: sourceLocation)
        case (.refused(let m), .value):
            #expect(isExtraRefusal(m), "only the codec refused (\(m)): \(doc)", sourceLocation: sourceLocation)
        case (.value, .refused(let m)):
            Issue.record("only the Codable path refused (\(m)): \(doc)", sourceLocation: sourceLocation)
        case (.refused(let a), .refused(let b)):
            if sameMessage && !b.contains("The given data was not valid JSON") {
                #expect(a == b, "messages differ for \(doc)", sourceLocation: sourceLocation)
            }
        }
        return mine.message != nil
    }

    static func example(_ name: String) throws -> [UInt8] {
        Array(try WireFormatTests.example(name))
    }

    // MARK: Examples

    @Test func theSchemaExamplesDecodeAlikeAndRoundTrip() throws {
        let delta = try Self.example("delta.json"), batch = try Self.example("batch.json"), ack = try Self.example("ack.json")
        #expect(!Self.agree(ServerDelta.self, delta))
        #expect(!Self.agree(Batch.self, batch))
        #expect(!Self.agree(BatchAck.self, ack))
        let d = try WireFormat.decode(ServerDelta.self, from: Data(delta))
        let b = try WireFormat.decode(Batch.self, from: Data(batch))
        let a = try WireFormat.decode(BatchAck.self, from: Data(ack))
        #expect(try WireFormat.encode(d) == WireFormat.encodeWithFoundation(d))
        #expect(try WireFormat.encode(b) == WireFormat.encodeWithFoundation(b))
        #expect(try WireFormat.encode(a) == WireFormat.encodeWithFoundation(a))
        #expect(try WireFormat.decode(ServerDelta.self, from: WireFormat.encode(d)) == d)
        #expect(try WireFormat.decode(Batch.self, from: WireFormat.encode(b)) == b)
        #expect(try WireFormat.decode(BatchAck.self, from: WireFormat.encode(a)) == a)
        // The borrowed-bytes entry point reads the same page.
        #expect(try delta.withUnsafeBytes { try WireCodec.decodeServerDelta($0) } == d)
    }

    // MARK: Refusals with one fault: the same message

    static let oneFault: [(String, String)] = [
        ("ServerDelta", #"{"tables":[]}"#),
        ("ServerDelta", #"{"anchor":"a"}"#),
        ("ServerDelta", #"{"anchor":5,"tables":[]}"#),
        ("ServerDelta", #"{"anchor":null,"tables":[]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":null}"#),
        ("ServerDelta", #"{"anchor":"a","tables":{}}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[5]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[null]}"#),
        ("ServerDelta", #"{"anchor":"a","since":3,"tables":[]}"#),
        ("ServerDelta", #"{"anchor":"a","mode":"everything","tables":[]}"#),
        ("ServerDelta", #"{"anchor":"a","mode":1,"tables":[]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[],"colour":1}"#),
        ("ServerDelta", #"[]"#),
        ("ServerDelta", #"null"#),
        ("ServerDelta", #""x""#),
        ("ServerDelta", #"{"anchor":"a","tables":[{}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":{}}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":null}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":[]}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{},"timestamp":"x"}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{},"version":1}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{},"colour":1}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"title":"plain"}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"title":[]}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"int":1,"string":"x"}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"colour":1}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"int":1,"colour":1}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"int":"1"}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"int":null}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"int":true}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"double":"x"}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"bool":1}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"bool":null}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"string":5}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"string":null}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"double":null}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"timestamp":null}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"bytes":null}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"int":{}}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"int":[]}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":5}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{},"timestamp":true}]}]}"#),
        ("Batch", #"{"id":null,"clientID":"c","number":1,"changes":[]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":null,"changes":[]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":true,"changes":[]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":1,"changes":null}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":1,"changes":[{"table":"t","key":[],"kind":null}]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":1,"changes":[{"table":"t","key":null,"kind":"insert"}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[null],"status":"ok","error":{"reason":null,"action":"drop"}}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[null],"status":"ok","error":5}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[null],"status":"error","error":null}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"bytes":"QQ"}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"bytes":5}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{"n":{"timestamp":"x"}}}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","deletes":[{"int":1}]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","deletes":[[5]]}]}"#),
        ("ServerDelta", #"{"anchor":"a","tables":[{"table":"t","deletes":null,"upserts":null,"x":1}]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":0,"changes":[]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":"1","changes":[]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","changes":[]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":1,"changes":[{"table":"t","key":[],"kind":"upsert"}]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":1,"changes":[{"table":"t","kind":"insert"}]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":1,"changes":[{"table":"t","key":[],"kind":"insert","values":[]}]}"#),
        ("Batch", #"{"id":"c-1","clientID":"c","number":1,"changes":[{"table":"t","key":{},"kind":"insert"}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[{"int":1}],"status":"error"}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[{"int":1}],"status":"error","error":{"reason":"r"}}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[{"int":1}],"status":"error","error":{"reason":"r","action":"shrug"}}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[{"int":1}],"status":"ok","newKey":{}}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[{"int":1}],"status":"ok","serverValues":{"a":1}}]}"#),
        ("BatchAck", #"{"batchID":"b","results":[{"table":"t","key":[{"int":1}],"status":"fine"}]}"#),
        ("BatchAck", #"{"batchID":"b"}"#),
    ]

    @Test(arguments: oneFault.indices)
    func aDocumentWithOneFaultIsRefusedWithTheSameMessage(_ i: Int) throws {
        let (type, json) = Self.oneFault[i]
        let bytes = Array(json.utf8)
        let refused = switch type {
        case "ServerDelta": Self.agree(ServerDelta.self, bytes, sameMessage: true)
        case "Batch": Self.agree(Batch.self, bytes, sameMessage: true)
        default: Self.agree(BatchAck.self, bytes, sameMessage: true)
        }
        #expect(refused, "\(json)")
    }

    // MARK: The codec's extra refusals

    static func refusal<T: Decodable & Equatable>(_ type: T.Type, _ json: [UInt8]) -> String? {
        codec(T.self, json).message
    }

    static func delta(fields: String) -> [UInt8] {
        Array(#"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{\#(fields)}}]}]}"#.utf8)
    }

    @Test func anIntWithAFractionOrAnExponentIsNotAnInt() throws {
        for written in ["3.0", "3e0", "30e-1", "-0.0", "1E2"] {
            let doc = Self.delta(fields: #""n":{"int":\#(written)}"#)
            #expect(Self.refusal(ServerDelta.self, doc) == "malformed ServerDelta payload: tables[0].upserts[0].fields.n.int: \(written) is not an integer: an integer is written without a fraction or an exponent")
            // The Codable path cannot see how the number was written: it takes the value.
            guard case .value(let d) = Self.foundation(ServerDelta.self, doc) else { Issue.record("refused \(written)"); continue }
            #expect(d.tables[0].upserts[0].fields["n"]?.intValue != nil)
        }
        let batch = Array(#"{"id":"c-1","clientID":"c","number":1.0,"changes":[]}"#.utf8)
        #expect(Self.refusal(Batch.self, batch)?.hasSuffix("number: 1.0 is not an integer: an integer is written without a fraction or an exponent") == true)
        #expect(Self.foundation(Batch.self, batch).message == nil)
    }

    @Test func aDuplicateKeyIsRefusedWithItsPath() throws {
        let cases: [(String, String)] = [
            (#"{"anchor":"a","anchor":"b","tables":[]}"#, "the document: duplicate key 'anchor'"),
            (#"{"anchor":"a","tables":[{"table":"t","table":"u"}]}"#, "tables[0]: duplicate key 'table'"),
            (String(decoding: Self.delta(fields: #""title":null,"title":{"string":"x"}"#), as: UTF8.self), "tables[0].upserts[0].fields: duplicate key 'title'"),
            (String(decoding: Self.delta(fields: #""n":{"int":1,"int":2}"#), as: UTF8.self), "tables[0].upserts[0].fields.n: duplicate key 'int'"),
            // Two spellings of one name: one key of a Swift dictionary, and two names to Strata,
            // of which a row holds one. The message names both forms.
            (String(decoding: Self.delta(fields: "\"\u{E9}\":null,\"e\u{301}\":null"), as: UTF8.self),
             "tables[0].upserts[0].fields: duplicate key 'e\u{301}' (U+0065 U+0301): it differs from the key '\u{E9}' (U+00E9) only in Unicode form, and a row holds one of two such field names (Strata compares them by their bytes)"),
        ]
        for (json, message) in cases {
            #expect(Self.refusal(ServerDelta.self, Array(json.utf8)) == "malformed ServerDelta payload: \(message)")
            #expect(Self.foundation(ServerDelta.self, Array(json.utf8)).message == nil, "the Codable path keeps the first: \(json)")
        }
        let ack = #"{"batchID":"b","results":[{"table":"t","key":[null],"status":"ok","status":"ok"}]}"#
        #expect(Self.refusal(BatchAck.self, Array(ack.utf8)) == "malformed BatchAck payload: results[0]: duplicate key 'status'")
    }

    /// The codec makes a field map that repeats the last one's names from that map (no name
    /// made or hashed again); this walks it through every way the next map can differ: the
    /// same names, one changed, one in its other Unicode form, one fewer, one more, the order
    /// changed, a name twice. Each document must decode as the `Codable` path decodes it, and a
    /// name twice must be refused with the codec's message for it.
    @Test func fieldMapsThatRepeatTheLastOnesNamesDecodeAlike() throws {
        var g = SplitMix64(seed: testSeed("WireCodec repeatedFieldMaps"))
        let pool = ["title", "done", "priority", "notes", "\u{E9}t\u{E9}", "e\u{301}t\u{E9}", "a-name-longer-than-fifteen-bytes", "x"]
        func value(_ g: inout SplitMix64) -> String {
            switch g.below(4) {
            case 0: "null"
            case 1: #"{"int":\#(g.below(1000))}"#
            case 2: #"{"string":"v\#(g.below(1000))"}"#
            default: #"{"bool":\#(g.below(2) == 0)}"#
            }
        }
        var twice = 0
        for _ in 0..<300 {
            var names = Array(pool.shuffled(using: &g).prefix(1 + g.below(4)))
            var rows: [String] = []
            for _ in 0..<(2 + g.below(8)) {
                switch g.below(8) {
                case 0: names[g.below(names.count)] = pool[g.below(pool.count)]
                case 1: names.removeLast(names.count > 1 ? 1 : 0)
                case 2: names.append(pool[g.below(pool.count)])
                case 3: names.shuffle(using: &g)
                default: break   // the same names again (most often)
                }
                rows.append("{\"fields\":{" + names.map { "\"\($0)\":\(value(&g))" }.joined(separator: ",") + "}}")
            }
            let doc = Array(#"{"anchor":"a","tables":[{"table":"t","upserts":[\#(rows.joined(separator: ","))]}]}"#.utf8)
            if Self.agree(ServerDelta.self, doc) {
                // Only a name twice in one map may make the codec refuse what the other path takes.
                #expect(Self.refusal(ServerDelta.self, doc)?.contains("duplicate key '") == true)
                twice += 1
            }
        }
        // The draws must reach the refusal now and then, or the test says nothing of it.
        #expect(twice > 0)
    }

    @Test func batchNumberZeroIsRefusedByBothPaths() throws {
        let json = Array(#"{"id":"c-0","clientID":"c","number":0,"changes":[]}"#.utf8)
        let message = "malformed Batch payload: number: a batch number counts from 1"
        #expect(Self.refusal(Batch.self, json) == message)
        #expect(Self.foundation(Batch.self, json).message == message)
    }

    @Test func aByteOrderMarkIsRefused() throws {
        let json = [0xEF, 0xBB, 0xBF] + (try Self.example("delta.json"))
        #expect(Self.refusal(ServerDelta.self, json) == "malformed ServerDelta payload: the document: invalid JSON: a byte-order mark starts the document")
        #expect(Self.foundation(ServerDelta.self, json).message == nil)
    }

    @Test func aCommaBeforeAClosingBracketIsRefused() throws {
        for json in [#"{"anchor":"a","tables":[],}"#, #"{"anchor":"a","tables":[{"table":"t","deletes":[[null],]}]}"#] {
            #expect(Self.refusal(ServerDelta.self, Array(json.utf8))?.contains("invalid JSON: a comma before") == true)
            #expect(Self.foundation(ServerDelta.self, Array(json.utf8)).message == nil)
        }
    }

    @Test func aValueWithAKeyNamingNoTypeIsRefusedByBothPaths() throws {
        let json = Self.delta(fields: #""n":{"int":1,"colour":2}"#)
        let message = "malformed ServerDelta payload: tables[0].upserts[0].fields.n.colour: unknown field 'colour'"
        #expect(Self.refusal(ServerDelta.self, json) == message)
        #expect(Self.foundation(ServerDelta.self, json).message == message)
    }

    // MARK: JSON syntax and numbers

    static let syntax: [String] = [
        "", " ", "{", "}", "{]", "[", "{\"anchor\":\"a\",\"tables\":[]} x", "{\"anchor\":\"a\",\"tables\":[]}{",
        "{\"anchor\" \"a\",\"tables\":[]}", "{,\"anchor\":\"a\",\"tables\":[]}", "{\"anchor\":\"a\",,\"tables\":[]}",
        "{\"anchor\":'a',\"tables\":[]}", "{anchor:\"a\",\"tables\":[]}", "{\"anchor\":\"a\",\"tables\":[]}\u{0B}",
        "\u{0C}{\"anchor\":\"a\",\"tables\":[]}", " \r\n\t{ \"anchor\" : \"a\" , \"tables\" : [ ] } \r\n\t",
        "{\"anchor\":\"a\\u00e9\\ud83d\\ude00\\/\\b\\f\\n\\r\\t\\\"\\\\\",\"tables\":[]}",
        "{\"anchor\":\"\\ud800\",\"tables\":[]}", "{\"anchor\":\"\\udc00\",\"tables\":[]}",
        "{\"anchor\":\"\\ud800\\u0041\",\"tables\":[]}", "{\"anchor\":\"\\ud800x\",\"tables\":[]}",
        "{\"anchor\":\"\\x\",\"tables\":[]}", "{\"anchor\":\"\\u00G0\",\"tables\":[]}", "{\"anchor\":\"\\U0041\",\"tables\":[]}",
        "{\"anchor\":\"\\u0000\",\"tables\":[]}", "{\"anchor\":\"\u{7F}\u{2028}\",\"tables\":[]}",
        "{\"anchor\":\"a\",\"tables\":[],\"mode\":nul}", "{\"anchor\":\"a\",\"tables\":[],\"mode\":null}",
        "{\"anchor\":\"a\",\"tables\":[],\"since\":null}", "{\"anchor\":\"a\",\"tables\":[{\"table\":\"t\",\"upserts\":null,\"deletes\":null}]}",
        "{\"anchor\":\"a\",\"tables\":[],\"mode\":\"snapshot\"}", "{\"anchor\":\"a\",\"tables\":[]}\u{0}",
    ]

    @Test func syntaxIsJudgedAlike() throws {
        for json in Self.syntax { Self.agree(ServerDelta.self, Array(json.utf8)) }
        // Raw bytes that are not valid UTF-8, and raw control characters, in a string.
        for bad: [UInt8] in [[0xFF], [0xC0, 0xAF], [0xED, 0xA0, 0x80], [0xE2, 0x82], [0xF4, 0x90, 0x80, 0x80], [0x01], [0x1F], [0xC3, 0xA9], [0xF0, 0x9F, 0x98, 0x80]] {
            Self.agree(ServerDelta.self, Array(#"{"anchor":""#.utf8) + bad + Array(#"","tables":[]}"#.utf8))
            Self.agree(ServerDelta.self, Array(#"{"anchor":"a\n"#.utf8) + bad + Array(#"","tables":[]}"#.utf8))
        }
    }

    @Test func nestingIsLimitedAlike() throws {
        for depth in [509, 510, 511, 512, 600] {
            // A key is an array of values; a value is never an array, so deep arrays are refused
            // either way, but at a depth past the limit as invalid JSON by both.
            let keys = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
            Self.agree(ServerDelta.self, Array(#"{"anchor":"a","tables":[{"table":"t","deletes":\#(keys)}]}"#.utf8))
        }
    }

    static let numbers = [
        "0", "-0", "1", "-1", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
        "18446744073709551615", "18446744073709551616", "123456789012345678901234567890", "01", "-", "1.", ".5", "1e",
        "+1", "1.5", "0.1", "-0.0", "1e400", "-1e400", "1e-400", "2.4e-324", "2.5e-324", "4.9e-324", "1e-310",
        "1.7976931348623157e308", "1.7976931348623158e308", "1.7976931348623159e308", "2.2250738585072011e-308",
        "0.1000000000000000055511151231257827", "9007199254740993", "9007199254740993.0", "1e22", "1e23", "1E+2",
        "-1.5E-3", "0e-500", "0.0e5", "123456789012345678901234567890123456789012345678901234567890e-30",
        "0.30000000000000004", "1e-7", "100000000000000000000e-2", "1.0e0000000000000000000000000001",
    ]

    @Test(arguments: numbers)
    func numbersAreReadAlike(_ n: String) throws {
        for type in ["int", "double", "timestamp"] {
            Self.agree(ServerDelta.self, Self.delta(fields: #""n":{"\#(type)":\#(n)}"#))
        }
        Self.agree(ServerDelta.self, Array(#"{"anchor":"a","tables":[{"table":"t","upserts":[{"fields":{},"timestamp":\#(n)}]}]}"#.utf8))
        Self.agree(Batch.self, Array(#"{"id":"c-1","clientID":"c","number":\#(n),"changes":[]}"#.utf8))
    }

    // MARK: Randomized documents

    /// Random payloads: every value type, strings with escapes, control characters, slashes and
    /// characters outside the BMP, doubles at the edges of their formatting.
    struct Generator {
        var g: SplitMix64

        mutating func int(_ n: Int) -> Int { Int(g.next() % UInt64(n)) }

        mutating func string() -> String {
            let pieces = ["a", "task", "/", "\\", "\"", "\u{0}", "\u{1}", "\u{1F}", "\u{7F}", "\n", "\t", "\u{8}", "\u{C}", "\r",
                          "é", "e\u{301}", "\u{2028}", "😀", "中", "ｱ", " ", "A", "z", "0", "10", "_", "~", "\u{FEFF}"]
            return (0..<int(6)).map { _ in pieces[int(pieces.count)] }.joined()
        }

        mutating func double() -> Double {
            let edges: [Double] = [0, -0.0, 1, -1, 0.1, 2.5, 1e15, 1e16, 9007199254740992, 9999999999999998, 1e-7, 1e-5, 1e-4,
                                   .leastNonzeroMagnitude, .leastNormalMagnitude, .greatestFiniteMagnitude, -.greatestFiniteMagnitude, 1763700000.5,
                                   123456789012345.6, 1e21, 1e22, 1e23, 0.30000000000000004, 1 / 3]
            switch int(4) {
            case 0: return edges[int(edges.count)]
            case 1: return Double(Int64(bitPattern: g.next()) % 1_000_000_000) / 1000
            case 2:
                let d = Double(bitPattern: g.next())
                return d.isFinite ? d : 1
            default: return Double(Int64(bitPattern: g.next()))
            }
        }

        mutating func value() -> Value {
            switch int(8) {
            case 0: return .null
            case 1: return .bool(int(2) == 0)
            case 2: return .int([0, 1, -1, .max, .min, Int64(bitPattern: g.next())][int(6)])
            case 3: return .double(double())
            case 4: return .string(string())
            case 5: return .bytes((0..<int(9)).map { _ in UInt8(truncatingIfNeeded: g.next()) })
            case 6: return .timestamp(Date(timeIntervalSince1970: double()))
            default: return .int(Int64(int(1000)))
            }
        }

        mutating func fields() -> [String: Value] {
            var f: [String: Value] = [:]
            for _ in 0..<int(6) { f[string()] = value() }
            return f
        }

        mutating func key() -> RowKey { RowKey((0..<1 + int(2)).map { _ in value() }) }

        mutating func delta() -> ServerDelta {
            ServerDelta(since: int(2) == 0 ? nil : string(), anchor: string(), mode: int(2) == 0 ? .incremental : .snapshot,
                        tables: (0..<int(3)).map { _ in
                            TableDelta(string(), upserts: (0..<int(4)).map { _ in
                                ServerRow(fields(), version: int(2) == 0 ? nil : string(), timestamp: int(2) == 0 ? nil : Date(timeIntervalSince1970: double()))
                            }, deletes: (0..<int(3)).map { _ in key() })
                        })
        }

        mutating func batch() -> Batch {
            let kinds: [RowChange.Kind] = [.insert, .update, .delete]
            return Batch(id: string(), clientID: string(), number: 1 + g.next() % UInt64.max, changes: (0..<int(4)).map { _ in
                RowChange(table: string(), key: key(), kind: kinds[int(3)], values: fields(), originals: fields())
            })
        }

        mutating func ack() -> BatchAck {
            let statuses: [RowResult.Status] = [.ok, .conflict, .error]
            let actions: [RowError.Action] = [.drop, .recreate, .retry, .rollback, .setAside]
            return BatchAck(batchID: string(), results: (0..<int(4)).map { _ in
                let status = statuses[int(3)]
                return RowResult(table: string(), key: key(), status: status,
                                 serverValues: int(2) == 0 ? nil : fields(), newKey: int(2) == 0 ? nil : key(),
                                 error: status == .error || int(3) == 0 ? RowError(reason: string(), action: actions[int(5)]) : nil)
            })
        }

        /// The document written differently but meaning the same: whitespace between tokens, and
        /// some characters of strings written as `\u` escapes (surrogate pairs beyond the BMP).
        mutating func rewrite(_ doc: [UInt8]) -> [UInt8] {
            var out: [UInt8] = []
            var i = 0
            var inString = false
            let ws: [UInt8] = [0x20, 0x0A, 0x0D, 0x09]
            while i < doc.count {
                let b = doc[i]
                if !inString {
                    out.append(b)
                    if b == UInt8(ascii: "\"") { inString = true }
                    if [UInt8(ascii: ","), UInt8(ascii: ":"), UInt8(ascii: "{"), UInt8(ascii: "[")].contains(b) && int(3) == 0 {
                        out.append(ws[int(4)])
                    }
                    i += 1
                    continue
                }
                if b == UInt8(ascii: "\"") { inString = false; out.append(b); i += 1; continue }
                if b == UInt8(ascii: "\\") {  // an escape: kept as it is
                    let n = doc[i + 1] == UInt8(ascii: "u") ? 6 : 2
                    out.append(contentsOf: doc[i..<i + n])
                    i += n
                    continue
                }
                let width = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4
                if int(4) == 0, let scalar = String(decoding: doc[i..<i + width], as: UTF8.self).unicodeScalars.first {
                    for unit in String(scalar).utf16 {
                        let hex = String(unit, radix: 16)
                        out.append(contentsOf: Array(("\\u" + String(repeating: "0", count: 4 - hex.count) + hex).utf8))
                    }
                } else {
                    out.append(contentsOf: doc[i..<i + width])
                }
                i += width
            }
            return out
        }
    }

    @Test func randomDocumentsDecodeAndEncodeAlike() throws {
        var gen = Generator(g: SplitMix64(seed: testSeed("WireCodec randomDocuments")))
        for i in 0..<1500 {
            switch i % 3 {
            case 0: try Self.check(gen.delta(), &gen)
            case 1: try Self.check(gen.batch(), &gen)
            default: try Self.check(gen.ack(), &gen)
            }
        }
    }

    /// Where two encodings part, with some bytes of context, escaped.
    static func firstDifference(_ a: Data, _ b: Data) -> String {
        let at = Array(zip(a, b)).firstIndex { $0 != $1 } ?? min(a.count, b.count)
        let a = Data(a), b = Data(b)
        func around(_ d: Data) -> String { String(decoding: d[max(0, at - 40)..<min(d.count, at + 30)], as: UTF8.self).debugDescription }
        return "at \(at):\n\(around(a))\n\(around(b))"
    }

    static func check<T: Codable & Equatable>(_ value: T, _ gen: inout Generator, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let reference = try WireFormat.encodeWithFoundation(value)
        let mine = try WireFormat.encode(value)
        #expect(mine == reference, "bytes differ: \(firstDifference(mine, reference))", sourceLocation: sourceLocation)
        #expect(!agree(T.self, Array(reference), sourceLocation: sourceLocation))
        #expect(!agree(T.self, gen.rewrite(Array(reference)), sourceLocation: sourceLocation))
    }

    @Test func fieldMapsKeysAndValuesEncodeAlike() throws {
        var gen = Generator(g: SplitMix64(seed: testSeed("WireCodec fieldMaps")))
        for _ in 0..<2000 {
            let f = gen.fields(), k = gen.key(), v = gen.value()
            let (fa, fb) = (try WireFormat.encode(f), try WireFormat.encodeWithFoundation(f))
            #expect(fa == fb, "\(Self.firstDifference(fa, fb))")
            #expect(try WireFormat.encode(k) == WireFormat.encodeWithFoundation(k))
            #expect(try WireFormat.encode(k.values) == WireFormat.encodeWithFoundation(k.values))
            let (va, vb) = (try WireFormat.encode(v), try WireFormat.encodeWithFoundation(v))
            #expect(va == vb, "\(Self.firstDifference(va, vb))")
            #expect(!Self.agree([String: Value].self, Array(try WireFormat.encode(f))))
            #expect(!Self.agree([Value].self, Array(try WireFormat.encode(k.values))))
        }
    }

    @Test func aNonFiniteDoubleIsRefusedAsTheEncoderRefusesIt() throws {
        for bad in [Double.nan, .infinity, -.infinity] {
            let row = ServerDelta(anchor: "a", tables: [TableDelta("t", upserts: [ServerRow(["x": .double(bad)])])])
            let mine = #expect(throws: StrataError.self) { try WireFormat.encode(row) }
            let theirs = #expect(throws: StrataError.self) { try WireFormat.encodeWithFoundation(row) }
            #expect(mine?.message == theirs?.message)
        }
    }

    // MARK: Mutations

    /// The fuzz corpus of `WireFuzzTests` (the examples, mutated) and mutated random documents:
    /// both paths accept and refuse alike, with equal values.
    @Test func mutatedPayloadsAreJudgedAlike() throws {
        var gen = Generator(g: SplitMix64(seed: testSeed("WireCodec mutatedPayloads")))
        let examples = try ["delta.json", "batch.json", "ack.json"].map { try Self.example($0) }
        var refused = 0, extra = 0
        for i in 0..<9000 {
            var b: [UInt8]
            if i % 2 == 0 {
                b = examples[i % 3]
            } else {
                b = switch i % 3 {
                case 0: Array(try WireFormat.encode(gen.delta()))
                case 1: Array(try WireFormat.encode(gen.batch()))
                default: Array(try WireFormat.encode(gen.ack()))
                }
            }
            let noise = Array("{}[]\":,0-9ex\\.nul ".utf8)
            for _ in 0..<(1 + gen.int(3)) where !b.isEmpty {
                let at = gen.int(b.count)
                switch gen.int(4) {
                case 0: b[at] = noise[gen.int(noise.count)]
                case 1: b.remove(at: at)
                case 2: b.insert(noise[gen.int(noise.count)], at: at)
                default: b = Array(b.prefix(at))
                }
            }
            let codecRefused = switch i % 3 {
            case 0: Self.agree(ServerDelta.self, b)
            case 1: Self.agree(Batch.self, b)
            default: Self.agree(BatchAck.self, b)
            }
            if codecRefused { refused += 1 }
            let theirs: String? = switch i % 3 {
            case 0: Self.foundation(ServerDelta.self, b).message
            case 1: Self.foundation(Batch.self, b).message
            default: Self.foundation(BatchAck.self, b).message
            }
            if codecRefused && theirs == nil { extra += 1 }
        }
        print("WireCodec mutatedPayloads: \(refused) of 9000 refused, \(extra) of them by the codec alone")
        #expect(refused > 4000)
    }
}

import Foundation
import Strata

/// The wire format's purpose-built codec: ``ServerDelta``, ``Batch`` and ``BatchAck`` (and the
/// types inside them) decoded straight from bytes and encoded straight to bytes, without
/// Foundation's `JSONDecoder` and `JSONEncoder`.
///
/// ``WireFormat/decode(_:from:)`` and ``WireFormat/encode(_:)`` go through it for these types; the
/// `Codable` conformances stay, for the API and as the reference the tests hold the codec to
/// (`WireCodecTests`): the same documents are accepted, with the same values, and the same bytes
/// are written. A refused document gets the same path as the `Codable` path gives
/// (`tables[0].upserts[2].fields.title`), and for a document with a single fault, the same message.
///
/// The codec is stricter than the `Codable` path in a few places, each a document the schema
/// already rules out:
/// - a duplicate key in any object is refused, naming the object's path and the key
///   (`JSONDecoder` keeps the first); two field names that Swift's `String` calls equal
///   (`"é"` and `"e\u{301}"`) are one key of a `[String: Value]`, so they are duplicates too,
///   and the message names both forms (a row holds one of two such names: `RowRule`);
/// - an integer written with a fraction or an exponent (`{"int": 3.0}`, `"number": 1e1`) is
///   refused (`JSONDecoder` accepts any number whose value is an integer);
/// - a leading byte-order mark, and a comma before a closing bracket or brace, are refused
///   (`JSONDecoder` accepts both).
///
/// Messages for documents that are not valid JSON, or that hold a number out of range, say what
/// and where (`invalid JSON: expected ',' or '}', found ']' at offset 40`); `JSONDecoder` says
/// only that "the given data was not valid JSON". A document with several faults may be refused
/// for a different one of them: the codec reads in document order, `JSONDecoder` checks the
/// whole syntax first, then each type its fields in declaration order.
package enum WireCodec {}

/// A decoding error of the wire codec: what was wrong, and where.
package struct WireCodecError: Error {
    /// One step of a path: a field name or an array index.
    enum Step {
        case key(String)
        case index(Int)
    }

    /// What was wrong.
    var what: String
    /// The path to the offending value, innermost step first.
    var steps: [Step] = []

    init(_ what: String) { self.what = what }

    /// The error, as seen from the container holding the value at `step`.
    func at(_ step: Step) -> WireCodecError {
        var e = self
        e.steps.append(step)
        return e
    }

    func at(_ key: StaticString) -> WireCodecError { at(.key("\(key)")) }

    /// The path as the `Codable` path writes it: `tables[0].upserts[2].fields.title`.
    var path: String {
        var out = ""
        for step in steps.reversed() {
            switch step {
            case .index(let i): out += "[\(i)]"
            case .key(let k): out += out.isEmpty ? k : ".\(k)"
            }
        }
        return out.isEmpty ? "the document" : out
    }

    var message: String { "\(path): \(what)" }
}

// MARK: - Entry points

extension WireCodec {
    /// Decodes a ``ServerDelta`` page from borrowed bytes, without copying them into `Data`.
    ///
    /// - Parameter bytes: the JSON document; only read during the call.
    /// - Throws: `StrataError` `malformedInput`, naming the path of the offending value.
    /// - Complexity: O(*n*) in the length of `bytes`.
    package static func decodeServerDelta(_ bytes: UnsafeRawBufferPointer) throws(StrataError) -> ServerDelta {
        try document(bytes, ServerDelta.self, serverDelta)
    }

    /// Decodes `T` from `data` if the codec handles `T`; `nil` for any other type.
    package static func decode<T>(_ type: T.Type, from data: Data) throws(StrataError) -> T? {
        let result: Result<T?, StrataError> = data.withUnsafeBytes { bytes in
            do throws(StrataError) {
                return .success(try decode(T.self, from: bytes))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    /// Decodes `T` from borrowed bytes if the codec handles `T`; `nil` for any other type.
    package static func decode<T>(_ type: T.Type, from bytes: UnsafeRawBufferPointer) throws(StrataError) -> T? {
        if T.self == ServerDelta.self { return try document(bytes, T.self, serverDelta) as? T }
        if T.self == Batch.self { return try document(bytes, T.self, batch) as? T }
        if T.self == BatchAck.self { return try document(bytes, T.self, batchAck) as? T }
        if T.self == [RowChange].self { return try document(bytes, T.self, { (r: inout JSONReader) throws(WireCodecError) in try array(&r, rowChange) }) as? T }
        if T.self == [String: Value].self { return try document(bytes, T.self, fields) as? T }
        if T.self == [Value].self { return try document(bytes, T.self, { (r: inout JSONReader) throws(WireCodecError) in try array(&r, value) }) as? T }
        if T.self == RowKey.self { return try document(bytes, T.self, rowKey) as? T }
        if T.self == Value.self { return try document(bytes, T.self, value) as? T }
        return nil
    }

    /// Reads one whole document with `body`.
    private static func document<T, R>(_ bytes: UnsafeRawBufferPointer, _ type: T.Type, _ body: (inout JSONReader) throws(WireCodecError) -> R) throws(StrataError) -> R {
        var r = JSONReader(bytes)
        do {
            try r.beginDocument()
            let v = try body(&r)
            try r.endDocument()
            return v
        } catch {
            throw StrataError(.malformedInput, "malformed \(T.self) payload: \(error.message)", cause: error)
        }
    }
}

// MARK: - Shared decoding rules

extension WireCodec {
    /// The error for a value of the wrong JSON type, in the words of `JSONDecoder`.
    static func mismatch(_ r: JSONReader, _ expected: String) -> WireCodecError {
        switch r.nextKind() {
        case .null: WireCodecError("expected \(expected), found null")
        case .invalid: r.syntaxError("a value")
        default: WireCodecError("expected \(expected)")
        }
    }

    static let objectType = "Dictionary<String, Any>"
    static let arrayType = "Array<Any>"

    static func unknownField(_ r: JSONReader, _ key: JSONReader.Key) -> WireCodecError {
        let name = r.string(key)
        return WireCodecError("unknown field '\(name)'").at(.key(name))
    }

    static func duplicate(_ name: String) -> WireCodecError {
        WireCodecError("duplicate key '\(name)'")
    }

    static func missing(_ key: StaticString) -> WireCodecError {
        WireCodecError("missing").at(key)
    }

    /// Reads `{` of a struct's object, or throws the mismatch `JSONDecoder` reports.
    @inline(__always)
    static func beginStruct(_ r: inout JSONReader) throws(WireCodecError) -> Bool {
        guard r.nextKind() == .object else { throw mismatch(r, objectType) }
        return try r.beginObject()
    }

    /// Records that field `bit` was read, refusing a second time.
    @inline(__always)
    static func see(_ bit: Int, _ seen: inout UInt32, _ name: StaticString) throws(WireCodecError) {
        if seen & 1 << bit != 0 { throw duplicate("\(name)") }
        seen |= 1 << bit
    }

    static func string(_ r: inout JSONReader) throws(WireCodecError) -> String {
        guard r.nextKind() == .string else { throw mismatch(r, "String") }
        return try r.readString()
    }

    /// `decodeIfPresent(String.self, …)`: `null` is absent.
    static func optionalString(_ r: inout JSONReader) throws(WireCodecError) -> String? {
        if try r.readNull() { return nil }
        return try string(&r)
    }

    static func double(_ r: inout JSONReader) throws(WireCodecError) -> Double {
        guard r.nextKind() == .number else { throw mismatch(r, "Double") }
        let n = try r.readNumber()
        guard let d = r.double(n) else { throw WireCodecError("\(r.text(n)) is out of range for Double") }
        return d
    }

    static func int64(_ r: inout JSONReader) throws(WireCodecError) -> Int64 {
        guard r.nextKind() == .number else { throw mismatch(r, "Int64") }
        let n = try r.readNumber()
        guard n.isInteger else { throw notAnInteger(r, n) }
        guard let i = r.int64(n) else { throw WireCodecError("\(r.text(n)) is out of range for Int64") }
        return i
    }

    static func uint64(_ r: inout JSONReader) throws(WireCodecError) -> UInt64 {
        guard r.nextKind() == .number else { throw mismatch(r, "UInt64") }
        let n = try r.readNumber()
        guard n.isInteger else { throw notAnInteger(r, n) }
        guard let m = r.magnitude(n), !n.isNegative || m == 0 else { throw WireCodecError("\(r.text(n)) is out of range for UInt64") }
        return m
    }

    /// An integer written with a fraction or an exponent: refused by the codec alone.
    static func notAnInteger(_ r: JSONReader, _ n: JSONReader.Number) -> WireCodecError {
        WireCodecError("\(r.text(n)) is not an integer: an integer is written without a fraction or an exponent")
    }

    /// A `String`-backed enum, with `RawRepresentable`'s message for an unknown raw value.
    static func enumeration<E: RawRepresentable<String>>(_ r: inout JSONReader, _ type: E.Type) throws(WireCodecError) -> E {
        let raw = try string(&r)
        guard let e = E(rawValue: raw) else { throw WireCodecError("Cannot initialize \(E.self) from invalid String value \(raw)") }
        return e
    }

    /// An array of `element`s, each error given its index.
    static func array<E>(_ r: inout JSONReader, _ element: (inout JSONReader) throws(WireCodecError) -> E) throws(WireCodecError) -> [E] {
        guard r.nextKind() == .array else { throw mismatch(r, arrayType) }
        var out: [E] = []
        guard try r.beginArray() else { return out }
        repeat {
            do { out.append(try element(&r)) } catch { throw error.at(.index(out.count)) }
        } while try r.nextElement()
        return out
    }

    /// `decodeIfPresent([E].self, …) ?? []`.
    static func optionalArray<E>(_ r: inout JSONReader, _ element: (inout JSONReader) throws(WireCodecError) -> E) throws(WireCodecError) -> [E] {
        if try r.readNull() { return [] }
        return try array(&r, element)
    }
}

// MARK: - Values

extension WireCodec {
    /// `null`, or an object with exactly one of the keys `bool`, `int`, `double`, `string`,
    /// `bytes`, `timestamp`, as ``Value``'s `init(from:)` decodes it.
    static func value(_ r: inout JSONReader) throws(WireCodecError) -> Value {
        if try r.readNull() { return .null }
        guard r.nextKind() == .object else { throw mismatch(r, objectType) }
        guard try r.beginObject() else { throw WireCodecError(Value.oneKeyMessage) }
        let key = try r.readKey()
        let v: Value
        if r.key(key, is: "int") {
            do { v = .int(try int64(&r)) } catch { throw error.at("int") }
        } else if r.key(key, is: "string") {
            do { v = .string(try string(&r)) } catch { throw error.at("string") }
        } else if r.key(key, is: "double") {
            do { v = .double(try double(&r)) } catch { throw error.at("double") }
        } else if r.key(key, is: "bool") {
            do { v = .bool(try bool(&r)) } catch { throw error.at("bool") }
        } else if r.key(key, is: "timestamp") {
            do { v = .timestamp(Date(timeIntervalSince1970: try double(&r))) } catch { throw error.at("timestamp") }
        } else if r.key(key, is: "bytes") {
            do { v = .bytes(try base64(&r)) } catch { throw error.at("bytes") }
        } else {
            throw unknownField(r, key)
        }
        guard try r.nextMember() else { return v }
        // A second key: the same one again, one the format does not know, or another type.
        let second = try r.readKey()
        let name = r.string(second)
        if name == v.type?.rawValue { throw duplicate(name) }
        if ValueType(rawValue: name) == nil { throw WireCodecError("unknown field '\(name)'").at(.key(name)) }
        throw WireCodecError(Value.oneKeyMessage)
    }

    static func bool(_ r: inout JSONReader) throws(WireCodecError) -> Bool {
        // `JSONDecoder` reports a `null` bool as a mismatch, not as a missing value.
        guard r.nextKind() == .bool else { throw r.nextKind() == .null ? WireCodecError("expected Bool") : mismatch(r, "Bool") }
        return try r.readBool()
    }

    /// Base64 as `Data(base64Encoded:)` reads it (the one rule for both paths).
    static func base64(_ r: inout JSONReader) throws(WireCodecError) -> [UInt8] {
        guard r.nextKind() == .string else { throw mismatch(r, "String") }
        let key = try r.readStringBytes()
        let data = r.withBytes(of: key) { Data(base64Encoded: Data($0)) }
        guard let data else { throw WireCodecError("bytes must be base64") }
        r.skipWhitespace()
        return Array(data)
    }

    /// A row key: an array of values.
    static func rowKey(_ r: inout JSONReader) throws(WireCodecError) -> RowKey {
        RowKey(try array(&r, value))
    }

    /// A field map; a name twice is refused (the `Codable` path keeps the first).
    static func fields(_ r: inout JSONReader) throws(WireCodecError) -> [String: Value] {
        guard r.nextKind() == .object else { throw mismatch(r, objectType) }
        guard try r.beginObject() else { return [:] }
        r.fieldShape.begin()
        repeat {
            // Two statements: `r.withBytes(of: try r.readKey(), …)` would read the key from a copy
            // of `r` taken before the key was read.
            let key = try r.readKey()
            let name = r.fieldName(key)
            let v: Value
            do { v = try value(&r) } catch { throw error.at(.key(name)) }
            r.fieldShape.value(v)
        } while try r.nextMember()
        return try r.fieldShape.finish { name, held in
            held.sameBytes(name) ? duplicate(name) : WireCodecError("duplicate key '\(name)' (\(name.codePoints)): it differs from the key '\(held)' (\(held.codePoints)) only in Unicode form, and a row holds one of two such field names (Strata compares them by their bytes)")
        }
    }

    /// `decodeIfPresent([String: Value].self, …)`: `null` is absent.
    static func optionalFields(_ r: inout JSONReader) throws(WireCodecError) -> [String: Value]? {
        if try r.readNull() { return nil }
        return try fields(&r)
    }

    static func optionalRowKey(_ r: inout JSONReader) throws(WireCodecError) -> RowKey? {
        if try r.readNull() { return nil }
        return try rowKey(&r)
    }
}

// MARK: - Deltas

extension WireCodec {
    static func serverDelta(_ r: inout JSONReader) throws(WireCodecError) -> ServerDelta {
        var since: String?
        var anchor: String?
        var mode: ServerDelta.Mode?
        var tables: [TableDelta]?
        var seen: UInt32 = 0
        if try beginStruct(&r) {
            repeat {
                let key = try r.readKey()
                if r.key(key, is: "tables") {
                    try see(0, &seen, "tables")
                    do { tables = try array(&r, tableDelta) } catch { throw error.at("tables") }
                } else if r.key(key, is: "anchor") {
                    try see(1, &seen, "anchor")
                    do { anchor = try string(&r) } catch { throw error.at("anchor") }
                } else if r.key(key, is: "since") {
                    try see(2, &seen, "since")
                    do { since = try optionalString(&r) } catch { throw error.at("since") }
                } else if r.key(key, is: "mode") {
                    try see(3, &seen, "mode")
                    do { mode = try r.readNull() ? nil : try enumeration(&r, ServerDelta.Mode.self) } catch { throw error.at("mode") }
                } else {
                    throw unknownField(r, key)
                }
            } while try r.nextMember()
        }
        guard let anchor else { throw missing("anchor") }
        guard let tables else { throw missing("tables") }
        return ServerDelta(since: since, anchor: anchor, mode: mode ?? .incremental, tables: tables)
    }

    static func tableDelta(_ r: inout JSONReader) throws(WireCodecError) -> TableDelta {
        var table: String?
        var upserts: [ServerRow] = []
        var deletes: [RowKey] = []
        var seen: UInt32 = 0
        if try beginStruct(&r) {
            repeat {
                let key = try r.readKey()
                if r.key(key, is: "upserts") {
                    try see(0, &seen, "upserts")
                    do { upserts = try optionalArray(&r, serverRow) } catch { throw error.at("upserts") }
                } else if r.key(key, is: "table") {
                    try see(1, &seen, "table")
                    do { table = try string(&r) } catch { throw error.at("table") }
                } else if r.key(key, is: "deletes") {
                    try see(2, &seen, "deletes")
                    do { deletes = try optionalArray(&r, rowKey) } catch { throw error.at("deletes") }
                } else {
                    throw unknownField(r, key)
                }
            } while try r.nextMember()
        }
        guard let table else { throw missing("table") }
        return TableDelta(table, upserts: upserts, deletes: deletes)
    }

    static func serverRow(_ r: inout JSONReader) throws(WireCodecError) -> ServerRow {
        var fields: [String: Value]?
        var version: String?
        var timestamp: Double?
        var seen: UInt32 = 0
        if try beginStruct(&r) {
            repeat {
                let key = try r.readKey()
                if r.key(key, is: "fields") {
                    try see(0, &seen, "fields")
                    do { fields = try Self.fields(&r) } catch { throw error.at("fields") }
                } else if r.key(key, is: "version") {
                    try see(1, &seen, "version")
                    do { version = try optionalString(&r) } catch { throw error.at("version") }
                } else if r.key(key, is: "timestamp") {
                    try see(2, &seen, "timestamp")
                    do { timestamp = try r.readNull() ? nil : try double(&r) } catch { throw error.at("timestamp") }
                } else {
                    throw unknownField(r, key)
                }
            } while try r.nextMember()
        }
        guard let fields else { throw missing("fields") }
        return ServerRow(fields, version: version, timestamp: timestamp.map(Date.init(timeIntervalSince1970:)))
    }
}

// MARK: - Batches and acknowledgements

extension WireCodec {
    static func batch(_ r: inout JSONReader) throws(WireCodecError) -> Batch {
        var id: String?
        var clientID: String?
        var number: UInt64?
        var changes: [RowChange]?
        var seen: UInt32 = 0
        if try beginStruct(&r) {
            repeat {
                let key = try r.readKey()
                if r.key(key, is: "changes") {
                    try see(0, &seen, "changes")
                    do { changes = try array(&r, rowChange) } catch { throw error.at("changes") }
                } else if r.key(key, is: "id") {
                    try see(1, &seen, "id")
                    do { id = try string(&r) } catch { throw error.at("id") }
                } else if r.key(key, is: "clientID") {
                    try see(2, &seen, "clientID")
                    do { clientID = try string(&r) } catch { throw error.at("clientID") }
                } else if r.key(key, is: "number") {
                    try see(3, &seen, "number")
                    do { number = try batchNumber(&r) } catch { throw error.at("number") }
                } else {
                    throw unknownField(r, key)
                }
            } while try r.nextMember()
        }
        guard let id else { throw missing("id") }
        guard let clientID else { throw missing("clientID") }
        guard let number else { throw missing("number") }
        guard let changes else { throw missing("changes") }
        return Batch(id: id, clientID: clientID, number: number, changes: changes)
    }

    /// A batch number: an integer from 1.
    static func batchNumber(_ r: inout JSONReader) throws(WireCodecError) -> UInt64 {
        let n = try uint64(&r)
        guard n >= 1 else { throw WireCodecError(Batch.numberMessage) }
        return n
    }

    static func rowChange(_ r: inout JSONReader) throws(WireCodecError) -> RowChange {
        var table: String?
        var key: RowKey?
        var kind: RowChange.Kind?
        var values: [String: Value]?
        var originals: [String: Value]?
        var seen: UInt32 = 0
        if try beginStruct(&r) {
            repeat {
                let k = try r.readKey()
                if r.key(k, is: "values") {
                    try see(0, &seen, "values")
                    do { values = try optionalFields(&r) } catch { throw error.at("values") }
                } else if r.key(k, is: "key") {
                    try see(1, &seen, "key")
                    do { key = try rowKey(&r) } catch { throw error.at("key") }
                } else if r.key(k, is: "table") {
                    try see(2, &seen, "table")
                    do { table = try string(&r) } catch { throw error.at("table") }
                } else if r.key(k, is: "kind") {
                    try see(3, &seen, "kind")
                    do { kind = try enumeration(&r, RowChange.Kind.self) } catch { throw error.at("kind") }
                } else if r.key(k, is: "originals") {
                    try see(4, &seen, "originals")
                    do { originals = try optionalFields(&r) } catch { throw error.at("originals") }
                } else {
                    throw unknownField(r, k)
                }
            } while try r.nextMember()
        }
        guard let table else { throw missing("table") }
        guard let key else { throw missing("key") }
        guard let kind else { throw missing("kind") }
        return RowChange(table: table, key: key, kind: kind, values: values ?? [:], originals: originals ?? [:])
    }

    static func batchAck(_ r: inout JSONReader) throws(WireCodecError) -> BatchAck {
        var batchID: String?
        var results: [RowResult]?
        var seen: UInt32 = 0
        if try beginStruct(&r) {
            repeat {
                let key = try r.readKey()
                if r.key(key, is: "results") {
                    try see(0, &seen, "results")
                    do { results = try array(&r, rowResult) } catch { throw error.at("results") }
                } else if r.key(key, is: "batchID") {
                    try see(1, &seen, "batchID")
                    do { batchID = try string(&r) } catch { throw error.at("batchID") }
                } else {
                    throw unknownField(r, key)
                }
            } while try r.nextMember()
        }
        guard let batchID else { throw missing("batchID") }
        guard let results else { throw missing("results") }
        return BatchAck(batchID: batchID, results: results)
    }

    static func rowResult(_ r: inout JSONReader) throws(WireCodecError) -> RowResult {
        var table: String?
        var key: RowKey?
        var status: RowResult.Status?
        var serverValues: [String: Value]?
        var newKey: RowKey?
        var rowError: RowError?
        var seen: UInt32 = 0
        if try beginStruct(&r) {
            repeat {
                let k = try r.readKey()
                if r.key(k, is: "key") {
                    try see(0, &seen, "key")
                    do { key = try rowKey(&r) } catch { throw error.at("key") }
                } else if r.key(k, is: "status") {
                    try see(1, &seen, "status")
                    do { status = try enumeration(&r, RowResult.Status.self) } catch { throw error.at("status") }
                } else if r.key(k, is: "table") {
                    try see(2, &seen, "table")
                    do { table = try string(&r) } catch { throw error.at("table") }
                } else if r.key(k, is: "serverValues") {
                    try see(3, &seen, "serverValues")
                    do { serverValues = try optionalFields(&r) } catch { throw error.at("serverValues") }
                } else if r.key(k, is: "newKey") {
                    try see(4, &seen, "newKey")
                    do { newKey = try optionalRowKey(&r) } catch { throw error.at("newKey") }
                } else if r.key(k, is: "error") {
                    try see(5, &seen, "error")
                    do { rowError = try r.readNull() ? nil : try Self.rowError(&r) } catch { throw error.at("error") }
                } else {
                    throw unknownField(r, k)
                }
            } while try r.nextMember()
        }
        guard let table else { throw missing("table") }
        guard let key else { throw missing("key") }
        guard let status else { throw missing("status") }
        if status == .error && rowError == nil { throw missing("error") }
        return RowResult(table: table, key: key, status: status, serverValues: serverValues, newKey: newKey, error: rowError)
    }

    static func rowError(_ r: inout JSONReader) throws(WireCodecError) -> RowError {
        var reason: String?
        var action: RowError.Action?
        var seen: UInt32 = 0
        if try beginStruct(&r) {
            repeat {
                let key = try r.readKey()
                if r.key(key, is: "reason") {
                    try see(0, &seen, "reason")
                    do { reason = try string(&r) } catch { throw error.at("reason") }
                } else if r.key(key, is: "action") {
                    try see(1, &seen, "action")
                    do { action = try enumeration(&r, RowError.Action.self) } catch { throw error.at("action") }
                } else {
                    throw unknownField(r, key)
                }
            } while try r.nextMember()
        }
        guard let reason else { throw missing("reason") }
        guard let action else { throw missing("action") }
        return RowError(reason: reason, action: action)
    }
}

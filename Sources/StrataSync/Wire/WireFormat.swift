import Foundation
import Strata

/// The JSON wire format of deltas, batches and acknowledgements.
///
/// Every type is `Codable`, and deltas, batches and acknowledgements also have a purpose-built
/// codec (`WireCodec`) that reads and writes them straight from and to bytes; the schema is `Sources/StrataSync/Wire/strata-wire.schema.json`, with
/// examples beside it. Values are JSON `null` or an object naming their type:
/// `{"int": 3}`, `{"double": 2.5}`, `{"string": "x"}`, `{"bool": true}`,
/// `{"bytes": "<base64>"}`, `{"timestamp": <seconds since 1970>}` — exact, with no guessing
/// between integers and doubles. A row key is an array of values.
///
/// Decoding is strict: a missing field, a field of the wrong type, or a field the format does not
/// know is an error whose message gives the path to it (`tables[0].upserts[2].fields.title`).
public enum WireFormat {
    /// The encoder every payload is written with (sorted keys, so equal payloads are equal bytes).
    public static let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        return e
    }()

    /// Encodes a payload, as ``encoder`` does.
    ///
    /// Deltas, batches and acknowledgements (and field maps, keys and values) are written by the
    /// wire codec, whose bytes equal the encoder's; other types go through ``encoder``.
    ///
    /// - Complexity: O(*n*) in the size of the payload, plus sorting each field map's names.
    public static func encode(_ value: some Encodable) throws(StrataError) -> Data {
        if let data = WireCodec.encode(value) { return data }
        return try encodeWithFoundation(value)
    }

    /// Decodes a payload strictly.
    ///
    /// Deltas, batches and acknowledgements (and field maps, keys and values) are read by the wire
    /// codec, straight from the bytes; other types go through `JSONDecoder`.
    ///
    /// - Throws: `StrataError` `malformedInput`, naming the path of the offending field.
    /// - Complexity: O(*n*) in the length of `data`.
    public static func decode<T: Decodable>(_ type: T.Type, from data: Data) throws(StrataError) -> T {
        if let value = try WireCodec.decode(T.self, from: data) { return value }
        return try decodeWithFoundation(T.self, from: data)
    }

    /// Encodes with ``encoder``: the `Codable` path, and the reference the codec is tested against.
    package static func encodeWithFoundation(_ value: some Encodable) throws(StrataError) -> Data {
        return try strataErrors {
            try encoder.encode(value)
        }
    }

    /// Decodes with `JSONDecoder` and the `Codable` conformances: the reference the codec is
    /// tested against, and the path of every type the codec does not handle.
    package static func decodeWithFoundation<T: Decodable>(_ type: T.Type, from data: Data) throws(StrataError) -> T {
        do {
            return try JSONDecoder().decode(T.self, from: data)
        } catch let e as DecodingError {
            throw StrataError(.malformedInput, "malformed \(T.self) payload: \(describe(e))", cause: e)
        } catch {
            throw StrataError(.malformedInput, "malformed \(T.self) payload: \(error)")
        }
    }

    static func path(_ codingPath: [any CodingKey]) -> String {
        var out = ""
        for k in codingPath {
            if let i = k.intValue { out += "[\(i)]" } else { out += out.isEmpty ? k.stringValue : ".\(k.stringValue)" }
        }
        return out.isEmpty ? "the document" : out
    }

    static func describe(_ e: DecodingError) -> String {
        switch e {
        case .keyNotFound(let key, let c): "\(path(c.codingPath + [key])): missing"
        case .typeMismatch(let type, let c): "\(path(c.codingPath)): expected \(type)"
        case .valueNotFound(let type, let c): "\(path(c.codingPath)): expected \(type), found null"
        case .dataCorrupted(let c): "\(path(c.codingPath)): \(c.debugDescription)"
        @unknown default: "\(e)"
        }
    }
}

/// A coding key for any field name, to find the fields a type does not know.
struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

extension Decoder {
    /// Throws for any field not in `known`, so that a typo in a payload is an error, not a silently
    /// ignored field.
    func rejectUnknownFields(_ known: Set<String>) throws {
        let c = try container(keyedBy: AnyKey.self)
        for k in c.allKeys where !known.contains(k.stringValue) {
            throw DecodingError.dataCorrupted(.init(codingPath: codingPath + [k], debugDescription: "unknown field '\(k.stringValue)'"))
        }
    }
}

import Foundation

/// The type of a non-null ``Value``.
public enum ValueType: String, Sendable, Codable, CaseIterable, CustomStringConvertible {
    /// ``Value/bool(_:)``.
    case bool
    /// ``Value/int(_:)``: a 64-bit signed integer.
    case int
    /// ``Value/double(_:)``: a 64-bit floating-point number.
    case double
    /// ``Value/string(_:)``.
    case string
    /// ``Value/bytes(_:)``: a BLOB.
    case bytes
    /// ``Value/timestamp(_:)``: a point in time.
    case timestamp

    public var description: String { rawValue }
}

/// One field value of a row.
///
/// Literals work where a `Value` is expected: `nil`, `true`, `42`, `2.5`, `"text"`.
///
/// Two values are equal when they have the same type and the same stored bits: `.int(1)` is not
/// `.double(1)`, `0.0` is not `-0.0`, and strings are equal when their UTF-8 bytes are (no Unicode
/// normalisation: "é" and "e" + U+0301 differ, as keys and as values). This is the equality the
/// store uses to decide whether a field changed, so it matches the binary encoding exactly.
/// (NaN and infinite doubles never enter a store: edits and merges refuse them.)
///
/// Because `nil` is a `Value` literal, `fields[name] = isEmpty ? nil : value` on a
/// `[String: Value]` stores `.null` rather than removing the key: the conditional's type is
/// `Value`. Use `removeValue(forKey:)` to remove.
public enum Value: Sendable, Hashable {
    /// No value.
    case null
    /// A boolean.
    case bool(Bool)
    /// A 64-bit signed integer.
    case int(Int64)
    /// A 64-bit floating-point number; never NaN or infinite in a store.
    case double(Double)
    /// Text, compared by its UTF-8 bytes.
    case string(String)
    /// Raw bytes (a BLOB).
    case bytes([UInt8])
    /// A point in time, stored as seconds since 1970 in a `Double` (about a quarter of a
    /// microsecond apart today; see ``ValueConvertible`` for what that means for a `Date`).
    case timestamp(Date)

    /// The type of the value, or `nil` for ``null``.
    public var type: ValueType? {
        switch self {
        case .null: nil
        case .bool: .bool
        case .int: .int
        case .double: .double
        case .string: .string
        case .bytes: .bytes
        case .timestamp: .timestamp
        }
    }

    /// Whether the value is ``null``.
    public var isNull: Bool { if case .null = self { true } else { false } }

    /// The boolean, or `nil` when the value is not a bool.
    public var boolValue: Bool? { if case .bool(let b) = self { b } else { nil } }
    /// The integer, or `nil` when the value is not an int.
    public var intValue: Int64? { if case .int(let i) = self { i } else { nil } }
    /// The value as a `Double`: a double, or an int converted.
    public var doubleValue: Double? {
        switch self {
        case .double(let d): d
        case .int(let i): Double(i)
        default: nil
        }
    }
    /// The text, or `nil` when the value is not a string.
    public var stringValue: String? { if case .string(let s) = self { s } else { nil } }
    /// The bytes, or `nil` when the value is not bytes.
    public var bytesValue: [UInt8]? { if case .bytes(let b) = self { b } else { nil } }
    /// The date, or `nil` when the value is not a timestamp.
    public var dateValue: Date? { if case .timestamp(let d) = self { d } else { nil } }

    public static func == (lhs: Value, rhs: Value) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.bool(let a), .bool(let b)): a == b
        case (.int(let a), .int(let b)): a == b
        case (.double(let a), .double(let b)): a.bitPattern == b.bitPattern
        // Byte for byte, as the store compares its encodings: "é" and "e" + U+0301 are two
        // values (and two keys), though Swift's `==` on strings calls them equal.
        case (.string(let a), .string(let b)): a.utf8.elementsEqual(b.utf8)
        case (.bytes(let a), .bytes(let b)): a == b
        case (.timestamp(let a), .timestamp(let b)):
            a.timeIntervalSince1970.bitPattern == b.timeIntervalSince1970.bitPattern
        default: false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .null: hasher.combine(0)
        case .bool(let b): hasher.combine(1); hasher.combine(b)
        case .int(let i): hasher.combine(2); hasher.combine(i)
        case .double(let d): hasher.combine(3); hasher.combine(d.bitPattern)
        case .string(let s):
            hasher.combine(4)
            // The UTF-8 bytes, consistent with `==` (a String hashes by canonical equivalence).
            hasher.combine(s.utf8.count)
            for b in s.utf8 { hasher.combine(b) }
        case .bytes(let b): hasher.combine(5); hasher.combine(b)
        case .timestamp(let d): hasher.combine(6); hasher.combine(d.timeIntervalSince1970.bitPattern)
        }
    }
}

extension Value: ExpressibleByNilLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral
{
    public init(nilLiteral: ()) { self = .null }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(stringLiteral value: String) { self = .string(value) }
}

extension Value: CustomStringConvertible {
    /// A readable rendering: strings quoted, bytes in hex, timestamps in ISO 8601.
    public var description: String {
        switch self {
        case .null: "null"
        case .bool(let b): b ? "true" : "false"
        case .int(let i): String(i)
        case .double(let d): String(d)
        case .string(let s): "\"\(s)\""
        case .bytes(let b): "0x" + b.map { String(format: "%02x", $0) }.joined()
        case .timestamp(let d): d.formatted(.iso8601)
        }
    }
}

extension Value: Codable {
    private enum CodingKeys: String, CodingKey {
        case bool, int, double, string, bytes, timestamp
    }

    /// Encodes as a one-key object naming the type (`{"int": 3}`), or `null`.
    public func encode(to encoder: any Encoder) throws {
        if case .null = self {
            var c = encoder.singleValueContainer()
            try c.encodeNil()
            return
        }
        var c = encoder.container(keyedBy: CodingKeys.self)
        switch self {
        case .null: break
        case .bool(let b): try c.encode(b, forKey: .bool)
        case .int(let i): try c.encode(i, forKey: .int)
        case .double(let d): try c.encode(d, forKey: .double)
        case .string(let s): try c.encode(s, forKey: .string)
        case .bytes(let b): try c.encode(Data(b).base64EncodedString(), forKey: .bytes)
        case .timestamp(let d): try c.encode(d.timeIntervalSince1970, forKey: .timestamp)
        }
    }

    /// The message for an object with none or several of the type keys (shared with the wire
    /// codec, which refuses the same objects).
    package static let oneKeyMessage = "a value is an object with exactly one of the keys bool, int, double, string, bytes, timestamp"

    /// Any key of a value's object, to refuse those that name no type.
    private struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    /// Decodes `null` or a one-key object naming the type. A key that names no type is refused,
    /// as the schema says (`additionalProperties: false`). An int written with a fraction or an
    /// exponent (`{"int": 3.0}`) is accepted here when its value is an integer: `JSONDecoder`
    /// does not show how a number was written. The wire codec refuses it.
    public init(from decoder: any Decoder) throws {
        if let single = try? decoder.singleValueContainer(), single.decodeNil() {
            self = .null
            return
        }
        for k in try decoder.container(keyedBy: AnyKey.self).allKeys where CodingKeys(stringValue: k.stringValue) == nil {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath + [k], debugDescription: "unknown field '\(k.stringValue)'"))
        }
        let c = try decoder.container(keyedBy: CodingKeys.self)
        guard let key = c.allKeys.first, c.allKeys.count == 1 else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: Self.oneKeyMessage))
        }
        switch key {
        case .bool: self = .bool(try c.decode(Bool.self, forKey: key))
        case .int: self = .int(try c.decode(Int64.self, forKey: key))
        case .double: self = .double(try c.decode(Double.self, forKey: key))
        case .string: self = .string(try c.decode(String.self, forKey: key))
        case .bytes:
            guard let data = Data(base64Encoded: try c.decode(String.self, forKey: key)) else {
                throw DecodingError.dataCorruptedError(forKey: key, in: c, debugDescription: "bytes must be base64")
            }
            self = .bytes(Array(data))
        case .timestamp: self = .timestamp(Date(timeIntervalSince1970: try c.decode(Double.self, forKey: key)))
        }
    }
}

/// `"task \(n)"` is a string value.
extension Value: ExpressibleByStringInterpolation {}

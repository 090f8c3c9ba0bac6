import Foundation

/// The primary key of a row: one value, or several for a composite key.
///
/// Literals work: `key: 7`, `key: "a1"`, `key: [7, "x"]`.
public struct RowKey: Hashable, Sendable, CustomStringConvertible {
    /// The key's components, in the order of the table's primary key fields.
    public var values: [Value]

    /// A key of several values, in the order of the table's primary key fields.
    public init(_ values: [Value]) { self.values = values }
    /// A key of one value.
    public init(_ value: Value) { self.values = [value] }

    public var description: String {
        values.count == 1 ? values[0].description : "(" + values.map(\.description).joined(separator: ", ") + ")"
    }
}

extension RowKey: ExpressibleByIntegerLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral {
    public init(integerLiteral value: Int64) { self.init(.int(value)) }
    public init(stringLiteral value: String) { self.init(.string(value)) }
    public init(arrayLiteral elements: Value...) { self.init(elements) }
}

/// The order-preserving encoding of key components: comparing encoded keys byte by byte (as LMDB
/// does) orders them like their values, component by component, so a range scan is a sorted scan.
///
/// Each component is a tag byte and a payload:
/// - int: 8 bytes big-endian with the sign bit flipped (negatives sort first);
/// - double and timestamp: the IEEE bits big-endian, all bits flipped for negatives and only the
///   sign bit for positives;
/// - string and bytes: the bytes with `00` escaped as `00 FF`, ended by `00 00`, so that a prefix
///   sorts before its extensions and composite keys stay unambiguous.
enum KeyCodec {
    static let tagNull: UInt8 = 0x05
    static let tagFalse: UInt8 = 0x10
    static let tagTrue: UInt8 = 0x11
    static let tagInt: UInt8 = 0x20
    static let tagDouble: UInt8 = 0x30
    static let tagString: UInt8 = 0x40
    static let tagBytes: UInt8 = 0x50
    static let tagTimestamp: UInt8 = 0x60

    /// An int component's payload, before its big-endian write: the sign bit flipped, so that
    /// negatives sort first.
    @inline(__always)
    static func intBits(_ i: Int64) -> UInt64 { UInt64(bitPattern: i) ^ (1 << 63) }

    @inline(__always)
    static func orderedBits(_ d: Double) -> UInt64 {
        let bits = d.bitPattern
        return bits & (1 << 63) != 0 ? ~bits : bits | (1 << 63)
    }

    @inline(__always)
    static func doubleFromOrdered(_ bits: UInt64) -> Double {
        Double(bitPattern: bits & (1 << 63) != 0 ? bits & ~(1 << 63) : ~bits)
    }

    static func appendEscaped(_ raw: UnsafeRawBufferPointer, to w: inout ByteWriter) {
        for b in raw {
            w.append(b)
            if b == 0 { w.append(0xFF) }
        }
        w.append(0)
        w.append(0)
    }

    /// Appends the encoding of one key component.
    static func append(_ value: Value, to w: inout ByteWriter) {
        switch value {
        case .null: w.append(tagNull)
        case .bool(let b): w.append(b ? tagTrue : tagFalse)
        case .int(let i):
            w.append(tagInt)
            w.appendBigEndian(intBits(i))
        case .double(let d):
            w.append(tagDouble)
            w.appendBigEndian(orderedBits(d))
        case .timestamp(let d):
            w.append(tagTimestamp)
            w.appendBigEndian(orderedBits(d.timeIntervalSince1970))
        case .string(var s):
            w.append(tagString)
            s.withUTF8 { appendEscaped(UnsafeRawBufferPointer($0), to: &w) }
        case .bytes(let b):
            w.append(tagBytes)
            b.withUnsafeBytes { appendEscaped($0, to: &w) }
        }
    }

    static func readEscaped(_ r: inout ByteReader) throws(StrataError) -> [UInt8] {
        var out: [UInt8] = []
        while true {
            let b = try r.byte()
            if b != 0 {
                out.append(b)
                continue
            }
            let next = try r.byte()
            switch next {
            case 0: return out
            case 0xFF: out.append(0)
            default: throw r.corrupt("bad escape in a key")
            }
        }
    }

    /// Decodes one key component.
    static func readComponent(_ r: inout ByteReader) throws(StrataError) -> Value {
        let tag = try r.byte()
        switch tag {
        case tagNull: return .null
        case tagFalse: return .bool(false)
        case tagTrue: return .bool(true)
        case tagInt: return .int(Int64(bitPattern: try r.bigEndian64() ^ (1 << 63)))
        case tagDouble: return .double(doubleFromOrdered(try r.bigEndian64()))
        case tagTimestamp: return .timestamp(Date(timeIntervalSince1970: doubleFromOrdered(try r.bigEndian64())))
        case tagString:
            let raw = try readEscaped(&r)
            guard let s = String(validating: raw, as: UTF8.self) else { throw r.corrupt("invalid UTF-8 in a key") }
            return .string(s)
        case tagBytes: return .bytes(try readEscaped(&r))
        default: throw r.corrupt("unknown key tag \(tag)")
        }
    }

    /// Decodes `count` components from the reader.
    static func readKey(_ r: inout ByteReader, count: Int) throws(StrataError) -> RowKey {
        var values: [Value] = []
        // `count` may come from damaged or hostile bytes: every component takes at least one
        // byte, so room for more than the bytes left is never needed (and a huge reservation
        // would trap before the truncation is noticed).
        values.reserveCapacity(min(count, r.remaining))
        for _ in 0..<count { values.append(try readComponent(&r)) }
        return RowKey(values)
    }
}

/// `"user-\(id)"` is a single string key.
extension RowKey: ExpressibleByStringInterpolation {}

extension RowKey: Codable {
    /// A key is encoded as the array of its values.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(values)
    }

    public init(from decoder: any Decoder) throws {
        self.init(try decoder.singleValueContainer().decode([Value].self))
    }
}

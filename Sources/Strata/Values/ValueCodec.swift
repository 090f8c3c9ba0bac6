import Foundation
import LMDB

/// The compact binary encoding of a ``Value`` inside records (row states and operations).
///
/// One tag byte, then the payload:
///
/// | tag | value | payload |
/// |---|---|---|
/// | 0 | null | — |
/// | 1, 2 | false, true | — |
/// | 3 | int | zig-zag LEB128 varint |
/// | 4 | double | 8 bytes, IEEE 754 bits little-endian |
/// | 5 | string | varint length + UTF-8 |
/// | 6 | bytes | varint length + bytes |
/// | 7 | timestamp | 8 bytes, seconds since 1970 as IEEE 754 bits little-endian |
///
/// The encoding is canonical — each value has exactly one — so two encoded values are equal
/// exactly when the values are (``Value/==(_:_:)``). The write path relies on this to decide
/// whether a field changed by comparing bytes, without decoding.
enum ValueTag {
    static let null: UInt8 = 0
    static let `false`: UInt8 = 1
    static let `true`: UInt8 = 2
    static let int: UInt8 = 3
    static let double: UInt8 = 4
    static let string: UInt8 = 5
    static let bytes: UInt8 = 6
    static let timestamp: UInt8 = 7
}

extension ByteWriter {
    
    static func zigzag(_ v: Int64) -> UInt64 { UInt64(bitPattern: (v << 1) ^ (v >> 63)) }

    /// Appends the canonical encoding of `value`.

    mutating func appendValue(_ value: Value) {
        switch value {
        case .null: append(ValueTag.null)
        case .bool(let b): append(b ? ValueTag.true : ValueTag.false)
        case .int(let i):
            append(ValueTag.int)
            appendVarint(Self.zigzag(i))
        case .double(let d):
            append(ValueTag.double)
            appendLittleEndian(d.bitPattern)
        case .string(var s):
            append(ValueTag.string)
            // withUTF8 gives the contiguous UTF-8 of a native string without copying.
            s.withUTF8 { utf8 in
                appendVarint(UInt64(utf8.count))
                append(UnsafeRawBufferPointer(utf8))
            }
        case .bytes(let b):
            append(ValueTag.bytes)
            appendVarint(UInt64(b.count))
            append(b)
        case .timestamp(let d):
            append(ValueTag.timestamp)
            appendLittleEndian(d.timeIntervalSince1970.bitPattern)
        }
    }
}

extension ByteReader {
    /// Skips one encoded value and returns the byte range it occupied.
    
    mutating func skipValue() throws(StrataError) -> Range<Int> {
        let start = offset
        let tag = try byte()
        switch tag {
        case ValueTag.null, ValueTag.false, ValueTag.true: break
        case ValueTag.int: _ = try varint()
        case ValueTag.double, ValueTag.timestamp:
            // As `bytes(8)` checks, without making the slice.
            guard remaining >= 8 else { throw corrupt("length 8 past the end") }
            offset += 8
        case ValueTag.string, ValueTag.bytes:
            let n = try varint()
            guard n <= UInt64(remaining) else { throw corrupt("length \(n) past the end") }
            offset += Int(n)
        default: throw corrupt("unknown value tag \(tag)")
        }
        return start..<offset
    }

    /// Decodes one value.
    mutating func value() throws(StrataError) -> Value {
        let tag = try byte()
        switch tag {
        case ValueTag.null: return .null
        case ValueTag.false: return .bool(false)
        case ValueTag.true: return .bool(true)
        case ValueTag.int:
            let z = try varint()
            return .int(Int64(bitPattern: (z >> 1)) ^ -Int64(bitPattern: z & 1))
        case ValueTag.double: return .double(Double(bitPattern: try littleEndian64()))
        case ValueTag.timestamp:
            return .timestamp(Date(timeIntervalSince1970: Double(bitPattern: try littleEndian64())))
        case ValueTag.string:
            let n = try varint()
            guard n <= UInt64(remaining) else { throw corrupt("string length \(n) past the end") }
            let raw = try bytes(Int(n))
            guard let s = String(validating: raw, as: UTF8.self) else { throw corrupt("invalid UTF-8 in a string") }
            return .string(s)
        case ValueTag.bytes:
            let n = try varint()
            guard n <= UInt64(remaining) else { throw corrupt("bytes length \(n) past the end") }
            return .bytes(Array(try bytes(Int(n))))
        default:
            offset -= 1
            throw corrupt("unknown value tag \(tag)")
        }
    }
}

extension Value {
    /// The canonical binary encoding of this value (see ``ValueTag``).
    var encoded: [UInt8] {
        var w = ByteWriter(capacity: 16)
        w.appendValue(self)
        return w.bytes
    }

    /// Decodes a value encoded by ``encoded``; the bytes must hold exactly one value.
    init(decoding bytes: UnsafeRawBufferPointer) throws(StrataError) {
        var r = ByteReader(bytes)
        self = try r.value()
        guard r.isAtEnd else { throw r.corrupt("trailing bytes after a value") }
    }
}

/// The store's binary value encoding, for code that records values in its own records (such as
/// the sync layer's audit annotations).
///
/// Not part of the public API: it is `@_spi(ValueCoding)`, for StrataSync and for the SQLite peers
/// of `Benchmarks/` (a separate package), which encode their payloads in the same format so that
/// the comparison is fair. Import it with `@_spi(ValueCoding) import Strata`.
@_spi(ValueCoding)
public enum ValueCoding {
    /// Appends the canonical encoding of `value`.
    public static func append(_ value: Value, to bytes: inout [UInt8]) {
        switch value {
        // The values an audit record holds most, written straight into `bytes`, as
        // `ByteWriter.appendValue` writes them: moving the array into a writer and back cost
        // about 200 instructions a value, five or more values per merged server row.
        case .null:
            bytes.append(ValueTag.null)
        case .string(var s):
            bytes.append(ValueTag.string)
            s.withUTF8 { utf8 in
                appendVarint(UInt64(utf8.count), to: &bytes)
                bytes.append(contentsOf: utf8)
            }
        default:
            var w = ByteWriter(capacity: 0)
            swap(&w.bytes, &bytes)
            w.appendValue(value)
            swap(&w.bytes, &bytes)
        }
    }

    /// Appends `value` as a LEB128 varint (as `ByteWriter.appendVarint`).
    public static func appendVarint(_ value: UInt64, to bytes: inout [UInt8]) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }

    /// Reads one value at `offset` and moves `offset` past it.
    ///
    /// - Throws: ``StrataError`` `corruptRecord` for bytes that are not a value.
    public static func readValue(_ bytes: [UInt8], at offset: inout Int) throws(StrataError) -> Value {
        try withBytes(bytes) { (b) throws(StrataError) in
            var r = ByteReader(b, offset: offset)
            let v = try r.value()
            offset = r.offset
            return v
        }
    }

    /// Reads a varint at `offset` and moves `offset` past it.
    public static func readVarint(_ bytes: [UInt8], at offset: inout Int) throws(StrataError) -> UInt64 {
        try withBytes(bytes) { (b) throws(StrataError) in
            var r = ByteReader(b, offset: offset)
            let v = try r.varint()
            offset = r.offset
            return v
        }
    }
}

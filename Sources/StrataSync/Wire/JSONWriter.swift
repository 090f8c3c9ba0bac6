/// Writes JSON tokens to bytes exactly as Foundation's `JSONEncoder` writes them, for
/// ``WireCodec``: the codec's output must equal `WireFormat.encoder`'s byte for byte (the server
/// recognises a retried batch by the hash of its bytes), which `WireCodecTests` checks.
///
/// `JSONEncoder`'s choices, followed here: `"` `\` and `/` are escaped with a backslash, as are
/// `\b \f \n \r \t`; other control characters are written `\u00XX` (lowercase hex); everything
/// else, DEL and U+2028 included, is written as its UTF-8 bytes. A double is its shortest
/// round-trip form (`description`) less a trailing `.0`; NaN and infinities are not written.
struct JSONWriter {
    /// The document written so far.
    private(set) var bytes: [UInt8] = []

    /// A double that JSON cannot hold (NaN or an infinity).
    struct NonFinite: Error {}

    init(capacity: Int = 256) {
        bytes.reserveCapacity(capacity)
    }

    @inline(__always)
    mutating func byte(_ b: UInt8) { bytes.append(b) }

    /// Cuts the document back to its first `count` bytes (what was written after them goes).
    mutating func truncate(to count: Int) { bytes.removeSubrange(count...) }

    /// Appends bytes that already are JSON, as they are.
    mutating func append(_ raw: UnsafeRawBufferPointer) { bytes.append(contentsOf: raw) }

    /// Writes ASCII text as it is: punctuation and keys that need no escaping.
    @inline(__always)
    mutating func raw(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// Writes a string with its quotes, escaped as `JSONEncoder` escapes it.
    mutating func string(_ s: String) {
        var s = s
        s.withUTF8 { string(utf8: $0) }
    }

    private static let hex: StaticString = "0123456789abcdef"

    mutating func string(utf8: UnsafeBufferPointer<UInt8>) {
        bytes.append(UInt8(ascii: "\""))
        var mark = 0
        for i in 0..<utf8.count {
            let b = utf8[i]
            // Bytes that need no escape: everything from 0x20 up but `"` `/` `\`.
            if b >= 0x20 && b != UInt8(ascii: "\"") && b != UInt8(ascii: "/") && b != UInt8(ascii: "\\") { continue }
            if mark < i { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[mark..<i])) }
            mark = i + 1
            bytes.append(UInt8(ascii: "\\"))
            switch b {
            case UInt8(ascii: "\""), UInt8(ascii: "/"), UInt8(ascii: "\\"): bytes.append(b)
            case 0x08: bytes.append(UInt8(ascii: "b"))
            case 0x0C: bytes.append(UInt8(ascii: "f"))
            case 0x0A: bytes.append(UInt8(ascii: "n"))
            case 0x0D: bytes.append(UInt8(ascii: "r"))
            case 0x09: bytes.append(UInt8(ascii: "t"))
            default:
                raw("u00")
                bytes.append(Self.hex.utf8Start[Int(b >> 4)])
                bytes.append(Self.hex.utf8Start[Int(b & 0xF)])
            }
        }
        if mark < utf8.count { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[mark...])) }
        bytes.append(UInt8(ascii: "\""))
    }

    /// Writes an integer in decimal.
    mutating func int(_ v: Int64) {
        if v < 0 { bytes.append(UInt8(ascii: "-")) }
        uint(v.magnitude)
    }

    /// Writes an unsigned integer in decimal.
    mutating func uint(_ v: UInt64) {
        if v < 10 {
            bytes.append(UInt8(ascii: "0") + UInt8(v))
            return
        }
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // room for UInt64.max's 20 digits
        withUnsafeMutableBytes(of: &digits) { buf in
            var v = v
            var i = buf.count
            repeat {
                i -= 1
                buf[i] = UInt8(ascii: "0") + UInt8(v % 10)
                v /= 10
            } while v != 0
            bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: buf[i...]))
        }
    }

    /// Writes a double as `JSONEncoder` does: `description` without a trailing `.0`.
    mutating func double(_ d: Double) throws(NonFinite) {
        guard d.isFinite else { throw NonFinite() }
        // An integral double below 2^53 in magnitude is written as the integer, without making
        // a String (the description of 3.0 is "3.0", written "3"; from 2^53 on, `description`
        // switches to an exponent: 9.999999999999998e+15); -0.0 is "-0".
        if d == d.rounded(.towardZero) && d.magnitude < 0x1p53 {
            if d == 0 && d.sign == .minus { raw("-0"); return }
            int(Int64(d))
            return
        }
        var text = d.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        text.withUTF8 { bytes.append(contentsOf: $0) }
    }

    private static let base64Alphabet: StaticString = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    /// Writes bytes as a base64 string (with padding, as `Data.base64EncodedString()`), `/`
    /// escaped like any string's.
    mutating func base64(_ data: [UInt8]) {
        let alphabet = Self.base64Alphabet.utf8Start
        bytes.append(UInt8(ascii: "\""))
        func put(_ sextet: UInt32) {
            let c = alphabet[Int(sextet & 0x3F)]
            if c == UInt8(ascii: "/") { bytes.append(UInt8(ascii: "\\")) }
            bytes.append(c)
        }
        var i = 0
        while i + 3 <= data.count {
            let v = UInt32(data[i]) << 16 | UInt32(data[i + 1]) << 8 | UInt32(data[i + 2])
            put(v >> 18); put(v >> 12); put(v >> 6); put(v)
            i += 3
        }
        switch data.count - i {
        case 1:
            let v = UInt32(data[i]) << 16
            put(v >> 18); put(v >> 12); raw("==")
        case 2:
            let v = UInt32(data[i]) << 16 | UInt32(data[i + 1]) << 8
            put(v >> 18); put(v >> 12); put(v >> 6); raw("=")
        default: break
        }
        bytes.append(UInt8(ascii: "\""))
    }
}

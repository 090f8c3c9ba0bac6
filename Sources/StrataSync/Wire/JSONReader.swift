/// A strict RFC 8259 JSON tokenizer over borrowed bytes, for ``WireCodec``.
///
/// The reader never builds a tree: the wire codec asks for the token it expects next (an object's
/// next member, a string, a number) and decodes the payload's types directly from the bytes. Keys
/// are compared as bytes against the names a type knows, and a `String` is made only for values.
///
/// Strictness, compared with Foundation's `JSONDecoder` (which the ``WireCodec`` tests check):
/// - the same: only space, tab, line feed and carriage return are whitespace; strings refuse raw
///   control characters, invalid UTF-8 (overlong forms, encoded surrogates, stray bytes) and lone
///   surrogate escapes; numbers follow the RFC grammar (no leading zeros, no `+`, no bare `.`);
///   nothing but whitespace may follow the document; at most 512 nested arrays and objects;
/// - stricter: a leading byte-order mark is refused (RFC 8259 §8.1: senders must not add one),
///   and so is a comma before a closing bracket or brace (`[1,]`, `{"a":1,}`), which
///   `JSONDecoder` accepts. Duplicate keys are refused by the codec, which sees the keys.
///
/// The bytes are borrowed: the reader must not outlive the buffer it was made with.
struct JSONReader {
    /// The most arrays and objects open at once, as `JSONDecoder` allows.
    static let maximumDepth = 512

    private let bytes: UnsafeRawBufferPointer
    /// The offset of the next byte to read.
    private(set) var offset = 0
    private var depth = 0
    /// Unescaped string contents, when a string holds escapes.
    private var scratch: [UInt8] = []
    /// What the codec keeps of the last field map read, for the next one (``WireCodec/fields(_:)``).
    var fieldShape = FieldMapShape()

    /// The kind of the next value, from its first byte.
    enum Kind {
        case object, array, string, number, bool, null, invalid
    }

    /// A reader of `bytes`, which must stay valid while the reader is used.
    init(_ bytes: UnsafeRawBufferPointer) {
        self.bytes = bytes
    }

    // MARK: Bytes

    /// The byte at `offset`, or 0 past the end (a 0 byte is never valid outside a string).
    @inline(__always)
    private func peek() -> UInt8 {
        offset < bytes.count ? bytes[offset] : 0
    }

    @inline(__always)
    mutating func skipWhitespace() {
        while offset < bytes.count {
            switch bytes[offset] {
            case 0x20, 0x0A, 0x0D, 0x09: offset += 1
            default: return
            }
        }
    }

    /// An error at the current offset, describing the byte found there.
    func syntaxError(_ expected: String) -> WireCodecError {
        let found: String
        if offset >= bytes.count {
            found = "the end of the document"
        } else {
            let b = bytes[offset]
            found = b >= 0x21 && b < 0x7F ? "'\(Character(Unicode.Scalar(b)))'" : "byte 0x\(String(b, radix: 16))"
        }
        return WireCodecError("invalid JSON: expected \(expected), found \(found) at offset \(offset)")
    }

    // MARK: Document

    /// Refuses a byte-order mark, and skips the whitespace before the document's value.
    mutating func beginDocument() throws(WireCodecError) {
        if bytes.count >= 3 && bytes[0] == 0xEF && bytes[1] == 0xBB && bytes[2] == 0xBF {
            throw WireCodecError("invalid JSON: a byte-order mark starts the document")
        }
        skipWhitespace()
    }

    /// Checks that nothing but whitespace follows the document's value.
    mutating func endDocument() throws(WireCodecError) {
        skipWhitespace()
        if offset != bytes.count { throw syntaxError("the end of the document") }
    }

    /// The kind of the next value (whitespace before it already skipped).
    @inline(__always)
    func nextKind() -> Kind {
        switch peek() {
        case UInt8(ascii: "{"): .object
        case UInt8(ascii: "["): .array
        case UInt8(ascii: "\""): .string
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): .number
        case UInt8(ascii: "t"), UInt8(ascii: "f"): .bool
        case UInt8(ascii: "n"): .null
        default: .invalid
        }
    }

    // MARK: Literals

    private mutating func literal(_ text: StaticString) throws(WireCodecError) {
        let n = text.utf8CodeUnitCount
        let p = text.utf8Start
        for i in 0..<n {
            guard offset + i < bytes.count, bytes[offset + i] == p[i] else {
                offset += i
                throw syntaxError("'\(text)'")
            }
        }
        offset += n
        skipWhitespace()
    }

    /// Reads `null` if it is next.
    mutating func readNull() throws(WireCodecError) -> Bool {
        guard peek() == UInt8(ascii: "n") else { return false }
        try literal("null")
        return true
    }

    /// Reads `true` or `false`; the next kind must be ``Kind/bool``.
    mutating func readBool() throws(WireCodecError) -> Bool {
        if peek() == UInt8(ascii: "t") {
            try literal("true")
            return true
        }
        try literal("false")
        return false
    }

    // MARK: Containers

    /// Reads `{` and tells whether the object has a member; false also reads its `}`.
    mutating func beginObject() throws(WireCodecError) -> Bool {
        try open(UInt8(ascii: "{"))
        if peek() == UInt8(ascii: "}") {
            close()
            return false
        }
        return true
    }

    /// After a member's value: reads `,` and returns true, or reads `}` and returns false.
    mutating func nextMember() throws(WireCodecError) -> Bool {
        try next(UInt8(ascii: "}"), "',' or '}'")
    }

    /// Reads a member's key and the colon after it. The key's bytes, unescaped, are valid until
    /// the next string is read.
    mutating func readKey() throws(WireCodecError) -> Key {
        guard peek() == UInt8(ascii: "\"") else { throw syntaxError("a key") }
        let key = try readStringBytes()
        skipWhitespace()
        guard peek() == UInt8(ascii: ":") else { throw syntaxError("':'") }
        offset += 1
        skipWhitespace()
        return key
    }

    /// Reads `[` and tells whether the array has an element; false also reads its `]`.
    mutating func beginArray() throws(WireCodecError) -> Bool {
        try open(UInt8(ascii: "["))
        if peek() == UInt8(ascii: "]") {
            close()
            return false
        }
        return true
    }

    /// After an element: reads `,` and returns true, or reads `]` and returns false.
    mutating func nextElement() throws(WireCodecError) -> Bool {
        try next(UInt8(ascii: "]"), "',' or ']'")
    }

    private mutating func open(_ bracket: UInt8) throws(WireCodecError) {
        guard peek() == bracket else { throw syntaxError("'\(Character(Unicode.Scalar(bracket)))'") }
        guard depth < Self.maximumDepth else {
            throw WireCodecError("invalid JSON: more than \(Self.maximumDepth) nested arrays and objects at offset \(offset)")
        }
        depth += 1
        offset += 1
        skipWhitespace()
    }

    @inline(__always)
    private mutating func close() {
        depth -= 1
        offset += 1
        skipWhitespace()
    }

    private mutating func next(_ closing: UInt8, _ expected: String) throws(WireCodecError) -> Bool {
        switch peek() {
        case UInt8(ascii: ","):
            offset += 1
            skipWhitespace()
            if peek() == closing { throw WireCodecError("invalid JSON: a comma before '\(Character(Unicode.Scalar(closing)))' at offset \(offset)") }
            return true
        case closing:
            close()
            return false
        default:
            throw syntaxError(expected)
        }
    }

    // MARK: Strings

    /// A string's bytes: a range of the document, or (when it held escapes) the reader's scratch.
    struct Key {
        fileprivate var start: Int
        fileprivate var count: Int
        fileprivate var escaped: Bool
    }

    /// Calls `body` with the bytes of a string read last (valid until the next string is read).
    @inline(__always)
    func withBytes<R>(of key: Key, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        if key.escaped {
            return scratch.withUnsafeBytes(body)
        }
        return body(UnsafeRawBufferPointer(rebasing: bytes[key.start..<key.start + key.count]))
    }

    /// Whether a key read last is `name`.
    @inline(__always)
    func key(_ key: Key, is name: StaticString) -> Bool {
        guard key.count == name.utf8CodeUnitCount else { return false }
        return withBytes(of: key) { b in
            let p = name.utf8Start
            for i in 0..<b.count where b[i] != p[i] { return false }
            return true
        }
    }

    /// The text of a string read last.
    func string(_ key: Key) -> String {
        withBytes(of: key) { String(decoding: $0, as: UTF8.self) }
    }

    /// The text of a field name read last: the name of the next place in ``fieldShape``.
    mutating func fieldName(_ key: Key) -> String {
        if key.escaped {
            // Rare: the unescaped bytes live in `scratch`, which `self` holds.
            let unescaped = scratch
            return unescaped.withUnsafeBytes { fieldShape.name($0) }
        }
        // The document's own bytes, borrowed for the reader's life: no closure over `self`.
        return fieldShape.name(UnsafeRawBufferPointer(rebasing: bytes[key.start..<key.start + key.count]))
    }

    /// Reads a string value.
    mutating func readString() throws(WireCodecError) -> String {
        let k = try readStringBytes()
        skipWhitespace()
        return string(k)
    }

    /// Reads a string and returns its bytes (unescaped, valid UTF-8); `offset` is left just past
    /// the closing quote.
    mutating func readStringBytes() throws(WireCodecError) -> Key {
        offset += 1  // the opening quote
        let start = offset
        var ascii = true
        // Fast scan: most strings are plain ASCII without escapes.
        while offset < bytes.count {
            let b = bytes[offset]
            if b == UInt8(ascii: "\"") {
                let key = Key(start: start, count: offset - start, escaped: false)
                if !ascii { try validateUTF8(from: start, to: offset) }
                offset += 1
                return key
            }
            if b == UInt8(ascii: "\\") { break }
            if b < 0x20 { throw WireCodecError("invalid JSON: a control character in a string at offset \(offset)") }
            if b >= 0x80 { ascii = false }
            offset += 1
        }
        if offset >= bytes.count { throw syntaxError("'\"'") }
        // An escape: unescape into the scratch buffer, from the start of the string.
        if !ascii { try validateUTF8(from: start, to: offset) }
        scratch.removeAll(keepingCapacity: true)
        scratch.append(contentsOf: bytes[start..<offset])
        var runStart = offset
        while offset < bytes.count {
            let b = bytes[offset]
            switch b {
            case UInt8(ascii: "\""):
                try appendRun(from: runStart)
                offset += 1
                return Key(start: start, count: scratch.count, escaped: true)
            case UInt8(ascii: "\\"):
                try appendRun(from: runStart)
                try readEscape()
                runStart = offset
            case 0..<0x20:
                throw WireCodecError("invalid JSON: a control character in a string at offset \(offset)")
            default:
                offset += 1
            }
        }
        throw syntaxError("'\"'")
    }

    /// Appends the unescaped bytes from `runStart` to `offset`, checked as UTF-8.
    private mutating func appendRun(from runStart: Int) throws(WireCodecError) {
        guard runStart < offset else { return }
        try validateUTF8(from: runStart, to: offset)
        scratch.append(contentsOf: bytes[runStart..<offset])
    }

    private func validateUTF8(from start: Int, to end: Int) throws(WireCodecError) {
        let slice = UnsafeRawBufferPointer(rebasing: bytes[start..<end])
        var it = slice.makeIterator()
        var decoder = UTF8()
        var at = start
        while true {
            switch decoder.decode(&it) {
            case .scalarValue(let s): at += UTF8.width(s)
            case .emptyInput: return
            case .error: throw WireCodecError("invalid JSON: invalid UTF-8 in a string at offset \(at)")
            }
        }
    }

    /// Reads one escape sequence (at the backslash) and appends what it stands for.
    private mutating func readEscape() throws(WireCodecError) {
        let at = offset
        offset += 1
        let c = peek()
        offset += 1
        switch c {
        case UInt8(ascii: "\""): scratch.append(UInt8(ascii: "\""))
        case UInt8(ascii: "\\"): scratch.append(UInt8(ascii: "\\"))
        case UInt8(ascii: "/"): scratch.append(UInt8(ascii: "/"))
        case UInt8(ascii: "b"): scratch.append(0x08)
        case UInt8(ascii: "f"): scratch.append(0x0C)
        case UInt8(ascii: "n"): scratch.append(0x0A)
        case UInt8(ascii: "r"): scratch.append(0x0D)
        case UInt8(ascii: "t"): scratch.append(0x09)
        case UInt8(ascii: "u"):
            var scalar = try readHex4(escapeAt: at)
            if scalar & 0xFC00 == 0xD800 {
                // A high surrogate: a low one must follow as the next escape.
                guard offset + 1 < bytes.count, bytes[offset] == UInt8(ascii: "\\"), bytes[offset + 1] == UInt8(ascii: "u") else {
                    throw WireCodecError("invalid JSON: a lone surrogate escape in a string at offset \(at)")
                }
                offset += 2
                let low = try readHex4(escapeAt: at)
                guard low & 0xFC00 == 0xDC00 else {
                    throw WireCodecError("invalid JSON: a lone surrogate escape in a string at offset \(at)")
                }
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
            } else if scalar & 0xFC00 == 0xDC00 {
                throw WireCodecError("invalid JSON: a lone surrogate escape in a string at offset \(at)")
            }
            scratch.append(contentsOf: UTF8.encode(Unicode.Scalar(scalar)!)!)
        default:
            throw WireCodecError("invalid JSON: an invalid escape in a string at offset \(at)")
        }
    }

    private mutating func readHex4(escapeAt at: Int) throws(WireCodecError) -> UInt32 {
        var v: UInt32 = 0
        for _ in 0..<4 {
            let b = peek()
            let d: UInt8
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = b - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): d = b - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): d = b - UInt8(ascii: "A") + 10
            default: throw WireCodecError("invalid JSON: an invalid \\u escape in a string at offset \(at)")
            }
            v = v << 4 | UInt32(d)
            offset += 1
        }
        return v
    }

    // MARK: Numbers

    /// A number's text, checked against the RFC grammar.
    struct Number {
        fileprivate var start: Int
        fileprivate var end: Int
        /// Whether it has neither a fraction nor an exponent.
        var isInteger: Bool
        var isNegative: Bool
    }

    /// Reads a number (the next kind must be ``Kind/number``).
    mutating func readNumber() throws(WireCodecError) -> Number {
        let start = offset
        let negative = peek() == UInt8(ascii: "-")
        if negative { offset += 1 }
        var integer = true
        // int = zero / ( digit1-9 *DIGIT )
        switch peek() {
        case UInt8(ascii: "0"): offset += 1
        case UInt8(ascii: "1")...UInt8(ascii: "9"): skipDigits()
        default: throw syntaxError("a digit")
        }
        if peek() == UInt8(ascii: ".") {
            integer = false
            offset += 1
            guard isDigit(peek()) else { throw syntaxError("a digit") }
            skipDigits()
        }
        if peek() | 0x20 == UInt8(ascii: "e") {
            integer = false
            offset += 1
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { offset += 1 }
            guard isDigit(peek()) else { throw syntaxError("a digit") }
            skipDigits()
        }
        let n = Number(start: start, end: offset, isInteger: integer, isNegative: negative)
        skipWhitespace()
        return n
    }

    @inline(__always)
    private func isDigit(_ b: UInt8) -> Bool { b &- UInt8(ascii: "0") < 10 }

    @inline(__always)
    private mutating func skipDigits() {
        while offset < bytes.count && isDigit(bytes[offset]) { offset += 1 }
    }

    /// The magnitude of an integer number, or `nil` past `UInt64.max`.
    func magnitude(_ n: Number) -> UInt64? {
        var v: UInt64 = 0
        for i in (n.isNegative ? n.start + 1 : n.start)..<n.end {
            let (m, o1) = v.multipliedReportingOverflow(by: 10)
            let (a, o2) = m.addingReportingOverflow(UInt64(bytes[i] &- UInt8(ascii: "0")))
            if o1 || o2 { return nil }
            v = a
        }
        return v
    }

    /// The number as an `Int64`, or `nil` out of range (the number must be an integer).
    func int64(_ n: Number) -> Int64? {
        guard let m = magnitude(n) else { return nil }
        if n.isNegative {
            return m <= UInt64(Int64.max) + 1 ? Int64(truncatingIfNeeded: 0 &- m) : nil
        }
        return m <= UInt64(Int64.max) ? Int64(m) : nil
    }

    /// The number as the nearest `Double`, or `nil` when it is too large for one or so small that
    /// it rounds to zero (JSONDecoder refuses both).
    func double(_ n: Number) -> Double? {
        if let d = fastDouble(n) { return d }
        let d = Double(String(decoding: UnsafeRawBufferPointer(rebasing: bytes[n.start..<n.end]), as: UTF8.self))
        guard let d, d.isFinite else { return nil }
        if d == 0 {
            // Zero only when every digit of the significand is zero.
            for i in n.start..<n.end {
                let b = bytes[i]
                if b | 0x20 == UInt8(ascii: "e") { break }
                if b >= UInt8(ascii: "1") && b <= UInt8(ascii: "9") { return nil }
            }
        }
        return d
    }

    private static let powersOfTen: [Double] = (0...22).map { e in
        var p = 1.0
        for _ in 0..<e { p *= 10 }
        return p
    }

    /// Clinger's fast path: a significand of at most 2^53 and a power of ten of at most 22 are
    /// both exact as doubles, so one multiplication or division rounds correctly.
    private func fastDouble(_ n: Number) -> Double? {
        var i = n.isNegative ? n.start + 1 : n.start
        var significand: UInt64 = 0
        var digits = 0
        var scale = 0
        while i < n.end, isDigit(bytes[i]) {
            significand = significand &* 10 &+ UInt64(bytes[i] &- UInt8(ascii: "0"))
            digits += 1
            i += 1
        }
        if i < n.end && bytes[i] == UInt8(ascii: ".") {
            i += 1
            while i < n.end, isDigit(bytes[i]) {
                significand = significand &* 10 &+ UInt64(bytes[i] &- UInt8(ascii: "0"))
                digits += 1
                scale -= 1
                i += 1
            }
        }
        if i < n.end {  // the exponent
            i += 1
            var negative = false
            if bytes[i] == UInt8(ascii: "-") { negative = true; i += 1 } else if bytes[i] == UInt8(ascii: "+") { i += 1 }
            var e = 0
            while i < n.end {
                if e > 10_000 { return nil }
                e = e * 10 + Int(bytes[i] &- UInt8(ascii: "0"))
                i += 1
            }
            scale += negative ? -e : e
        }
        // 19 digits always fit in a UInt64; leading zeros count, which only errs towards the slow path.
        guard digits <= 19, significand <= 1 << 53, scale >= -22, scale <= 22 else { return nil }
        var d = Double(significand)
        if scale < 0 { d /= Self.powersOfTen[-scale] } else { d *= Self.powersOfTen[scale] }
        return n.isNegative ? -d : d
    }

    /// The bytes of a number, for messages.
    func text(_ n: Number) -> String {
        String(decoding: UnsafeRawBufferPointer(rebasing: bytes[n.start..<n.end]), as: UTF8.self)
    }

    // MARK: Any value

    /// Reads and checks one value of any kind, discarding it.
    mutating func skipValue() throws(WireCodecError) {
        switch nextKind() {
        case .object:
            guard try beginObject() else { return }
            repeat {
                _ = try readKey()
                try skipValue()
            } while try nextMember()
        case .array:
            guard try beginArray() else { return }
            repeat { try skipValue() } while try nextElement()
        case .string:
            _ = try readStringBytes()
            skipWhitespace()
        case .number: _ = try readNumber()
        case .bool: _ = try readBool()
        case .null: _ = try readNull()
        case .invalid: throw syntaxError("a value")
        }
    }
}

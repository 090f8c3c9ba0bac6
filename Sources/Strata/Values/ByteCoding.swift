import LMDB

/// A growable byte buffer for encoding records.
///
/// The write path keeps one of each per transaction and resets it between edits, so encoding an
/// edit allocates nothing once the buffers have grown to the size of a typical record.

struct ByteWriter {
    var bytes: [UInt8]

    init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    var count: Int { bytes.count }

    mutating func reset() { bytes.removeAll(keepingCapacity: true) }

    mutating func append(_ byte: UInt8) { bytes.append(byte) }

    mutating func append(_ buffer: UnsafeRawBufferPointer) { bytes.append(contentsOf: buffer) }

    mutating func append(_ array: [UInt8]) { bytes.append(contentsOf: array) }

    /// Replaces the bytes with `buffer`'s: `reset()` and `append(buffer)` in one call.
    mutating func replaceAll(with buffer: UnsafeRawBufferPointer) { bytes.replaceSubrange(bytes.indices, with: buffer) }

    /// LEB128: seven bits a byte, low bits first.
    @inline(__always)
    mutating func appendVarint(_ value: UInt64) {
        // Most varints are one byte (field ids, lengths, small ints): written without the loop
        // or a call (about 85 instructions a varint through the call).
        if value < 0x80 {
            bytes.append(UInt8(value))
            return
        }
        appendLongVarint(value)
    }

    private mutating func appendLongVarint(_ value: UInt64) {
        // Written on the stack and appended by one call: an append per byte checks the
        // array's uniqueness each time.
        var buffer: (UInt64, UInt64) = (0, 0)
        let n = Swift.withUnsafeMutableBytes(of: &buffer) { Self.writeVarint(value, to: $0, at: 0) }
        Swift.withUnsafeBytes(of: &buffer) { append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }

    /// Writes `value` as a LEB128 varint (as ``appendVarint(_:)``) into `b` at `offset`, where
    /// 10 bytes must be free; returns the offset after it.
    @inline(__always)
    static func writeVarint(_ value: UInt64, to b: UnsafeMutableRawBufferPointer, at offset: Int) -> Int {
        var v = value
        var o = offset
        while v >= 0x80 {
            b[o] = UInt8(truncatingIfNeeded: v) | 0x80
            v >>= 7
            o += 1
        }
        b[o] = UInt8(v)
        return o + 1
    }

    mutating func appendLittleEndian(_ value: UInt64) {
        Swift.withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }

    mutating func appendBigEndian(_ value: UInt64) {
        Swift.withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    mutating func appendBigEndian(_ value: UInt32) {
        Swift.withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    /// Overwrites eight bytes at `offset` with `value`, big-endian.
    mutating func setBigEndian(_ value: UInt64, at offset: Int) {
        Swift.withUnsafeBytes(of: value.bigEndian) { src in
            for i in 0..<8 { bytes[offset + i] = src[i] }
        }
    }

    func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try withBytes(bytes, body)
    }
}

/// A bounds-checked reader over bytes lent by LMDB or by a buffer.
///
/// Every read checks the remaining length and throws ``StrataError/Code/corruptRecord`` instead
/// of reading past the end, so a damaged record is reported, never misread.

struct ByteReader {
    let buffer: UnsafeRawBufferPointer
    var offset: Int

    init(_ buffer: UnsafeRawBufferPointer, offset: Int = 0) {
        self.buffer = buffer
        self.offset = offset
    }

    var isAtEnd: Bool { offset >= buffer.count }
    var remaining: Int { buffer.count - offset }


    func corrupt(_ what: String) -> StrataError {
        StrataError(.corruptRecord, "a stored record is damaged: \(what) at byte \(offset) of \(buffer.count)")
    }

    /// Inlined: every field entry and value reads its tag through it (a call cost about 25
    /// instructions, a million times in a merge of 100,000 server rows).
    @inline(__always)
    mutating func byte() throws(StrataError) -> UInt8 {
        guard offset < buffer.count else { throw corrupt("unexpected end") }
        defer { offset += 1 }
        return buffer[offset]
    }

    @inline(__always)
    mutating func varint() throws(StrataError) -> UInt64 {
        // Most varints are one byte (field ids, lengths, small ints): read without the loop.
        if offset < buffer.count, buffer[offset] < 0x80 {
            defer { offset += 1 }
            return UInt64(buffer[offset])
        }
        return try longVarint()
    }

    private mutating func longVarint() throws(StrataError) -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            guard offset < buffer.count else { throw corrupt("unterminated varint") }
            let b = buffer[offset]
            offset += 1
            guard shift < 64 else { throw corrupt("varint too long") }
            result |= UInt64(b & 0x7F) << shift
            if b < 0x80 { return result }
            shift += 7
        }
    }

    mutating func littleEndian64() throws(StrataError) -> UInt64 {
        guard remaining >= 8 else { throw corrupt("truncated 8-byte field") }
        var v: UInt64 = 0
        withUnsafeMutableBytes(of: &v) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[offset..<offset + 8])) }
        offset += 8
        return UInt64(littleEndian: v)
    }

    mutating func bigEndian64() throws(StrataError) -> UInt64 {
        guard remaining >= 8 else { throw corrupt("truncated 8-byte field") }
        var v: UInt64 = 0
        withUnsafeMutableBytes(of: &v) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[offset..<offset + 8])) }
        offset += 8
        return UInt64(bigEndian: v)
    }

    mutating func bigEndian32() throws(StrataError) -> UInt32 {
        guard remaining >= 4 else { throw corrupt("truncated 4-byte field") }
        var v: UInt32 = 0
        withUnsafeMutableBytes(of: &v) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[offset..<offset + 4])) }
        offset += 4
        return UInt32(bigEndian: v)
    }

    mutating func bytes(_ count: Int) throws(StrataError) -> UnsafeRawBufferPointer {
        guard count >= 0, remaining >= count else { throw corrupt("length \(count) past the end") }
        defer { offset += count }
        return UnsafeRawBufferPointer(rebasing: buffer[offset..<offset + count])
    }
}

/// Big-endian bytes of an LSN, the `log` key.

func lsnKey(_ lsn: UInt64) -> UInt64 { lsn.bigEndian }

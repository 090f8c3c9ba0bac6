import CStrataCRC

/// CRC-32C (Castagnoli): the checksum of log records (operation format 3, see ``RecordFormat``).
///
/// The reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF — the CRC of
/// iSCSI (RFC 3720), ext4 and SSE4.2's `crc32` instruction, so any of their implementations can
/// check a record. Computed with the processor's CRC-32C instruction where it has one (SSE4.2 on
/// x86-64, the CRC32 extension on 64-bit Arm; `CStrataCRC`), eight bytes per instruction;
/// otherwise in software, slicing by 8: eight 256-entry tables let one step consume eight bytes,
/// about 1 byte per cycle. On the 1M-edit store, `verify` spent 6% of its instructions in the
/// software loop; the instruction makes that a fraction of a percent.
enum CRC32C {
    /// The checksum of `bytes`.
    ///
    /// - Complexity: O(n) for n bytes.
    static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        ~update(0xFFFF_FFFF, bytes)
    }

    /// The checksum of the byte `first` followed by `bytes`.
    static func checksum(_ first: UInt8, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        var b = first
        let crc = Swift.withUnsafeBytes(of: &b) { update(0xFFFF_FFFF, $0) }
        return ~update(crc, bytes)
    }

    /// The checksum of `bytes`.
    static func checksum(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBytes { checksum($0) }
    }

    /// The checksum of the 8 bytes of `prefix`, big-endian, then the byte `first`, then `bytes`:
    /// a log record's (format 5) with its LSN before it.
    static func checksum(prefix: UInt64, _ first: UInt8, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        var crc = Swift.withUnsafeBytes(of: prefix.bigEndian) { update(0xFFFF_FFFF, $0) }
        crc = Swift.withUnsafeBytes(of: first) { update(crc, $0) }
        return ~update(crc, bytes)
    }

    /// The CRC of `bytes` from a zero register, without the final inversion: linear in the
    /// bytes, so the checksums of two messages of one length differ by this of their xor.
    static func linear(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        update(0, bytes)
    }

    /// The register `crc` carried over `count` zero bytes, in O(log count): `crc` times
    /// x^(8·count) modulo the polynomial (as zlib's `crc32_combine` computes it).
    static func appendingZeros(_ crc: UInt32, count: Int) -> UInt32 {
        var p: UInt32 = 1 << 31  // x^0, reflected
        var n = count
        var k = 3  // powers[k] is x^(2^k): a byte is x^8
        while n > 0 {
            if n & 1 != 0 { p = multiply(powers[k & 31], p) }
            n >>= 1
            k += 1
        }
        return multiply(p, crc)
    }

    /// `a` times `b` modulo the polynomial, both reflected: with `a` = ``appendingZeros(_:count:)``
    /// of x^0 (`1 << 31`), `b` carried over that many zero bytes.
    static func multiply(_ a: UInt32, _ b: UInt32) -> UInt32 {
        var (m, b, p): (UInt32, UInt32, UInt32) = (1 << 31, b, 0)
        while m != 0 {
            if a & m != 0 { p ^= b }
            m >>= 1
            b = b & 1 != 0 ? b >> 1 ^ 0x82F6_3B78 : b >> 1
        }
        return p
    }

    /// x^(2^k) modulo the polynomial, reflected, for k in 0..<32 (the exponents cycle).
    private static let powers: [UInt32] = {
        var t = [UInt32](repeating: 0, count: 32)
        var p: UInt32 = 1 << 30  // x^1
        t[0] = p
        for k in 1..<32 {
            p = multiply(p, p)
            t[k] = p
        }
        return t
    }()

    /// Whether ``update(_:_:)`` uses the processor's instruction (read once).
    static let usesInstruction = strata_crc32c_available() != 0

    /// Continues the raw (not finally inverted) CRC `crc` over `bytes`.
    private static func update(_ crc: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        guard usesInstruction, let base = bytes.baseAddress else { return softwareUpdate(crc, bytes) }
        return strata_crc32c_update(crc, base, bytes.count)
    }

    /// ``update(_:_:)`` without the instruction: the tests check the two agree.
    static func softwareUpdate(_ crc: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        var crc = crc
        var i = 0
        let n = bytes.count
        table.withUnsafeBufferPointer { t in
            while i + 8 <= n {
                // Little-endian words: the first byte of the block is the low byte.
                let lo = crc ^ UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt32.self))
                let hi = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: i + 4, as: UInt32.self))
                crc = t[7 * 256 + Int(lo & 0xFF)] ^ t[6 * 256 + Int(lo >> 8 & 0xFF)]
                    ^ t[5 * 256 + Int(lo >> 16 & 0xFF)] ^ t[4 * 256 + Int(lo >> 24)]
                    ^ t[3 * 256 + Int(hi & 0xFF)] ^ t[2 * 256 + Int(hi >> 8 & 0xFF)]
                    ^ t[1 * 256 + Int(hi >> 16 & 0xFF)] ^ t[Int(hi >> 24)]
                i += 8
            }
            while i < n {
                crc = t[Int((crc ^ UInt32(bytes[i])) & 0xFF)] ^ crc >> 8
                i += 1
            }
        }
        return crc
    }

    /// Table k holds, for each byte b, the CRC of b followed by k zero bytes: table 0 is the
    /// classic byte table, and table k is table k−1 advanced by one more byte.
    private static let table: [UInt32] = {
        var t = [UInt32](repeating: 0, count: 8 * 256)
        for b in 0..<256 {
            var c = UInt32(b)
            for _ in 0..<8 { c = c & 1 != 0 ? c >> 1 ^ 0x82F6_3B78 : c >> 1 }
            t[b] = c
        }
        for k in 1..<8 {
            for b in 0..<256 {
                let prev = t[(k - 1) * 256 + b]
                t[k * 256 + b] = t[Int(prev & 0xFF)] ^ prev >> 8
            }
        }
        return t
    }()
}

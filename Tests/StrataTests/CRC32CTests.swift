@testable import Strata
import StrataWorkload
import Testing

/// The checksum of log records against published vectors, and both ways of computing it (the
/// processor's instruction, where the machine has one, and the table-driven loop) against the
/// bitwise definition at every length and alignment.
@Suite struct CRC32CTests {
    @Test func standardCheckValue() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
    }

    /// RFC 3720 (iSCSI), appendix B.4.
    @Test func rfc3720Vectors() {
        #expect(CRC32C.checksum([UInt8](repeating: 0, count: 32)) == 0x8A91_36AA)
        #expect(CRC32C.checksum([UInt8](repeating: 0xFF, count: 32)) == 0x62A8_AB43)
        #expect(CRC32C.checksum((0..<32).map { UInt8($0) }) == 0x46DD_794E)
        #expect(CRC32C.checksum((0..<32).map { UInt8(31 - $0) }) == 0x113F_DB5C)
        let scsiRead: [UInt8] = [
            0x01, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
            0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ]
        #expect(CRC32C.checksum(scsiRead) == 0xD996_3A56)
        #expect(CRC32C.checksum([]) == 0)
    }

    /// The bitwise definition, one bit at a time.
    static func reference(_ bytes: ArraySlice<UInt8>) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for b in bytes {
            crc ^= UInt32(b)
            for _ in 0..<8 { crc = crc & 1 != 0 ? crc >> 1 ^ 0x82F6_3B78 : crc >> 1 }
        }
        return ~crc
    }

    @Test func slicingEqualsTheBitwiseDefinition() {
        var rng = SplitMix64(seed: testSeed("CRC32CTests.slicing"))
        let data = (0..<300).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        for start in 0..<9 {
            for end in stride(from: start, through: data.count, by: 7) {
                let slice = data[start..<end]
                let fast = slice.withUnsafeBytes { CRC32C.checksum($0) }
                #expect(fast == Self.reference(slice), "bytes \(start)..<\(end)")
            }
        }
    }

    /// The table-driven loop, which machines without the instruction use, gives what the
    /// instruction gives (the test above checks whichever `checksum` uses).
    @Test func theSoftwareLoopEqualsTheBitwiseDefinition() {
        var rng = SplitMix64(seed: testSeed("CRC32CTests.software"))
        let data = (0..<300).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        print("CRC-32C: the processor's instruction is \(CRC32C.usesInstruction ? "used" : "not available")")
        for start in 0..<9 {
            for end in stride(from: start, through: data.count, by: 7) {
                let slice = data[start..<end]
                let software = slice.withUnsafeBytes { ~CRC32C.softwareUpdate(0xFFFF_FFFF, $0) }
                #expect(software == Self.reference(slice), "bytes \(start)..<\(end)")
            }
        }
    }

    /// A log record's checksum (format 5) is the CRC of its LSN's 8 bytes, big-endian, then
    /// the format byte and the rest, and a key damaged in one byte is told from damaged content
    /// by the CRC's linearity: carrying a register over zero bytes in O(log n) equals running
    /// the CRC over them, at every length.
    @Test func theLSNPrefixAndZeroBytesFollowTheDefinition() {
        var rng = SplitMix64(seed: testSeed("CRC32CTests.prefix"))
        let data = (0..<300).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        for length in [0, 1, 7, 8, 9, 64, 299] {
            let lsn = rng.next() >> 2
            let message = withUnsafeBytes(of: lsn.bigEndian) { Array($0) } + [5] + data.prefix(length)
            let prefixed = data.prefix(length).withUnsafeBytes { CRC32C.checksum(prefix: lsn, 5, $0) }
            #expect(prefixed == Self.reference(message[...]), "length \(length)")
        }
        for count in [0, 1, 2, 3, 8, 100, 4095, 65_537] {
            let register = UInt32(truncatingIfNeeded: rng.next())
            let zeros = [UInt8](repeating: 0, count: count)
            let run = zeros.withUnsafeBytes { CRC32C.softwareUpdate(register, $0) }
            #expect(CRC32C.appendingZeros(register, count: count) == run, "\(count) zero bytes")
        }
    }
}

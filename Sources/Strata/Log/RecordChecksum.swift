import LMDB

/// The checksum of operation records (format 3 on, see ``RecordFormat``): sealing a record the
/// write path built, and checking one read from the log as evidence. Format 3's covers the bytes
/// after it; format 4's also the format byte, so neither layout reads as the other; format 5's
/// also the LSN the record is stored under, its key in the log.
///
/// Format 5's checksum is the CRC-32C of the LSN as 8 bytes big-endian (the log key), then the
/// format byte and the bytes after the checksum: the CRC seeded with the key. Key and record are
/// one message to the CRC, so a damaged key is caught as surely as damaged content, with the
/// CRC's guarantees over the whole (every error within 32 consecutive bits; so a record stored
/// under another LSN below 2^32 always fails). A key damaged in one byte is also named: CRC-32C
/// is linear, so for an intact record the checksum differs from the one computed under the key
/// it is found at by a term that depends only on how the two LSNs differ, which
/// ``status(_:lsn:rules:)`` looks up for each one-byte change of the key.
///
/// Not checked in `OperationHeader.init`; checked once per record wherever the log is read to
/// rebuild, verify, compact, replay, salvage or show history. The write path seals the records
/// it builds and never parses them back (``OperationHeader/start(_:origin:transactionOffset:carried:schemaBump:target:prevLSN:annotation:into:)``).
enum RecordChecksum {
    /// What a record's checksum says.
    enum Status: Equatable {
        /// A record of format 5 or later whose checksum matches its content and its LSN.
        case valid
        /// A record of format 3 or 4 whose checksum matches its content; it does not cover the
        /// record's LSN (written before format 5, below ``ChecksumRules/lsnCoveredFrom``).
        case validWithoutLSN
        /// A record written before format 3, which carries no checksum.
        case absent
        /// The record is damaged; says how.
        case damaged(String)
    }

    /// Writes the checksum of the complete record in `record`, to be stored at `lsn`, into its
    /// checksum field.
    static func seal(_ record: inout ByteWriter, lsn: UInt64) {
        let crc = record.withUnsafeBytes { b in compute(b, format: b[0], lsn: lsn) }
        Swift.withUnsafeBytes(of: crc.littleEndian) { src in
            for i in 0..<RecordFormat.checksumSize { record.bytes[1 + i] = src[i] }
        }
    }

    /// The status of the operation `record` stored at `lsn`, in a log whose operations carry a
    /// checksum from LSN `rules.checksumsFrom` on, and one that covers the LSN from
    /// `rules.lsnCoveredFrom` on (the `meta` counters of those names).
    ///
    /// - Complexity: O(n) for a record of n bytes.
    static func status(_ record: UnsafeRawBufferPointer, lsn: UInt64, rules: ChecksumRules) -> Status {
        guard let format = record.first else { return .damaged("it is empty") }
        switch format {
        case RecordFormat.checksummedFormat...RecordFormat.operationFormat:
            let start = 1 + RecordFormat.checksumSize
            guard record.count >= start else { return .damaged("it is shorter than its checksum") }
            let stored = UInt32(littleEndian: record.loadUnaligned(fromByteOffset: 1, as: UInt32.self))
            if format >= RecordFormat.lsnCoveredFormat {
                let actual = compute(record, format: format, lsn: lsn)
                if stored == actual { return .valid }
                if let sealed = sealedLSN(near: lsn, difference: stored ^ actual, after: record.count - RecordFormat.checksumSize) {
                    return .damaged("its checksum does not cover LSN \(lsn), the key it is stored under: it was sealed as LSN \(sealed), so its key is damaged or it was moved")
                }
                return .damaged("its checksum does not match its content and LSN \(lsn): the record or its key is damaged")
            }
            guard stored == compute(record, format: format, lsn: lsn) else {
                return .damaged("its checksum does not match its content")
            }
            if lsn >= rules.lsnCoveredFrom {
                // An intact older record under a key from the counter on: moved there, or its key damaged.
                return .damaged("it has format \(format), whose checksum does not cover its LSN, where every operation from LSN \(rules.lsnCoveredFrom) on has one that does")
            }
            return .validWithoutLSN
        case RecordFormat.oldestOperationFormat..<RecordFormat.checksummedFormat:
            // Written before checksums, or a format-3 record whose format byte was damaged.
            if lsn >= rules.checksumsFrom {
                return .damaged("it has format \(format), without a checksum, where every operation from LSN \(rules.checksumsFrom) on has one")
            }
            return .absent
        default:
            // A newer Strata writing a newer record format writes a newer store format, which
            // this one refuses to open: here, an unknown format byte is damage.
            return .damaged("it has an unknown format (\(format))")
        }
    }

    /// The checksum of the complete record `record` of format `format`, stored at `lsn`: of the
    /// bytes after the checksum field, from format 4 on preceded by the format byte, from
    /// format 5 on by the LSN too.
    private static func compute(_ record: UnsafeRawBufferPointer, format: UInt8, lsn: UInt64) -> UInt32 {
        let rest = UnsafeRawBufferPointer(rebasing: record[(1 + RecordFormat.checksumSize)...])
        if format >= RecordFormat.lsnCoveredFormat { return CRC32C.checksum(prefix: lsn, format, rest) }
        return format >= RecordFormat.compactFormat ? CRC32C.checksum(format, rest) : CRC32C.checksum(rest)
    }

    /// The LSN an intact format-5 record stored at `lsn` was sealed as, when the two differ in
    /// one byte (which covers every flipped bit of the key): `difference` is the record's
    /// checksum xor the one computed for `lsn`, and `count` the bytes the CRC reads after the
    /// LSN. Two messages of one length differ in CRC by the linear CRC of their xor, here an
    /// 8-byte change of the key followed by `count` zero bytes. `nil` when no one-byte change
    /// explains it: the content is damaged (or the key in more than one byte). Run only on a
    /// record found damaged: 2,040 CRCs of 8 bytes, each carried over the zeros by one product.
    private static func sealedLSN(near lsn: UInt64, difference: UInt32, after count: Int) -> UInt64? {
        let zeros = CRC32C.appendingZeros(1 << 31, count: count)  // x^(8·count)
        for shift in stride(from: UInt64(0), to: 64, by: 8) {
            for delta in UInt64(1)...0xFF {
                let change = delta << shift
                let candidate = lsn ^ change
                guard candidate > 0 else { continue }
                let term = Swift.withUnsafeBytes(of: change.bigEndian) { CRC32C.linear($0) }
                if CRC32C.multiply(zeros, term) == difference { return candidate }
            }
        }
        return nil
    }

    /// Throws `corruptRecord`, naming `lsn`, unless `record` is valid or older than checksums.
    /// Returns whether the record carries a checksum.
    @discardableResult
    static func check(_ record: UnsafeRawBufferPointer, lsn: UInt64, rules: ChecksumRules) throws(StrataError) -> Bool {
        switch status(record, lsn: lsn, rules: rules) {
        case .valid, .validWithoutLSN: return true
        case .absent: return false
        case .damaged(let why): throw damaged(lsn, why)
        }
    }

    /// The error for a damaged operation.
    static func damaged(_ lsn: UInt64, _ why: String) -> StrataError {
        StrataError(.corruptRecord, "the operation at LSN \(lsn) is damaged: \(why)")
    }
}

/// Where a store's log must carry checksums, from its `meta` counters (see ``RecordFormat``).
struct ChecksumRules: Equatable {
    /// The first LSN whose operation must carry a checksum (format 3 or later).
    var checksumsFrom: UInt64
    /// The first LSN whose operation's checksum must also cover its LSN (format 5 or later).
    var lsnCoveredFrom: UInt64

    /// Every operation must have a checksum that covers its LSN: a store created with store
    /// format 7 or later.
    static let everyOperation = ChecksumRules(checksumsFrom: 1, lsnCoveredFrom: 1)
    /// No operation must: what salvage assumes of a store whose counters it cannot read.
    static let none = ChecksumRules(checksumsFrom: .max, lsnCoveredFrom: .max)
}

extension ReadableTransaction {
    /// Where the log must carry checksums (see ``RecordFormat``): the meta counter
    /// `checksumsFrom`, set when the store was created or migrated to store format 5, and
    /// `lsnCoveredFrom`, set when it was created or migrated to store format 7; 1 (every
    /// operation) when missing.
    func checksumRules(in databases: StoreDatabases) throws(StrataError) -> ChecksumRules {
        ChecksumRules(
            checksumsFrom: try metaUInt64(MetaKey.checksumsFrom, in: databases) ?? 1,
            lsnCoveredFrom: try metaUInt64(MetaKey.lsnCoveredFrom, in: databases) ?? 1)
    }
}

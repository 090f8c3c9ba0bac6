import LMDB

/// The checksum of operation records (format 3 on, see ``RecordFormat``): sealing a record the
/// write path built, and checking one read from the log as evidence. Format 3's covers the bytes
/// after it; format 4's also the format byte, so neither layout reads as the other.
///
/// Not checked in `OperationHeader.init`, which the write path runs several times per edit on
/// a record it has just built; checked once per record wherever the log is read to rebuild,
/// verify, compact, replay, salvage or show history.
enum RecordChecksum {
    /// What a record's checksum says.
    enum Status: Equatable {
        /// A record of format 3 or later whose checksum matches.
        case valid
        /// A record written before format 3, which carries no checksum.
        case absent
        /// The record is damaged; says how.
        case damaged(String)
    }

    /// Writes the checksum of the complete record in `record` into its checksum field.
    static func seal(_ record: inout ByteWriter) {
        let crc = record.withUnsafeBytes { b in compute(b, format: b[0]) }
        Swift.withUnsafeBytes(of: crc.littleEndian) { src in
            for i in 0..<RecordFormat.checksumSize { record.bytes[1 + i] = src[i] }
        }
    }

    /// The status of the operation `record` stored at `lsn`, in a log whose operations carry a
    /// checksum from LSN `checksumsFrom` on (the `meta` counter of that name).
    ///
    /// - Complexity: O(n) for a record of n bytes.
    static func status(_ record: UnsafeRawBufferPointer, lsn: UInt64, checksumsFrom: UInt64) -> Status {
        guard let format = record.first else { return .damaged("it is empty") }
        switch format {
        case RecordFormat.checksummedFormat...RecordFormat.operationFormat:
            let start = 1 + RecordFormat.checksumSize
            guard record.count >= start else { return .damaged("it is shorter than its checksum") }
            let stored = UInt32(littleEndian: record.loadUnaligned(fromByteOffset: 1, as: UInt32.self))
            let actual = compute(record, format: format)
            return stored == actual ? .valid : .damaged("its checksum does not match its content")
        case RecordFormat.oldestOperationFormat..<RecordFormat.checksummedFormat:
            // Written before checksums, or a format-3 record whose format byte was damaged.
            if lsn >= checksumsFrom {
                return .damaged("it has format \(format), without a checksum, where every operation from LSN \(checksumsFrom) on has one")
            }
            return .absent
        default:
            // A newer Strata writing a newer record format writes a newer store format, which
            // this one refuses to open: here, an unknown format byte is damage.
            return .damaged("it has an unknown format (\(format))")
        }
    }

    /// The checksum of the complete record `record` of format `format`.
    private static func compute(_ record: UnsafeRawBufferPointer, format: UInt8) -> UInt32 {
        let rest = UnsafeRawBufferPointer(rebasing: record[(1 + RecordFormat.checksumSize)...])
        return format >= RecordFormat.compactFormat ? CRC32C.checksum(format, rest) : CRC32C.checksum(rest)
    }

    /// Throws `corruptRecord`, naming `lsn`, unless `record` is valid or older than checksums.
    /// Returns whether the record carries a checksum.
    @discardableResult
    static func check(_ record: UnsafeRawBufferPointer, lsn: UInt64, checksumsFrom: UInt64) throws(StrataError) -> Bool {
        switch status(record, lsn: lsn, checksumsFrom: checksumsFrom) {
        case .valid: return true
        case .absent: return false
        case .damaged(let why): throw damaged(lsn, why)
        }
    }

    /// The error for a damaged operation.
    static func damaged(_ lsn: UInt64, _ why: String) -> StrataError {
        StrataError(.corruptRecord, "the operation at LSN \(lsn) is damaged: \(why)")
    }
}

extension ReadableTransaction {
    /// The first LSN whose operation must carry a checksum (see ``RecordFormat``): the meta
    /// counter `checksumsFrom`, set when the store was created or migrated to store format 5;
    /// 1 (every operation) when it is missing.
    func checksumsFrom(in views: StoreDatabases) throws(StrataError) -> UInt64 {
        try metaUInt64(MetaKey.checksumsFrom, in: views) ?? 1
    }
}

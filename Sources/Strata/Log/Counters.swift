import LMDB

/// Checks for the numbers Strata reads back from disk: LSNs, transaction ids, the horizon,
/// versions. A damaged or hostile file can hold any 64-bit value there, and Swift traps on
/// overflow, so every such number is checked here, before any arithmetic or conversion.
enum Counter {
    /// The largest LSN, transaction id or version Strata accepts from disk: 2^62, far beyond
    /// anything a store reaches (a million operations a second for 146,000 years), and small
    /// enough that `+ 1`, `Int(_)` and sums of a few of them cannot overflow.
    static let limit: UInt64 = 1 << 62

    /// `value`, or a `corruptRecord` error naming `what` when it is beyond ``limit``.
    static func checked(_ value: UInt64, _ what: @autoclosure () -> String) throws(StrataError) -> UInt64 {
        guard value <= limit else {
            throw StrataError(.corruptRecord, "the store is damaged: \(what()) is \(value), beyond any value Strata writes (at most 2^62)")
        }
        return value
    }

    /// Decodes an 8-byte big-endian counter stored under `key` of database `database`: exactly
    /// 8 bytes, at most ``limit``.
    static func decode(_ bytes: UnsafeRawBufferPointer, database: String, key: String) throws(StrataError) -> UInt64 {
        guard bytes.count == 8 else {
            throw StrataError(.corruptRecord, "the store is damaged: the \(database) entry '\(key)' holds \(bytes.count) bytes, not the 8 of a counter")
        }
        var r = ByteReader(bytes)
        return try checked(try r.bigEndian64(), "the \(database) entry '\(key)'")
    }

    /// Decodes a `log` key (an LSN, 8 bytes big-endian), checking its length and range.
    static func lsn(key bytes: UnsafeRawBufferPointer) throws(StrataError) -> UInt64 {
        guard bytes.count == 8 else {
            throw StrataError(.corruptRecord, "the store is damaged: a key of the log database holds \(bytes.count) bytes, not the 8 of an LSN")
        }
        var r = ByteReader(bytes)
        let lsn = try r.bigEndian64()
        guard lsn > 0 else { throw StrataError(.corruptRecord, "the store is damaged: the log database holds an operation at LSN 0") }
        return try checked(lsn, "an LSN key of the log database")
    }
}

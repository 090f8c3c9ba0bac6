import Foundation
@_spi(ValueCoding) import Strata

/// The sync client's two lists of rows set aside, as binary records: the rows the server
/// rejected (`SyncClient.rejectedProperty`, read by every batch, acknowledgement and merge) and
/// the server rows this store refused (`SyncClient.refusedServerRowsProperty`, read by every
/// merge).
/// They use ``BatchRecord``'s value encoding and its reader.
///
/// Layouts, strings and key values as encoded values, counts as varints, kinds as in
/// ``BatchRecord``:
///
/// ```
/// rejected rows, version 1:        0x01  count (table key kind reason batchID)…
/// refused server rows, version 1:  0x01  count (table key reason anchor)…
/// key = keyCount value…
/// ```
///
/// Earlier versions kept each list as a `WireFormat` JSON array. That always starts with `[`
/// (0x5B, the encoder writes no leading space), which a version byte counting up from 1 will not
/// reach, so the first byte tells the formats apart: such a list is still read, and the next
/// save of the list writes it as a record.
enum SetAsideRecord {
    static let version: UInt8 = 1

    static func encode(_ rows: [RejectedRow]) -> [UInt8] {
        encode(rows) { row, out in
            ValueCoding.append(.string(row.table), to: &out)
            BatchRecord.append(row.key, to: &out)
            out.append(BatchRecord.kindCode(row.kind))
            ValueCoding.append(.string(row.reason), to: &out)
            ValueCoding.append(.string(row.batchID), to: &out)
        }
    }

    static func encode(_ rows: [RefusedServerRow]) -> [UInt8] {
        encode(rows) { row, out in
            ValueCoding.append(.string(row.table), to: &out)
            BatchRecord.append(row.key, to: &out)
            ValueCoding.append(.string(row.reason), to: &out)
            ValueCoding.append(.string(row.anchor), to: &out)
        }
    }

    /// The rejected rows of a record, or of a JSON list an earlier version wrote.
    ///
    /// - Throws: `StrataError` `corruptRecord`, naming `property`, for bytes that are neither.
    static func rejectedRows(_ bytes: [UInt8], property: String) throws(StrataError) -> [RejectedRow] {
        try decode(bytes, property: property, subject: "the list of rejected rows") { (r: inout BatchRecord.Reader) throws(StrataError) in
            RejectedRow(table: try r.string(), key: try r.key(), kind: try r.kind(), reason: try r.string(), batchID: try r.string())
        }
    }

    /// The refused server rows of a record, or of a JSON list an earlier version wrote.
    ///
    /// - Throws: `StrataError` `corruptRecord`, naming `property`, for bytes that are neither.
    static func refusedServerRows(_ bytes: [UInt8], property: String) throws(StrataError) -> [RefusedServerRow] {
        try decode(bytes, property: property, subject: "the list of refused server rows") { (r: inout BatchRecord.Reader) throws(StrataError) in
            RefusedServerRow(table: try r.string(), key: try r.key(), reason: try r.string(), anchor: try r.string())
        }
    }

    private static func encode<Row>(_ rows: [Row], _ appendRow: (Row, inout [UInt8]) -> Void) -> [UInt8] {
        var out: [UInt8] = [version]
        out.reserveCapacity(8 + rows.count * 64)
        ValueCoding.appendVarint(UInt64(rows.count), to: &out)
        for row in rows { appendRow(row, &out) }
        return out
    }

    private static func decode<Row: Decodable>(
        _ bytes: [UInt8], property: String, subject: String, _ readRow: (inout BatchRecord.Reader) throws(StrataError) -> Row
    ) throws(StrataError) -> [Row] {
        var r = BatchRecord.Reader(bytes: bytes, property: property, subject: subject)
        guard let first = bytes.first else { throw r.damaged("is empty") }
        if first == UInt8(ascii: "[") {
            do {
                return try WireFormat.decode([Row].self, from: Data(bytes))
            } catch {
                throw r.damaged("is neither a record nor a JSON list: \(error.message)")
            }
        }
        guard first == version else {
            throw r.damaged("has record version \(first); this version of Strata reads version \(version) (was the store written by a newer one?)")
        }
        r.at = 1
        let n = try r.count()
        var rows: [Row] = []
        rows.reserveCapacity(n)
        for _ in 0..<n { rows.append(try readRow(&r)) }
        guard r.at == bytes.count else { throw r.damaged("has \(bytes.count - r.at) bytes after its last row") }
        return rows
    }
}

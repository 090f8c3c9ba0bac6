import LMDB

/// The binary records of the `log` and `rows` databases.
///
/// Both are built from the same **field entry**:
///
///     varint fieldID, u8 state, value…       state 0 = clean:  one value (original == current)
///                                            state 1 = dirty:  two values, original then current
///                                            state 2 = in conflict: two values, the server's
///                                                      value then current (format 2 on)
///
/// A field *in conflict* is one a merge left unresolved (the deferred policy): the server changed
/// it, the device changed it, to different values. Its entry records the server's value in the
/// original's place — the merge sets the original to the server's value anyway — and stays a
/// conflict entry through local edits until a merge or ``resolve`` settles it, so the conflicting
/// fields and their server values are in the log and the row, and a fold reproduces them. For a
/// row the server deleted (a local insert then) the server's value is null.
///
/// A **row state** (value in `rows`) is `u8 flags, varint lastLSN` followed by the row's field
/// entries in field-id order; null clean fields are left out, and key fields live in the key.
///
/// An **operation** (value in `log`), from format 4 on (format 5 has the same layout), is
///
///     u8 format, u32 crc32c, u8 kind, u8 flags, varint txnOffset,
///     [varint timestamp (µs since 1970), varint schemaVersion,]      when flags carry the transaction
///     varint targetLength, target (the `rows` key), varint prevLSN,
///     [varint annotationLength, annotation,]                         when flags say so
///     field entries in field-id order
///
/// `flags` holds the row's flags after the operation (``RowFlags``: bits 0x01, 0x02, 0x04, 0x80)
/// and four bits of the operation's own (``OperationBits``): the origin is the server (0x08), an
/// annotation follows (0x10), the record carries its transaction's header (0x20), and the
/// operation's schema version is one above its transaction's (0x40, a write that changed the
/// schema before this edit). Both 0x20 and 0x40 are set only on an operation that compaction or
/// salvage rewrote to carry the header: the header keeps the transaction's schema version, which
/// the transaction's later operations add their own 0x40 to, and the operation stays one above it.
///
/// What the operations of one transaction share — the transaction id, its time, its schema
/// version (``TransactionHeader``) — is written once: in the transaction's first operation,
/// which carries it. The transaction id is that operation's LSN, so every operation names its
/// transaction by `txnOffset`, the distance back to it (0 in the first), and finds the header in
/// the first operation of its transaction still in the log, which always carries one: a
/// compaction whose horizon splits a transaction rewrites the operation after the horizon to
/// carry it (the one rewrite of an operation, changing nothing it says), and salvage does the same
/// for the first operation it keeps of a transaction whose first one is lost. A single-edit transaction pays nothing for this: its one
/// operation carries the header, which costs what every operation cost before.
///
/// Before format 4 every operation carried everything (formats 1 to 3):
///
///     u8 format, [u32 crc32c,] u8 kind, u8 origin, varint txnID, varint timestamp (µs since 1970),
///     varint schemaVersion, varint targetLength, target (the `rows` key), varint prevLSN,
///     u8 flagsAfter, varint annotationLength, annotation, field entries in field-id order
///
/// From format 3 on, the format byte is followed by a **checksum**: the CRC-32C (``CRC32C``) of
/// every byte after it — the rest of the header and the field entries — little-endian; from
/// format 4 on it covers the format byte too, so a damaged format byte cannot make a record read
/// in the other layout; from format 5 on it also covers the LSN the record is stored under (its
/// key in `log`, which LMDB keeps apart from the value): the CRC runs over the LSN's 8 bytes,
/// big-endian, before the format byte, so a damaged key, or a record stored under another LSN,
/// fails the check like damaged content (see ``RecordChecksum``). It is computed once, when
/// the write path has built the record and given it its LSN (or compaction or salvage has
/// rewritten it, under the same LSN), and checked where the log is read as evidence: `verify`,
/// `rebuild`, `replay`, `compact`, `salvage`, the fold of a log tail when a store opens, and the
/// history reads (``Snapshot/history(_:key:)-(_,RowKey)``, `strata log`). The format byte itself is covered
/// by the store: every operation from LSN `checksumsFrom` (a `meta` counter, set when the store
/// was created or migrated to store format 5) on must be format 3 or later, so a damaged format
/// byte that reads as 1 or 2 is caught too; and every operation from LSN `lsnCoveredFrom` (set
/// when the store was created or migrated to store format 7) on must be format 5 or later.
/// Operations written before (formats 1 and 2) carry no checksum and are not rewritten; nor are
/// format-3 and format-4 operations when a store moves to a later format: a log may hold every
/// format. A rewrite by compaction or salvage writes a format-4 operation as format 5.
///
/// The annotation is opaque to the store: sync code records its merge decisions there.
///
/// `prevLSN` is the LSN of the previous operation on the same row (0 for its first): the
/// operations of a row form a chain through the log, so a row's history costs no index — and no
/// extra random page write per edit.
///
/// An operation says what the row *is* after it: the new entry of every field it touched (a
/// clean null entry removes the field) and the row's new flags (`gone` removes the row). Applying
/// an operation is therefore mechanical — see ``RowFold`` — and the rules that decide what an edit
/// does live only in the write path (`EditRules.swift`).
enum RecordFormat {
    /// The current format of operation records: 2 adds conflict entries (state 2), 3 a checksum,
    /// 4 the compact header (a transaction's shared header once per transaction), 5 a checksum
    /// that also covers the record's LSN (format 4's layout).
    static let operationFormat: UInt8 = 5
    /// The first format whose operations carry a checksum (4 bytes after the format byte).
    static let checksummedFormat: UInt8 = 3
    /// The first format whose checksum covers the LSN the record is stored under.
    static let lsnCoveredFormat: UInt8 = 5
    /// The size of the checksum.
    static let checksumSize = 4
    /// The first format with the compact header (see above); later formats keep its layout.
    static let compactFormat: UInt8 = 4
    /// The oldest format still read: format 1 is format 2 without conflict entries.
    static let oldestOperationFormat: UInt8 = 1
}

/// The bits of a format-4 operation's flags byte that are the operation's own; the others are
/// the row's flags after it (``RowFlags``).
enum OperationBits {
    /// The operation was applied from the server (``LogEntry/Origin/server``).
    static let server: UInt8 = 0x08
    /// An annotation (length and bytes) follows the previous LSN.
    static let annotation: UInt8 = 0x10
    /// The record carries its transaction's header (time and schema version).
    static let carriesTransaction: UInt8 = 0x20
    /// The operation's schema version is one above its transaction header's.
    static let schemaBump: UInt8 = 0x40
    /// The row flags' bits.
    static let rowFlags: UInt8 = 0x87
}

/// What the operations of one transaction share. Every operation before format 4 carries it;
/// from format 4 on, the transaction's first operation in the log does (see ``RecordFormat``).
struct TransactionHeader: Equatable {
    /// The transaction id: a counter before format 4, the LSN of the transaction's first
    /// operation from format 4 on. Either way ids increase with the log.
    var id: UInt64
    var timestampMicros: UInt64
    /// The transaction's schema version: that of its first operation. An operation after a
    /// schema step in the transaction is one above it (``OperationBits/schemaBump``), even when
    /// it carries the header because compaction or salvage moved the header into it.
    var schemaVersion: UInt64
}

/// Row flags, stored in the row state and (as the state after) in each operation.
struct RowFlags: OptionSet, Sendable {
    let rawValue: UInt8
    /// Inserted locally and not yet acknowledged by the server.
    static let inserted = RowFlags(rawValue: 1)
    /// Deleted locally and not yet acknowledged; the row keeps its server values.
    static let deleted = RowFlags(rawValue: 2)
    /// The server and the device changed a field differently; upload is held back.
    static let conflicted = RowFlags(rawValue: 4)
    /// Only in operations: the row no longer exists after this operation.
    static let gone = RowFlags(rawValue: 0x80)
}

/// A field entry located in a buffer: byte ranges, nothing decoded.
struct FieldEntry {
    var id: Int
    /// Whether original and current differ.
    var isDirty: Bool
    /// A conflict entry (state 2): `original` is the server's value.
    var isConflict: Bool = false
    /// The original (server-confirmed) value; the same range as `current` when clean.
    var original: Range<Int>
    var current: Range<Int>
    /// The whole entry, to copy it verbatim.
    var whole: Range<Int>
}

extension ByteReader {
    /// Reads the next field entry, or `nil` at the end of the buffer.
    @inline(__always)
    mutating func nextEntry() throws(StrataError) -> FieldEntry? {
        if isAtEnd { return nil }
        let start = offset
        let id = try varint()
        guard id < 1 << 31 else { throw corrupt("field id \(id) out of range") }
        let state = try byte()
        switch state {
        case 0:
            let v = try skipValue()
            return FieldEntry(id: Int(id), isDirty: false, original: v, current: v, whole: start..<offset)
        case 1:
            let o = try skipValue()
            let c = try skipValue()
            return FieldEntry(id: Int(id), isDirty: true, original: o, current: c, whole: start..<offset)
        case 2:
            let o = try skipValue()
            let c = try skipValue()
            let differ = o.count != c.count || !buffer[o].elementsEqual(buffer[c])
            return FieldEntry(id: Int(id), isDirty: differ, isConflict: true, original: o, current: c, whole: start..<offset)
        default:
            throw corrupt("unknown field state \(state)")
        }
    }
}

extension ByteWriter {
    /// Appends a clean field entry (original == current) from encoded value bytes.
    @inline(__always)
    mutating func appendCleanEntry(_ id: Int, _ value: UnsafeRawBufferPointer) {
        appendVarint(UInt64(id))
        append(0)
        append(value)
    }

    /// Appends a dirty field entry from encoded original and current bytes.
    @inline(__always)
    mutating func appendDirtyEntry(_ id: Int, original: UnsafeRawBufferPointer, current: UnsafeRawBufferPointer) {
        appendVarint(UInt64(id))
        append(1)
        append(original)
        append(current)
    }

    /// Appends a conflict entry: the server's value, then the current value.
    @inline(__always)
    mutating func appendConflictEntry(_ id: Int, server: UnsafeRawBufferPointer, current: UnsafeRawBufferPointer) {
        appendVarint(UInt64(id))
        append(2)
        append(server)
        append(current)
    }
}

/// The header of a row state record.
struct RowHeader {
    var flags: RowFlags
    var lastLSN: UInt64
    /// Where the field entries start.
    var entriesStart: Int

    init(_ record: UnsafeRawBufferPointer) throws(StrataError) {
        var r = ByteReader(record)
        flags = RowFlags(rawValue: try r.byte())
        lastLSN = try Counter.checked(try r.varint(), "a row's last LSN")
        entriesStart = r.offset
    }
}

/// A stored row state with its header parsed: what the write path, the folds and the edit rules
/// pass along instead of bare bytes, so that an edit parses a row's header once, not at every
/// step. The bytes are lent (by LMDB or the overlay) and live as long as their source.
struct StoredRow {
    let bytes: UnsafeRawBufferPointer
    let header: RowHeader

    init(_ bytes: UnsafeRawBufferPointer) throws(StrataError) {
        self.bytes = bytes
        header = try RowHeader(bytes)
    }

    var flags: RowFlags { header.flags }

    /// A reader at the first field entry.
    var entries: ByteReader { ByteReader(bytes, offset: header.entriesStart) }

    /// The bytes in `range` (an entry, or one of its values).
    @inline(__always)
    subscript(range: Range<Int>) -> UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: bytes[range]) }

    /// Whether the row is pending: inserted, deleted or conflicted, or with a dirty field.
    var isPending: Bool {
        get throws(StrataError) {
            if !flags.intersection([.inserted, .deleted, .conflicted]).isEmpty { return true }
            var r = entries
            while let e = try r.nextEntry() {
                if e.isDirty { return true }
            }
            return false
        }
    }
}

/// The header of an operation record, in any format.
struct OperationHeader: Equatable {
    var format: UInt8
    var kind: UInt8
    var origin: UInt8
    /// Before format 4 the transaction id; from format 4 on, the distance back to it (the
    /// transaction id is an LSN): see ``transactionID(at:)``.
    private var txnField: UInt64
    /// The transaction header's time and schema version, when the record carries them (every
    /// record before format 4).
    private var carriedTime: UInt64?
    private var carriedSchema: UInt64
    /// Format 4: the operation's schema version is one above its transaction header's (also
    /// when the record carries that header).
    private var schemaBump: Bool
    /// The `rows` key of the row the operation applies to.
    var target: Range<Int>
    /// The previous operation on the same row, 0 for none.
    var prevLSN: UInt64
    var flagsAfter: RowFlags
    /// Bytes the store does not interpret (the sync layer's audit record); often empty.
    var annotation: Range<Int>
    var entriesStart: Int

    init(_ record: UnsafeRawBufferPointer) throws(StrataError) {
        var r = ByteReader(record)
        format = try r.byte()
        guard format >= RecordFormat.oldestOperationFormat, format <= RecordFormat.operationFormat else {
            throw StrataError(.formatVersion, "an operation has format \(format); this version of Strata reads formats \(RecordFormat.oldestOperationFormat) to \(RecordFormat.operationFormat)")
        }
        // The checksum is checked by `RecordChecksum` where the log is evidence, not here:
        // once per record, not at each parse.
        if format >= RecordFormat.checksummedFormat {
            guard r.remaining >= RecordFormat.checksumSize else { throw r.corrupt("an operation shorter than its checksum") }
            r.offset += RecordFormat.checksumSize
        }
        kind = try r.byte()
        if format >= RecordFormat.compactFormat {
            let bits = try r.byte()
            flagsAfter = RowFlags(rawValue: bits & OperationBits.rowFlags)
            origin = bits & OperationBits.server != 0 ? LogEntry.Origin.server.rawValue : LogEntry.Origin.local.rawValue
            schemaBump = bits & OperationBits.schemaBump != 0
            txnField = try r.varint()
            if bits & OperationBits.carriesTransaction != 0 {
                // With a schema step too: an operation after the step that compaction or salvage
                // rewrote to carry the header, which holds the transaction's version (see above).
                carriedTime = try r.varint()
                carriedSchema = try r.varint()
            } else {
                guard txnField > 0 else { throw r.corrupt("the first operation of a transaction without its header") }
                carriedTime = nil
                carriedSchema = 0
            }
            target = try Self.target(&r)
            prevLSN = try Counter.checked(try r.varint(), "an operation's previous LSN")
            annotation = r.offset..<r.offset
            if bits & OperationBits.annotation != 0 { annotation = try Self.annotation(&r) }
        } else {
            origin = try r.byte()
            txnField = try r.varint()
            carriedTime = try r.varint()
            carriedSchema = try r.varint()
            schemaBump = false
            target = try Self.target(&r)
            prevLSN = try Counter.checked(try r.varint(), "an operation's previous LSN")
            flagsAfter = RowFlags(rawValue: try r.byte())
            annotation = try Self.annotation(&r)
        }
        entriesStart = r.offset
    }

    private static func target(_ r: inout ByteReader) throws(StrataError) -> Range<Int> {
        let n = try r.varint()
        guard n >= 4, n <= UInt64(r.remaining) else { throw r.corrupt("operation target length \(n)") }
        defer { r.offset += Int(n) }
        return r.offset..<r.offset + Int(n)
    }

    private static func annotation(_ r: inout ByteReader) throws(StrataError) -> Range<Int> {
        let a = try r.varint()
        guard a <= UInt64(r.remaining) else { throw r.corrupt("annotation length \(a)") }
        defer { r.offset += Int(a) }
        return r.offset..<r.offset + Int(a)
    }

    /// Whether the record carries its transaction's header: every record before format 4, and
    /// from format 4 on the first operation of each transaction in the log.
    var carriesTransaction: Bool { carriedTime != nil }

    /// The id of the operation's transaction, for the operation stored at `lsn`.
    func transactionID(at lsn: UInt64) throws(StrataError) -> UInt64 {
        if format < RecordFormat.compactFormat { return txnField }
        guard txnField < lsn else {
            throw StrataError(.corruptRecord, "operation \(lsn) places its transaction \(txnField) operations back, before the log's start")
        }
        return lsn - txnField
    }

    /// The transaction header the record carries, `nil` when it carries none (then the first
    /// operation of its transaction in the log does: ``ReadableTransaction/transactionHeader(of:at:log:rules:cache:)``).
    func carriedTransaction(at lsn: UInt64) throws(StrataError) -> TransactionHeader? {
        guard let carriedTime else { return nil }
        return TransactionHeader(id: try transactionID(at: lsn), timestampMicros: carriedTime, schemaVersion: carriedSchema)
    }

    /// The operation's schema version, given its transaction's header.
    func schemaVersion(in transaction: TransactionHeader) -> UInt64 {
        (carriesTransaction ? carriedSchema : transaction.schemaVersion) + (schemaBump ? 1 : 0)
    }

    /// The table id: the first four bytes of the target, big-endian.
    func tableID(in record: UnsafeRawBufferPointer) -> UInt32 {
        var id: UInt32 = 0
        for i in 0..<4 { id = id << 8 | UInt32(record[target.lowerBound + i]) }
        return id
    }
}

/// The write path's builder of operation records: it writes a record of the current format in
/// two steps (the head, then, after the caller's field entries, the flags and the checksum) and
/// returns the header with the bytes, so that the write path folds and appends the record it
/// built without parsing it back. ``OperationHeader/init(_:)`` reads what these write.
extension OperationHeader {
    /// The flags byte's offset in a record of the compact layout: after the format, the
    /// checksum and the kind.
    private static let flagsOffset = 2 + RecordFormat.checksumSize

    /// Starts an operation of the current format in `w` (emptied first), up to its field
    /// entries, which the caller appends next; ``seal(_:flags:lsn:)`` completes it.
    ///
    /// - Parameters:
    ///   - transactionOffset: how many LSNs back the transaction's first operation is; 0 for
    ///     that operation, which carries the transaction's header (`carried`).
    ///   - carried: the transaction's time and schema version, for its first operation.
    ///   - schemaBump: the operation's schema version is one above its transaction's (never
    ///     with `carried`, which holds the version already).
    ///   - target: the `rows` key of the row.
    ///   - prevLSN: the row's previous operation, 0 for none.
    /// - Returns: the record's header, its row flags still empty: `seal` sets them.
    static func start(
        _ kind: LogEntry.Kind, origin: LogEntry.Origin, transactionOffset: UInt64,
        carried: (timestampMicros: UInt64, schemaVersion: UInt64)?, schemaBump: Bool,
        target: [UInt8], prevLSN: UInt64, annotation: [UInt8], into w: inout ByteWriter
    ) -> OperationHeader {
        // The format, four bytes for the checksum (written by `seal` once the record is
        // complete), the kind, and the flags byte (`seal` too), made on the stack and put in
        // place of the writer's bytes by one call: emptying the writer and four appends cost
        // about 200 instructions an operation.
        var head: UInt64 = 0
        withUnsafeMutableBytes(of: &head) { b in
            b[0] = RecordFormat.operationFormat
            b[5] = kind.rawValue
        }
        withUnsafeBytes(of: &head) { w.replaceAll(with: UnsafeRawBufferPointer(rebasing: $0[0..<7])) }
        assert(w.count == flagsOffset + 1)
        w.appendVarint(transactionOffset)
        if let carried {
            w.appendVarint(carried.timestampMicros)
            w.appendVarint(carried.schemaVersion)
        }
        w.appendVarint(UInt64(target.count))
        let targetStart = w.count
        w.append(target)
        w.appendVarint(prevLSN)
        var annotationRange = w.count..<w.count
        if !annotation.isEmpty {
            w.appendVarint(UInt64(annotation.count))
            annotationRange = w.count..<w.count + annotation.count
            w.append(annotation)
        }
        return OperationHeader(
            format: RecordFormat.operationFormat, kind: kind.rawValue, origin: origin.rawValue,
            txnField: transactionOffset, carriedTime: carried?.timestampMicros,
            carriedSchema: carried?.schemaVersion ?? 0, schemaBump: schemaBump,
            target: targetStart..<targetStart + target.count, prevLSN: prevLSN, flagsAfter: [],
            annotation: annotationRange, entriesStart: w.count
        )
    }

    /// Completes the operation ``start(_:origin:transactionOffset:carried:schemaBump:target:prevLSN:annotation:into:)``
    /// began in `w`, once its field entries follow: writes the row's flags after it (with the
    /// operation's own bits) and seals the record for `lsn`, the LSN it is appended under.
    mutating func seal(_ w: inout ByteWriter, flags: RowFlags, lsn: UInt64) {
        flagsAfter = flags
        var bits = flags.rawValue
        if origin == LogEntry.Origin.server.rawValue { bits |= OperationBits.server }
        if !annotation.isEmpty { bits |= OperationBits.annotation }
        if carriesTransaction { bits |= OperationBits.carriesTransaction }
        if schemaBump { bits |= OperationBits.schemaBump }
        w.bytes[Self.flagsOffset] = bits
        // Sealed once, with the LSN: the checksum covers the key too.
        RecordChecksum.seal(&w, lsn: lsn)
    }

    private init(
        format: UInt8, kind: UInt8, origin: UInt8, txnField: UInt64, carriedTime: UInt64?,
        carriedSchema: UInt64, schemaBump: Bool, target: Range<Int>, prevLSN: UInt64,
        flagsAfter: RowFlags, annotation: Range<Int>, entriesStart: Int
    ) {
        self.format = format
        self.kind = kind
        self.origin = origin
        self.txnField = txnField
        self.carriedTime = carriedTime
        self.carriedSchema = carriedSchema
        self.schemaBump = schemaBump
        self.target = target
        self.prevLSN = prevLSN
        self.flagsAfter = flagsAfter
        self.annotation = annotation
        self.entriesStart = entriesStart
    }
}

/// Rewrites of operation records, for the two places that move a transaction's header:
/// compaction (when it splits a transaction) and salvage (when a transaction's first operation
/// is lost).
enum OperationRecord {
    /// The format-4 or -5 operation `record`, stored at `lsn`, rewritten to carry the header of
    /// its transaction (`transaction`, as the transaction's first operation carried it), keeping
    /// its distance back to the transaction (so its id) and everything else, as a format-5
    /// record sealed for `lsn`, where it stays. The header keeps the
    /// transaction's schema version and the record its schema-step bit: the transaction's later
    /// operations read the version from this header and add their own step bit to it, so
    /// carrying the record's own (stepped) version would put them one too high.
    static func carrying(_ transaction: TransactionHeader, _ record: UnsafeRawBufferPointer, lsn: UInt64) throws(StrataError) -> [UInt8] {
        let header = try OperationHeader(record)
        guard header.format >= RecordFormat.compactFormat else { return Array(record) }
        var r = ByteReader(record, offset: 1 + RecordFormat.checksumSize)
        let kind = try r.byte()
        let bits = try r.byte()
        let offset = try r.varint()
        var w = ByteWriter(capacity: record.count + 16)
        w.append(RecordFormat.operationFormat)
        w.append([0, 0, 0, 0])
        w.append(kind)
        w.append(bits | OperationBits.carriesTransaction)
        w.appendVarint(offset)
        w.appendVarint(transaction.timestampMicros)
        w.appendVarint(transaction.schemaVersion)
        w.appendVarint(UInt64(header.target.count))
        w.append(UnsafeRawBufferPointer(rebasing: record[header.target.lowerBound...]))
        RecordChecksum.seal(&w, lsn: lsn)
        return w.bytes
    }
}

import LMDB

/// A table's pending changes as one compact binary buffer: every pending row once, already
/// coalesced the way the `rows` view keeps them — an insert carries its current values, an
/// update the first original and the last current of each changed field, a delete the row's
/// originals; a row inserted and deleted again is not there at all.
///
/// ``Snapshot/pendingChangeset(_:)`` copies the field entries straight from the stored row
/// records, without decoding them — an insert's or a delete's in one copy — so producing one costs
/// little more than reading the pages. The buffer names its table and fields, so it can be stored,
/// sent and read back with ``changes()`` by any version of Strata that reads its format.
///
/// Format (varints are LEB128, values in Strata's value encoding):
///
///     "STCS" u8 version(3)
///     value table name, varint key field count,
///     varint field name count, value name…          (index = field id)
///     per row: u8 kind (1 insert, 2 update, 3 delete; +0x80 conflicted),
///              varint key length, key (order-preserving key encoding),
///              varint entries length, field entries as the `rows` view stores them:
///                  varint field id, u8 state, then state 0: value · state 1: original, current ·
///                  state 2 (a field in conflict, rows of a conflicted row only): the server's
///                  value, current
///              insert: every field, its value the current one · update: the changed fields ·
///              delete: every field, its value the original (the server's) one
///
/// Version 2 is version 3 without state-2 entries; it is still read. Version 1 (one value per
/// field instead of stored entries) was never released; it is refused.
public struct Changeset: Sendable, Hashable {
    /// The encoded changeset.
    public let bytes: [UInt8]

    /// One pending row of a changeset.
    public struct Change: Sendable, Hashable {
        /// How the row is to be uploaded.
        public enum Kind: UInt8, Sendable {
            /// Inserted locally: the row's values.
            case insert = 1
            /// Changed fields, with their originals.
            case update = 2
            /// Deleted locally: the server's values as originals.
            case delete = 3
        }

        /// The row's primary key.
        public let key: RowKey
        /// Whether the row is a pending insert, update or delete.
        public let kind: Kind
        /// Whether the row holds an unresolved conflict (the sync client holds such rows back).
        public let isConflicted: Bool
        /// The fields the change carries (key fields are in ``key``): every non-null field of an
        /// insert (original `null`), the changed fields of an update, every non-null field of a
        /// delete (current `null`), in field order.
        public let fields: [LogEntry.FieldChange]
    }

    static let magic: [UInt8] = Array("STCS".utf8)
    static let version: UInt8 = 3

    /// Wraps an encoded changeset, checking its header.
    ///
    /// - Throws: ``StrataError`` `malformedInput` when the bytes are not a changeset or its header
    ///   does not hold together (a key field count of 0, or more than its field names);
    ///   `formatVersion` when they are a newer one.
    public init(bytes: [UInt8]) throws(StrataError) {
        self.bytes = bytes
        _ = try header()
    }

    init(unchecked bytes: [UInt8]) { self.bytes = bytes }

    /// The table the changes belong to.
    public var table: String { (try? header().table) ?? "" }

    private struct Header {
        var table: String
        var keyCount: Int
        var fieldNames: [String]
        var rowsStart: Int
    }

    private func header() throws(StrataError) -> Header {
        try withBytes(bytes) { (b) throws(StrataError) -> Header in
            guard b.count >= Self.magic.count + 1, b.prefix(Self.magic.count).elementsEqual(Self.magic) else {
                throw StrataError(.malformedInput, "the bytes are not a Strata changeset")
            }
            var r = ByteReader(b, offset: Self.magic.count)
            let version = try Self.malformed { () throws(StrataError) in try r.byte() }
            guard version == 2 || version == Self.version else {
                throw StrataError(.formatVersion, "the changeset has format \(version); this version of Strata reads formats 2 and \(Self.version)")
            }
            return try Self.malformed { () throws(StrataError) -> Header in
                guard case .string(let table) = try r.value() else { throw r.corrupt("a changeset's table name is not text") }
                let keyCount = try r.varint()
                let n = try r.varint()
                guard n <= UInt64(r.remaining) else { throw r.corrupt("field name count \(n)") }
                var names: [String] = []
                for _ in 0..<n {
                    guard case .string(let name) = try r.value() else { throw r.corrupt("a changeset's field name is not text") }
                    names.append(name)
                }
                // The key fields are among the table's fields, and a table has at least one; an
                // encoded key component takes at least one byte, so no key has more components
                // than a key's byte limit either.
                guard keyCount >= 1, keyCount <= UInt64(names.count), keyCount <= UInt64(TableInfo.maxKeyBytes) else {
                    throw StrataError(.malformedInput, "the changeset is damaged: it gives table '\(table)' \(keyCount) key fields, where a table has at least 1 and at most its field count (\(names.count) here)")
                }
                return Header(table: table, keyCount: Int(keyCount), fieldNames: names, rowsStart: r.offset)
            }
        }
    }

    /// Decodes every change, in key order.
    ///
    /// - Throws: ``StrataError`` `malformedInput` for a damaged or truncated buffer.
    public func changes() throws(StrataError) -> [Change] {
        let h = try header()
        return try withBytes(bytes) { (b) throws(StrataError) -> [Change] in
            try Self.malformed { () throws(StrataError) -> [Change] in
                var r = ByteReader(b, offset: h.rowsStart)
                var changes: [Change] = []
                while !r.isAtEnd {
                    let tag = try r.byte()
                    guard let kind = Change.Kind(rawValue: tag & 0x7F) else { throw r.corrupt("change kind \(tag)") }
                    let keyBytes = try r.bytes(Int(clamping: try r.varint()))
                    var kr = ByteReader(keyBytes)
                    let key = try KeyCodec.readKey(&kr, count: h.keyCount)
                    var fields: [LogEntry.FieldChange] = []
                    var er = ByteReader(try r.bytes(Int(clamping: try r.varint())))
                    while let e = try er.nextEntry() {
                        guard e.id < h.fieldNames.count else { throw r.corrupt("field id \(e.id)") }
                        var o = ByteReader(UnsafeRawBufferPointer(rebasing: er.buffer[e.original]))
                        var c = ByteReader(UnsafeRawBufferPointer(rebasing: er.buffer[e.current]))
                        let name = h.fieldNames[e.id]
                        switch kind {
                        case .insert:
                            let v = try c.value()
                            if !v.isNull { fields.append(.init(field: name, original: .null, current: v)) }
                        case .update:
                            fields.append(.init(field: name, original: try o.value(), current: try c.value()))
                        case .delete:
                            let v = try o.value()
                            if !v.isNull { fields.append(.init(field: name, original: v, current: .null)) }
                        }
                    }
                    changes.append(Change(key: key, kind: kind, isConflicted: tag & 0x80 != 0, fields: fields))
                }
                return changes
            }
        }
    }

    /// Reports damage in a changeset as bad input, not as a corrupt store.
    private static func malformed<R>(_ body: () throws(StrataError) -> R) throws(StrataError) -> R {
        do {
            return try body()
        } catch where error.code == .corruptRecord {
            throw StrataError(.malformedInput, "the changeset is damaged or truncated (\(error.message))")
        }
    }
}

extension Snapshot {
    /// The pending changes of `table` as a ``Changeset``, in key order.
    ///
    /// - Throws: ``StrataError`` `tableNotFound`.
    /// - Complexity: O(p + r) for p pending rows over r rows: the `pending` and `rows` views are
    ///   walked together in key order, and values are copied as stored, never decoded.
    public func pendingChangeset(_ table: String) throws(StrataError) -> Changeset {
        return try strataErrors {
            let catalog = try self.catalog
            let t = try catalog.table(named: table)
            var w = ByteWriter(capacity: try payloadEstimate())
            w.append(Changeset.magic)
            w.append(Changeset.version)
            w.appendValue(.string(t.name))
            w.appendVarint(UInt64(t.keyFieldIDs.count))
            w.appendVarint(UInt64(t.fieldNames.count))
            for name in t.fieldNames { w.appendValue(.string(name)) }
            try txn.scan(databases.rows) { rows in
                // The rows cursor moves forward with the pending scan (both are in key order). When
                // most rows are pending the next row is usually the one wanted, and stepping to it
                // is cheaper than a seek's binary search; a few steps without a match mean a gap,
                // which a seek crosses.
                var row: LMDB.Entry? = nil
                var dirty: [Range<Int>] = []
                try scanTable(t, in: databases.pending) { key, _ in
                    var steps = 0
                    while let r = row, compareBytes(r.key, key) < 0, steps < 4 {
                        row = try rows.next()
                        steps += 1
                    }
                    if row == nil || compareBytes(row!.key, key) < 0 { row = try rows.seek(atLeast: key) }
                    guard let found = row, compareBytes(found.key, key) == 0 else {
                        throw StrataError(.corruptRecord, "the pending view names \(catalog.describe(rowsKey: key)), which has no row")
                    }
                    try Self.appendChange(key: key, record: found.value, to: &w, dirty: &dirty)
                    return true
                }
            }
            return Changeset(unchecked: w.bytes)
        }
    }

    /// A generous guess at a changeset's size, so that its buffer is allocated once instead of
    /// doubled (and copied) about twenty times on the way to tens of megabytes: the pending
    /// share of the `rows` pages. Pages of the reservation that are never written are never
    /// touched, so an overestimate costs address space, not memory.
    private func payloadEstimate() throws -> Int {
        let rows = try txn.stats(databases.rows), pending = try txn.stats(databases.pending)
        guard rows.entries > 0 else { return 1 << 12 }
        let rowBytes = (rows.leafPages + rows.overflowPages) * rows.pageSize
        let share = Double(min(pending.entries, rows.entries)) / Double(rows.entries)
        return max(1 << 12, Int(Double(rowBytes) * share))
    }

    private static func appendChange(key: UnsafeRawBufferPointer, record: UnsafeRawBufferPointer, to w: inout ByteWriter, dirty: inout [Range<Int>]) throws(StrataError) {
        let h = try RowHeader(record)
        let kind: Changeset.Change.Kind = h.flags.contains(.inserted) ? .insert : h.flags.contains(.deleted) ? .delete : .update
        w.append(kind.rawValue | (h.flags.contains(.conflicted) ? 0x80 : 0))
        w.appendVarint(UInt64(key.count - 4))
        w.append(UnsafeRawBufferPointer(rebasing: key[4...]))
        if kind != .update {
            // Every entry, exactly as stored: one copy.
            w.appendVarint(UInt64(record.count - h.entriesStart))
            w.append(UnsafeRawBufferPointer(rebasing: record[h.entriesStart...]))
            return
        }
        // Only the changed entries; their total length goes first.
        dirty.removeAll(keepingCapacity: true)
        var length = 0
        var r = ByteReader(record, offset: h.entriesStart)
        while let e = try r.nextEntry() {
            if e.isDirty {
                dirty.append(e.whole)
                length += e.whole.count
            }
        }
        w.appendVarint(UInt64(length))
        for d in dirty { w.append(UnsafeRawBufferPointer(rebasing: record[d])) }
    }
}

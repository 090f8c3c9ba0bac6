import LMDB

/// A secondary index of a table: its rows ordered by some of their fields.
struct IndexInfo: Sendable, Codable, Hashable {
    let id: UInt32
    let name: String
    /// The indexed fields, in order.
    let fieldIDs: [Int]
    /// No two rows may hold the same values in the indexed fields (rows with a null there excepted).
    let unique: Bool
}

/// An index the app declared, as ``Snapshot/indexes(_:)`` lists it.
public struct IndexDefinition: Sendable, Hashable {
    /// The index's name, unique in the store.
    public let name: String
    /// The table it indexes.
    public let table: String
    /// The indexed fields, in index order.
    public let fields: [String]
    /// Whether no two rows may hold the same values in the indexed fields.
    public let unique: Bool
}

/// The entries of the `index` database: index id (4 bytes BE), each indexed field's value in the
/// order-preserving key encoding, then the row key (the `rows` key without its table id), with
/// an empty value.
///
/// Text and bytes longer than ``maxValueBytes`` are indexed by that prefix, to keep keys within
/// LMDB's limit; index scans re-check every row against the query and re-sort rows whose indexed
/// prefixes are equal, and a unique index compares the full values, so results stay exact.
enum IndexKeys {
    static let maxValueBytes = 200

    /// The indexed fields' current values of a stored row.
    static func values(_ index: IndexInfo, table t: TableInfo, target: UnsafeRawBufferPointer, record: UnsafeRawBufferPointer) throws(StrataError) -> [Value] {
        var values = [Value](repeating: .null, count: index.fieldIDs.count)
        if index.fieldIDs.contains(where: t.isKeyField) {
            let key = try t.decodeKey(target)
            for (i, fid) in index.fieldIDs.enumerated() {
                if let k = t.keyFieldIDs.firstIndex(of: fid) { values[i] = key.values[k] }
            }
        }
        let h = try RowHeader(record)
        var r = ByteReader(record, offset: h.entriesStart)
        while let e = try r.nextEntry() {
            if let i = index.fieldIDs.firstIndex(of: e.id) {
                values[i] = try Value(decoding: UnsafeRawBufferPointer(rebasing: record[e.current]))
            }
        }
        return values
    }

    /// Index id and the values' key encodings (bounded): the prefix shared by equal values.
    static func prefix(_ index: IndexInfo, _ values: [Value]) -> [UInt8] {
        var w = ByteWriter(capacity: 64)
        w.appendBigEndian(index.id)
        for v in values { appendBounded(v, to: &w) }
        return w.bytes
    }

    /// Appends a value's key encoding, cut to ``maxValueBytes`` for text and bytes.
    static func appendBounded(_ v: Value, to w: inout ByteWriter) {
        switch v {
        case .string(let s) where s.utf8.count > maxValueBytes:
            w.append(KeyCodec.tagString)
            Array(s.utf8.prefix(maxValueBytes)).withUnsafeBytes { KeyCodec.appendEscaped($0, to: &w) }
        case .bytes(let b) where b.count > maxValueBytes:
            w.append(KeyCodec.tagBytes)
            Array(b.prefix(maxValueBytes)).withUnsafeBytes { KeyCodec.appendEscaped($0, to: &w) }
        case .double(let d) where d == 0:
            // -0.0 and 0.0 are equal to queries; index them as one value.
            KeyCodec.append(.double(0), to: &w)
        default:
            KeyCodec.append(v, to: &w)
        }
    }
}

extension StoreDatabases {
    /// The longest key LMDB takes (`MDB_MAXKEYSIZE`, 511 in the default build). Row keys stay
    /// under it by ``TableInfo/maxKeyBytes``; an index or view entry adds the indexed or sorted
    /// values to the row key, so it is checked on its own (``checkEntryKey(_:of:table:target:)``).
    static let maxEntryKeyBytes = 511

    /// Refuses an index or named-view entry longer than LMDB's key limit. Called where every
    /// entry is built — an edit, a merge, a fold of the log, an index or view built over
    /// existing rows — and before any entry is written, so a refused edit logs nothing and
    /// leaves the overlay as it was (an entry over the limit would fail only at the next
    /// checkpoint, and every one after it).
    func checkEntryKey(_ key: [UInt8], of what: String, table t: TableInfo, target: UnsafeRawBufferPointer) throws(StrataError) {
        guard key.count > Self.maxEntryKeyBytes else { return }
        let row = (try? t.decodeKey(target)).map { "\($0)" } ?? "?"
        throw StrataError(.invalidValue, "\(what) of table '\(t.name)' cannot hold row \(row): its entry would be \(key.count) bytes (the row key's \(target.count - 4) plus the indexed or sorted values, text and bytes cut to \(IndexKeys.maxValueBytes) bytes each); the limit is \(Self.maxEntryKeyBytes). Use shorter values or a shorter primary key")
    }

    /// Updates the indexes and named views of table `t` for a row that changed from `old` to
    /// `new` (`nil`: no row). Every entry is built and checked first — a unique index refuses a
    /// value another row holds (unless `checkingUniqueness` is false: a fold of a log whose
    /// writes were checked), an entry over LMDB's key limit is refused — and only then is any
    /// written, so a refused change leaves both as they were.
    func updateIndexesAndViews(
        _ t: TableInfo, target: UnsafeRawBufferPointer, old: UnsafeRawBufferPointer?, new: UnsafeRawBufferPointer?, in txn: ViewWriter,
        checkingUniqueness: Bool = true
    ) throws(StrataError) {
        let rowKey = Array(target[4...])
        let indexChanges = try self.indexChanges(t, target: target, rowKey: rowKey, old: old, new: new, in: txn, checkingUniqueness: checkingUniqueness)
        let viewChanges = try self.viewChanges(t, target: target, rowKey: rowKey, old: old, new: new)
        guard !indexChanges.isEmpty || !viewChanges.isEmpty else { return }
        try lmdb { () throws(LMDBError) in
            for c in indexChanges {
                if let o = c.old { try txn.delete(o, in: self.index) }
                if let n = c.new { try txn.put(n, [], in: self.index) }
            }
            for c in viewChanges {
                if let o = c.old { try txn.delete(o, in: self.view) }
                if let n = c.new { try txn.put(n, rowKey, in: self.view) }
            }
        }
    }

    /// The index entries of table `t` to delete and put for a row that changed from `old` to
    /// `new`, checked (uniqueness, key length) but not written.
    private func indexChanges(
        _ t: TableInfo, target: UnsafeRawBufferPointer, rowKey: [UInt8], old: UnsafeRawBufferPointer?, new: UnsafeRawBufferPointer?, in txn: ViewWriter,
        checkingUniqueness: Bool
    ) throws(StrataError) -> [(old: [UInt8]?, new: [UInt8]?)] {
        guard !t.indexes.isEmpty else { return [] }
        var changes: [(old: [UInt8]?, new: [UInt8]?)] = []
        for index in t.indexes {
            let oldValues = try old.map { (r) throws(StrataError) in try IndexKeys.values(index, table: t, target: target, record: r) }
            let newValues = try new.map { (r) throws(StrataError) in try IndexKeys.values(index, table: t, target: target, record: r) }
            guard oldValues != newValues else { continue }
            let newEntry = newValues.map { IndexKeys.prefix(index, $0) + rowKey }
            if let newEntry { try checkEntryKey(newEntry, of: "index '\(index.name)'", table: t, target: target) }
            if checkingUniqueness, index.unique, let newValues, !newValues.contains(where: \.isNull) {
                try checkUnique(index, t, newValues, rowKey: rowKey, in: txn)
            }
            changes.append((oldValues.map { IndexKeys.prefix(index, $0) + rowKey }, newEntry))
        }
        return changes
    }

    /// Throws when another row holds `values` in a unique index.
    private func checkUnique(_ index: IndexInfo, _ t: TableInfo, _ values: [Value], rowKey: [UInt8], in txn: ViewWriter) throws(StrataError) {
        let prefix = IndexKeys.prefix(index, values)
        let others: [[UInt8]] = try txn.scan(self.index) { c in
            var keys: [[UInt8]] = []
            var e = try c.seek(atLeast: prefix)
            while let entry = e, entry.key.starts(with: prefix) {
                let other = Array(entry.key[prefix.count...])
                if other != rowKey { keys.append(other) }
                e = try c.next()
            }
            return keys
        }
        for other in others {
            var target = ByteWriter(capacity: 4 + other.count)
            target.appendBigEndian(t.id)
            target.append(other)
            // Equal prefixes may hide different long values: compare the full values.
            let clash = try target.withUnsafeBytes { (tk) throws(StrataError) -> Bool in
                guard let record = try lmdb({ () throws(LMDBError) in try txn.get(tk, in: rows) }) else { return false }
                return try IndexKeys.values(index, table: t, target: tk, record: record) == values
            }
            if clash {
                let key = try target.withUnsafeBytes { (tk) throws(StrataError) in try t.decodeKey(tk) }
                throw StrataError(.duplicateKey, "index '\(index.name)' of table '\(t.name)' is unique, and row \(key) already holds \(values.map(\.description).joined(separator: ", "))")
            }
        }
    }
}

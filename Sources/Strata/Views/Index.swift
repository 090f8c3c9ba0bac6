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
    /// Updates the indexes of table `t` for a row that changed from `old` to `new` (`nil`: no row).
    /// A unique index refuses a value another row holds, before anything is written (unless
    /// `checkingUniqueness` is false: a fold of a log whose writes were checked).
    func updateIndexes(
        _ t: TableInfo, target: UnsafeRawBufferPointer, old: UnsafeRawBufferPointer?, new: UnsafeRawBufferPointer?, in txn: ViewWriter,
        checkingUniqueness: Bool = true
    ) throws(StrataError) {
        guard !t.indexes.isEmpty else { return }
        let rowKey = Array(target[4...])
        var changes: [(old: [UInt8]?, new: [UInt8]?)] = []
        for index in t.indexes {
            let oldValues = try old.map { (r) throws(StrataError) in try IndexKeys.values(index, table: t, target: target, record: r) }
            let newValues = try new.map { (r) throws(StrataError) in try IndexKeys.values(index, table: t, target: target, record: r) }
            guard oldValues != newValues else { continue }
            if checkingUniqueness, index.unique, let newValues, !newValues.contains(where: \.isNull) {
                try checkUnique(index, t, newValues, rowKey: rowKey, in: txn)
            }
            changes.append((oldValues.map { IndexKeys.prefix(index, $0) + rowKey }, newValues.map { IndexKeys.prefix(index, $0) + rowKey }))
        }
        try lmdb { () throws(LMDBError) in
            for c in changes {
                if let o = c.old { try txn.delete(o, in: self.index) }
                if let n = c.new { try txn.put(n, [], in: self.index) }
            }
        }
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

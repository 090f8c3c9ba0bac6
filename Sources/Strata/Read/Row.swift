/// A row as stored: its current values, the original (server-confirmed) value of each field, and
/// its pending state.
///
/// A `Row` is a copy: it stays valid after the snapshot that produced it has ended.
///
/// ```swift
/// if let task = try store.read({ try $0.row("tasks", key: 7) }) {
///     print(task["title"], task.original("title"), task.changedFields, task.status)
/// }
/// ```
public struct Row: Sendable, Hashable, CustomStringConvertible {
    /// Where a row stands against the server.
    public enum Status: String, Sendable, Codable {
        /// Equal to what the server last confirmed.
        case unchanged
        /// Inserted on this device, not yet acknowledged by the server.
        case inserted
        /// One or more fields changed on this device since the server last confirmed them.
        case updated
        /// Deleted on this device, not yet acknowledged. The row holds the server's values.
        case deleted
    }

    /// The table the row belongs to.
    public let table: String
    /// The row's primary key.
    public let key: RowKey
    /// Where the row stands against the server.
    public let status: Status
    /// Whether a merge left a conflict on this row that the app has not resolved yet.
    public let isConflicted: Bool
    /// The LSN of the last operation that changed the row.
    public let lastLSN: UInt64
    /// The row's field names: every declared field of a fixed table, the key fields and the
    /// fields that hold a value in a property bag.
    public let fieldNames: [String]
    /// The names of the primary key fields, in key order.
    public let keyFieldNames: [String]
    let currents: [Value]
    let originals: [Value]
    /// Where each field is: its table's map of field name → field id (shared by every row of the
    /// table, not copied), and the field ids of `fieldNames`, ascending. A lookup by name is a
    /// hash lookup and a binary search, not a scan: a property-bag row may have 100,000 fields.
    private let tableFieldIDs: [String: Int]
    /// Empty when every field id is its own position (a fixed table with no dropped field).
    private let ids: [Int]

    /// The position of `field` in `fieldNames`.
    ///
    /// - Complexity: O(log f) for f fields.
    private func position(of field: String) -> Int? {
        guard let id = tableFieldIDs[field] else { return nil }
        let position: Int
        if ids.isEmpty {
            guard id < fieldNames.count else { return nil }
            position = id
        } else {
            var (low, high) = (0, ids.count)
            while low < high {
                let mid = (low + high) / 2
                if ids[mid] < id { low = mid + 1 } else { high = mid }
            }
            guard low < ids.count && ids[low] == id else { return nil }
            position = low
        }
        // The map hashes as `==` compares: a name in another Unicode form finds the field too,
        // but names compare by their bytes.
        return fieldNames[position].sameBytes(field) ? position : nil
    }
    /// Per position, whether the field is in conflict; empty when none is.
    let conflictMarks: [Bool]

    /// Whether the row has changes the server has not acknowledged.
    public var isPending: Bool { status != .unchanged || isConflicted }

    /// The current value of `field`; `null` when the row has no such field. Names compare by
    /// their UTF-8 bytes: `"e\u{301}"` does not find a field named `"\u{e9}"`.
    ///
    /// - Complexity: O(log f) for f fields.
    public subscript(field: String) -> Value {
        guard let i = position(of: field) else { return .null }
        return currents[i]
    }

    /// The value the server last confirmed for `field`: equal to the current value when the field
    /// is unchanged, and `null` for every field of a row inserted on this device.
    ///
    /// - Complexity: O(log f) for f fields.
    public func original(_ field: String) -> Value {
        guard let i = position(of: field) else { return .null }
        return originals[i]
    }

    /// Whether `field`'s current value differs from its original.
    public func isChanged(_ field: String) -> Bool {
        guard let i = position(of: field) else { return false }
        return currents[i] != originals[i]
    }

    /// The fields whose current value differs from the original, in field order. For a row
    /// inserted locally, every field that holds a value.
    public var changedFields: [String] {
        fieldNames.indices.filter { currents[$0] != originals[$0] }.map { fieldNames[$0] }
    }

    /// The fields a merge left in conflict (see ``isConflicted``), in field order: changed by the
    /// server and by this device to different values. Their ``original(_:)`` is the server's
    /// value (`null` for a row the server deleted, which is then ``Status/inserted`` here).
    ///
    /// A field stays listed through local edits until the conflict is resolved. A row left
    /// conflicted by a store of format 2, which did not record the fields, lists what that
    /// format reported: its changed fields, or every field holding a value for a row inserted or
    /// deleted here.
    public var conflictingFields: [String] {
        guard isConflicted else { return [] }
        if recordsConflictingFields { return fieldNames.indices.filter { conflictMarks[$0] }.map { fieldNames[$0] } }
        let key = Set(keyFieldNames)
        switch status {
        case .inserted, .deleted:
            return fieldNames.indices.filter { !key.contains(fieldNames[$0]) && !currents[$0].isNull }.map { fieldNames[$0] }
        case .updated, .unchanged:
            return changedFields
        }
    }

    /// Whether the row records which of its fields are in conflict: true for every conflicted
    /// row but one a store of format 2 left conflicted (``conflictingFields`` then says what
    /// format 2 reported; sync code may know better from the merge's audit record).
    public var recordsConflictingFields: Bool { conflictMarks.contains(true) }

    /// The current values by field name (null fields included for fixed tables).
    public var values: [String: Value] {
        Dictionary(uniqueKeysWithValues: zip(fieldNames, currents))
    }

    /// The original values by field name.
    public var originalValues: [String: Value] {
        Dictionary(uniqueKeysWithValues: zip(fieldNames, originals))
    }

    public var description: String {
        let fields = fieldNames.indices.map { i in
            currents[i] == originals[i] || status == .inserted
                ? "\(fieldNames[i]): \(currents[i])"
                : "\(fieldNames[i]): \(originals[i]) → \(currents[i])"
        }
        return "\(table) \(key) [\(status.rawValue)\(isConflicted ? ", conflicted" : "")] {\(fields.joined(separator: ", "))}"
    }

    /// Decodes a row from its `rows` key and record.
    init(table t: TableInfo, rowsKey: UnsafeRawBufferPointer, record: UnsafeRawBufferPointer) throws(StrataError) {
        let h = try RowHeader(record)
        let key = try t.decodeKey(rowsKey)
        let inserted = h.flags.contains(.inserted)
        self.table = t.name
        self.key = key
        self.isConflicted = h.flags.contains(.conflicted)
        self.lastLSN = h.lastLSN
        self.keyFieldNames = t.schema.primaryKey
        self.tableFieldIDs = t.fieldIDs
        if !t.isPropertyBag && t.dropped.isEmpty {
            // The common case, and every point read's: each field of the table is in the row at
            // the position of its id, so the values are decoded into place and the table's
            // arrays of names is shared rather than rebuilt (two allocations per row, not a dozen).
            let n = t.fieldNames.count
            var cur = [Value](repeating: .null, count: n)
            var orig = [Value](repeating: .null, count: n)
            var marks: [Bool] = []
            var anyDirty = false
            var r = ByteReader(record, offset: h.entriesStart)
            while let e = try r.nextEntry() {
                guard e.id < n else { throw r.corrupt("field id \(e.id) unknown to table '\(t.name)'") }
                let current = try Value(decoding: UnsafeRawBufferPointer(rebasing: record[e.current]))
                cur[e.id] = current
                // A row inserted here has no server values: its originals stay null.
                if !inserted { orig[e.id] = e.isDirty ? try Value(decoding: UnsafeRawBufferPointer(rebasing: record[e.original])) : current }
                anyDirty = anyDirty || e.isDirty
                if e.isConflict {
                    if marks.isEmpty { marks = [Bool](repeating: false, count: n) }
                    marks[e.id] = true
                }
            }
            for (i, id) in t.keyFieldIDs.enumerated() {
                cur[id] = key.values[i]
                if !inserted { orig[id] = key.values[i] }
            }
            self.status = inserted ? .inserted : h.flags.contains(.deleted) ? .deleted : anyDirty ? .updated : .unchanged
            self.fieldNames = t.fieldNames
            self.currents = cur
            self.originals = orig
            self.conflictMarks = marks
            self.ids = []
            return
        }
        // Per field id: current and original, nil when the record has no entry.
        var currents = [Value?](repeating: nil, count: t.fieldNames.count)
        var originals = currents
        var marks = [Bool](repeating: false, count: t.fieldNames.count)
        var anyDirty = false
        var r = ByteReader(record, offset: h.entriesStart)
        while let e = try r.nextEntry() {
            guard e.id < currents.count else { throw r.corrupt("field id \(e.id) unknown to table '\(t.name)'") }
            currents[e.id] = try Value(decoding: UnsafeRawBufferPointer(rebasing: record[e.current]))
            originals[e.id] = e.isDirty ? try Value(decoding: UnsafeRawBufferPointer(rebasing: record[e.original])) : currents[e.id]
            anyDirty = anyDirty || e.isDirty
            marks[e.id] = e.isConflict
        }
        for (i, id) in t.keyFieldIDs.enumerated() {
            currents[id] = key.values[i]
            originals[id] = key.values[i]
        }
        var names: [String] = []
        var ids: [Int] = []
        var cur: [Value] = []
        var orig: [Value] = []
        var conflictMarks: [Bool] = []
        names.reserveCapacity(currents.count)
        ids.reserveCapacity(currents.count)
        cur.reserveCapacity(currents.count)
        orig.reserveCapacity(currents.count)
        for id in t.fieldNames.indices where !t.dropped.contains(id) && (!t.isPropertyBag || t.definitions[id] != nil || currents[id] != nil) {
            names.append(t.fieldNames[id])
            ids.append(id)
            conflictMarks.append(marks[id])
            cur.append(currents[id] ?? .null)
            orig.append(inserted ? .null : (originals[id] ?? .null))
        }
        self.status = inserted ? .inserted : h.flags.contains(.deleted) ? .deleted : anyDirty ? .updated : .unchanged
        self.fieldNames = names
        self.currents = cur
        self.originals = orig
        self.conflictMarks = conflictMarks.contains(true) ? conflictMarks : []
        // Never empty here (a table has at least its key fields), so `position(of:)` searches it.
        self.ids = ids
    }

    // Equality and hashing over what the row holds; the lookup structures follow from it.
    public static func == (a: Row, b: Row) -> Bool {
        a.table == b.table && a.key == b.key && a.status == b.status && a.isConflicted == b.isConflicted
            && a.lastLSN == b.lastLSN && a.fieldNames == b.fieldNames && a.keyFieldNames == b.keyFieldNames
            && a.currents == b.currents && a.originals == b.originals
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(table)
        hasher.combine(key)
        hasher.combine(lastLSN)
        hasher.combine(fieldNames)
        hasher.combine(currents)
        hasher.combine(originals)
    }
}

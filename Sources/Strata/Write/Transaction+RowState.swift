import LMDB

/// The complete state of a row as sync code computes it: per field the original (server) and
/// current values, and the row's flags. See ``Transaction/setRowState(_:key:_:kind:origin:annotation:)``.
package struct RowState: Sendable, Hashable {
    /// A field's original (server-confirmed) and current value.
    package struct Field: Sendable, Hashable {
        /// The value the server last confirmed; for a field in conflict, the server's value.
        package var original: Value
        package var current: Value
        /// Whether a merge left this field in conflict (see ``Row/conflictingFields``). Only a
        /// conflicted row has such fields; a field in conflict is kept even when both values are null.
        package var isInConflict: Bool
        package init(original: Value, current: Value, isInConflict: Bool = false) {
            self.original = original
            self.current = current
            self.isInConflict = isInConflict
        }
        /// A field the server and the device agree on.
        package static func clean(_ value: Value) -> Field { Field(original: value, current: value) }
    }

    /// The non-key fields; a field not listed is null on both sides.
    package var fields: [String: Field]
    /// Inserted locally and not yet acknowledged (originals are then ignored).
    package var isInserted: Bool
    /// Deleted locally and not yet acknowledged.
    package var isDeleted: Bool
    /// Holds a conflict the app has not resolved; the batcher holds it back.
    package var isConflicted: Bool

    package init(fields: [String: Field] = [:], isInserted: Bool = false, isDeleted: Bool = false, isConflicted: Bool = false) {
        self.fields = fields
        self.isInserted = isInserted
        self.isDeleted = isDeleted
        self.isConflicted = isConflicted
    }

    /// The state of a stored row (key fields left out).
    package init(_ row: Row) {
        var fields: [String: Field] = [:]
        let key = Set(row.keyFieldNames)
        let conflicting = Set(row.conflictingFields)
        for name in row.fieldNames where !key.contains(name) {
            let f = Field(original: row.original(name), current: row[name], isInConflict: conflicting.contains(name))
            if f.isInConflict || !(f.original.isNull && f.current.isNull) { fields[name] = f }
        }
        self.init(fields: fields, isInserted: row.status == .inserted, isDeleted: row.status == .deleted, isConflicted: row.isConflicted)
    }

    /// The current value of `field`.
    package subscript(field: String) -> Value { fields[field]?.current ?? .null }

    /// Whether the device changed the row since the server last confirmed it: inserted,
    /// deleted, or a field whose current value differs from its original. A conflict mark alone
    /// does not count (callers that care ask ``isConflicted`` too).
    package var hasLocalValueChanges: Bool {
        isInserted || isDeleted || fields.values.contains { $0.original != $0.current }
    }

    /// The fields in conflict, sorted.
    package var conflictingFields: [String] { fields.filter(\.value.isInConflict).keys.sorted() }

    /// Drops every field's conflict mark and the row's conflict flag; fields left null on both
    /// sides are dropped.
    package mutating func clearConflict() {
        isConflicted = false
        for (f, field) in fields where field.isInConflict {
            fields[f]!.isInConflict = false
            if field.original.isNull && field.current.isNull { fields[f] = nil }
        }
    }
}

extension Transaction {
    /// Sets a row's complete state — `nil` removes the row — and logs one operation recording
    /// the fields that differ from the stored state, with the given kind, origin and annotation.
    ///
    /// This is the primitive the sync layer (merge, acknowledgements, resets) writes with; the
    /// rules that decide the state live there. Nothing is logged when nothing changes and
    /// `annotation` is empty.
    ///
    /// - Throws: ``StrataError`` `fieldNotFound`, `typeMismatch` (originals may be null; currents
    ///   must fit the field), `nullNotAllowed`.
    package func setRowState(
        _ table: String, key: RowKey, _ state: RowState?, kind: LogEntry.Kind, origin: LogEntry.Origin, annotation: [UInt8] = []
    ) throws {
        var t = try catalog.table(named: table)
        var k = ByteWriter(capacity: 32)
        try t.encodeKey(key, into: &k)
        // Build the wanted entries first: validation must finish before anything is written.
        var wanted: [(id: Int, entry: [UInt8])] = []
        var tableChanged = false
        if let state {
            for (name, f) in state.fields.sorted(by: { $0.key < $1.key }) {
                var id = t.fieldID(name)
                if id == nil {
                    guard t.isPropertyBag else { throw t.unknownField(name) }
                    id = try t.addNewField(name)
                    tableChanged = true
                }
                guard !t.isKeyField(id!) else { continue }
                // The one validation of values entering the store (`TableInfo.admit`). Originals
                // may be null (a field the server has no value for).
                let current = try t.admit(f.current, field: id, name: name)
                let original = try t.admit(f.original, field: id, name: name, nullable: true)
                var w = ByteWriter(capacity: 32)
                w.appendVarint(UInt64(id!))
                if f.isInConflict {
                    w.append(2)
                    w.appendValue(original)
                } else if state.isInserted || original == current {
                    if current.isNull { continue }
                    w.append(0)
                } else {
                    w.append(1)
                    w.appendValue(original)
                }
                w.appendValue(current)
                wanted.append((id!, w.bytes))
            }
            wanted.sort { $0.id < $1.id }
            // A field left out is null: a required field must hold a value, whatever brings the
            // state (a merge, a reset, an import).
            for (fid, def) in t.definitions.enumerated() {
                guard let def, !def.isNullable, !t.isKeyField(fid), !t.dropped.contains(fid) else { continue }
                guard state.fields[def.name].map({ $0.current.isNull }) ?? true else { continue }
                guard let d = def.defaultValue else {
                    throw StrataError(.nullNotAllowed, "row \(key) of table '\(t.name)' would have no value for the required field '\(def.name)' (not nullable)")
                }
                // A field with a default that neither side has a value for takes the default, on
                // both sides (clean), as it does in a row new to this device.
                var w = ByteWriter(capacity: 16)
                w.appendVarint(UInt64(fid))
                w.append(0)
                w.appendValue(d)
                wanted.removeAll { $0.id == fid }
                wanted.append((fid, w.bytes))
            }
            wanted.sort { $0.id < $1.id }
        }
        var flags: RowFlags = []
        if let state {
            if state.isInserted { flags.insert(.inserted) }
            if state.isDeleted { flags.insert(.deleted) }
            if state.isConflicted { flags.insert(.conflicted) }
        } else {
            flags = [.gone]
        }
        try writeRowState(t, target: k.bytes, wanted: wanted, flags: flags, kind: kind, origin: origin, annotation: annotation, tableChanged: tableChanged)
    }
}


import Foundation

extension TableInfo {
    /// The longest encoded row key (table id included). LMDB's key limit is 511 bytes and history
    /// keys add 8 bytes of LSN.
    static let maxKeyBytes = 500

    /// The one check of a value entering the store, whatever brings it — an edit, a merge, a
    /// reset, a conflict resolution, a briefcase import (``Transaction`` edits,
    /// `setRowState` and `mergeServerValues` all call it):
    ///
    /// - a field needs a non-empty name (property bags create fields by name);
    /// - doubles and timestamps must be finite: NaN and infinities have no order, no place in an
    ///   index and no JSON form, so an upload carrying one could never be sent;
    /// - a declared field's value must fit it (``coerce(_:_:)``: type, nullability, an int for a
    ///   double field converted); `nullable` overrides the field's nullability, for originals.
    func admit(_ value: Value, field id: Int?, name fieldName: String, nullable: Bool? = nil) throws(StrataError) -> Value {
        guard !fieldName.isEmpty else { throw StrataError(.fieldNotFound, "table '\(name)': a field name cannot be empty") }
        guard let id, let def = definitions[id] else {
            try checkFinite(value, fieldName)
            return value
        }
        return try coerce(value, nullable.map { FieldDefinition(def.name, def.type, nullable: $0) } ?? def)
    }

    /// Refuses a NaN or infinite double or timestamp, naming the field.
    func checkFinite(_ value: Value, _ fieldName: String) throws(StrataError) {
        let bad: String? = switch value {
        case .double(let d) where !d.isFinite: "\(d)"
        case .timestamp(let t) where !t.timeIntervalSince1970.isFinite: "a timestamp of \(t.timeIntervalSince1970) seconds"
        default: nil
        }
        if let bad {
            throw StrataError(.invalidValue, "field '\(fieldName)' of table '\(name)' cannot hold \(bad): Strata stores only finite numbers and times (NaN and infinities cannot be ordered, indexed or sent to a server)")
        }
    }

    /// Checks `value` against a declared field; an int given for a double field is converted.
    /// A NaN or infinite double or timestamp is refused (see ``admit(_:field:name:nullable:)``).
    func coerce(_ value: Value, _ def: FieldDefinition) throws(StrataError) -> Value {
        try checkFinite(value, def.name)
        switch (value, def.type) {
        case (.null, _):
            guard def.isNullable else {
                throw StrataError(.nullNotAllowed, "field '\(def.name)' of table '\(name)' cannot be null")
            }
            return value
        case (.int(let i), .double):
            return .double(Double(i))
        default:
            guard value.type == def.type else {
                throw StrataError(.typeMismatch, "field '\(def.name)' of table '\(name)' holds \(def.type) values, not \(value.type!) (\(value))")
            }
            return value
        }
    }

    /// Writes the `rows` key of `key` — table id, then the order-preserving key components —
    /// into `w`, checking the key against the primary key.
    func encodeKey(_ key: RowKey, into w: inout ByteWriter) throws(StrataError) {
        guard key.values.count == keyFieldIDs.count else {
            let names = schema.primaryKey.joined(separator: ", ")
            throw StrataError(.invalidKey, "table '\(name)' has a primary key of \(keyFieldIDs.count) field(s) (\(names)); the key \(key) has \(key.values.count)")
        }
        w.reset()
        w.appendBigEndian(id)
        for (i, fid) in keyFieldIDs.enumerated() {
            KeyCodec.append(try coerce(key.values[i], definitions[fid]!), to: &w)
        }
        guard w.count <= Self.maxKeyBytes else {
            throw StrataError(.invalidKey, "the key \(key) of table '\(name)' is \(w.count) bytes encoded; the limit is \(Self.maxKeyBytes)")
        }
    }

    /// Decodes the row key from a `rows` key (table id included).
    func decodeKey(_ rowsKey: UnsafeRawBufferPointer) throws(StrataError) -> RowKey {
        var r = ByteReader(rowsKey, offset: 4)
        return try KeyCodec.readKey(&r, count: keyFieldIDs.count)
    }
}

extension Catalog {
    /// A readable name for a `rows` key: `table key`, or the raw bytes if it cannot be decoded.
    func describe(rowsKey k: UnsafeRawBufferPointer) -> String {
        if k.count >= 4 {
            var r = ByteReader(k)
            if let id = try? r.bigEndian32(), let t = tables[id], let key = try? t.decodeKey(k) {
                return "\(t.name) \(key)"
            }
        }
        return k.map { String($0, radix: 16) }.joined()
    }
}

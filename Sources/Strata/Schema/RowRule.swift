import Foundation

/// What a row of a table may hold: the one rule that every way into a store applies (edits,
/// merges, resets, conflict resolutions, briefcase imports) and that a sync server applies to
/// the rows it accepts, so that a server never takes a row a client cannot store.
///
/// A row fits its table when:
/// - its key has one value per key field, each of the key field's type (an int for a double
///   field is converted), none null, and the key takes at most ``maxKeyBytes`` encoded;
/// - every field it names is declared (a property bag takes any name), and no name is empty.
///   Names compare by their UTF-8 bytes: a name that Swift's `==` calls equal to a declared one
///   but that is written in another Unicode form (`"e\u{301}"` for `"\u{e9}"`) is not that field;
/// - every value is of its field's type (an int for a double field is converted), null only
///   where the field is nullable, and finite (no NaN or infinite double or timestamp).
///
/// ```swift
/// let key = try RowRule.admit(key: [7], of: tasks)                    // checked and normalized
/// let title = try RowRule.admit(.string("Buy milk"), field: "title", of: tasks)
/// ```
public enum RowRule {
    /// The most bytes a row key takes encoded, table id included (`invalidKey` past it). LMDB's
    /// key limit is 511 bytes, and history keys add 8 bytes of LSN.
    public static let maxKeyBytes = 500

    /// Checks a key for `schema`'s table and returns it as the store keeps it (an int for a
    /// double key field converted).
    ///
    /// - Throws: `StrataError` `invalidKey` (arity or size), `typeMismatch`, `nullNotAllowed`,
    ///   `invalidValue` (not finite).
    /// - Complexity: O(k) for a key of k bytes.
    public static func admit(key: RowKey, of schema: TableSchema) throws(StrataError) -> RowKey {
        var w = ByteWriter(capacity: 64)
        let defs = try schema.primaryKey.map { (name: String) throws(StrataError) -> FieldDefinition in
            guard let def = schema.field(name) else {
                throw StrataError(.invalidSchema, "table '\(schema.name)': primary key field '\(name)' is not declared")
            }
            return def
        }
        // The table's id is not known outside a store; it always takes 4 bytes.
        try encodeKey(key, of: schema, tableID: 0, definitions: defs, into: &w)
        return RowKey(zip(key.values, defs).map { v, d in (try? coerce(v, table: schema.name, d)) ?? v })
    }

    /// Checks a value for the field `field` of `schema`'s table and returns it as the store keeps
    /// it (an int for a double field converted). `nullable` overrides the field's nullability
    /// (for originals).
    ///
    /// - Throws: `StrataError` `fieldNotFound` (an empty name, a field a fixed table does not
    ///   declare, or a name a declared field has in another Unicode form), `typeMismatch`,
    ///   `nullNotAllowed`, `invalidValue` (not finite).
    /// - Complexity: O(f) for a table of f declared fields.
    public static func admit(_ value: Value, field: String, of schema: TableSchema, nullable: Bool? = nil) throws(StrataError) -> Value {
        let def = schema.field(field)
        if def == nil, !field.isEmpty, let twin = schema.twin(of: field) {
            throw StrataError(.fieldNotFound, twinMessage(table: schema.name, field, twin))
        }
        if def == nil, schema.mode == .fixed, !field.isEmpty {
            throw StrataError(.fieldNotFound, "table '\(schema.name)' has no field '\(field)'")
        }
        return try admit(value, table: schema.name, field: field, definition: def, nullable: nullable)
    }

    /// The check itself, for a field whose definition (`nil` for a property-bag field) the
    /// caller found.
    static func admit(_ value: Value, table: String, field: String, definition: FieldDefinition?, nullable: Bool?) throws(StrataError) -> Value {
        guard !field.isEmpty else { throw StrataError(.fieldNotFound, "table '\(table)': a field name cannot be empty") }
        guard let def = definition else {
            try checkFinite(value, table: table, field: field)
            return value
        }
        return try coerce(value, table: table, nullable.map { FieldDefinition(def.name, def.type, nullable: $0) } ?? def)
    }

    /// Refuses a NaN or infinite double or timestamp, naming the field: NaN and infinities have
    /// no order, no place in an index and no JSON form, so an upload carrying one could never be
    /// sent.
    static func checkFinite(_ value: Value, table: String, field: String) throws(StrataError) {
        let bad: String? = switch value {
        case .double(let d) where !d.isFinite: "\(d)"
        case .timestamp(let t) where !t.timeIntervalSince1970.isFinite: "a timestamp of \(t.timeIntervalSince1970) seconds"
        default: nil
        }
        if let bad {
            throw StrataError(.invalidValue, "field '\(field)' of table '\(table)' cannot hold \(bad): Strata stores only finite numbers and times (NaN and infinities cannot be ordered, indexed or sent to a server)")
        }
    }

    /// Checks `value` against a declared field; an int given for a double field is converted.
    static func coerce(_ value: Value, table: String, _ def: FieldDefinition) throws(StrataError) -> Value {
        try checkFinite(value, table: table, field: def.name)
        switch (value, def.type) {
        case (.null, _):
            guard def.isNullable else {
                throw StrataError(.nullNotAllowed, "field '\(def.name)' of table '\(table)' cannot be null")
            }
            return value
        case (.int(let i), .double):
            return .double(Double(i))
        default:
            guard value.type == def.type else {
                throw StrataError(.typeMismatch, "field '\(def.name)' of table '\(table)' holds \(def.type) values, not \(value.type!) (\(value))")
            }
            return value
        }
    }

    /// Writes the `rows` key of `key` — table id, then the order-preserving key components —
    /// into `w`, checking the key against the primary key (`definitions`, in key order).
    static func encodeKey(
        _ key: RowKey, of schema: TableSchema, tableID: UInt32, definitions: some Collection<FieldDefinition>, into w: inout ByteWriter
    ) throws(StrataError) {
        guard key.values.count == definitions.count else {
            let names = schema.primaryKey.joined(separator: ", ")
            throw StrataError(.invalidKey, "table '\(schema.name)' has a primary key of \(definitions.count) field(s) (\(names)); the key \(key) has \(key.values.count)")
        }
        w.reset()
        w.appendBigEndian(tableID)
        for (value, def) in zip(key.values, definitions) {
            KeyCodec.append(try coerce(value, table: schema.name, def), to: &w)
        }
        guard w.count <= maxKeyBytes else {
            throw StrataError(.invalidKey, "the key \(key) of table '\(schema.name)' is \(w.count) bytes encoded; the limit is \(maxKeyBytes)")
        }
    }
}

extension RowRule {
    /// Why `name` is not the field `twin` of `table`, which it equals under Swift's `==` only:
    /// the two are written in different Unicode forms, and Strata compares names by their bytes.
    package static func twinMessage(table: String, _ name: String, _ twin: String) -> String {
        "table '\(table)' has no field '\(name)' (\(name.codePoints)): it differs from the field '\(twin)' (\(twin.codePoints)) only in Unicode form, and Strata compares field names by their bytes; use the table's form"
    }
}

extension String {
    /// Whether `other` is this very string: the same small string (up to 15 UTF-8 bytes, kept
    /// inline, where equal bytes make equal bits) or the same storage. It then has the same
    /// bytes (``sameBytes(_:)``); `false` proves nothing.
    ///
    /// A few instructions, where ``sameBytes(_:)`` costs about 45 even for names of unequal
    /// lengths: a search over a few names tries this on each first. A merge resolves each server
    /// row's names (short ones, all) against its table's this way, without a byte comparison.
    @inline(__always)
    package func sameRepresentation(_ other: String) -> Bool {
        MemoryLayout<String>.size == 16
            && unsafeBitCast(self, to: (UInt64, UInt64).self) == unsafeBitCast(other, to: (UInt64, UInt64).self)
    }

    /// Whether `other` is the same name as this one to Strata: the same UTF-8 bytes. Swift's `==`
    /// also calls canonically equivalent strings equal (`"\u{e9}"` and `"e\u{301}"`), which Strata
    /// keeps apart, as keys, table names and field names.
    @inline(__always)
    package func sameBytes(_ other: String) -> Bool {
        let n = utf8.count
        guard n == other.utf8.count else { return false }
        if n == 0 { return true }
        let contiguous = utf8.withContiguousStorageIfAvailable { a in
            other.utf8.withContiguousStorageIfAvailable { b in memcmp(a.baseAddress!, b.baseAddress!, n) == 0 }
        }
        if let contiguous, let same = contiguous { return same }
        return utf8.elementsEqual(other.utf8)
    }

    /// The string's code points, for a message that must tell two forms apart: `U+0065 U+0301`
    /// (at most 16 of them, then `…`).
    package var codePoints: String {
        let scalars = unicodeScalars.prefix(16).map { s in
            let hex = String(s.value, radix: 16, uppercase: true)
            return "U+" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
        }
        return scalars.joined(separator: " ") + (unicodeScalars.count > 16 ? " …" : "")
    }
}

extension Dictionary where Key == String {
    /// The value under `name` compared by its UTF-8 bytes: `self[name]` hashes and compares as
    /// `==` does, and so finds an entry under `name` in another Unicode form too.
    @inline(__always)
    package subscript(exactly name: String) -> Value? {
        guard let i = index(forKey: name), self[i].key.sameBytes(name) else { return nil }
        return self[i].value
    }
}

extension Dictionary where Key == String, Value == Strata.Value {
    /// The value under `name` compared by its UTF-8 bytes, for a row's fields: compiled here for
    /// `[String: Value]`, so that another module's call does not run the generic form (which
    /// looks up type metadata at run time).
    ///
    /// A dictionary of a few entries (a server row's fields) is searched by comparing bytes,
    /// which costs less than hashing the name. It finds the same entry as the hash: an entry
    /// under `name`'s bytes is the one entry `==` to `name` that the dictionary can hold.
    package subscript(exactly name: String) -> Strata.Value? {
        if count <= 8 {
            var i = startIndex
            // The same string first (see `sameRepresentation`), then the same bytes: the one
            // entry with `name`'s bytes is found either way.
            while i != endIndex {
                if self[i].key.sameRepresentation(name) { return self[i].value }
                formIndex(after: &i)
            }
            i = startIndex
            while i != endIndex {
                if self[i].key.sameBytes(name) { return self[i].value }
                formIndex(after: &i)
            }
            return nil
        }
        guard let i = index(forKey: name), self[i].key.sameBytes(name) else { return nil }
        return self[i].value
    }
}

/// A few names (a table's key fields) that `contains` compares by their UTF-8 bytes.
package struct ExactNames: Sendable {
    package let names: [String]
    package init(_ names: [String]) { self.names = names }
    package func contains(_ name: String) -> Bool { names.contains { $0.sameBytes(name) } }
}

import Foundation

extension Row: Identifiable {
    /// A row's identity: its table and its key. Two reads of the same row, before and after an
    /// edit, have the same `id`.
    public struct ID: Hashable, Sendable, CustomStringConvertible {
        /// The table the row belongs to.
        public let table: String
        /// The row's primary key.
        public let key: RowKey

        /// The identity of the row with `key` in `table`.
        public init(table: String, key: RowKey) {
            self.table = table
            self.key = key
        }

        public var description: String { "\(table) \(key)" }
    }

    /// The row's table and key, for SwiftUI's `ForEach` and `List`. (A field named `id` is read
    /// with `row["id"]`.)
    public var id: ID { ID(table: table, key: key) }
}

extension Row {
    /// The current value of `field` as a Swift value: `try row["title", as: String.self]`.
    ///
    /// An optional type reads `null` as `nil` (`row["notes", as: String?.self]`); a field the
    /// row does not have reads as `null`, as in ``subscript(_:)``. Which Swift type reads which
    /// value: ``ValueConvertible``.
    ///
    /// - Throws: ``StrataError`` `typeMismatch` naming the table, the key, the field, the type
    ///   asked for and the value stored, when the value does not read as `T`: another type, an
    ///   integer out of `T`'s range, `null` for a non-optional `T`; `fieldNotFound` when the row
    ///   has no field `field` and `T` is not optional.
    /// - Complexity: O(log f) for f fields.
    public subscript<T: ValueConvertible>(field: String, as type: T.Type) -> T {
        get throws(StrataError) { try read(field, self[field], as: T.self, original: false) }
    }

    /// The original (server-confirmed) value of `field` as a Swift value; see
    /// ``original(_:)`` for what the original is and ``subscript(_:as:)`` for the reading.
    ///
    /// - Throws: ``StrataError`` `typeMismatch` or `fieldNotFound`, as ``subscript(_:as:)``.
    public func original<T: ValueConvertible>(_ field: String, as type: T.Type) throws(StrataError) -> T {
        try read(field, original(field), as: T.self, original: true)
    }

    private func read<T: ValueConvertible>(_ field: String, _ value: Value, as type: T.Type, original: Bool) throws(StrataError) -> T {
        if let t = T(strataValue: value) { return t }
        // The error path only: a null may be a field the row does not have, found by a scan.
        let which = original ? "the original of field" : "field"
        if value.isNull, !fieldNames.contains(field) {
            throw StrataError(.fieldNotFound, "row \(key) of table '\(table)' has no field '\(field)' to read as \(strataTypeName(T.self)) (its fields: \(fieldNames.prefix(12).joined(separator: ", "))\(fieldNames.count > 12 ? ", …" : ""))")
        }
        let stored = value.type.map { "\($0) \(Self.abbreviated(value))" } ?? "null"
        let hint = value.isNull ? "; read it as \(strataTypeName(T.self))? to get nil" : ""
        throw StrataError(.typeMismatch, "\(which) '\(field)' of row \(key) in table '\(table)' holds \(stored), which does not read as \(strataTypeName(T.self))\(hint)")
    }

    /// A value's description, cut to a length a message can carry.
    private static func abbreviated(_ value: Value) -> String {
        let s = value.description
        return s.count <= 60 ? s : s.prefix(57) + "…"
    }
}

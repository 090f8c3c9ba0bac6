import Foundation

// Edits and reads that take Swift variables (see `ValueConvertible`): fields as
// `["title": title, "due": due]` and keys as `key: id`.
//
// Each is an overload marked `@_disfavoredOverload`, so that a call the existing signatures
// accept (literals, `Value`s, a `RowKey`, a `FieldValues`) still resolves to them unchanged, with
// no conversion: only a call that names a Swift variable comes here. Fields pass through an
// existential per field (small values, held inline: no allocation) and are converted to `Value`s
// once, before the edit; a loop that writes many rows should build `FieldValues` of `Value`s.

extension Transaction {
    /// Inserts a row given as Swift values: `try tx.insert("tasks", ["id": id, "title": title])`.
    /// Otherwise as `insert(_:_:)`.
    @_disfavoredOverload
    public func insert(_ table: String, _ fields: KeyValuePairs<String, (any ValueConvertible)?>) throws(StrataError) {
        try insert(table, FieldValues(fields))
    }

    /// Updates a row with fields given as Swift values; as `update(_:key:_:)`.
    @_disfavoredOverload
    public func update(_ table: String, key: RowKey, _ fields: KeyValuePairs<String, (any ValueConvertible)?>) throws(StrataError) {
        try update(table, key: key, FieldValues(fields))
    }

    /// Updates the row whose key is one Swift value: `try tx.update("tasks", key: id, ["done": true])`.
    @_disfavoredOverload
    public func update(_ table: String, key: some ValueConvertible, _ fields: FieldValues) throws(StrataError) {
        try update(table, key: RowKey(key), fields)
    }

    /// Updates the row whose key is one Swift value, with fields given as Swift values.
    @_disfavoredOverload
    public func update(_ table: String, key: some ValueConvertible, _ fields: KeyValuePairs<String, (any ValueConvertible)?>) throws(StrataError) {
        try update(table, key: RowKey(key), FieldValues(fields))
    }

    /// Inserts or updates a row given as Swift values; as `upsert(_:_:)`.
    @_disfavoredOverload
    public func upsert(_ table: String, _ fields: KeyValuePairs<String, (any ValueConvertible)?>) throws(StrataError) {
        try upsert(table, FieldValues(fields))
    }

    /// Deletes the row whose key is one Swift value; as `delete(_:key:)`.
    @_disfavoredOverload
    public func delete(_ table: String, key: some ValueConvertible) throws(StrataError) {
        try delete(table, key: RowKey(key))
    }

    /// Reverts one field of the row whose key is one Swift value; as `revert(_:key:field:)`.
    @_disfavoredOverload
    public func revert(_ table: String, key: some ValueConvertible, field: String) throws(StrataError) {
        try revert(table, key: RowKey(key), field: field)
    }

    /// Reverts the row whose key is one Swift value; as `revert(_:key:)`.
    @_disfavoredOverload
    public func revert(_ table: String, key: some ValueConvertible) throws(StrataError) {
        try revert(table, key: RowKey(key))
    }

    /// Acknowledges the row whose key is one Swift value; as `acknowledge(_:key:)`.
    @_disfavoredOverload
    public func acknowledge(_ table: String, key: some ValueConvertible) throws(StrataError) {
        try acknowledge(table, key: RowKey(key))
    }

    /// The row whose key is one Swift value, as this transaction sees it.
    @_disfavoredOverload
    public func row(_ table: String, key: some ValueConvertible, includingDeleted: Bool = false) throws(StrataError) -> Row? {
        try row(table, key: RowKey(key), includingDeleted: includingDeleted)
    }
}

extension Snapshot {
    /// The row whose key is one Swift value: `try $0.row("tasks", key: id)`; as
    /// `row(_:key:includingDeleted:)`.
    @_disfavoredOverload
    public func row(_ table: String, key: some ValueConvertible, includingDeleted: Bool = false) throws(StrataError) -> Row? {
        try row(table, key: RowKey(key), includingDeleted: includingDeleted)
    }

    /// The history of the row whose key is one Swift value; as `history(_:key:)`.
    @_disfavoredOverload
    public func history(_ table: String, key: some ValueConvertible) throws(StrataError) -> [LogEntry] {
        try history(table, key: RowKey(key))
    }

    /// The row whose key is one Swift value, decoded as a `T`; as
    /// `record(_:from:key:)`.
    @_disfavoredOverload
    public func record<T: Decodable>(_ type: T.Type, from table: String, key: some ValueConvertible) throws(StrataError) -> T? {
        try record(T.self, from: table, key: RowKey(key))
    }
}

import Foundation
import Strata

/// A row of a server delta that this store cannot hold (`RowRule`: a field it lacks, a value
/// of the wrong type, a key too long, …), set aside so that the rest of the delta merges and the
/// anchor moves on. One bad row on the server never walls a client in.
///
/// The store keeps what it had for the row's key, if anything. The entry stays listed
/// (``SyncClient/refusedServerRows()``) until a later delta brings a row the store can hold
/// under the same key, deletes it, or is a snapshot of its table that no longer refuses it.
public struct RefusedServerRow: Sendable, Codable, Hashable {
    /// The row's table.
    public var table: String
    /// The row's key as the server sent it: the values of the table's key fields that the row
    /// lists (fewer when it lacks one).
    public var key: RowKey
    /// Why this store cannot hold it: the message of the `StrataError` the row met.
    public var reason: String
    /// The anchor of the delta that brought it.
    public var anchor: String

    /// A refused row.
    public init(table: String, key: RowKey, reason: String, anchor: String) {
        self.table = table
        self.key = key
        self.reason = reason
        self.anchor = anchor
    }
}

extension RefusedServerRow {
    /// Why this store cannot hold `row` as a whole row (its key, as sent, is `key`), checked by
    /// `RowRule`: a field it leaves out takes its default, so a required field without one
    /// must be there. `nil` when it can.
    static func reason(refusing row: ServerRow, _ key: RowKey, of schema: TableSchema) -> String? {
        guard key.values.count == schema.primaryKey.count else {
            return "the row lacks a key field of table '\(schema.name)' (\(schema.primaryKey.joined(separator: ", ")))"
        }
        if schema.mode == .fixed, let f = schema.fields.first(where: { f in
            !f.isNullable && f.defaultValue == nil && row.fields[f.name] == nil && !schema.primaryKey.contains(f.name)
        }) {
            return "the row lacks the required field '\(f.name)' of table '\(schema.name)'"
        }
        do {
            _ = try RowRule.admit(key: key, of: schema)
            for (name, value) in row.fields where !schema.primaryKey.contains(name) {
                _ = try RowRule.admit(value, field: name, of: schema)
            }
            return nil
        } catch {
            return error.message
        }
    }
}

extension SyncClient {
    static let refusedServerRowsProperty = "strata.sync.refusedServerRows"

    /// The rows of server deltas that this store could not hold, newest last (see
    /// ``RefusedServerRow``).
    ///
    /// - Complexity: O(n) for n rows listed.
    public func refusedServerRows() throws(StrataError) -> [RefusedServerRow] {
        return try strataErrors {
            try store.read { try Self.refusedServerRows($0) }
        }
    }

    static func refusedServerRows(_ snap: Snapshot) throws -> [RefusedServerRow] {
        guard let b = try snap.property(refusedServerRowsProperty)?.bytesValue else { return [] }
        return try SetAsideRecord.refusedServerRows(b, property: refusedServerRowsProperty)
    }

    /// Stores the list as a record (``SetAsideRecord``); an empty list removes the property.
    static func saveRefusedServerRows(_ list: [RefusedServerRow], _ tx: Transaction) throws {
        try tx.setStrataProperty(refusedServerRowsProperty, list.isEmpty ? nil : .bytes(SetAsideRecord.encode(list)))
    }

    /// Brings the list up to date after a merge of `delta` that refused `refused`: entries of
    /// rows the delta names again (or, for a snapshot, of every table it lists) go, and this
    /// merge's refusals come in their place.
    static func updateRefusedServerRows(after delta: ServerDelta, refused: [RefusedServerRow], _ tx: Transaction) throws {
        let list = try refusedServerRows(tx.snapshot)
        guard !list.isEmpty || !refused.isEmpty else { return }
        let snapshotTables = delta.mode == .snapshot ? Set(delta.tables.map(\.table)) : []
        var named = Set<RowID>()
        if delta.mode != .snapshot {
            for table in delta.tables {
                // A row's key as the list keeps it: the values of its key fields, as sent.
                let schema = try tx.snapshot.schema(table.table)
                for row in table.upserts {
                    named.insert(rowID(table.table, RowKey(schema.primaryKey.compactMap { row.fields[$0] })))
                }
                for key in table.deletes { named.insert(rowID(table.table, key)) }
            }
        }
        let new = Set(refused.map { rowID($0.table, $0.key) })
        let kept = list.filter { r in
            !snapshotTables.contains(r.table) && !named.contains(rowID(r.table, r.key)) && !new.contains(rowID(r.table, r.key))
        }
        let updated = kept + refused
        guard updated != list else { return }
        try saveRefusedServerRows(updated, tx)
    }

    /// After the last page of a snapshot merged page by page: the entries of `tables` that no
    /// page of it refused (their anchor is not the snapshot's) go, as a whole snapshot's merge
    /// drops them; its pages took off the entries of rows they named.
    static func dropRefusedServerRows(of tables: Set<String>, exceptAnchor anchor: String, _ tx: Transaction) throws {
        let list = try refusedServerRows(tx.snapshot)
        let kept = list.filter { !tables.contains($0.table) || $0.anchor == anchor }
        guard kept != list else { return }
        try saveRefusedServerRows(kept, tx)
    }
}

/// Thrown out of a merge's transaction when one server row breaks the store's rules: the merge
/// runs again without it (see `SyncClient.merge`).
struct ServerRowRefusal: Error {
    /// Where the row is in the delta: its table's index, and its index among the upserts.
    let position: ServerRowPosition
    let row: RefusedServerRow

    /// The refusal of the row at `position` for `error`, or `nil` when the error is not the
    /// row's fault.
    init?(_ error: any Error, position: ServerRowPosition, table: String, fields: [String: Value], schema: TableSchema, anchor: String) {
        guard let error = error as? StrataError, error.code.refusesServerRow else { return nil }
        self.position = position
        let sent = RowKey(schema.primaryKey.compactMap { fields[exactly: $0] })
        row = RefusedServerRow(table: table, key: sent, reason: error.message, anchor: anchor)
    }
}

extension SyncClient {
    /// The row under `key` (a pending delete included), `.some(nil)` when there is none, and
    /// `nil` when this store cannot hold such a key (so no row has it).
    static func rowUnlessRefused(_ table: String, _ key: RowKey, _ tx: Transaction) throws -> Row?? {
        do {
            return .some(try tx.row(table, key: key, includingDeleted: true))
        } catch {
            if error.code.refusesServerRow { return nil }
            throw error
        }
    }
}

/// A row's place in a delta, which stays the same when the merge runs again.
struct ServerRowPosition: Hashable {
    let table: Int
    let upsert: Int
}

extension StrataError.Code {
    /// Whether an error of this code, met while one server row is merged, is that row's fault:
    /// it breaks the store's rules for what a row may be (`RowRule`).
    var refusesServerRow: Bool {
        [.invalidKey, .typeMismatch, .nullNotAllowed, .missingField, .fieldNotFound, .invalidValue].contains(self)
    }
}

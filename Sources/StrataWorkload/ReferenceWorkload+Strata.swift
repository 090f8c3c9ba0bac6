import Strata

/// One edit of the reference workload, with its arguments built for Strata's API.
public enum StrataEdit: Sendable {
    /// Insert a row.
    case insert(FieldValues)
    /// Update fields of the row with this key.
    case update(RowKey, FieldValues)
    /// Delete the row with this key.
    case delete(RowKey)

    /// Applies the edit to the `tasks` table in `tx`.
    @inline(__always)
    public func apply(in tx: Transaction) throws(StrataError) {
        switch self {
        case .insert(let f): try tx.insert("tasks", f)
        case .update(let k, let f): try tx.update("tasks", key: k, f)
        case .delete(let k): try tx.delete("tasks", key: k)
        }
    }
}

extension ReferenceWorkload {
    /// The preload rows as insert arguments (ids 1…P). Build them before timing.
    public func strataPreload() -> [FieldValues] {
        preload.enumerated().map { i, values in
            FieldValues([("id", .int(Int64(i + 1)))] + zip(Self.columns, values).map { ($0, $1) })
        }
    }

    /// The edit stream as Strata calls. Build it before timing.
    public func strataEdits() -> [StrataEdit] {
        edits.map { e in
            switch e {
            case .insert(let id, let values):
                .insert(FieldValues([("id", .int(id))] + zip(Self.columns, values).map { ($0, $1) }))
            case .update(let id, let cols, let values):
                .update(RowKey(.int(id)), FieldValues(zip(cols, values).map { (Self.columns[$0], $1) }))
            case .delete(let id):
                .delete(RowKey(.int(id)))
            }
        }
    }
}

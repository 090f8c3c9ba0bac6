import Strata

/// What an acknowledgement does to a row, given the change that was sent and the row as it is
/// now — which may have been edited again while the batch was in flight.
///
/// - **ok**: the server holds the sent values, so they become the originals; an edit made after
///   the batch was frozen stays pending against them. An insert becomes a server row (or, if the
///   row was deleted meanwhile, a pending delete of it); an acknowledged delete removes the row
///   (or, if the row was inserted again meanwhile, leaves it as a pending insert). Values the
///   server assigned become the originals too, and the currents where the app has not changed the
///   field since.
/// - **rollback** (an update refused with that action): the row returns to the server's values.
enum AckRules {
    static func ok(_ change: RowChange, local: RowState?, serverValues: [String: Value]) -> RowState? {
        var state: RowState
        switch change.kind {
        case .insert:
            guard let local else {
                // Deleted locally while in flight: the server has the row now, so delete it there.
                state = RowState(fields: change.values.mapValues(RowState.Field.clean), isDeleted: true)
                break
            }
            state = local
            state.isInserted = false
            for f in Set(local.fields.keys).union(change.values.keys) {
                state.fields[f] = RowState.Field(original: change.values[f] ?? .null, current: local[f])
            }
        case .update:
            guard let local else { return nil }
            state = local
            for (f, sent) in change.values {
                state.fields[f] = local.isDeleted ? .clean(sent) : RowState.Field(original: sent, current: local[f])
            }
        case .delete:
            guard let local, !local.isDeleted else { return nil }
            // Inserted again while the delete was in flight: the server has no row any more.
            return RowState(fields: local.fields.mapValues { .clean($0.current) }.filter { !$0.value.current.isNull }, isInserted: true)
        }
        for (f, v) in serverValues {
            let field = state.fields[f] ?? .clean(.null)
            // Untouched since the batch was frozen: the field takes the server's value.
            let untouched = change.values[f].map { field.current == $0 } ?? (field.current == field.original)
            state.fields[f] = untouched || state.isDeleted ? .clean(v) : RowState.Field(original: v, current: field.current)
        }
        state.fields = state.fields.filter { !($0.value.original.isNull && $0.value.current.isNull) }
        return state
    }

    static func rollback(local: RowState?, serverValues: [String: Value]?) -> RowState? {
        guard var state = local else { return nil }
        state.fields = state.fields.mapValues { .clean($0.original) }
        for (f, v) in serverValues ?? [:] { state.fields[f] = .clean(v) }
        state.fields = state.fields.filter { !$0.value.current.isNull }
        state.isDeleted = false
        state.isConflicted = false
        return state
    }
}

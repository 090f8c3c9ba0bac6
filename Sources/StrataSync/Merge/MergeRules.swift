import Foundation
import Strata

/// What the server says about one row.
enum ServerChange: Sendable {
    /// The fields the server sets (key fields excluded); fields not listed are unchanged.
    case upsert([String: Value])
    case delete
}

/// One field's fate in a merge, as recorded in the audit.
public struct FieldDecision: Sendable, Hashable {
    /// How the merge settled the field.
    public enum Outcome: UInt8, Sendable, Hashable {
        /// Changed only on the server: the server's value was taken.
        case takeServer = 1
        /// Changed only locally: the local value stays pending.
        case keepLocal = 2
        /// Changed on both sides to the same value: no longer pending.
        case settled = 3
        /// Conflict resolved for the server.
        case conflictServer = 4
        /// Conflict resolved for the local value (its original is now the server's value).
        case conflictLocal = 5
        /// Conflict resolved with merged values.
        case conflictMerged = 6
        /// Conflict kept for the app to resolve.
        case conflictDeferred = 7
    }

    /// The field's name.
    public let field: String
    /// The value the server last confirmed before the merge (`nil` for a row inserted on both sides).
    public let base: Value?
    /// The local current value before the merge.
    public let local: Value
    /// The value the server sent.
    public let server: Value
    /// How the field was settled.
    public let outcome: Outcome
}

extension FieldDecision.Outcome {
    /// A conflict's outcome, whichever side it went to.
    var isConflict: Bool {
        switch self {
        case .takeServer, .keepLocal, .settled: false
        case .conflictServer, .conflictLocal, .conflictMerged, .conflictDeferred: true
        }
    }
}

/// The result of merging one row.
struct MergeOutcome {
    /// The row's new state; `nil` removes it.
    var state: RowState?
    var decisions: [FieldDecision] = []
    var conflict: Conflict?
    var resolution: Resolution?
}

/// The three-way merge of one row: the server's change against the local state, field by field.
///
/// Per field, with *base* the original (what the server last confirmed), *local* the current
/// value and *server* the value in the delta:
///
/// | local vs base | server vs base | result |
/// |---|---|---|
/// | unchanged | unchanged | nothing |
/// | unchanged | changed | take the server's value; the field is clean |
/// | changed | unchanged | keep the local value, still pending |
/// | changed | changed to the local value | settled: clean at that value |
/// | changed | changed to another value | conflict → the policy |
///
/// Conflicts by policy: *server wins* takes the server's value (clean); *client wins* keeps the
/// local value and moves its original to the server's, so the upload carries the server's value
/// as "old"; *deferred* does the same and marks the row conflicted; *custom* lets a resolver pick.
///
/// Row-level rules:
///
/// | local row | server upserts | server deletes |
/// |---|---|---|
/// | none | a new clean row | nothing |
/// | unchanged | fields taken | removed |
/// | updated | field rules above | conflict (local update vs server delete): server → removed; local → uploaded again as an insert |
/// | inserted locally | conflict on every differing field (no base); the row becomes a server row | kept: the server never had this row |
/// | deleted locally | if the server changed a field, conflict: server → row restored with the server's values; local → stays deleted, originals updated | settled: removed |
enum MergeRules {
    /// The per-field rule of the first table, for a row that is not a local insert.
    enum FieldRule: Equatable {
        /// Neither side changed the field.
        case unchanged
        case takeServer
        case keepLocal
        case settled
        case conflict
    }

    static func field(localChanged: Bool, serverChanged: Bool, serverIsLocal: Bool) -> FieldRule {
        if !localChanged { return serverChanged ? .takeServer : .unchanged }
        if !serverChanged { return .keepLocal }
        return serverIsLocal ? .settled : .conflict
    }

    /// The resolution `policy` gives every conflict whatever it holds, or `nil` for the
    /// policies that look at the conflict (last writer wins, custom).
    static func fixedResolution(_ policy: ConflictPolicy) -> Resolution? {
        switch policy {
        case .serverWins: .server
        case .clientWins: .local
        case .deferred: .deferred
        case .lastWriterWins, .custom: nil
        }
    }

    static func resolve(_ c: Conflict, _ policy: ConflictPolicy) -> Resolution {
        switch policy {
        case .serverWins, .clientWins, .deferred: fixedResolution(policy)!
        case .lastWriterWins:
            // Ties and missing timestamps go to the server: every client decides alike.
            if let l = c.localTimestamp, let s = c.serverTimestamp, l > s { .local } else { .server }
        case .custom(let resolver): resolver(c)
        }
    }

    /// The merge of a live server row (not a local insert, delete or conflict) on its stored
    /// record: the same rules as ``fields(_:_:_:_:_:_:_:)``, per field, as a write action for
    /// `Transaction.mergeServerValues` and the outcome to record (as its raw value; 0 for none).
    /// `nil` for a conflict that `resolution` (the policy's fixed one) cannot settle without
    /// looking at it: the caller then merges the row as a `RowState`.
    /// A row new to the device takes every field the server sends, each recorded as taken (null
    /// ones too), as ``merge(table:key:local:server:serverTimestamp:localTimestamp:policy:)``
    /// does for a row with no local state.
    static func onRecord(_ sides: Transaction.ServerFieldSides, resolution: Resolution?) -> (action: Transaction.ServerFieldAction, tag: UInt8)? {
        if sides.isNewRow { return (.takeServer, FieldDecision.Outcome.takeServer.rawValue) }
        return switch field(localChanged: sides.localChanged, serverChanged: sides.serverChanged, serverIsLocal: sides.serverIsLocal) {
        case .unchanged: (.keep, 0)
        case .takeServer: (.takeServer, FieldDecision.Outcome.takeServer.rawValue)
        case .keepLocal: (.keep, FieldDecision.Outcome.keepLocal.rawValue)
        case .settled: (.takeServer, FieldDecision.Outcome.settled.rawValue)
        case .conflict:
            switch resolution {
            // As in `fields`: the server's value clean; the local value rebased onto the
            // server's; both kept, in conflict.
            case .server?: (.takeServer, FieldDecision.Outcome.conflictServer.rawValue)
            case .local?: (.rebase, FieldDecision.Outcome.conflictLocal.rawValue)
            case .deferred?: (.conflict, FieldDecision.Outcome.conflictDeferred.rawValue)
            case .merged?, nil: nil
            }
        }
    }

    static func merge(
        table: String, key: RowKey, local: RowState?, server: ServerChange,
        serverTimestamp: Date?, localTimestamp: () -> Date?, policy: ConflictPolicy
    ) -> MergeOutcome {
        switch server {
        case .upsert(let values):
            guard let local else {
                var out = MergeOutcome(state: RowState(fields: values.filter { !$0.value.isNull }.mapValues(RowState.Field.clean)))
                for (f, v) in values.sorted(by: { $0.key < $1.key }) {
                    out.decisions.append(FieldDecision(field: f, base: .null, local: .null, server: v, outcome: .takeServer))
                }
                return out
            }
            if local.isDeleted {
                return deletedLocally(table, key, local, values, serverTimestamp, localTimestamp, policy)
            }
            return fields(table, key, local, values, serverTimestamp, localTimestamp, policy)
        case .delete:
            guard let local else { return MergeOutcome(state: nil) }
            if local.isInserted { return MergeOutcome(state: local) }
            if local.isDeleted { return MergeOutcome(state: nil) }
            let dirty = local.fields.filter { $0.value.original != $0.value.current }.keys.sorted()
            if dirty.isEmpty { return MergeOutcome(state: nil) }
            let conflict = Conflict(
                table: table, key: key, kind: .localUpdateServerDelete, fields: dirty,
                base: local.fields.mapValues(\.original), local: local.fields.mapValues(\.current), server: [:],
                localTimestamp: localTimestamp(), serverTimestamp: serverTimestamp
            )
            let resolution = resolve(conflict, policy)
            var out = MergeOutcome(state: nil, conflict: conflict, resolution: resolution)
            // Re-created rows go up as inserts of their current values.
            var recreated = RowState(fields: local.fields.mapValues { .clean($0.current) }.filter { !$0.value.current.isNull }, isInserted: true)
            switch resolution {
            case .server: out.state = nil
            case .local: out.state = recreated
            case .merged(let m):
                for (f, v) in m { recreated.fields[f] = .clean(v) }
                out.state = recreated
            case .deferred:
                // The fields the device changed are in conflict with a server that has no row:
                // their server value is null.
                for f in dirty { recreated.fields[f] = RowState.Field(original: .null, current: local[f], isInConflict: true) }
                recreated.isConflicted = true
                out.state = recreated
            }
            let outcome = outcomeFor(resolution)
            out.decisions = dirty.map { FieldDecision(field: $0, base: local.fields[$0]?.original ?? .null, local: local[$0], server: .null, outcome: outcome) }
            return out
        }
    }

    private static func outcomeFor(_ r: Resolution) -> FieldDecision.Outcome {
        switch r {
        case .server: .conflictServer
        case .local: .conflictLocal
        case .merged: .conflictMerged
        case .deferred: .conflictDeferred
        }
    }

    /// A live row (server-known or inserted locally) and server values.
    private static func fields(
        _ table: String, _ key: RowKey, _ local: RowState, _ values: [String: Value],
        _ serverTimestamp: Date?, _ localTimestamp: () -> Date?, _ policy: ConflictPolicy
    ) -> MergeOutcome {
        var state = local
        var out = MergeOutcome(state: nil)
        var conflicting: [String] = []
        let insertInsert = local.isInserted
        // For a row inserted on both sides there is no base: the fields the server lists are
        // compared; a local field it does not list stays pending against a null original (the
        // server has no value for it that this device knows of).
        let names = values.keys.sorted()
        state.isInserted = false
        if insertInsert {
            // A row the server deleted in a deferred conflict is an insert here; the server now
            // has it again, so that conflict is over: this merge decides the row afresh.
            state.clearConflict()
            for (f, field) in local.fields where values[f] == nil {
                state.fields[f] = RowState.Field(original: .null, current: field.current)
            }
        }
        for f in names {
            let s = values[f] ?? .null
            let field = local.fields[f] ?? .clean(.null)
            let l = field.current
            if insertInsert {
                if l == s {
                    state.fields[f] = .clean(s)
                    out.decisions.append(FieldDecision(field: f, base: nil, local: l, server: s, outcome: .settled))
                } else {
                    conflicting.append(f)
                }
                continue
            }
            let b = field.original
            switch Self.field(localChanged: l != b, serverChanged: s != b, serverIsLocal: s == l) {
            case .unchanged:
                break
            case .takeServer:
                state.fields[f] = .clean(s)
                out.decisions.append(FieldDecision(field: f, base: b, local: l, server: s, outcome: .takeServer))
            case .keepLocal:
                // The server did not change the field: it stays as it is, in conflict if it was.
                out.decisions.append(FieldDecision(field: f, base: b, local: l, server: s, outcome: .keepLocal))
            case .settled:
                state.fields[f] = .clean(s)
                out.decisions.append(FieldDecision(field: f, base: b, local: l, server: s, outcome: .settled))
            case .conflict:
                conflicting.append(f)
            }
        }
        if !conflicting.isEmpty {
            var server = local.fields.mapValues(\.original)
            for (f, v) in values { server[f] = v }
            let conflict = Conflict(
                table: table, key: key, kind: insertInsert ? .insertInsert : .fields, fields: conflicting,
                base: insertInsert ? [:] : local.fields.mapValues(\.original), local: local.fields.mapValues(\.current),
                server: insertInsert ? values : server, localTimestamp: localTimestamp(), serverTimestamp: serverTimestamp
            )
            let resolution = resolve(conflict, policy)
            out.conflict = conflict
            out.resolution = resolution
            let outcome = outcomeFor(resolution)
            for f in conflicting {
                let s = values[f] ?? .null
                let l = local[f]
                switch resolution {
                case .server: state.fields[f] = .clean(s)
                case .local: state.fields[f] = RowState.Field(original: s, current: l)
                case .deferred: state.fields[f] = RowState.Field(original: s, current: l, isInConflict: true)
                case .merged(let m): state.fields[f] = RowState.Field(original: s, current: m[f] ?? s)
                }
                out.decisions.append(FieldDecision(field: f, base: insertInsert ? nil : (local.fields[f]?.original ?? .null), local: l, server: s, outcome: outcome))
            }
        }
        state.fields = state.fields.filter { $0.value.isInConflict || !($0.value.original.isNull && $0.value.current.isNull) }
        // The row is conflicted exactly while a field is in conflict (fields this merge decided
        // lost their mark above; fields it did not touch keep theirs).
        state.isConflicted = state.fields.values.contains(where: \.isInConflict)
        // A conflict with nothing left to resolve would hold the row back for nothing.
        if state.isConflicted && state.fields.values.allSatisfy({ $0.original == $0.current }) {
            state.clearConflict()
        }
        out.state = state
        return out
    }

    /// A row deleted locally (its fields hold the server's last values) and server values.
    private static func deletedLocally(
        _ table: String, _ key: RowKey, _ local: RowState, _ values: [String: Value],
        _ serverTimestamp: Date?, _ localTimestamp: () -> Date?, _ policy: ConflictPolicy
    ) -> MergeOutcome {
        let changed = values.filter { local.fields[$0.key]?.original ?? .null != $0.value }.keys.sorted()
        guard !changed.isEmpty else { return MergeOutcome(state: local) }
        var server = local.fields.mapValues(\.original)
        for (f, v) in values { server[f] = v }
        server = server.filter { !$0.value.isNull }
        let conflict = Conflict(
            table: table, key: key, kind: .localDeleteServerUpdate, fields: changed,
            base: local.fields.mapValues(\.original), local: [:], server: server,
            localTimestamp: localTimestamp(), serverTimestamp: serverTimestamp
        )
        let resolution = resolve(conflict, policy)
        var out = MergeOutcome(state: nil, conflict: conflict, resolution: resolution)
        var state = RowState(fields: server.mapValues(RowState.Field.clean), isConflicted: local.isConflicted)
        // Fields of an earlier conflict on this deleted row, which stay in conflict unless this
        // merge settles the row.
        let earlier = Set(local.conflictingFields)
        func mark(_ names: some Sequence<String>) {
            for f in names { state.fields[f] = RowState.Field(original: server[f] ?? .null, current: server[f] ?? .null, isInConflict: true) }
        }
        switch resolution {
        case .server:
            state.isConflicted = false
        case .local:
            state.isDeleted = true
            if state.isConflicted { mark(earlier) }
        case .merged(let m):
            for (f, v) in m { state.fields[f] = RowState.Field(original: server[f] ?? .null, current: v) }
            state.isConflicted = false
        case .deferred:
            state.isDeleted = true
            state.isConflicted = true
            mark(earlier.union(changed))
        }
        out.state = state
        let outcome = outcomeFor(resolution)
        out.decisions = changed.map { FieldDecision(field: $0, base: local.fields[$0]?.original ?? .null, local: .null, server: values[$0]!, outcome: outcome) }
        return out
    }

    /// Whether a row the server set aside (listed by `rejectedRows()`) stays listed after a
    /// merge or a reset of its table: while it holds local changes (pending or conflicted). The
    /// entry lists edits the server refused; once none are left — the server deleted the row, made
    /// the same change, won a conflict over it, or a reset discarded it — it stands for nothing,
    /// and kept, it would hold back as set aside any later edit of a row under that key. A local
    /// change that remains (a local insert the server never had, an edit it did not touch, a row
    /// uploaded again as an insert after a server delete) keeps the entry.
    static func staysSetAside(_ row: Row?) -> Bool {
        row?.isPending ?? false
    }

    /// A client reset: the server's row (`nil`: the server has none) against the local state.
    /// Keeping local changes re-applies every locally changed field on top of the server's
    /// values; otherwise the server's row replaces the local one.
    ///
    /// A row in an unresolved (deferred) conflict stays in conflict, with the same fields marked:
    /// the reset brings the server's current values, but choosing between them and the local
    /// ones is still the app's, and until it does the batcher holds the row back.
    static func reset(local: RowState?, server: [String: Value]?, keepLocalChanges: Bool) -> RowState? {
        guard var state = resetValues(local: local, server: server, keepLocalChanges: keepLocalChanges) else { return nil }
        if keepLocalChanges, let local, local.isConflicted, state.hasLocalValueChanges {
            state.isConflicted = true
            for f in local.conflictingFields { state.fields[f, default: .clean(.null)].isInConflict = true }
        }
        return state
    }

    private static func resetValues(local: RowState?, server: [String: Value]?, keepLocalChanges: Bool) -> RowState? {
        let fresh = server.map { RowState(fields: $0.filter { !$0.value.isNull }.mapValues(RowState.Field.clean)) }
        guard keepLocalChanges, let local, local.hasLocalValueChanges else {
            return fresh
        }
        if local.isDeleted { return fresh.map { var s = $0; s.isDeleted = true; return s } }
        guard var state = fresh else {
            // The server lost the row (or never had it): upload it as an insert.
            return RowState(fields: local.fields.mapValues { .clean($0.current) }.filter { !$0.value.current.isNull }, isInserted: true)
        }
        for (f, field) in local.fields where local.isInserted || field.original != field.current {
            state.fields[f] = RowState.Field(original: state.fields[f]?.original ?? .null, current: field.current)
        }
        if local.isInserted {
            for (f, field) in state.fields where local.fields[f] == nil {
                state.fields[f] = RowState.Field(original: field.original, current: .null)
            }
        }
        state.fields = state.fields.filter { !($0.value.original.isNull && $0.value.current.isNull) }
        return state
    }
}

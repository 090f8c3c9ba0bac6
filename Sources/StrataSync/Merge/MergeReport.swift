import Strata

/// What a merge did.
public struct MergeReport: Sendable, Hashable, CustomStringConvertible {
    /// One conflict and how it was settled.
    public struct ConflictRecord: Sendable, Hashable {
        /// The row's table.
        public let table: String
        /// The row's primary key.
        public let key: RowKey
        /// What collided.
        public let kind: Conflict.Kind
        /// The fields in conflict.
        public let fields: [String]
        /// How it was settled.
        public let resolution: Resolution.Kind
        /// The policy that decided.
        public let policy: ConflictPolicy.Kind
    }

    /// Rows whose state changed.
    public var rowsApplied = 0
    /// Fields that took the server's value (changed only on the server).
    public var fieldsFromServer = 0
    /// Fields changed only locally that stay pending.
    public var fieldsKeptLocal = 0
    /// Fields changed on both sides to the same value.
    public var fieldsSettled = 0
    /// Every conflict found, with its resolution.
    public var conflicts: [ConflictRecord] = []
    /// Server rows this store cannot hold, set aside so that the rest merged
    /// (``SyncClient/refusedServerRows()`` lists them until they are settled).
    public var refusedRows: [RefusedServerRow] = []

    /// Conflicts left for the app to resolve.
    public var deferred: Int { conflicts.filter { $0.resolution == .deferred }.count }
    /// Conflicts settled, by policy.
    public var resolvedByPolicy: [ConflictPolicy.Kind: Int] {
        conflicts.filter { $0.resolution != .deferred }.reduce(into: [:]) { $0[$1.policy, default: 0] += 1 }
    }

    public var description: String {
        "\(rowsApplied) rows applied; fields: \(fieldsFromServer) from the server, \(fieldsKeptLocal) kept local, \(fieldsSettled) settled; \(conflicts.count) conflicts (\(deferred) deferred)"
            + (refusedRows.isEmpty ? "" : "; \(refusedRows.count) server rows refused")
    }

    /// Adds what a merge of a later page did.
    mutating func absorb(_ page: MergeReport) {
        rowsApplied += page.rowsApplied
        fieldsFromServer += page.fieldsFromServer
        fieldsKeptLocal += page.fieldsKeptLocal
        fieldsSettled += page.fieldsSettled
        conflicts += page.conflicts
        refusedRows += page.refusedRows
    }

    mutating func record(_ outcome: MergeOutcome, table: String, key: RowKey, policy: ConflictPolicy) {
        record(outcome.decisions.map(\.outcome), conflict: outcome.conflict.flatMap { c in
            outcome.resolution.map { ConflictRecord(table: table, key: key, kind: c.kind, fields: c.fields, resolution: $0.kind, policy: policy.kind) }
        })
    }

    mutating func record(_ outcomes: some Sequence<FieldDecision.Outcome>, conflict: ConflictRecord?) {
        for outcome in outcomes { count(outcome) }
        if let conflict { conflicts.append(conflict) }
    }

    /// Counts one field decision.
    mutating func count(_ outcome: FieldDecision.Outcome) {
        switch outcome {
        case .takeServer: fieldsFromServer += 1
        case .keepLocal: fieldsKeptLocal += 1
        case .settled: fieldsSettled += 1
        default: break
        }
    }
}

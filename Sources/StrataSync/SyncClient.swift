import Foundation
import Strata

/// The sync side of a store: merges server deltas into it, lists and resolves conflicts, and
/// resets it from a server snapshot.
///
/// ```swift
/// let sync = SyncClient(store: store, policy: .serverWins, tablePolicies: ["notes": .deferred])
/// let report = try sync.merge(delta)            // one transaction, anchor included
/// for c in try sync.conflicts() { try sync.resolve(c.table, key: c.key, with: .local) }
/// ```
public final class SyncClient: Sendable {
    /// The store this client syncs.
    public let store: Store
    /// The policy for tables without one of their own.
    public let policy: ConflictPolicy
    /// Policies per table name.
    public let tablePolicies: [String: ConflictPolicy]
    /// References between tables, which order uploads and follow server-assigned keys: the
    /// ones passed to ``init(store:policy:tablePolicies:associations:)``, or `nil` when the
    /// client uses those stored with the store (`Snapshot.associations()`), read in each
    /// transaction that needs them.
    public let associations: [Association]?

    /// The store property holding the anchor of the last merged delta.
    public static let anchorProperty = "strata.sync.anchor"

    /// Whether live server rows are merged on their stored records (see `mergeOnRecord`). Off
    /// only in tests, which check that it decides as the field-by-field merge does.
    let mergesOnRecords: Bool
    /// The overlay a pull of several pages leaves after a page before it checkpoints, in bytes
    /// (the store's own ``StoreOptions/overlayBudget`` bounds it otherwise). A pull of many
    /// pages is a bulk load whose rows wait in the overlay for nothing: with only the store's
    /// default budget of 64 MiB, a first sync of 1,000,000 rows held 164 MiB of the phone's own
    /// memory, and 46 MiB with 8 MiB here, at the same speed (`docs/server.md`, "First sync").
    let pullOverlayBound: Int

    /// A sync client for `store`: `policy` settles conflicts in tables without a policy of their
    /// own in `tablePolicies`; `associations` order uploads and follow server-assigned keys —
    /// when `nil`, those stored with the store (``TablesFile/createTables(in:)``,
    /// `Transaction.setAssociations(_:)`, `strata create`), none if none were.
    public init(store: Store, policy: ConflictPolicy = .serverWins, tablePolicies: [String: ConflictPolicy] = [:], associations: [Association]? = nil) {
        self.store = store
        self.policy = policy
        self.tablePolicies = tablePolicies
        self.associations = associations
        self.mergesOnRecords = true
        self.pullOverlayBound = 8 << 20
    }

    init(store: Store, policy: ConflictPolicy, mergesOnRecords: Bool, pullOverlayBound: Int = 8 << 20) {
        self.store = store
        self.policy = policy
        self.tablePolicies = [:]
        self.associations = nil
        self.mergesOnRecords = mergesOnRecords
        self.pullOverlayBound = pullOverlayBound
    }

    /// The associations this client follows in `snap`: the ones it was given, else the stored ones.
    func associations(_ snap: Snapshot) throws(StrataError) -> [Association] {
        if let associations { return associations }
        return try snap.associations()
    }

    /// The anchor of the last merged delta (`nil` before the first), to pull the next one from.
    public func anchor() throws(StrataError) -> String? {
        return try strataErrors {
            try store.read { try $0.property(Self.anchorProperty)?.stringValue }
        }
    }

    // MARK: Merge

    /// Merges a server delta into the store in one write transaction, together with its anchor:
    /// a crash or an error leaves the store and the anchor exactly as before.
    ///
    /// Each row is merged field by field against the pending local edits (see `MergeRules.swift`
    /// for every rule); conflicts are settled by `policy` if given, else by the table's policy,
    /// else by the client's. Every changed row gets a server-origin log entry carrying a
    /// ``MergeAudit`` of the decisions. A row set aside (``rejectedRows()``) that the merge
    /// leaves without local changes is taken off that list. With a batch in flight, a server
    /// delete that changes nothing here is noted for the batch's acknowledgement
    /// (`AckRules.remembersDelete`), and so is what the device holds where a server row comes
    /// under the key of an insert the batch carries (`AckRules.notesEcho`).
    ///
    /// - Throws: `StrataError`: `tableNotFound`, `fieldNotFound`, `typeMismatch`, `missingField`
    ///   (a row without its key, or a new row without a required field), `invalidKey`,
    ///   `invalidOperation` (a key listed twice, or a delta that does not continue from the
    ///   stored anchor).
    /// - Complexity: O(r log n) for r rows in the delta; a snapshot also reads every local row of
    ///   the tables it lists.
    ///
    /// With `dryRun`, the merge runs and reports but nothing is stored.
    @discardableResult
    public func merge(_ delta: ServerDelta, policy: ConflictPolicy? = nil, dryRun: Bool = false) throws(StrataError) -> MergeReport {
        return try strataErrors {
            struct DryRun: Error { let report: MergeReport }
            do {
                return try merge(delta, policy: policy, abortingWith: dryRun ? { DryRun(report: $0) } : nil)
            } catch let dry as DryRun {
                return dry.report
            }
        }
    }

    /// What a merged delta does to the anchor.
    enum MergeEnd {
        /// The delta's anchor is stored, and any pull cursor forgotten: a whole delta, an
        /// incremental page, or the last page of a snapshot.
        case anchor
        /// A page of a snapshot merged page by page: the anchor stays, and the cursor of the next
        /// page is stored with the page, so that a sync that stops resumes there.
        case resumeAt(PullCursor)
    }

    func merge(_ delta: ServerDelta, policy: ConflictPolicy?, end: MergeEnd = .anchor, abortingWith abort: ((MergeReport) -> any Error)?) throws -> MergeReport {
        // A server row this store cannot hold aborts the transaction (`ServerRowRefusal`), and
        // the merge runs again without it: checking every row up front would cost every merge,
        // where this costs only the rare delta that carries such a row (a run per such row).
        var refused: [ServerRowPosition: RefusedServerRow] = [:]
        while true {
            do {
                return try merge(delta, policy: policy, refusing: refused, end: end, abortingWith: abort)
            } catch let refusal as ServerRowRefusal {
                guard refused.updateValue(refusal.row, forKey: refusal.position) == nil else {
                    throw StrataError(.invalidOperation, "the merge refused \(refusal.row.table) \(refusal.row.key) twice: \(refusal.row.reason)")
                }
            }
        }
    }

    private func merge(
        _ delta: ServerDelta, policy: ConflictPolicy?, refusing refused: [ServerRowPosition: RefusedServerRow], end: MergeEnd,
        abortingWith abort: ((MergeReport) -> any Error)?
    ) throws -> MergeReport {
        try store.write { tx in
            let current = try tx.property(Self.anchorProperty)?.stringValue
            if let since = delta.since, since != current {
                throw StrataError(.invalidOperation, "the delta continues from anchor '\(since)' but the store is at \(current.map { "'\($0)'" } ?? "no anchor"); pull again from the stored anchor")
            }
            var report = MergeReport()
            // With a batch in flight, what its acknowledgement must know of this merge: the
            // deletes it must meet (`AckRules.remembersDelete`), what the device held where a
            // server row comes back under an insert's key (`AckRules.notesEcho`), the rows of
            // the batch the delta upserts and whether it was a snapshot (`AckRules.awaitsSnapshot`).
            let inFlight = try Self.inFlightRecord(tx)
            let changes = inFlight?.batch.changes ?? []
            let inserts = changes.filter { $0.kind == .insert }
            let notes = InFlightNotes(
                inserting: Set(inserts.map(\.table)),
                carried: Set(inserts.map { Self.rowID($0.table, $0.key) }),
                sent: Set(changes.map { Self.rowID($0.table, $0.key) })
            )
            for (index, table) in delta.tables.enumerated() {
                let p = policy ?? tablePolicies[table.table] ?? self.policy
                try mergeTable(
                    table, at: index, mode: delta.mode, anchor: delta.anchor, policy: p, refusing: refused, notes: notes, tx: tx,
                    report: &report)
            }
            report.refusedRows = refused.sorted { ($0.key.table, $0.key.upsert) < ($1.key.table, $1.key.upsert) }.map(\.value)
            try Self.updateRefusedServerRows(after: delta, refused: report.refusedRows, tx)
            if var record = inFlight {
                record.note(notes.deletes, in: \.serverDeletes)
                record.note(notes.echoes, in: \.echoes)
                record.note(notes.listed, in: \.listed)
                if delta.mode == .snapshot, changes.contains(where: { $0.kind != .delete }) { record.snapshotMerged = true }
                if record != inFlight { try Self.saveInFlight(record, tx) }
            }
            try Self.dropSettledRejected(in: Set(delta.tables.map(\.table)), tx)
            switch end {
            case .anchor:
                try tx.setStrataProperty(Self.anchorProperty, .string(delta.anchor))
                try Self.savePullCursor(nil, tx)
            case .resumeAt(let cursor):
                try Self.savePullCursor(cursor, tx)
            }
            // A dry run throws out of the transaction, so nothing is committed.
            if let abort { throw abort(report) }
            return report
        }
    }

    /// What a merge gathers, table by table, for the acknowledgement of the batch in flight.
    private final class InFlightNotes {
        /// The tables the batch inserts into.
        let inserting: Set<String>
        /// The rows the batch inserts.
        let carried: Set<RowID>
        /// Every row the batch sends.
        let sent: Set<RowID>
        /// Server deletes the acknowledgement must meet (`AckRules.remembersDelete`).
        var deletes: [RowChange] = []
        /// What the device held under an insert's key (`AckRules.notesEcho`).
        var echoes: [RowChange] = []
        /// Rows of the batch that the delta upserts (`AckRules.awaitsSnapshot`).
        var listed: [RowChange] = []

        init(inserting: Set<String>, carried: Set<RowID>, sent: Set<RowID>) {
            self.inserting = inserting
            self.carried = carried
            self.sent = sent
        }

        /// Notes a row the delta upserts, if the batch sends it. (A server delete of a row the
        /// batch inserts is noted by `AckRules.remembersDelete`'s rule instead.)
        func list(_ table: String, _ key: RowKey) {
            if !sent.isEmpty, sent.contains(SyncClient.rowID(table, key)) {
                listed.append(RowChange(table: table, key: key, kind: .update))
            }
        }
    }

    private func mergeTable(
        _ delta: TableDelta, at tableIndex: Int, mode: ServerDelta.Mode, anchor: String, policy: ConflictPolicy,
        refusing refused: [ServerRowPosition: RefusedServerRow], notes: InFlightNotes, tx: Transaction, report: inout MergeReport
    ) throws {
        let snap = try tx.snapshot
        let schema = try snap.schema(delta.table)
        // Names compare by their bytes, as the store's do: a delta's field that is a key field's
        // name in another Unicode form is not that key field.
        let keyFields = ExactNames(schema.primaryKey)
        var seen = ListedKeys(minimumCapacity: delta.upserts.count + delta.deletes.count)
        var order: [Int] = []  // `mergeOnRecord`'s, reused
        let encodedAnchor = MergeAudit.encodedAnchor(anchor)  // once per delta, not per audit
        // Which key fields take an int as a double (`stored`): looked up once, not per row.
        let keyIsDouble = schema.primaryKey.map { schema.field($0)?.type == .double }
        func context(_ key: RowKey) -> String { "the delta's row \(key) of table '\(delta.table)'" }
        var oneFieldKey = RowKey(.null)  // see below

        for (index, row) in delta.upserts.enumerated() {
            let position = ServerRowPosition(table: tableIndex, upsert: index)
            if refused[position] != nil {
                // Set aside: what the store holds under its key stays as it is (a snapshot does
                // not take it for deleted).
                _ = seen.insert(RowKey(schema.primaryKey.compactMap { k in row.fields[exactly: k].map { stored($0, k, schema) } }))
                continue
            }
            do {
                func keyValue(_ i: Int) throws(StrataError) -> Value {
                    let k = schema.primaryKey[i]
                    guard let v = row.fields[exactly: k], !v.isNull else {
                        throw StrataError(.missingField, "row \(index) of table '\(delta.table)' in the delta lacks its key field '\(k)'")
                    }
                    // As `stored` converts it, with the field's type found once per table.
                    if case .int(let n) = v, keyIsDouble[i] { return .double(Double(n)) }
                    return v
                }
                let key: RowKey
                if schema.primaryKey.count == 1 {
                    // A key of one field, the most common: its array is made once per delta and
                    // written in place row after row (an allocation and a free less per row,
                    // about 400 instructions). A row that keeps its key (a conflict record) only
                    // makes the next row copy the array.
                    oneFieldKey.values[0] = try keyValue(0)
                    key = oneFieldKey
                } else {
                    key = RowKey(try schema.primaryKey.indices.map { (i) throws(StrataError) in try keyValue(i) })
                }
                guard seen.insert(key) else {
                    throw StrataError(.invalidOperation, "\(context(key)) is listed twice")
                }
                notes.list(delta.table, key)
                // The merge on the stored record writes nothing for a row that names a field the
                // table lacks (and resolves every name before it looks at a value), so the check
                // below still comes first for such a row.
                // A row new to the device goes this way too, unless a batch in flight inserts
                // rows: the field-by-field merge notes what comes under their keys.
                if mergesOnRecords, try mergeOnRecord(
                    row, table: delta.table, key: key, anchor: encodedAnchor, policy: policy, newRows: notes.carried.isEmpty, tx: tx, order: &order, report: &report
                ) { continue }
                if schema.mode == .fixed {
                    for name in row.fields.keys where !keyFields.contains(name) && schema.field(name) == nil {
                        if let twin = schema.twin(of: name) {
                            throw StrataError(.fieldNotFound, "\(context(key)) sets field '\(name)': " + RowRule.twinMessage(table: delta.table, name, twin))
                        }
                        throw StrataError(.fieldNotFound, "\(context(key)) sets field '\(name)', which the table does not have")
                    }
                } else {
                    // A property bag holds one of two names `==` calls equal. The merge below
                    // works on `[String: Value]`, where the server's name would land on the
                    // table's other form: refused first (the merge on the record refuses it too).
                    for name in row.fields.keys where !keyFields.contains(name) {
                        if let twin = try tx.fieldTwin(delta.table, of: name) {
                            throw StrataError(.fieldNotFound, "\(context(key)) sets field '\(name)': " + RowRule.twinMessage(table: delta.table, name, twin))
                        }
                    }
                }
                var values: [String: Value] = [:]
                for (name, value) in row.fields where !keyFields.contains(name) { values[name] = stored(value, name, schema) }
                let existing = try tx.row(delta.table, key: key, includingDeleted: true)
                if !notes.carried.isEmpty, AckRules.notesEcho(local: existing, carried: notes.carried.contains(Self.rowID(delta.table, key))) {
                    let held = existing.map { row in row.values.filter { !keyFields.contains($0.key) } }
                    notes.echoes.append(RowChange(table: delta.table, key: key, kind: held == nil ? .delete : .insert, values: held ?? [:]))
                }
                if schema.mode == .fixed && (existing == nil || existing?.status == .inserted) {
                    // A row new to this device: fields the server leaves out take their defaults.
                    // A local insert not yet acknowledged holds no server copy either, so the server's
                    // row is new to it too. Without this, omitted fields got `null` originals, and a
                    // required one made a later merge of the row (a local delete against a server
                    // update) refuse the whole delta, on every pull.
                    for f in schema.fields where !keyFields.contains(f.name) && values[f.name] == nil {
                        if let d = f.defaultValue {
                            values[f.name] = d
                        } else if !f.isNullable {
                            throw StrataError(.missingField, "\(context(key)) is new to this device but lacks the required field '\(f.name)'")
                        }
                    }
                }
                try apply(.upsert(values), table: delta.table, key: key, local: existing, server: row, anchor: anchor, policy: policy, tx: tx, report: &report)
            } catch {
                // A row that breaks this store's rules (`RowRule`): the merge runs again without it.
                guard let refusal = ServerRowRefusal(error, position: position, table: delta.table, fields: row.fields, schema: schema, anchor: anchor) else {
                    throw error
                }
                throw refusal
            }
        }
        for key in delta.deletes {
            // A key this store cannot hold names no row here: nothing to delete.
            guard let existing = try Self.rowUnlessRefused(delta.table, key, tx) else { continue }
            let k = existing?.key ?? key
            guard seen.insert(k) else {
                throw StrataError(.invalidOperation, "\(context(k)) is listed twice")
            }
            if try AckRules.remembersDelete(local: existing, table: delta.table, inserting: notes.inserting, history: { try tx.snapshot.history(delta.table, key: k) }) {
                notes.deletes.append(RowChange(table: delta.table, key: k, kind: .delete))
            }
            try apply(.delete, table: delta.table, key: k, local: existing, server: nil, anchor: anchor, policy: policy, tx: tx, report: &report)
        }
        if mode == .snapshot {
            // Rows the snapshot leaves out were deleted on the server. Read through a snapshot
            // taken now, not `snap`: the upserts above may have added property-bag fields, and
            // `snap`'s catalog, older, cannot read the rows that hold them.
            let missing = try tx.snapshot.rows(delta.table, includingDeleted: true).filter { !seen.contains($0.key) }
            for row in missing {
                try apply(.delete, table: delta.table, key: row.key, local: row, server: nil, anchor: anchor, policy: policy, tx: tx, report: &report)
            }
        }
    }

    /// A value as the store holds it: the store converts an int given for a double field, so
    /// the delta's `5` and a stored `5.0` are the same value (and `5` and `5.0` the same key).
    private func stored(_ value: Value, _ field: String, _ schema: TableSchema) -> Value {
        if case .int(let i) = value, schema.field(field)?.type == .double { return .double(Double(i)) }
        return value
    }

    /// The merge of a server row into a live server row — most rows of most deltas — done on
    /// the stored record by `Transaction.mergeServerValues`, with one read and one write and
    /// no `Row`, `RowState` or dictionaries. The decisions are `MergeRules.onRecord`'s, the same
    /// rules as the field-by-field merge. Returns `false` (nothing written) when the row is
    /// absent (unless `newRows`, when the row names every declared field), a local insert or
    /// delete, conflicted, or meets a conflict its policy decides by
    /// looking at it: the caller merges it field by field.
    private func mergeOnRecord(
        _ row: ServerRow, table: String, key: RowKey, anchor: [UInt8], policy: ConflictPolicy, newRows: Bool, tx: Transaction,
        order: inout [Int], report: inout MergeReport
    ) throws -> Bool {
        let resolution = MergeRules.fixedResolution(policy)
        // The closures below only sort `order` and write the audit: the report is written
        // after the merge returns. A variable that a closure or local function captures and
        // changes cost a dynamic exclusivity check at each access (about 75 instructions,
        // three times per row).
        let result = try tx.mergeServerValues(table, key: key, row.fields, kind: .serverChange, newRows: newRows) {
            MergeRules.onRecord($0, resolution: resolution)
        } annotation: { values, b in
            let fields = values.decisions
            Self.sortDecisions(fields, into: &order)
            let conflicted = resolution != nil && order.contains { Self.outcome(fields[$0]).isConflict }
            // Written from the record's bytes: the values are never decoded.
            MergeAudit.appendStart(
                anchor: anchor, serverVersion: row.version, conflict: conflicted ? .fields : nil, resolution: conflicted ? resolution?.kind : nil,
                policy: conflicted ? policy.kind : nil, decisions: order.count, to: &b
            )
            for i in order {
                let d = fields[i]
                MergeAudit.appendField(d.field, outcome: d.tag, to: &b)
                b.append(1)  // a base: only a local insert has none, and it never comes here
                b.append(contentsOf: values.base(i))
                b.append(contentsOf: values.local(i))
                b.append(contentsOf: values.server(i))
            }
        }
        guard case .merged(let fields, let logged) = result else { return false }
        if logged {
            report.rowsApplied += 1
        } else {
            Self.sortDecisions(fields, into: &order)
        }
        var conflict: MergeReport.ConflictRecord? = nil
        if let resolution, order.contains(where: { Self.outcome(fields[$0]).isConflict }) {
            let conflicting = order.filter { Self.outcome(fields[$0]).isConflict }.map { fields[$0].field }
            conflict = MergeReport.ConflictRecord(table: table, key: key, kind: .fields, fields: conflicting, resolution: resolution.kind, policy: policy.kind)
        }
        // Counted one by one: a lazy map over `order` allocated its closure's context per row.
        for i in order { report.count(Self.outcome(fields[i])) }
        if let conflict { report.conflicts.append(conflict) }
        return true
    }

    /// The outcome a decision of `mergeOnRecord` was tagged with.
    private static func outcome(_ d: Transaction.ServerFieldDecision) -> FieldDecision.Outcome {
        FieldDecision.Outcome(rawValue: d.tag)!
    }

    /// Puts into `order` the indices of `fields` in the audit's order, as the field-by-field
    /// merge records its decisions: the fields decided by the rules by name, then the
    /// conflicting ones by name. `order` is the caller's, kept from row to row: one allocation
    /// per delta, not per row.
    private static func sortDecisions(_ fields: [Transaction.ServerFieldDecision], into order: inout [Int]) {
        func before(_ a: Int, _ b: Int) -> Bool {
            outcome(fields[a]).isConflict != outcome(fields[b]).isConflict ? !outcome(fields[a]).isConflict : fields[a].field < fields[b].field
        }
        // An insertion sort: a row's decisions are a handful, most often one.
        // Written in place when the last row had as many (most rows): emptying the array costs
        // about 70 instructions.
        if order.count == fields.count {
            for i in fields.indices { order[i] = i }
        } else {
            order.removeAll(keepingCapacity: true)
            for i in fields.indices { order.append(i) }  // one or two: cheaper than the generic append
        }
        for i in order.indices.dropFirst() {
            var j = i
            while j > 0 && before(order[j], order[j - 1]) {
                order.swapAt(j, j - 1)
                j -= 1
            }
        }
    }

    private func apply(
        _ change: ServerChange, table: String, key: RowKey, local: Row?, server: ServerRow?,
        anchor: String, policy: ConflictPolicy, tx: Transaction, report: inout MergeReport
    ) throws {
        let localState = try local.map { try Self.state(of: $0, tx.snapshot) }
        let outcome = MergeRules.merge(
            table: table, key: key, local: localState, server: change,
            serverTimestamp: server?.timestamp,
            // Read from the row's history only for the policies that look at it.
            localTimestamp: { MergeRules.fixedResolution(policy) == nil ? Self.lastLocalEdit(table, key, tx) : nil },
            policy: policy
        )
        report.record(outcome, table: table, key: key, policy: policy)
        guard outcome.state != localState || outcome.conflict != nil else { return }
        let audit = MergeAudit(
            anchor: anchor, serverVersion: server?.version, conflict: outcome.conflict?.kind,
            resolution: outcome.resolution?.kind, policy: outcome.conflict == nil ? nil : policy.kind,
            decisions: outcome.decisions
        )
        let kind: LogEntry.Kind = if case .delete = change { .serverDelete } else { .serverChange }
        try tx.setRowState(table, key: key, outcome.state, kind: kind, origin: .server, annotation: audit.encoded)
        if outcome.state != localState { report.rowsApplied += 1 }
    }

    /// When the row was last edited on this device, for last-writer-wins.
    static func lastLocalEdit(_ table: String, _ key: RowKey, _ tx: Transaction) -> Date? {
        (try? tx.snapshot.history(table, key: key))?.last { $0.origin == .local }?.timestamp
    }

    // MARK: Conflicts

    /// The rows holding a conflict the app has not resolved (left by the ``ConflictPolicy/deferred``
    /// policy or a custom resolver), in table and key order.
    public func conflicts() throws(StrataError) -> [UnresolvedConflict] {
        return try strataErrors {
            try store.read { snap in
                try snap.pendingRows().filter(\.isConflicted).map { UnresolvedConflict($0, try Self.state(of: $0, snap)) }
            }
        }
    }

    /// How the app settles a conflict. Each choice applies to the row's conflicting fields
    /// only (``UnresolvedConflict/fields``); local edits of other fields stay pending.
    public enum Choice: Sendable, Hashable {
        /// Take the server's values of the conflicting fields (for a row the server deleted:
        /// remove it; for a row deleted locally that the server changed: restore it).
        case server
        /// Keep the local values; they stay pending and are uploaded.
        case local
        /// Set these current values for conflicting fields; a conflicting field not listed takes
        /// the server's value (keeps its local value, for a row the server deleted). The row stays
        /// pending against the server's values. Naming a field that is not in conflict is an error.
        case values([String: Value])
    }

    /// Resolves the conflict on a row: the choice applies to the fields in conflict, exactly as
    /// the policy making the same choice during the merge would have (``ConflictPolicy/serverWins``
    /// for `.server`, ``ConflictPolicy/clientWins`` for `.local`, a custom resolver returning
    /// ``Resolution/merged(_:)`` for `.values`). Other fields keep their local edits.
    ///
    /// - Throws: `StrataError` `rowNotFound`; `invalidOperation` when the row holds no conflict,
    ///   or `.values` names a field that is not in conflict; `fieldNotFound`, `typeMismatch`,
    ///   `nullNotAllowed` for a value that does not fit. On a throw nothing is written.
    /// - Complexity: O(f log f) for the row's f fields.
    public func resolve(_ table: String, key: RowKey, with choice: Choice) throws(StrataError) {
        try strataErrors {
            try store.write { tx in
                guard let row = try tx.row(table, key: key, includingDeleted: true) else {
                    throw StrataError(.rowNotFound, "table '\(table)' has no row with key \(key)")
                }
                guard row.isConflicted else {
                    throw StrataError(.invalidOperation, "row \(key) of table '\(table)' holds no conflict")
                }
                let state = try Self.resolved(try Self.state(of: row, tx.snapshot), table: table, key: row.key, with: choice)
                try tx.setRowState(table, key: row.key, state, kind: .resolve, origin: .local)
            }
        }
    }

    /// A stored row's state for the merge rules. A row a format-2 store left conflicted does
    /// not record its conflicting fields; the merge that deferred the conflict logged them in
    /// its audit record (decisions `conflictDeferred`), which compaction keeps (it never folds a
    /// pending row's operations), so they are taken from there, and recorded in the row by the
    /// next operation that writes it.
    static func state(of row: Row, _ snap: Snapshot) throws -> RowState {
        var state = RowState(row)
        guard row.isConflicted, !row.recordsConflictingFields else { return state }
        let audits = try snap.history(row.table, key: row.key).reversed().lazy.filter { $0.origin == .server }.compactMap(MergeAudit.init)
        guard let audit = audits.first(where: { $0.decisions.contains { $0.outcome == .conflictDeferred } }) else { return state }
        let deferred = Set(audit.decisions.filter { $0.outcome == .conflictDeferred }.map(\.field))
        for f in Array(state.fields.keys) { state.fields[f]!.isInConflict = deferred.contains(f) }
        for f in deferred where state.fields[f] == nil { state.fields[f] = RowState.Field(original: .null, current: .null, isInConflict: true) }
        return state
    }

    /// A conflicted row's state after `choice` (see ``resolve(_:key:with:)``).
    static func resolved(_ row: RowState, table: String, key: RowKey, with choice: Choice) throws -> RowState? {
        var state = row
        let conflicting = row.conflictingFields
        state.clearConflict()
        switch choice {
        case .server:
            // The server deleted the row: its side is no row.
            if row.isInserted { return nil }
            state.isDeleted = false
            for f in conflicting {
                let server = row.fields[f]!.original
                state.fields[f] = server.isNull ? nil : .clean(server)
            }
        case .local:
            break
        case .values(let values):
            if let extra = values.keys.sorted().first(where: { !conflicting.contains($0) }) {
                throw StrataError(.invalidOperation, "field '\(extra)' of row \(key) of table '\(table)' is not in conflict; the conflicting fields are \(conflicting.joined(separator: ", "))")
            }
            state.isDeleted = false
            for f in conflicting {
                let server = row.fields[f]!.original
                if row.isInserted {
                    // No server row: a field not listed keeps its local value.
                    if let v = values[f] { state.fields[f] = .clean(v) }
                } else {
                    state.fields[f] = RowState.Field(original: server, current: values[f] ?? server)
                }
            }
        }
        state.fields = state.fields.filter { !($0.value.original.isNull && $0.value.current.isNull) }
        return state
    }
}

/// The keys a table's delta lists, to refuse a key listed twice. Most keys are one int: those
/// go into a set of ints, which hashes one word and frees nothing per key (a `Set<RowKey>`
/// hashed and freed an array per key, about 3% of a merged server row). A one-int key equals
/// only another one-int key, so the two kinds never hold equal keys.
///
/// Ints that arrive in increasing order, as a delta sorted by key lists them, are only
/// appended to an array, which needs no hash (a set's insert cost about 190 instructions a
/// key); the first one out of order moves them into the set, which takes every int after it.
private struct ListedKeys {
    private var ascending: [Int64] = []
    private var inOrder = true
    private var ints: Set<Int64> = []
    private var others: Set<RowKey> = []

    init(minimumCapacity: Int) { ascending.reserveCapacity(minimumCapacity) }

    /// Adds `key`; `false` when it was listed already.
    mutating func insert(_ key: RowKey) -> Bool {
        guard key.values.count == 1, case .int(let i) = key.values[0] else { return others.insert(key).inserted }
        if inOrder {
            // Above every int listed: new.
            if ascending.isEmpty || i > ascending[ascending.count - 1] {
                ascending.append(i)
                return true
            }
            inOrder = false
            ints = Set(ascending)
            ascending = []
        }
        return ints.insert(i).inserted
    }

    func contains(_ key: RowKey) -> Bool {
        guard key.values.count == 1, case .int(let i) = key.values[0] else { return others.contains(key) }
        guard inOrder else { return ints.contains(i) }
        // A binary search of the sorted ints.
        var lo = 0
        var hi = ascending.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if ascending[mid] < i { lo = mid + 1 } else { hi = mid }
        }
        return lo < ascending.count && ascending[lo] == i
    }
}

/// A row holding a conflict the app has not resolved.
public struct UnresolvedConflict: Sendable, Hashable {
    /// The row's table.
    public let table: String
    /// The row's primary key.
    public let key: RowKey
    /// The fields in conflict: changed by the server and by this device to different values
    /// (for a delete conflict: the fields the surviving side changed). Only these are decided
    /// by ``SyncClient/resolve(_:key:with:)``.
    public let fields: [String]
    /// The local values of those fields (null when the row is deleted here).
    public let local: [String: Value]
    /// The server's values of those fields (null when the server deleted the row).
    public let server: [String: Value]
    /// The device deleted the row; the server changed it.
    public let isDeletedLocally: Bool
    /// The server deleted the row; the device changed it.
    public let isDeletedOnServer: Bool

    init(_ row: Row, _ state: RowState) {
        table = row.table
        key = row.key
        isDeletedLocally = row.status == .deleted
        isDeletedOnServer = row.status == .inserted
        let conflicting = Set(state.conflictingFields)
        let names = row.fieldNames.filter(conflicting.contains)
        fields = names
        local = Dictionary(uniqueKeysWithValues: names.map { ($0, row.status == .deleted ? .null : row[$0]) })
        // A conflicting field's original is the server's value (null for a row the server deleted).
        server = Dictionary(uniqueKeysWithValues: names.map { ($0, row.original($0)) })
    }
}

import Foundation
import Strata

/// Where the batch in flight is: frozen and not yet handed to the transport, or handed to it and
/// waiting for the server's acknowledgement. See ``SyncClient/inFlightBatch()``.
///
/// The raw values are what the store holds (as every earlier version wrote them): a store with a
/// batch in flight keeps reading across versions.
public enum BatchState: String, Sendable, Hashable, CaseIterable {
    /// Frozen by ``SyncClient/nextBatch(maxRows:maxBytes:)`` but not yet handed to the transport.
    case pending
    /// Handed to the transport (``SyncClient/markSent(_:)``); the acknowledgement is awaited.
    case sent
}

/// What an acknowledgement did.
public struct AckReport: Sendable, Hashable {
    /// The ack repeated one already applied, and was ignored.
    public var duplicate = false
    /// Rows the server applied; their sent values became the originals.
    public var acknowledged = 0
    /// Rows the server reported in conflict: pull and merge, then they go up again.
    public var conflicts = 0
    /// Rows left pending to be sent again (`retry`, `recreate`).
    public var retried = 0
    /// Refused inserts removed locally (`drop`).
    public var dropped = 0
    /// Refused updates returned to the server's values (`rollback`).
    public var rolledBack = 0
    /// Refused rows set aside until the app retries or discards them (`setAside`).
    public var setAside = 0
    /// Rows whose client key the server replaced.
    public var rekeyed = 0
    /// Accepted rows that a merge had changed after the batch was frozen: the merged state
    /// stands where the merge took the server's values, since a delta pulled after the server
    /// applied the batch is newer than the acknowledgement. Sent fields the merge did not show,
    /// or showed with a value the device kept, are acknowledged all the same, and the next pull
    /// is a full snapshot (see ``anchorCleared``).
    public var superseded = 0
    /// Whether the acknowledgement cleared the anchor, so that the next pull is a full snapshot:
    /// a merge while the batch was in flight left the device unsure what the server holds for
    /// an accepted row (a snapshot that left it out, a delta that upserted it unchanged, or one
    /// that changed it but not a field the batch sent, or that met a sent field the device kept,
    /// or an inserted row a merge brought back that the app then deleted; see
    /// `AckRules.awaitsSnapshot`, `AckRules.unseenSent` and `AckRules.echoed`). Only an app that
    /// merges between `nextBatch()` and `acknowledge(_:)` meets this.
    public var anchorCleared = false
}

extension SyncClient {
    /// The batch in flight and what its acknowledgement reads: an ``InFlightRecord``
    /// (`BatchRecord` version 2; versions before kept the batch alone here, and the rest in
    /// ``LegacyInFlight``'s properties).
    static let inFlightProperty = "strata.sync.batch.inflight"
    /// The log pin held while a batch is in flight.
    static let batchPin = "strata.sync.batch"
    static let batchNumberProperty = "strata.sync.batch.number"
    static let lastAckProperty = "strata.sync.batch.lastAcknowledged"
    static let rejectedProperty = "strata.sync.rejected"

    // MARK: Batches

    /// The batch to upload next: the batch in flight if there is one — same id, same changes,
    /// whatever was edited since — otherwise a new batch frozen from the pending rows (see
    /// `BatchingRules.swift`), or `nil` when nothing is pending.
    ///
    /// The batch is stored before it is returned, so after a crash or a lost response the same
    /// batch is sent again. Edits made while it is in flight go into a later batch.
    ///
    /// - Parameters:
    ///   - maxRows: The most changes a new batch holds.
    ///   - maxBytes: The most bytes a new batch's payload takes as ``WireFormat`` encodes it,
    ///     envelope included: a server's request-size limit can be set here. A single change
    ///     larger than that goes alone in its batch.
    /// - Throws: `StrataError` `invalidSchema` when the associations form a cycle,
    ///   `invalidOperation` when `maxRows` or `maxBytes` is below 1.
    public func nextBatch(maxRows: Int = 500, maxBytes: Int = 1 << 20) throws(StrataError) -> Batch? {
        try BatchingRules.checkLimits(maxRows: maxRows, maxBytes: maxBytes, ("maxRows", "maxBytes"))
        return try strataErrors {
            try nextBatch(maxRows: maxRows, maxBytes: maxBytes, excluding: [])
        }
    }

    func nextBatch(maxRows: Int, maxBytes: Int, excluding: Set<RowID>) throws -> Batch? {
        return try store.write { tx in
            if let inFlight = try Self.inFlight(tx) { return inFlight }
            let snap = try tx.snapshot
            let changes = try uploadOrder(snap, excluding: excluding)
            guard !changes.isEmpty else { return nil }
            let last = try tx.property(Self.batchNumberProperty)?.intValue ?? 0
            guard last >= 0, last < Int64.max else {
                throw StrataError(.corruptRecord, "the store is damaged: its last batch number (property \(Self.batchNumberProperty)) is \(last)")
            }
            let number = UInt64(last) + 1
            let chosen = BatchingRules.firstBatch(changes, clientID: store.clientID, number: number, maxRows: maxRows, maxBytes: maxBytes)
            let batch = Batch(id: "\(store.clientID)-\(number)", clientID: store.clientID, number: number, changes: chosen)
            try tx.setStrataProperty(Self.batchNumberProperty, .int(Int64(number)))
            let frozenAt = try snap.lastLSN
            try Self.saveInFlight(InFlightRecord(batch: batch, state: .pending, frozenAt: frozenAt), tx)
            // The acknowledgement reads the history after the freeze (see `mergedSince`):
            // compaction must keep it until then.
            try tx.pinLog(Self.batchPin, after: frozenAt)
            return batch
        }
    }

    /// Every change the pending rows would upload, coalesced and in upload order, without
    /// freezing a batch (held-back rows — conflicted or set aside — are left out).
    public func pendingChanges() throws(StrataError) -> [RowChange] {
        return try strataErrors {
            try store.read { try uploadOrder($0, excluding: []) }
        }
    }

    /// Calls `body` with each change ``pendingChanges()`` returns, in the same order, one at a
    /// time: memory stays flat however many rows are pending (the pending rows are read twice,
    /// once for inserts and updates and once for deletes, which go last).
    ///
    /// - Complexity: O(p log n) for p pending rows.
    public func forEachPendingChange(_ body: (RowChange) throws -> Void) throws {
        try store.read { snap in
            let rejected = Set(try Self.rejected(snap).map { Self.rowID($0.table, $0.key) })
            let order = try BatchingRules.tableOrder(snap.tables.map(\.name), associations(snap))
            for (tables, deletes) in [(order, false), (order.reversed(), true)] {
                for table in tables {
                    try snap.forEachPendingRow(table) { row in
                        guard !row.isConflicted, !rejected.contains(Self.rowID(row.table, row.key)),
                              let c = BatchingRules.change(for: row), (c.kind == .delete) == deletes else { return true }
                        try body(c)
                        return true
                    }
                }
            }
        }
    }

    /// The change of every pending row that may go up — not conflicted, not set aside, not in
    /// `excluding` — coalesced and ordered by the batching rules.
    private func uploadOrder(_ snap: Snapshot, excluding: Set<RowID>) throws -> [RowChange] {
        let rejected = Set(try Self.rejected(snap).map { Self.rowID($0.table, $0.key) })
        var changes: [RowChange] = []
        for row in try snap.pendingRows() where !row.isConflicted {
            let id = Self.rowID(row.table, row.key)
            guard !rejected.contains(id), !excluding.contains(id), let c = BatchingRules.change(for: row) else { continue }
            changes.append(c)
        }
        return BatchingRules.order(changes, tableOrder: try BatchingRules.tableOrder(snap.tables.map(\.name), associations(snap)))
    }

    /// The batch in flight and whether it was handed to the transport (``BatchState/sent``) or
    /// not yet (``BatchState/pending``), if any.
    ///
    /// Throws `StrataError` (`corruptRecord`) when the stored state is not one this library writes.
    public func inFlightBatch() throws(StrataError) -> (batch: Batch, state: BatchState)? {
        return try strataErrors {
            try store.read { try Self.inFlightRecord($0).map { ($0.batch, $0.state) } }
        }
    }

    /// Records that the batch was handed to the transport.
    public func markSent(_ batch: Batch) throws(StrataError) {
        try strataErrors {
            try store.write { tx in
                guard var record = try Self.inFlightRecord(tx), record.batch.id == batch.id else {
                    throw StrataError(.invalidOperation, "batch \(batch.id) is not the batch in flight")
                }
                record.state = .sent
                try Self.saveInFlight(record, tx)
            }
        }
    }

    // MARK: Refusals

    /// What ``settleRefusal(_:of:)`` did with a batch the server refused as a whole.
    public enum RefusalOutcome: Sendable, Hashable {
        /// The batch was dropped. Its rows are still pending and go up in the next batch:
        /// call ``nextBatch(maxRows:maxBytes:)`` again, with `maxBytes` at most `maxBytes` when
        /// it is given (the server refused the batch as too large).
        case refreeze(maxBytes: Int?)
        /// Every row of the batch was set aside with the server's message as its reason, as if
        /// the server's acknowledgement had said so (``rejectedRows()``), and the batch is over.
        /// The report is that acknowledgement's.
        case setAside(AckReport)
    }

    /// Settles a refusal that an app's own upload got for the batch in flight, as ``sync(with:maxAttempts:backoff:maxBatchRows:maxBatchBytes:onReset:progress:)``
    /// does for its uploads, so that the rows do not stay stuck behind a batch the server will
    /// never take:
    /// - ``BatchRefused/Reason/idReused``: the batch is dropped and the batch counter moves past
    ///   the server's highest number for this client; the next batch has an id the server has
    ///   not seen ("refreeze").
    /// - ``BatchRefused/Reason/tooLarge``: a batch of several rows is dropped, to be frozen again
    ///   at half its encoded size ("refreeze" with that size); a single row too large by itself
    ///   is set aside.
    /// - ``BatchRefused/Reason/invalid``: every row of the batch is set aside; sending them again
    ///   would be refused again.
    ///
    /// A row set aside keeps its local changes and waits in ``rejectedRows()`` for the app.
    ///
    /// - Throws: `StrataError` `invalidOperation` when `batch` is not the batch in flight, or
    ///   for a reused id without the server's highest batch number (no free id can be known:
    ///   the batch stays in flight, and `sync` would throw the refusal itself). Nothing changes
    ///   then.
    @discardableResult
    public func settleRefusal(_ refused: BatchRefused, of batch: Batch) throws(StrataError) -> RefusalOutcome {
        // Checked first: an acknowledgement of a batch already over is otherwise taken as a
        // repeat and ignored, and the app would not learn that it settled the wrong batch.
        guard try inFlightBatch()?.batch.id == batch.id else {
            throw StrataError(.invalidOperation, "batch \(batch.id) is not the batch in flight; only that batch's refusal can be settled")
        }
        let settlement: Settlement
        do {
            settlement = try settle(refused, of: batch)
        } catch let error as StrataError {
            throw error
        } catch {
            throw StrataError(.invalidOperation, "the server refused batch \(batch.id) as \(refused.reason) without saying its highest batch number for this client, so no free id can be known; the batch stays in flight (\(refused.message))")
        }
        switch settlement {
        case .refreeze(let maxBytes): return .refreeze(maxBytes: maxBytes)
        case .answer(let ack): return .setAside(try acknowledge(ack))
        }
    }

    /// What ``settle(_:of:)`` made of a batch the server refused as a whole.
    enum Settlement {
        /// The batch was dropped; its rows, still pending, are frozen again by the next
        /// `nextBatch`, in batches of at most `maxBytes` bytes when given.
        case refreeze(maxBytes: Int?)
        /// The answer to acknowledge in the server's place: every row set aside, with the
        /// server's message as the reason.
        case answer(BatchAck)
    }

    /// Settles a refusal of the batch in flight that sending it again cannot fix, so that the
    /// sync goes on:
    /// - `idReused` drops the batch and moves the batch counter past the server's highest
    ///   number for this client, so that its rows go up again under an id the server has not
    ///   seen;
    /// - `tooLarge` drops a batch of several rows, to be frozen again at half its size; a
    ///   batch of one row is too large by itself, and the row is set aside;
    /// - `invalid` sets every row of the batch aside: the server names none, and sending them
    ///   again would be refused again.
    ///
    /// A row set aside keeps its local changes and waits in ``rejectedRows()`` for the app,
    /// as a row the server refused in its acknowledgement does.
    ///
    /// - Throws: the refusal itself when it cannot be settled (`idReused` without the server's
    ///   highest number); `invalidOperation` when `batch` is not the batch in flight.
    func settle(_ refused: BatchRefused, of batch: Batch) throws -> Settlement {
        func setAside(_ reason: String) -> Settlement {
            .answer(BatchAck(batchID: batch.id, results: batch.changes.map {
                RowResult(table: $0.table, key: $0.key, status: .error, error: RowError(reason: reason, action: .setAside))
            }))
        }
        switch refused.reason {
        case .idReused:
            guard let highest = refused.highestBatchNumber else { throw refused }
            guard highest < UInt64(Int64.max) else {
                throw StrataError(.invalidOperation, "the server's highest batch number for this client, \(highest), leaves no number to continue from")
            }
            try drop(batch) { tx in
                let last = try tx.property(Self.batchNumberProperty)?.intValue ?? 0
                try tx.setStrataProperty(Self.batchNumberProperty, .int(max(last, Int64(highest))))
            }
            return .refreeze(maxBytes: nil)
        case .tooLarge where batch.changes.count > 1:
            let size = try WireFormat.encode(batch).count
            try drop(batch) { _ in }
            return .refreeze(maxBytes: max(1, size / 2))
        case .tooLarge:
            return setAside("the server refuses this row as too large: \(refused.message)")
        case .invalid:
            return setAside("the server refused the batch that carried this row: \(refused.message)")
        }
    }

    /// Drops `batch`, which must be the batch in flight, and runs `then` in the same transaction.
    private func drop(_ batch: Batch, then: (Transaction) throws -> Void) throws {
        try store.write { tx in
            guard try Self.inFlight(tx)?.id == batch.id else {
                throw StrataError(.invalidOperation, "batch \(batch.id) is not the batch in flight")
            }
            try Self.dropInFlight(tx)
            try then(tx)
        }
    }

    // MARK: Acknowledgements

    /// Applies the server's answer to the batch in flight, row by row, in one transaction, and
    /// ends the batch. An ack for a batch already acknowledged is recognised and ignored. An
    /// accepted insert whose row a merge since the freeze saw the server delete (the app pulled
    /// before acknowledging) meets that delete by the merge rules (`AckRules.remembersDelete`);
    /// one whose row such a merge brought back is acknowledged from what the device held then,
    /// meets the merged row by the merge rules, and keeps what the app did since that merge
    /// (`AckRules.echoed`). An accepted row that a snapshot merged since the freeze left out, or
    /// that a delta upserted without changing it, is acknowledged as usual, and the anchor is
    /// cleared, so that the next pull is a full snapshot, which settles it
    /// (`AckRules.awaitsSnapshot`, `AckReport.anchorCleared`).
    ///
    /// - Throws: `StrataError` `invalidOperation` for an ack that does not match the batch in
    ///   flight: another batch id, a missing, extra or repeated row result, an error without a
    ///   reason, an action that does not fit the change (drop, recreate or setAside for inserts;
    ///   retry, rollback or setAside for updates; retry or setAside for deletes: see `match`), or a
    ///   new key for a row that was not an accepted insert. Also `invalidOperation` for a new key
    ///   already used on this device: by a row no merge brought since the batch was frozen, or by
    ///   one a merge brought (the app pulled before acknowledging) that holds local edits while
    ///   the acknowledged row does too — revert one of them and acknowledge again (see
    ///   `AckRules.ontoMerged` for how a merged row is otherwise brought together with the
    ///   acknowledged one). Nothing changes then; the batch stays in flight.
    @discardableResult
    public func acknowledge(_ ack: BatchAck) throws(StrataError) -> AckReport {
        return try strataErrors {
            try store.write { tx in try acknowledge(ack, tx) }
        }
    }

    /// The dispatcher: each row's ``AckDecision`` (`AckRules.decide`), applied in the batch's
    /// order, then the batch is over.
    private func acknowledge(_ ack: BatchAck, _ tx: Transaction) throws -> AckReport {
        guard let record = try Self.inFlightRecord(tx), record.batch.id == ack.batchID else { return try Self.repeated(ack, tx) }
        let results = try Self.match(ack, to: record.batch)
        let notes = AckNotes(record)
        var run = AckRun(rejected: try Self.rejected(tx))
        let associations = try self.associations(tx.snapshot)
        for (sent, result) in zip(record.batch.changes, results) {
            let change = AckRules.followingKeys(sent, rekeyed: run.rekeyed, associations: associations)
            let facts = try ackFacts(change, notes, rekeyed: run.rekeyed, associations: associations, tx: tx)
            try apply(try AckRules.decide(change, result, facts), to: change, notes, &run, tx: tx)
        }
        try Self.saveRejected(run.rejected, tx)
        try Self.dropInFlight(tx)
        if run.report.anchorCleared { try tx.setStrataProperty(Self.anchorProperty, nil) }
        try tx.setStrataProperty(Self.lastAckProperty, .string(record.batch.id))
        return run.report
    }

    /// An ack for a batch that is not in flight: a repeat of the last one applied, ignored, or
    /// a mistake.
    private static func repeated(_ ack: BatchAck, _ tx: Transaction) throws -> AckReport {
        if try tx.property(lastAckProperty)?.stringValue == ack.batchID { return AckReport(duplicate: true) }
        let current = try inFlight(tx)?.id
        throw StrataError(.invalidOperation, "the acknowledgement is for batch '\(ack.batchID)' but \(current.map { "'\($0)'" } ?? "no batch") is in flight")
    }

    /// What an acknowledgement has done so far.
    private struct AckRun {
        var report = AckReport()
        var rejected: [RejectedRow]
        /// Parent table → client key → server key, for the rows rekeyed so far (parents come
        /// first in a batch: see `AckRules.followingKeys`).
        var rekeyed: [String: [Value: Value]] = [:]

        mutating func accepted(clearing anchor: Bool) {
            report.acknowledged += 1
            if anchor { report.anchorCleared = true }
        }
    }

    /// The in-flight record's notes, by row, as the acknowledgement looks them up.
    private struct AckNotes {
        let batchID: String
        let frozenAt: UInt64
        let serverDeletes: Set<RowID>
        let echoes: [RowID: RowChange]
        let listed: Set<RowID>
        let snapshotMerged: Bool

        init(_ record: InFlightRecord) {
            batchID = record.batch.id
            frozenAt = record.frozenAt
            serverDeletes = Set(record.serverDeletes.map { rowID($0.table, $0.key) })
            echoes = Dictionary(record.echoes.map { (rowID($0.table, $0.key), $0) }) { first, _ in first }
            listed = Set(record.listed.map { rowID($0.table, $0.key) })
            snapshotMerged = record.snapshotMerged
        }
    }

    /// What the store says about `change`'s row, for `AckRules.decide`.
    private func ackFacts(_ change: RowChange, _ notes: AckNotes, rekeyed: [String: [Value: Value]], associations: [Association], tx: Transaction) throws -> AckFacts {
        let (table, key, frozenAt) = (change.table, change.key, notes.frozenAt)
        return AckFacts(
            local: try tx.row(table, key: key, includingDeleted: true).map(RowState.init),
            mergedSinceFreeze: { try Self.mergedSince(frozenAt, table, $0, tx) },
            // What the device held names parents by the keys it knew then.
            echo: notes.echoes[Self.rowID(table, key)].map { AckRules.followingKeys($0, rekeyed: rekeyed, associations: associations) },
            setSinceMerge: { try Self.setSinceMerge(after: frozenAt, table, key, tx) },
            editedSinceFreeze: { try Self.fieldsEditedSinceFreeze(change, after: frozenAt, tx) },
            listed: notes.listed.contains(Self.rowID(table, key)),
            snapshotMerged: notes.snapshotMerged,
            serverDeleted: { notes.serverDeletes.contains(Self.rowID(table, $0)) },
            meet: { acked, merged in try self.ontoMerged(acked, merged: merged, change, key: key, tx: tx) }
        )
    }

    /// Carries out one row's ``AckDecision`` and counts it.
    private func apply(_ decision: AckDecision, to change: RowChange, _ notes: AckNotes, _ run: inout AckRun, tx: Transaction) throws {
        let (table, key) = (change.table, change.key)
        func write(_ state: RowState?, _ kind: LogEntry.Kind, _ note: String) throws {
            try tx.setRowState(table, key: key, state, kind: kind, origin: .server, annotation: Array(note.utf8))
        }
        switch decision {
        case .settle(let state, let clears):
            try write(state, .acknowledge, notes.batchID)
            run.accepted(clearing: clears)
        case .settleMerged(let outcome, let clears):
            try storeMerged(outcome, table, key: key, tx: tx)
            run.accepted(clearing: clears)
        case .standsAsMerged(let clears):
            run.accepted(clearing: clears)
        case .rekey(let newKey, let state, let deletedSince, let clears):
            try rekey(change, to: newKey, state: state, frozenAt: notes.frozenAt, deletedSince: deletedSince, tx: tx)
            if key.values.count == 1, newKey.values.count == 1 { run.rekeyed[table, default: [:]][key.values[0]] = newKey.values[0] }
            run.report.rekeyed += 1
            run.accepted(clearing: clears)
        case .supersede(let adopting):
            if let adopting {
                try write(adopting, .acknowledge, notes.batchID)
                run.report.anchorCleared = true
            }
            run.report.superseded += 1
        case .conflict: run.report.conflicts += 1
        case .retry: run.report.retried += 1
        case .drop(let reason):
            try write(nil, .uploadRejected, reason)
            run.report.dropped += 1
        case .rollback(let state, let reason):
            try write(state, .uploadRejected, reason)
            run.report.rolledBack += 1
        case .setAside(let reason):
            run.rejected.append(RejectedRow(table: table, key: key, kind: change.kind, reason: reason, batchID: notes.batchID))
            run.report.setAside += 1
        }
    }

    /// One result per change, in the batch's order; anything else is a malformed ack.
    static func match(_ ack: BatchAck, to batch: Batch) throws -> [RowResult] {
        func bad(_ why: String) -> StrataError { StrataError(.invalidOperation, "the acknowledgement of batch '\(batch.id)' \(why); nothing was applied") }
        var byRow: [RowID: RowResult] = [:]
        for r in ack.results {
            let id = rowID(r.table, r.key)
            guard byRow.updateValue(r, forKey: id) == nil else { throw bad("answers row \(r.table) \(r.key) twice") }
        }
        var results: [RowResult] = []
        for c in batch.changes {
            guard let r = byRow.removeValue(forKey: rowID(c.table, c.key)) else { throw bad("has no result for row \(c.table) \(c.key)") }
            if r.status == .error {
                guard let e = r.error, !e.reason.isEmpty else { throw bad("refuses row \(c.table) \(c.key) without a reason") }
                let allowed: Set<RowError.Action> = switch c.kind {
                case .insert: [.drop, .recreate, .setAside]
                case .update: [.retry, .rollback, .setAside]
                case .delete: [.retry, .setAside]
                }
                guard allowed.contains(e.action) else { throw bad("asks to \(e.action.rawValue) the \(c.kind.rawValue) of row \(c.table) \(c.key)") }
            }
            if r.newKey != nil && !(r.status == .ok && c.kind == .insert) {
                throw bad("gives a new key for row \(c.table) \(c.key), which was not an accepted insert")
            }
            results.append(r)
        }
        if let extra = byRow.values.first { throw bad("answers row \(extra.table) \(extra.key), which it did not carry") }
        return results
    }

    /// Moves an acknowledged insert to the server's key and rewrites every reference to it (the
    /// changes of the same batch that name it are translated by `AckRules.followingKeys`; a
    /// stored child changes in that field only, and keeps a conflict: `AckRules.followingParent`).
    ///
    /// A merge since the freeze may already have brought the row under the server's key (the app
    /// pulled before acknowledging), or deleted it there (`deletedSince`, noted by the merge: see
    /// `AckRules.remembersDelete`): the two are brought together by `AckRules.ontoMerged`.
    private func rekey(_ change: RowChange, to newKey: RowKey, state: RowState?, frozenAt: UInt64, deletedSince: Bool, tx: Transaction) throws {
        let note = Array("rekey \(change.key) → \(newKey)".utf8)
        let existing = try tx.row(change.table, key: newKey, includingDeleted: true)
        if let state, try Self.mergedSince(frozenAt, change.table, newKey, tx) || (deletedSince && existing == nil) {
            let merged = try existing.map { try Self.state(of: $0, tx.snapshot) }
            guard let outcome = try ontoMerged(state, merged: merged, change, key: newKey, tx: tx) else {
                throw StrataError(.invalidOperation, "the server's key \(newKey) for row \(change.table) \(change.key) names a row a merge brought after the batch was frozen, and both rows hold local edits since; no rule chooses between them: copy what should stay onto row \(change.key), revert row \(newKey), then acknowledge again (nothing was applied)")
            }
            try tx.setRowState(change.table, key: change.key, nil, kind: .acknowledge, origin: .server, annotation: note)
            if outcome.state != merged || outcome.conflict != nil {
                try storeMerged(outcome, change.table, key: newKey, tx: tx)
            }
        } else {
            guard existing == nil else {
                throw StrataError(.invalidOperation, "the server's key \(newKey) for row \(change.table) \(change.key) is already used on this device; nothing was applied")
            }
            try tx.setRowState(change.table, key: change.key, nil, kind: .acknowledge, origin: .server, annotation: note)
            try tx.setRowState(change.table, key: newKey, state, kind: .acknowledge, origin: .server, annotation: note)
        }
        guard change.key.values.count == 1, newKey.values.count == 1 else { return }
        let old = change.key.values[0]
        let new = newKey.values[0]
        for a in try associations(tx.snapshot) where a.parent == change.table {
            for row in try tx.snapshot.rows(a.child, includingDeleted: true) where row[a.field] == old || row.original(a.field) == old {
                let s = AckRules.followingParent(try Self.state(of: row, tx.snapshot), field: a.field, from: old, to: new)
                try tx.setRowState(a.child, key: row.key, s, kind: .acknowledge, origin: .server, annotation: note)
            }
        }
    }

    /// `AckRules.ontoMerged` for the accepted insert `change`, acknowledged as `state`, and the row
    /// a merge since the freeze left under `key` (`merged`; `nil` when the server deleted it).
    private func ontoMerged(_ state: RowState, merged: RowState?, _ change: RowChange, key: RowKey, tx: Transaction) throws -> MergeOutcome? {
        let keyFields = Set(try tx.snapshot.schema(change.table).primaryKey)
        var acked = state
        // `ok` reads an insert's sent values, key included; the merge compares non-key fields only.
        acked.fields = acked.fields.filter { !keyFields.contains($0.key) }
        return AckRules.ontoMerged(
            acked, merged: merged, table: change.table, key: key,
            localTimestamp: { Self.lastLocalEdit(change.table, change.key, tx) }, policy: tablePolicies[change.table] ?? policy
        )
    }

    /// Stores what `ontoMerged` decided under `key`, audited like a merge: the decisions are the
    /// merge rules'.
    private func storeMerged(_ outcome: MergeOutcome, _ table: String, key: RowKey, tx: Transaction) throws {
        let policy = tablePolicies[table] ?? self.policy
        let audit = MergeAudit(
            anchor: try tx.property(Self.anchorProperty)?.stringValue ?? "", serverVersion: nil, conflict: outcome.conflict?.kind,
            resolution: outcome.resolution?.kind, policy: outcome.conflict == nil ? nil : policy.kind,
            decisions: outcome.decisions
        )
        try tx.setRowState(table, key: key, outcome.state, kind: .acknowledge, origin: .server, annotation: audit.encoded)
    }

    /// Whether a merge or reset changed the row after LSN `lsn`.
    static func mergedSince(_ lsn: UInt64, _ table: String, _ key: RowKey, _ tx: Transaction) throws -> Bool {
        for entry in try tx.snapshot.history(table, key: key).reversed() {
            if entry.lsn <= lsn { return false }
            if [.serverChange, .serverDelete, .reset].contains(entry.kind) { return true }
        }
        return false
    }

    /// Of the fields `change` sent, those whose current value the app set since the batch was
    /// frozen at LSN `lsn`, rather than a merge: the last operation since then that changed the
    /// field's current value was the app's (an edit, a revert, a resolution). A field no
    /// operation changed still holds the value sent (`AckRules.unseenSent`).
    ///
    /// The app's delete sets nothing: it puts each edited field's current back to its original,
    /// and a merge that then restores the row (server wins) shows no change in those fields. Taken
    /// for an edit, or skipped so that an edit made before the delete stayed the field's last
    /// word, the restored base went up over the value sent
    /// (`InterleavedMergeTests.aFieldAMergeSetToTheBaseIsNotTakenForAnEdit`).
    static func fieldsEditedSinceFreeze(_ change: RowChange, after lsn: UInt64, _ tx: Transaction) throws -> Set<String> {
        var current = change.values
        var edited: Set<String> = []
        for entry in try tx.snapshot.history(change.table, key: change.key) where entry.lsn > lsn {
            for c in entry.changes where change.values[c.field] != nil && current[c.field] != c.current {
                current[c.field] = c.current
                if entry.origin == .local && entry.kind != .delete { edited.insert(c.field) } else { edited.remove(c.field) }
            }
        }
        return edited
    }

    /// The fields the app set on the row (its local operations) after the first merge that
    /// changed it after LSN `lsn`, and whether the row's last operation since then is the app's
    /// delete: for a row a merge brought back under the key of an insert of the batch in flight,
    /// what the app did since that merge (`AckRules.echoed`). The log pin of the batch in flight
    /// keeps that history.
    static func setSinceMerge(after lsn: UInt64, _ table: String, _ key: RowKey, _ tx: Transaction) throws -> (fields: Set<String>, deleted: Bool) {
        var merged = false
        var fields: Set<String> = []
        var deleted = false
        for entry in try tx.snapshot.history(table, key: key) where entry.lsn > lsn {
            if entry.kind == .serverChange {
                merged = true
            } else if merged && entry.origin == .local {
                fields.formUnion(entry.changes.map(\.field))
            }
            // The app's delete, unless a server operation came after it.
            if merged { deleted = entry.origin == .local && entry.kind == .delete }
        }
        return (fields, deleted)
    }

    // MARK: Rejected rows

    /// The rows the server refused with the `setAside` action: kept locally, left out of uploads.
    ///
    /// A row stays listed until the app calls ``retryRejected(_:key:)`` or
    /// ``discardRejected(_:key:)``, or a merge or reset of its table leaves it without local
    /// changes (the server deleted it, made the same change or won a conflict over it; the reset
    /// discarded them): the entry then stands for nothing and is dropped.
    public func rejectedRows() throws(StrataError) -> [RejectedRow] {
        return try strataErrors {
            try store.read { try Self.rejected($0) }
        }
    }

    /// Puts a rejected row back in the upload queue.
    public func retryRejected(_ table: String, key: RowKey) throws(StrataError) {
        try strataErrors {
            try store.write { tx in try Self.removeRejected(table, key, tx) }
        }
    }

    /// Gives up a rejected row's local changes: the row returns to the server's values.
    public func discardRejected(_ table: String, key: RowKey) throws(StrataError) {
        try strataErrors {
            try store.write { tx in
                try Self.removeRejected(table, key, tx)
                try tx.revert(table, key: key)
            }
        }
    }

    private static func removeRejected(_ table: String, _ key: RowKey, _ tx: Transaction) throws {
        var list = try rejected(tx)
        guard let i = list.firstIndex(where: { $0.table == table && $0.key == key }) else {
            throw StrataError(.rowNotFound, "row \(key) of table '\(table)' is not among the rejected rows")
        }
        list.remove(at: i)
        try saveRejected(list, tx)
    }

    // MARK: Stored state

    /// A row's identity in sets and maps: its table and its key, compared byte for byte (a
    /// string built from them would compare by Unicode canonical equivalence).
    struct RowID: Hashable {
        let table: String
        let key: RowKey
    }

    static func rowID(_ table: String, _ key: RowKey) -> RowID { RowID(table: table, key: key) }

    /// Forgets the batch in flight and what merges noted for it. Called alone, without
    /// acknowledging it: its rows stay pending (only an acknowledgement settles them), and the
    /// batch counter stays where it is.
    static func dropInFlight(_ tx: Transaction) throws {
        guard try tx.property(inFlightProperty) != nil else { return }
        try saveInFlight(nil, tx)
        try tx.unpinLog(batchPin)
    }

    static func inFlight(_ tx: Transaction) throws -> Batch? {
        try inFlightRecord(tx.snapshot)?.batch
    }

    static func inFlightRecord(_ tx: Transaction) throws -> InFlightRecord? {
        try inFlightRecord(tx.snapshot)
    }

    /// The batch in flight and what its acknowledgement reads, read as a whole; `nil` when no
    /// batch is in flight. A store an earlier version wrote keeps the rest of the record in
    /// ``LegacyInFlight``'s properties, read here until the record is next saved.
    ///
    /// - Throws: `StrataError` `corruptRecord` when the record, or a property an earlier version
    ///   wrote, is not one this library writes.
    package static func inFlightRecord(_ snap: Snapshot) throws -> InFlightRecord? {
        guard let b = try snap.property(inFlightProperty)?.bytesValue else { return nil }
        switch try BatchRecord.decodeAny(b, property: inFlightProperty) {
        case .record(let record): return record
        case .batch(let batch): return try LegacyInFlight.record(of: batch, snap)
        }
    }

    /// Stores the in-flight record as a whole (`nil` removes it). The first save over a record an
    /// earlier version wrote removes the properties that version kept beside it: the store is
    /// migrated in place, in the transaction that next freezes, sends, merges around or
    /// acknowledges the batch.
    package static func saveInFlight(_ record: InFlightRecord?, _ tx: Transaction) throws {
        if let first = try tx.property(inFlightProperty)?.bytesValue?.first, first != BatchRecord.inFlightVersion {
            for name in LegacyInFlight.properties { try tx.setStrataProperty(name, nil) }
        }
        try tx.setStrataProperty(inFlightProperty, record.map { .bytes(BatchRecord.encode($0)) })
    }

    /// The properties in which versions before the in-flight record kept, beside the batch, the
    /// rest of its state; read to migrate such a store.
    enum LegacyInFlight {
        static let state = "strata.sync.batch.state"
        static let frozenAt = "strata.sync.batch.frozenAt"
        static let serverDeletes = "strata.sync.batch.serverDeletes"
        static let echoes = "strata.sync.batch.echoes"
        static let listed = "strata.sync.batch.listed"
        static let snapshotMerged = "strata.sync.batch.snapshotMerged"
        static let properties = [state, frozenAt, serverDeletes, echoes, listed, snapshotMerged]

        /// `batch` with the state those properties hold, read as those versions read it.
        static func record(of batch: Batch, _ snap: Snapshot) throws -> InFlightRecord {
            // No stored state: the batch was frozen and not yet sent (as every version has read it).
            var state = BatchState.pending
            if let stored = try snap.property(Self.state) {
                guard let name = stored.stringValue, let s = BatchState(rawValue: name) else {
                    throw StrataError(.corruptRecord, "the store is damaged: the in-flight batch's state (property \(Self.state)) is \(stored), not \"pending\" or \"sent\"")
                }
                state = s
            }
            let frozen = try snap.property(frozenAt)?.intValue ?? 0
            guard frozen >= 0 else {
                throw StrataError(.corruptRecord, "the store is damaged: the in-flight batch was frozen at LSN \(frozen) (property \(frozenAt))")
            }
            func notes(_ name: String) throws -> [RowChange] {
                guard let b = try snap.property(name)?.bytesValue else { return [] }
                return try WireFormat.decode([RowChange].self, from: Data(b))
            }
            var record = InFlightRecord(batch: batch, state: state, frozenAt: UInt64(frozen))
            record.serverDeletes = try notes(serverDeletes)
            record.echoes = try notes(echoes)
            record.listed = try notes(listed)
            record.snapshotMerged = try snap.property(snapshotMerged) != nil
            return record
        }
    }

    static func rejected(_ tx: Transaction) throws -> [RejectedRow] {
        try rejected(tx.snapshot)
    }

    static func rejected(_ snap: Snapshot) throws -> [RejectedRow] {
        guard let b = try snap.property(rejectedProperty)?.bytesValue else { return [] }
        return try SetAsideRecord.rejectedRows(b, property: rejectedProperty)
    }

    /// Takes off the rejected list the rows of `tables` that `MergeRules.staysSetAside` no longer
    /// keeps there. A merge and a reset call it in their transaction, after writing the rows.
    static func dropSettledRejected(in tables: Set<String>, _ tx: Transaction) throws {
        let list = try rejected(tx)
        guard !list.isEmpty else { return }
        let kept = try list.filter { r in
            try !tables.contains(r.table) || MergeRules.staysSetAside(try tx.row(r.table, key: r.key, includingDeleted: true))
        }
        if kept.count != list.count { try saveRejected(kept, tx) }
    }

    static func saveRejected(_ list: [RejectedRow], _ tx: Transaction) throws {
        try tx.setStrataProperty(rejectedProperty, list.isEmpty ? nil : .bytes(SetAsideRecord.encode(list)))
    }
}

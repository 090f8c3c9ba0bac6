import Foundation
import Strata

/// What the acknowledgement does with one row of the batch: ``AckRules/decide(_:_:_:)`` returns
/// one per row, and `SyncClient.acknowledge` applies them in the batch's order (docs/sync.md,
/// "Acknowledgement decisions", lists the same cases).
enum AckDecision {
    /// Accepted: the row takes `state` (``AckRules/ok(_:local:serverValues:)``; `nil` removes it).
    case settle(RowState?, clearsAnchor: Bool)
    /// Accepted: the row takes what the merge rules made of the acknowledged row and the one
    /// merges left (``AckRules/ontoMerged(_:merged:table:key:localTimestamp:policy:)``,
    /// ``AckRules/echoed(_:before:now:editedSince:deletedSince:serverValues:meet:)``), audited
    /// as a merge.
    case settleMerged(MergeOutcome, clearsAnchor: Bool)
    /// Accepted: the row a merge left already is what acknowledging gives; nothing is written.
    case standsAsMerged(clearsAnchor: Bool)
    /// Accepted insert that the server stored under `newKey`: the row moves there, its children
    /// follow (``AckRules/followingParent(_:field:from:to:)``), and a row a merge brought there
    /// (or a server delete noted there: `deletedSince`) meets it by the merge rules.
    case rekey(to: RowKey, state: RowState?, deletedSince: Bool, clearsAnchor: Bool)
    /// Accepted, but a merge since the freeze changed the row: the merged row stands, but for the
    /// sent fields the merges did not show or showed with a value the device kept (`adopting`,
    /// ``AckRules/unseenSent(_:local:editedSince:)``), which then also clear the anchor.
    case supersede(adopting: RowState?)
    /// `conflict`: nothing changes; the row is pulled, merged and sent again.
    case conflict
    /// `retry` or `recreate`: nothing changes; the row goes up in the next batch.
    case retry
    /// `drop` (an insert): the row is removed, logged as a rejected upload.
    case drop(reason: String)
    /// `rollback` (an update): the row takes `state` (``AckRules/rollback(_:local:serverValues:)``).
    case rollback(RowState?, reason: String)
    /// `setAside`: the row is listed in `rejectedRows()` and left out of uploads.
    case setAside(reason: String)
}

/// What the store says about one row of the batch, for ``AckRules/decide(_:_:_:)``. The reads
/// of the row's history are closures, made only when a rule needs them.
struct AckFacts {
    /// The row under the key the change names, as it is now.
    let local: RowState?
    /// Whether a merge or reset changed the row under a key (the change's, or the server's new
    /// one) since the freeze.
    let mergedSinceFreeze: (RowKey) throws -> Bool
    /// What a merge noted the device held under the key of this insert (``AckRules/notesEcho(local:carried:)``),
    /// parents named by the keys this acknowledgement replaced so far.
    let echo: RowChange?
    /// The fields the app set since the merge that changed the row, and whether its last
    /// operation since then is the app's delete (`SyncClient.setSinceMerge`).
    let setSinceMerge: () throws -> (fields: Set<String>, deleted: Bool)
    /// The sent fields the app set since the freeze (`SyncClient.fieldsEditedSinceFreeze`).
    let editedSinceFreeze: () throws -> Set<String>
    /// Whether a delta merged since the freeze upserted the row.
    let listed: Bool
    /// Whether a snapshot was merged since the freeze.
    let snapshotMerged: Bool
    /// Whether a merge noted the server's delete of the row under a key (``AckRules/remembersDelete(local:table:inserting:history:)``).
    let serverDeleted: (RowKey) -> Bool
    /// Brings the acknowledged row together with the row a merge left under the change's key
    /// (`nil`: the server deleted it), by ``AckRules/ontoMerged(_:merged:table:key:localTimestamp:policy:)``.
    let meet: (_ acked: RowState, _ merged: RowState?) throws -> MergeOutcome?
}

/// The rules by which an acknowledgement settles each row of the batch in flight: ``decide(_:_:_:)``
/// picks an ``AckDecision``, and the functions below compute the row states it carries.
package enum AckRules {
    /// The decision for one row: `change` as sent (parents named by the keys this
    /// acknowledgement has replaced so far: ``followingKeys(_:rekeyed:associations:)``), the
    /// server's `result` for it (checked by `SyncClient.match`), and what the store says of it.
    static func decide(_ change: RowChange, _ result: RowResult, _ facts: AckFacts) throws -> AckDecision {
        switch result.status {
        case .ok: return try accepted(change, result, facts)
        case .conflict: return .conflict
        case .error: break
        }
        // `match` lets no error without a reason through.
        let e = result.error ?? RowError(reason: "", action: .retry)
        switch e.action {
        case .drop: return .drop(reason: e.reason)
        case .rollback: return .rollback(rollback(change, local: facts.local, serverValues: result.serverValues), reason: e.reason)
        case .recreate, .retry: return .retry
        case .setAside: return .setAside(reason: e.reason)
        }
    }

    /// An accepted row. A merge since the freeze that changed it may hold a server state newer
    /// than this acknowledgement, which the sent values must not overwrite: the merged row
    /// stands (``echoed`` for a row the insert created, merged back; ``unseenSent`` otherwise).
    /// Else the `ok` applies, under the server's key if it gave one, against a server delete a
    /// merge noted (``remembersDelete``), clearing the anchor when a merge left the device
    /// unsure what the server holds (``awaitsSnapshot``).
    private static func accepted(_ change: RowChange, _ result: RowResult, _ facts: AckFacts) throws -> AckDecision {
        if try facts.mergedSinceFreeze(change.key) {
            if let echoed = try echoedDecision(change, result, facts) { return echoed }
            return .supersede(adopting: unseenSent(change, local: facts.local, editedSince: try facts.editedSinceFreeze()))
        }
        let key = result.newKey ?? change.key
        // Read before the acknowledgement writes the row under its new key.
        let clears = try (facts.snapshotMerged || facts.listed) && awaitsSnapshot(
            change, snapshotSinceFreeze: facts.snapshotMerged, listedSinceFreeze: facts.listed,
            rowMergedSinceFreeze: key != change.key && facts.mergedSinceFreeze(key))
        let state = ok(change, local: facts.local, serverValues: result.serverValues ?? [:])
        if key != change.key {
            return .rekey(to: key, state: state, deletedSince: facts.serverDeleted(key), clearsAnchor: clears)
        }
        // Without a merged row, `ontoMerged` always decides: a server delete.
        if let state, change.kind == .insert, facts.serverDeleted(key), let outcome = try facts.meet(state, nil) {
            return .settleMerged(outcome, clearsAnchor: clears)
        }
        return .settle(state, clearsAnchor: clears)
    }

    /// An accepted insert, under the key the server kept, whose row a merge brought back while
    /// the device held the insert or had deleted it (``echoed``); `nil` when that is not the case
    /// or the row as it is stands.
    private static func echoedDecision(_ change: RowChange, _ result: RowResult, _ facts: AckFacts) throws -> AckDecision? {
        guard change.kind == .insert, result.newKey == nil || result.newKey == change.key, let before = facts.echo else { return nil }
        let since = try facts.setSinceMerge()
        guard let outcome = try echoed(
            change, before: before, now: facts.local, editedSince: since.fields, deletedSince: since.deleted,
            serverValues: result.serverValues ?? [:], meet: facts.meet
        ) else { return nil }
        // The delete may be of a row the server no longer has: a snapshot settles it.
        let clears = facts.local == nil && since.deleted
        let unchanged = outcome.state == facts.local && outcome.conflict == nil
        return unchanged ? .standsAsMerged(clearsAnchor: clears) : .settleMerged(outcome, clearsAnchor: clears)
    }

    /// `change` as the server stored it: a field of a declared association that names a parent
    /// this acknowledgement has already moved to a server key (`rekeyed`: parent table → client
    /// key → server key) names the server key instead.
    ///
    /// Why: `rekey` rewrites the child's local values to the new key; if the child's originals
    /// then took the client key it sent, the child would look edited (client key → server key)
    /// and upload an update the server does not need, which under `clientWins` could overwrite
    /// another client's later change. Parents are acknowledged before their children because
    /// batches are ordered parents first.
    package static func followingKeys(_ change: RowChange, rekeyed: [String: [Value: Value]], associations: [Association]) -> RowChange {
        guard !rekeyed.isEmpty else { return change }
        var change = change
        for a in associations where a.child == change.table {
            if let v = change.values[a.field], let new = rekeyed[a.parent]?[v] { change.values[a.field] = new }
        }
        return change
    }

    /// `child`, a stored row whose `field` (of a declared association) names a parent this
    /// acknowledgement moved from client key `old` to server key `new`: each side of the field
    /// that holds `old` holds `new` instead, and nothing else changes — the other fields, the
    /// row's flags (inserted, deleted, conflicted) and every field's conflict mark, this
    /// field's own included, stay as they were.
    ///
    /// Why: a row in conflict is held back from uploads, so a child in conflict is still
    /// pending, conflict and all, when its parent is acknowledged. The rewrite only renames the
    /// parent; dropping a mark would silently end a conflict the app has not resolved. The one
    /// mark that goes is one the new key settles: the server's side already named `new` (the
    /// app merged between `nextBatch()` and `acknowledge(_:)`) and the device's named `old`, so
    /// both sides now agree, and the field is settled as a merge would settle it
    /// (`MergeRules`); with no field left in conflict the row is no longer conflicted.
    static func followingParent(_ child: RowState, field: String, from old: Value, to new: Value) -> RowState {
        var state = child
        let was = child.fields[field] ?? .clean(.null)
        var f = was
        if f.original == old { f.original = new }
        if f.current == old { f.current = new }
        let settled = was.isInConflict && was.original == new && was.current == old
        if settled { f.isInConflict = false }
        state.fields[field] = f
        if settled && !state.fields.values.contains(where: \.isInConflict) { state.isConflicted = false }
        return state
    }

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

    /// An accepted insert whose server key names a row that a merge brought after the batch was
    /// frozen: the server applied the batch, the app pulled before acknowledging it, and the
    /// delta carried the new row (`sync()` never does this: it acknowledges a batch in flight
    /// before it pulls). `acked` is the row under its client key with the acknowledgement applied
    /// (``ok``, key fields left out); `merged` the row under the server key, `nil` when a later
    /// delta deleted it again.
    ///
    /// The merge rules decide, as if the acknowledgement had come before the merge: `acked` is the
    /// local side (its originals what the server confirmed, its currents the edits made since the
    /// freeze) and the merged row, newer than the acknowledgement, the server's side. A merged
    /// row that holds local changes of its own (the app edited it after the merge) stands when
    /// `acked` holds none. When both hold local changes there are two sets of local edits to one
    /// server row, and no merge rule chooses between them: `nil`, and the caller refuses the
    /// acknowledgement.
    static func ontoMerged(
        _ acked: RowState, merged: RowState?, table: String, key: RowKey,
        localTimestamp: () -> Date?, policy: ConflictPolicy
    ) -> MergeOutcome? {
        func merge(_ server: ServerChange) -> MergeOutcome {
            // The store keeps no server timestamp for a row, so last-writer-wins gives a
            // conflict to the server, as for a server row without one.
            MergeRules.merge(table: table, key: key, local: acked, server: server, serverTimestamp: nil, localTimestamp: localTimestamp, policy: policy)
        }
        guard let merged else { return merge(.delete) }
        if hasLocalChanges(merged) { return hasLocalChanges(acked) ? nil : MergeOutcome(state: merged) }
        // The server's whole row: a field the merged row does not hold is null there.
        var values = merged.fields.mapValues(\.current)
        for f in acked.fields.keys where values[f] == nil { values[f] = .null }
        return merge(.upsert(values))
    }

    /// Whether a merge notes the server's delete of a row for the acknowledgement of the batch in
    /// flight: the batch inserts into the row's table (`inserting`: the tables it inserts into)
    /// and the delete leaves the store as it is — no row under that key (the key the server gave
    /// an insert, before the acknowledgement moves the row there), or a local insert (the insert
    /// itself, under the key the server kept: the merge rules keep a local insert that the server
    /// deletes, as a row the server never had). The acknowledgement of an accepted insert whose
    /// row the server deleted meets the delete by the merge rules, as if it had come before the
    /// merge: an unchanged row is removed; one edited since the freeze is a local update against
    /// a server delete, for the table's policy; one deleted here too is gone.
    ///
    /// Why: otherwise the acknowledgement stores as a clean server row one the server created and
    /// deleted since, and no later delta names that row again: client and server differ for good
    /// (an edit made since the freeze is uploaded as an update of a row the server no longer has,
    /// answered `conflict`, for ever). The delete is taken as newer than the acknowledgement, as a
    /// merged row is (``ontoMerged``): a server's key is new when it creates the row, and a key the
    /// client chose was free on the server when the batch came unless two clients chose it, which
    /// keys made to be unique rule out. Only a delta's listed deletes are noted: a row a snapshot
    /// leaves out may be one the server has not created yet.
    ///
    /// A key under which the server may have held an earlier row of the device's after the
    /// anchor the delta continues from is not noted: the delete may be of that row — typically
    /// the device's own delete of it, which the delta brings back after the app inserted a row
    /// under the same key again. Taken for a delete of the new row, it removed that row here
    /// while the server kept it, for good. Left un-noted, a delete that was of the new row leaves
    /// it here as before this rule. `history` (the operations on the key, oldest first, since the
    /// log's horizon) tells: a server operation (a merge, a reset, an acknowledgement; a briefcase
    /// import too) that leaves anything but a local insert shows a row of the device's on the
    /// server, and a later merge of the server's delete of it (`serverDelete`, a snapshot's
    /// included) shows that the anchor has passed that delete, so a delete a delta lists again is
    /// a later one. The key is noted when no such sign follows the last such merge: with only
    /// local operations before the insert (a row inserted and deleted here, never uploaded), or
    /// with an earlier row the server deleted, which the device kept in a conflict and uploads
    /// again as an insert. Both were left un-noted before, and the acknowledgement kept for good
    /// a row the server had deleted (`LateAckTests.aKeyUsedBeforeOnlyLocallyIsNoted`,
    /// `aKeyWhoseEarlierRowsDeleteWasMergedIsNoted`).
    static func remembersDelete(local: Row?, table: String, inserting: Set<String>, history: () throws -> [LogEntry]) rethrows -> Bool {
        guard inserting.contains(table), local == nil || local?.status == .inserted else { return false }
        let operations = try history()
        let sinceDelete = operations.lastIndex(where: { $0.kind == .serverDelete }).map { operations[($0 + 1)...] } ?? operations[...]
        // A briefcase import is local but may bring a server row (its originals): counted too.
        // One that leaves the row a local insert shows none: the acknowledgement that moved a
        // child to its parent's new key, say.
        return !sinceDelete.contains { ($0.origin == .server || $0.kind == .imported) && !$0.isPendingInsert }
    }

    /// A superseded update (a merge since the freeze changed the row, so the `ok` is skipped and
    /// the merged row stands: `AckReport.superseded`) that sent fields whose merged state the
    /// next upload would get wrong: the row with those fields acknowledged, or `nil` when there
    /// are none. The acknowledgement then also clears the anchor, so that the next pull is a
    /// full snapshot, taken after the server applied the batch, which brings any later value.
    /// `editedSince` names the sent fields whose current value the app set after the freeze
    /// (the others hold the value sent, or one a merge put there).
    ///
    /// - **A field the merges did not show** (its original is still the base the batch sent, and
    ///   it is not in conflict): the delta listed the row for other fields. It came either before
    ///   the push, or after it with the field set back to its base by another writer, a later
    ///   write the device took for no change
    ///   (`InterleavedMergeTests.aLaterChangeBackToTheOriginalsIsNotLost`). The sent value
    ///   becomes the original. The current stays if the app set it since; else it is the sent
    ///   value again, whatever a merge wrote there: a merge before the push that put the base
    ///   back into the current (server wins restoring a row the app had deleted, or another
    ///   writer's change and change back) made no edit, and kept, it went up over the sent value
    ///   (`InterleavedMergeTests.aFieldAMergeSetToTheBaseIsNotTakenForAnEdit`).
    /// - **A field the merges showed with another value, which the device kept** (client wins, or
    ///   a conflict, deferred or resolved `.local`), the app not having set it since: its current
    ///   is still the value sent. Before the push, a delta could show another value for a sent
    ///   field only if the server's value went back to the base before the push (else the server
    ///   answers `conflict`); after it, the server's value is another writer's later one, written
    ///   over the sent value, and there was no conflict to win
    ///   (`InterleavedMergeTests.aSentValueAMergeKeptIsNotPutBackOverALaterOne`). It is settled
    ///   as if the acknowledgement had come before the merge: the sent value confirmed, its
    ///   conflict mark gone.
    static func unseenSent(_ change: RowChange, local: RowState?, editedSince: Set<String>) -> RowState? {
        guard change.kind == .update, let local, !local.isDeleted, !local.isInserted else { return nil }
        var state = local
        var adopted = false
        var clearedMark = false
        for (f, sent) in change.values {
            let field = local.fields[f] ?? .clean(.null)
            let edited = editedSince.contains(f)
            let unseen = !field.isInConflict && field.original == (change.originals[f] ?? .null)
            let keptAsSent = !edited && field.current == sent && (field.original != sent || field.isInConflict)
            guard unseen || keptAsSent else { continue }
            state.fields[f] = RowState.Field(original: sent, current: edited ? field.current : sent)
            adopted = true
            clearedMark = clearedMark || field.isInConflict
        }
        guard adopted else { return nil }
        state.fields = state.fields.filter { !($0.value.original.isNull && $0.value.current.isNull) }
        if clearedMark && !state.fields.values.contains(where: \.isInConflict) { state.isConflicted = false }
        return state
    }

    /// Whether an accepted insert or update leaves the device unsure what the server holds for
    /// its row, so that the acknowledgement clears the anchor and the next pull is a full
    /// snapshot, which settles it: it is taken after the server applied the batch. The `ok` is
    /// applied as usual (the sent values become the originals). Two merges since the freeze
    /// that did not change the row (`rowMergedSinceFreeze`, under the key the row has after the
    /// acknowledgement; a merge that changed it supersedes the `ok`) leave that doubt:
    ///
    /// - **A snapshot that left the row out** (`snapshotSinceFreeze`). A snapshot lists the
    ///   rows the server holds when it is taken, and no deletes. It was taken either before the
    ///   server applied the batch (an inserted row did not exist yet) or after it applied it and
    ///   deleted the row again; the device cannot tell which. Kept as a server row, a deleted
    ///   row stayed here for good, since no later delta names it
    ///   (`LateAckTests.aSnapshotLeavesOutARowTheServerDeletedBeforeTheLateAck`).
    /// - **A delta that upserted the row without changing it** (`listedSinceFreeze`): the server
    ///   held the row's originals. Either the delta was pulled before the push, or after it,
    ///   when another writer had set the sent fields back. Taking the `ok` alone marked the sent
    ///   values as the server's for good, where the server held the other writer's later values
    ///   (`InterleavedMergeTests.aLaterChangeBackToTheOriginalsIsNotLost`).
    static func awaitsSnapshot(_ change: RowChange, snapshotSinceFreeze: Bool, listedSinceFreeze: Bool, rowMergedSinceFreeze: Bool) -> Bool {
        change.kind != .delete && !rowMergedSinceFreeze && (snapshotSinceFreeze || listedSinceFreeze)
    }

    /// Whether a merge notes, for the acknowledgement of the batch in flight, what the device
    /// holds under the key of a server row it merges: the batch carries an insert under that key
    /// (`carried`), and the device holds no row there (the insert was deleted since the freeze)
    /// or a local insert (the insert itself, maybe edited since). The merge itself goes on by the
    /// merge rules, which see no base: the row may be another writer's under the same key (an
    /// insert-insert conflict, or a new row). Only the acknowledgement can tell: an accepted
    /// insert means the server created the row from the batch (see ``echoed``).
    static func notesEcho(local: Row?, carried: Bool) -> Bool {
        carried && (local == nil || local?.status == .inserted)
    }

    /// An accepted insert, under the key the server kept, whose row a merge since the freeze
    /// brought back (``notesEcho``; `before` is what the device held then: an insert of its
    /// values, or a delete when it held no row). `now` is the row as it is, `editedSince` the
    /// fields the app has set on it since that merge (whether it deleted the row, `now` shows), and
    /// `meet` brings an acknowledged row together with a row a merge left, by the merge rules
    /// (``ontoMerged`` for this row). `deletedSince` says whether the row's last operation is a
    /// delete the app made since that merge. Returns the row's new state, or `nil` when `now`
    /// stands.
    ///
    /// The result is what acknowledging before that merge would have given (``ok`` of `before`:
    /// the sent values as originals, what the device held as currents), brought together with
    /// the server's row as the merges since left it (the originals `now` holds), followed by what
    /// the app did after the merge. Field by field:
    /// - set by the app since the merge: as `now` holds it. The app's latest word, even over
    ///   what the device held before the merge (the later edit of a field wins).
    /// - changed both by the device before the merge and by the server, each its own way: as
    ///   `now` holds it. That conflict is real, and the merges settled it by the policy as they
    ///   would have with the base — last writer wins with the server's timestamp, which only a
    ///   merge has.
    /// - any other field: by the merge rules, with the sent values as the base (``ontoMerged``,
    ///   which then finds no conflict). A field only the server changed takes its value; one only
    ///   the device changed stays pending against the sent value.
    ///
    /// A conflict mark on a field whose server value is still the sent one goes: no writer but
    /// this device changed that field, and only the merge's missing base made it a conflict.
    /// A row deleted since the merge stays deleted (a delete carries no values), with the same
    /// marks gone. With no row here (`now` is `nil`), the row's last operation decides: the
    /// app's delete (`deletedSince`: of a local insert, which a delete removes) goes up as a
    /// delete of the row the batch created; a server's delete meets the acknowledged row by the
    /// merge rules. `now` stands, superseded, when the server deleted the row since and the device
    /// keeps it to upload as an insert (a later merge's decision, made on its own values), and
    /// when the device had deleted the insert (`before` is a delete) but the app has changed the
    /// row since the merge: its latest action is an edit of a row the merge showed it, and that
    /// edit is kept rather than the earlier delete.
    ///
    /// Why: merged without a base, the row lost what the device did after the freeze. A delete
    /// left no row, so the merge stored the server's as new and clean; an edit was an insert-insert
    /// conflict with its own sent values, which server wins (and last writer wins, the server row
    /// being newer) settled by dropping it, and client wins settled the other way for the fields
    /// only another writer had changed, putting back the sent values over theirs. Skipped as
    /// superseded, or taken as it stands once the app edited it again, the row kept those losses
    /// for good. Acknowledged from `before`, the sent values are the base, as acknowledging first
    /// gives; the app's changes since the merge come after, as they did.
    ///
    /// Why a delete goes up when there is no row: the merged row may have been another writer's
    /// under the same key (two clients each uploading again a row the server deleted), which the
    /// server then deleted, with the push after that: the server created the row from the batch
    /// after every merge here. Read as the server's delete, the app's delete never went up and
    /// the server kept the row (`EchoBeforeAckTests.aDeleteAfterAnotherWritersRowWasMergedAndDeletedGoesUp`).
    /// When the push came first, the server no longer has the row: it answers the delete `ok`,
    /// but until the delete goes up, an insert the app makes under the key again is an update
    /// of a row the server lacks, answered `conflict` with nothing in the next delta to settle
    /// it. So the acknowledgement also clears the anchor, and the next pull, a snapshot, shows
    /// whether the server has the row.
    static func echoed(
        _ change: RowChange, before: RowChange, now: RowState?, editedSince: Set<String>, deletedSince: Bool, serverValues: [String: Value],
        meet: (_ acked: RowState, _ merged: RowState?) throws -> MergeOutcome?
    ) rethrows -> MergeOutcome? {
        let held = before.kind == .delete ? nil : RowState(
            fields: before.values.filter { !$0.value.isNull }.mapValues { RowState.Field(original: .null, current: $0) }, isInserted: true
        )
        // An accepted insert always gives a row (a pending delete when the device held none).
        guard var acked = ok(change, local: held, serverValues: serverValues) else { return nil }
        guard let now else {
            guard deletedSince else { return try meet(acked, nil) }
            return ok(change, local: nil, serverValues: serverValues).map { MergeOutcome(state: $0) }
        }
        if now.isInserted { return nil }
        if held == nil {
            return hasLocalChanges(now) || !editedSince.isEmpty ? nil : try meet(acked, now)
        }
        let sent = acked.fields.mapValues(\.original)
        var state: RowState
        var decisions: [FieldDecision] = []
        if now.isDeleted {
            state = now
        } else {
            // The fields whose state in `now` stands; `meet` finds nothing to merge in them.
            var kept: [String: RowState.Field] = [:]
            for f in Set(acked.fields.keys).union(now.fields.keys) {
                let a = acked.fields[f] ?? .clean(.null)
                let server = now.fields[f]?.original ?? .null
                // Key fields are in neither `before` nor `now`: never both changed.
                let bothChanged = a.current != a.original && server != a.original && server != a.current
                if editedSince.contains(f) || bothChanged {
                    kept[f] = now.fields[f] ?? .clean(.null)
                    acked.fields[f] = .clean(server)
                }
            }
            let server = RowState(fields: now.fields.mapValues { .clean($0.original) }.filter { !$0.value.current.isNull })
            // The server's row holds no local changes, so the merge rules always decide.
            guard let outcome = try meet(acked, server), let merged = outcome.state else { return nil }
            state = merged
            decisions = outcome.decisions
            for (f, field) in kept { state.fields[f] = field }
        }
        for (f, field) in state.fields where field.isInConflict && field.original == sent[f] ?? .null {
            state.fields[f]?.isInConflict = false
        }
        state.fields = state.fields.filter { $0.value.isInConflict || !($0.value.original.isNull && $0.value.current.isNull) }
        state.isConflicted = state.fields.values.contains(where: \.isInConflict)
        return MergeOutcome(state: state, decisions: decisions)
    }

    /// Whether a row holds anything the server has not confirmed.
    private static func hasLocalChanges(_ state: RowState) -> Bool {
        state.isConflicted || state.hasLocalValueChanges
    }

    static func rollback(_ change: RowChange, local: RowState?, serverValues: [String: Value]?) -> RowState? {
        guard var state = local else { return nil }
        for (f, sent) in change.values {
            guard let field = state.fields[f] else { continue }
            // Still what was sent: back to the original. Edited again after the batch was
            // frozen: that edit stays, pending against the original.
            if field.current == sent { state.fields[f] = .clean(field.original) }
        }
        for (f, v) in serverValues ?? [:] {
            let field = state.fields[f] ?? .clean(.null)
            // The server's value is the new original; the current follows it unless the app
            // changed the field after the batch was frozen (or deleted the row).
            let edited = !state.isDeleted && field.current != field.original
            state.fields[f] = edited ? RowState.Field(original: v, current: field.current) : .clean(v)
        }
        state.fields = state.fields.filter { !($0.value.original.isNull && $0.value.current.isNull) }
        // A delete made after the batch was frozen stays pending, as does a conflict a later
        // merge raised; with nothing left to upload, the row is simply the server's again.
        if !state.isDeleted && state.fields.values.allSatisfy({ $0.current == $0.original }) { state.isConflicted = false }
        return state
    }
}

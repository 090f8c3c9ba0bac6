import Foundation
import Strata

// A client reset: the store's rows replaced by a server snapshot, each row decided by
// `MergeRules.reset` (the unsynced local edits re-applied on top, or discarded). Two ways in:
//
// - `reset(with:keepLocalChanges:)`: a whole snapshot in hand, applied in one transaction.
// - `sync`'s reset, streamed (`streamReset`): the snapshot arrives page by page; each page is
//   applied in its own transaction, which also stores where the next page starts, so a reset
//   that is killed or loses its network resumes at the next page. Memory holds a page.
//
// A reset must also remove the rows the snapshot no longer holds. The streamed reset finds them
// without holding the snapshot: every row a page names is written by the reset (an unchanged
// one too, as an operation that changes nothing), so after the last page a row whose last
// operation is older than the reset's first was named by no page. This does not depend on the
// order the server sends rows in (strata-server sends them in the order of their key's JSON
// text, which is not the store's key order).

/// Where a streamed client reset stands, stored with each page it applies.
struct ResetProgress: Codable {
    /// Why the server asked for the reset, and its words.
    var reason: ResetRequired.Reason
    var message: String
    /// Decided when the reset began; a resumed reset keeps it.
    var keepLocalChanges: Bool
    /// No operation older than this LSN was written by the reset: a row whose last operation
    /// is older was named by no page so far.
    var fromLSN: UInt64
    /// The page to fetch next.
    var next: PullCursor
    /// The tables the pages listed so far.
    var tables: [String]
}

extension SyncClient {
    static let resetProgressProperty = "strata.sync.reset"

    /// The streamed reset this store is in the middle of, if any.
    static func resetProgress(_ snap: Snapshot) throws -> ResetProgress? { try storedValue(ResetProgress.self, resetProgressProperty, snap) }

    static func saveResetProgress(_ progress: ResetProgress?, _ tx: Transaction) throws { try storeValue(progress, resetProgressProperty, tx) }

    // MARK: A snapshot in hand

    /// Replaces the store's data with a server snapshot, for when the server no longer knows
    /// this client or has lost its history. Tables the snapshot does not list are left alone.
    ///
    /// With `keepLocalChanges`, every unsynced local edit is re-applied on top of the fresh data
    /// (a changed field keeps its local value against the server's as original; a local insert
    /// stays an insert, or becomes an update if the server has the key; a local delete stays a
    /// delete if the server still has the row). Without it, local edits are discarded. A row set
    /// aside (``rejectedRows()``) that the reset leaves without local changes is taken off that list.
    ///
    /// A batch in flight is dropped: it was frozen against data the server no longer has. Its
    /// rows are still pending (only an acknowledgement settles them), so with `keepLocalChanges`
    /// their edits go up again in the next batch.
    ///
    /// ``sync(with:maxAttempts:backoff:maxBatchRows:maxBatchBytes:onReset:progress:)`` resets
    /// itself when the transport throws ``ResetRequired``, page by page as the snapshot arrives.
    ///
    /// - Complexity: O(n log n) over the rows of the listed tables.
    @discardableResult
    public func reset(with snapshot: ServerDelta, keepLocalChanges: Bool) throws(StrataError) -> MergeReport {
        return try strataErrors {
            try store.write { tx in
                var report = MergeReport()
                try Self.dropInFlight(tx)
                try Self.saveResetProgress(nil, tx)
                try Self.savePullCursor(nil, tx)
                var named = Set<RowID>()
                try Self.resetRows(of: snapshot, keep: keepLocalChanges, writeUnchanged: false, report: &report, tx) { named.insert($0) }
                let tables = snapshot.tables.map(\.table)
                try Self.sweepReset(tables, keep: keepLocalChanges, report: &report, tx) { named.contains(Self.rowID($0.table, $0.key)) }
                try Self.dropSettledRejected(in: Set(tables), tx)
                try Self.updateRefusedServerRows(after: snapshot, refused: report.refusedRows, tx)
                try tx.setStrataProperty(Self.anchorProperty, .string(snapshot.anchor))
                return report
            }
        }
    }

    // MARK: A snapshot page by page

    /// `sync`'s client reset: asked for by the server (`asked`), or resumed where a reset that
    /// stopped left off (`asked` nil, a reset in progress stored). Fetches the snapshot page by
    /// page with `fetch` and applies each page in its own transaction.
    func streamReset(
        asked: ResetRequired?, keepLocalChanges: Bool, fetch: (PullCursor) async throws -> PulledPage,
        progress report: (@Sendable (SyncProgress) -> Void)?
    ) async throws -> ClientResetReport {
        var state: ResetProgress
        if let asked {
            state = ResetProgress(reason: asked.reason, message: asked.message, keepLocalChanges: keepLocalChanges,
                                  fromLSN: 0, next: PullCursor(since: nil), tables: [])
        } else {
            guard let stored = try await store.read({ try Self.resetProgress($0) }) else {
                throw StrataError(.invalidOperation, "no client reset is in progress")
            }
            state = stored
        }
        var merged = MergeReport()
        var rows: [String: Int] = [:]
        report?(SyncProgress(phase: .pull, status: .inProgress))
        var fresh = asked != nil
        while true {
            let page = try await fetch(state.next)
            for t in page.delta.tables { rows[t.table, default: 0] += t.upserts.count }
            if fresh && page.next == nil {
                // The whole snapshot came as one page: applied as a snapshot in hand, which
                // writes only the rows it changes.
                merged = try reset(with: page.delta, keepLocalChanges: state.keepLocalChanges)
                break
            }
            let done = try applyResetPage(page, &state, fresh: fresh, into: &merged)
            fresh = false
            report?(SyncProgress(phase: .merge, status: .inProgress, processed: rows))
            if done { break }
        }
        report?(SyncProgress(phase: .pull, status: .ok))
        return ClientResetReport(reason: state.reason, message: state.message, keptLocalChanges: state.keepLocalChanges, merge: merged)
    }

    /// Applies one page of a streamed reset (not the only page) in its own transaction, and
    /// stores where the next one starts; answers whether it was the last.
    private func applyResetPage(_ page: PulledPage, _ state: inout ResetProgress, fresh: Bool, into merged: inout MergeReport) throws -> Bool {
        try store.write { tx in
            if fresh {
                try Self.dropInFlight(tx)
                try Self.savePullCursor(nil, tx)
                state.fromLSN = try tx.snapshot.lastLSN + 1
            }
            var pageReport = MergeReport()
            try Self.resetRows(of: page.delta, keep: state.keepLocalChanges, writeUnchanged: true, report: &pageReport, tx) { _ in }
            for t in page.delta.tables where !state.tables.contains(t.table) { state.tables.append(t.table) }
            var part = page.delta
            part.mode = .incremental
            try Self.updateRefusedServerRows(after: part, refused: pageReport.refusedRows, tx)
            merged.absorb(pageReport)
            if let next = page.next {
                state.next = next
                try Self.saveResetProgress(state, tx)
                return false
            }
            // The last page: the rows no page named are gone from the server.
            let from = state.fromLSN
            try Self.sweepReset(state.tables, keep: state.keepLocalChanges, report: &merged, tx) { $0.lastLSN >= from }
            try Self.dropRefusedServerRows(of: Set(state.tables), exceptAnchor: page.delta.anchor, tx)
            try Self.dropSettledRejected(in: Set(state.tables), tx)
            try Self.saveResetProgress(nil, tx)
            try tx.setStrataProperty(Self.anchorProperty, .string(page.delta.anchor))
            return true
        }
    }

    // MARK: The rules' application

    /// Sets every row `snapshot` lists to its reset state, and tells `named` each key it names.
    /// `writeUnchanged` writes the rows whose state does not change too, as a streamed reset
    /// must (see the top of this file); `reset(with:)` writes only changes.
    private static func resetRows(
        of snapshot: ServerDelta, keep: Bool, writeUnchanged: Bool, report: inout MergeReport, _ tx: Transaction, named: (RowID) -> Void
    ) throws {
        // The audit names the snapshot; it also makes an operation that changes nothing a logged
        // one, which the streamed reset's sweep relies on.
        func audit(_ row: ServerRow) -> [UInt8] {
            MergeAudit(anchor: snapshot.anchor, serverVersion: row.version, conflict: nil, resolution: nil, policy: nil, decisions: []).encoded
        }
        for table in snapshot.tables {
            let schema = try tx.snapshot.schema(table.table)
            for row in table.upserts {
                let key = RowKey(schema.primaryKey.compactMap { row.fields[$0] })
                named(rowID(table.table, key))
                // A row this store cannot hold (`RowRule`) is set aside, as a merge sets it
                // aside; what the store holds under its key stays.
                if let reason = RefusedServerRow.reason(refusing: row, key, of: schema) {
                    report.refusedRows.append(RefusedServerRow(table: table.table, key: key, reason: reason, anchor: snapshot.anchor))
                    if writeUnchanged, case let local?? = try rowUnlessRefused(table.table, key, tx) {
                        try tx.setRowState(table.table, key: key, RowState(local), kind: .reset, origin: .server, annotation: audit(row))
                    }
                    continue
                }
                var fields = row.fields.filter { !schema.primaryKey.contains($0.key) }
                // As in a merge, fields the server leaves out take their defaults.
                for f in schema.fields where schema.mode == .fixed && !schema.primaryKey.contains(f.name) && fields[f.name] == nil {
                    if let d = f.defaultValue { fields[f.name] = d }
                }
                let local = try tx.row(table.table, key: key, includingDeleted: true).map(RowState.init)
                let state = MergeRules.reset(local: local, server: fields, keepLocalChanges: keep)
                if state != local { report.rowsApplied += 1 }
                if state != local || writeUnchanged {
                    try tx.setRowState(table.table, key: key, state, kind: .reset, origin: .server, annotation: audit(row))
                }
            }
        }
    }

    /// Sets the rows of `tables` that no page named (`named` false) to their reset state with
    /// no server row: a row the server had is removed, a local insert stays (or goes, without
    /// `keep`), and so on (`MergeRules.reset`).
    ///
    /// - Complexity: O(n) reads over the tables' n rows; memory holds the keys of the rows not
    ///   named (the rows the server deleted).
    private static func sweepReset(
        _ tables: [String], keep: Bool, report: inout MergeReport, _ tx: Transaction, named: (Row) -> Bool
    ) throws {
        for table in tables {
            // Keys first, written after: the rows are not changed under the scan.
            var unnamed: [RowKey] = []
            try tx.snapshot.forEachRow(table, includingDeleted: true) { row in
                if !named(row) { unnamed.append(row.key) }
                return true
            }
            for key in unnamed {
                let local = try tx.row(table, key: key, includingDeleted: true).map(RowState.init)
                let state = MergeRules.reset(local: local, server: nil, keepLocalChanges: keep)
                if state != local {
                    try tx.setRowState(table, key: key, state, kind: .reset, origin: .server)
                    report.rowsApplied += 1
                }
            }
        }
    }
}

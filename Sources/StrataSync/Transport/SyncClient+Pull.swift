import Foundation
import Strata

// The pull of `sync`: page by page, each page merged in its own write transaction as it
// arrives, while the next one is fetched; memory holds a page or two, never the delta.
//
// - An incremental pull: every page is a delta of its own (the server sends rows in version
//   order, and versions commit in order, so a page is a prefix of the server's history). Its
//   merge stores its anchor: a sync that stops resumes from the last page merged.
// - A snapshot (a first sync, or `pull(since: nil)`): its pages are parts of one snapshot, whose
//   rows missing from every page were deleted on the server. When nothing in the store could be
//   such a row (every row is a local insert the server never saw, as in a new store) and no
//   batch is in flight, each page merges on its own and stores the cursor of the next page, and
//   the anchor moves with the last page: a sync that stops resumes at the next page. Otherwise
//   the pages are combined and merged as one snapshot, as before.

extension SyncClient {
    static let pullCursorProperty = "strata.sync.pullCursor"

    /// The cursor where a snapshot merged page by page stopped, if it did.
    static func pullCursor(_ snap: Snapshot) throws -> PullCursor? { try storedValue(PullCursor.self, pullCursorProperty, snap) }

    static func savePullCursor(_ cursor: PullCursor?, _ tx: Transaction) throws { try storeValue(cursor, pullCursorProperty, tx) }

    /// A value of sync state kept in a `strata.` property, as `WireFormat` encodes it; `nil`
    /// when the property is not set.
    static func storedValue<T: Decodable>(_ type: T.Type, _ property: String, _ snap: Snapshot) throws -> T? {
        guard let b = try snap.property(property)?.bytesValue else { return nil }
        return try WireFormat.decode(T.self, from: Data(b))
    }

    /// Keeps `value` in `property` (`nil` removes it; removing an unset one writes nothing).
    static func storeValue<T: Encodable>(_ value: T?, _ property: String, _ tx: Transaction) throws {
        guard let value else {
            if try tx.property(property) != nil { try tx.setStrataProperty(property, nil) }
            return
        }
        try tx.setStrataProperty(property, .bytes(Array(try WireFormat.encoder.encode(value))))
    }

    /// Whether a snapshot can be merged page by page: no batch in flight, and no row in the store
    /// but local inserts (which a snapshot keeps), so that no row can be one the snapshot leaves
    /// out. Reads at most one row per table.
    func snapshotStreams() throws -> Bool {
        try store.read { snap in
            guard try snap.property(Self.inFlightProperty) == nil else { return false }
            for table in try snap.tables {
                var onlyInserts = true
                try snap.forEachRow(table.name, includingDeleted: true) { row in
                    if row.status != .inserted { onlyInserts = false }
                    return onlyInserts
                }
                if !onlyInserts { return false }
            }
            return true
        }
    }

    /// Pulls from the stored anchor (or where a stopped snapshot left off) and merges page by
    /// page; returns what the merges did, summed.
    ///
    /// - Parameters:
    ///   - fetch: fetches a page, with `sync`'s retries.
    ///   - progress: told after each page: rows merged so far, per table.
    func pullAndMerge(
        _ transport: some SyncTransport, fetch: (PullCursor) async throws -> PulledPage, progress: (@Sendable (SyncProgress) -> Void)?
    ) async throws -> MergeReport {
        let anchor = try self.anchor()
        var cursor = PullCursor(since: anchor)
        var streams = false
        if anchor == nil {
            if let stopped = try await store.read({ try Self.pullCursor($0) }) {
                cursor = stopped
                streams = true
            } else {
                streams = try snapshotStreams()
            }
        }
        var report = MergeReport()
        var combined: ServerDelta?   // a snapshot that cannot stream, its pages held until the last
        var merged: [String: Int] = [:]
        var pages = 0
        var page = try await fetch(cursor)
        while true {
            // The next page travels while this one merges.
            let next = page.next
            let prefetch = next.map { c in Task { try await transport.pullPage(c) } }
            do {
                report.absorb(try mergePage(page, of: cursor, streams: streams, combined: &combined))
            } catch {
                prefetch?.cancel()
                throw error
            }
            for t in page.delta.tables { merged[t.table, default: 0] += t.upserts.count + t.deletes.count }
            pages += 1
            if next != nil || pages > 1 {
                // See `pullOverlayBound`: a phone's memory stays flat whatever the delta's size.
                try store.checkpoint(ifOverlayExceeds: pullOverlayBound)
            }
            progress?(SyncProgress(phase: .merge, status: .inProgress, processed: merged))
            guard let next, let prefetch else { break }
            cursor = next
            do {
                page = try await prefetch.value
            } catch {
                // Fetched again with `sync`'s retries (a ResetRequired comes back at once and
                // reaches `sync`'s reset).
                page = try await fetch(next)
            }
        }
        progress?(SyncProgress(phase: .merge, status: .ok, total: merged, processed: merged))
        return report
    }

    /// Merges one page of a pull from `cursor` (see the top of this file).
    private func mergePage(_ page: PulledPage, of cursor: PullCursor, streams: Bool, combined: inout ServerDelta?) throws -> MergeReport {
        if !cursor.isSnapshot {
            return try merge(page.delta, policy: nil, abortingWith: nil)
        }
        if streams {
            var part = page.delta
            part.mode = .incremental
            part.since = nil
            return try merge(part, policy: nil, end: page.next.map { .resumeAt($0) } ?? .anchor, abortingWith: nil)
        }
        combined = combined.map { HTTPSyncTransport.append(page.delta, to: $0) } ?? page.delta
        return page.next == nil ? try merge(combined!, policy: nil, abortingWith: nil) : MergeReport()
    }
}

import Foundation
import Strata
@testable import StrataSync
import StrataWorkload
import Synchronization
import Testing

/// A transport that serves a delta page by page, as `strata-server` does: an incremental delta
/// in pages that each continue from the last (anchors `p1`, `p2`, …), a snapshot in pages of one
/// snapshot. It counts the pages it serves, and can fail from a page on (a sync killed there).
final class PagingTransport: SyncTransport {
    let delta: ServerDelta
    let pageSize: Int
    /// Pages served so far.
    let served = Atomic<Int>(0)
    /// From this page number on (0-based), every fetch fails with `io`.
    let failFrom: Int?
    /// An incremental pull is answered with `ResetRequired`: the server lost this client's
    /// history, and the (snapshot) delta is what it holds now.
    let asksForReset: Bool

    init(_ delta: ServerDelta, pageSize: Int, failFrom: Int? = nil, asksForReset: Bool = false) {
        self.delta = delta
        self.pageSize = pageSize
        self.failFrom = failFrom
        self.asksForReset = asksForReset
    }

    /// The rows in order: (table, an upsert or a delete).
    private var rows: [(String, ServerRow?, RowKey?)] {
        delta.tables.flatMap { t in t.upserts.map { (t.table, $0, nil) } + t.deletes.map { (t.table, nil, $0) } }
    }

    var pageCount: Int { max(1, (rows.count + pageSize - 1) / pageSize) }

    func pull(since anchor: String?) async throws -> ServerDelta { delta }

    func push(_ batch: Batch) async throws -> BatchAck {
        BatchAck(batchID: batch.id, results: batch.changes.map { .ok($0.table, $0.key) })
    }

    func pullPage(_ cursor: PullCursor) async throws -> PulledPage {
        // A store already at the delta's anchor gets an empty page.
        if cursor.since == delta.anchor { return PulledPage(delta: ServerDelta(since: delta.anchor, anchor: delta.anchor, tables: []), next: nil) }
        if asksForReset && cursor.since != nil { throw ResetRequired(.anchorExpired, message: "history pruned") }
        let index = cursor.until == nil ? 0 : Int(cursor.after!)!
        if let failFrom, index >= failFrom { throw StrataError(.io, "the network is gone (page \(index))") }
        served.add(1, ordering: .relaxed)
        let all = rows
        let slice = all[min(index * pageSize, all.count)..<min((index + 1) * pageSize, all.count)]
        // A snapshot page lists every table, rows or not, as `strata-server` does: a table it
        // leaves out is not part of the snapshot, and its rows would not be swept.
        var tables: [TableDelta] = delta.mode == .snapshot ? delta.tables.map { TableDelta($0.table) } : []
        for (table, upsert, delete) in slice {
            if !tables.contains(where: { $0.table == table }) { tables.append(TableDelta(table)) }
            let i = tables.firstIndex { $0.table == table }!
            if let upsert { tables[i].upserts.append(upsert) }
            if let delete { tables[i].deletes.append(delete) }
        }
        let last = index + 1 >= pageCount
        var page = delta
        page.tables = tables
        if delta.mode == .incremental {
            page.since = index == 0 ? delta.since : "p\(index)"
            page.anchor = last ? delta.anchor : "p\(index + 1)"
        }
        let next = last ? nil : PullCursor(since: cursor.since, until: "u", after: String(index + 1))
        return PulledPage(delta: page, next: next)
    }
}

@Suite struct StreamedPullTests {
    static let policies: [ConflictPolicy] = [.serverWins, .clientWins, .deferred, .lastWriterWins]

    /// Local state to merge onto: rows 1…40 the server confirmed (merged from a delta with
    /// anchor `a0`, or, before a snapshot, acknowledged with no anchor), then random local edits.
    static func prepare(_ store: Store, _ random: inout SplitMix64, serverRows: Bool, anchored: Bool) throws {
        if serverRows && anchored {
            try SyncClient(store: store).merge(ServerDelta(anchor: "a0", tables: [
                TableDelta("tasks", upserts: (1...40).map { ServerRow(["id": .int(Int64($0)), "title": .string("s\($0)")]) }),
            ]))
        } else if serverRows {
            try store.write { tx in
                for id in 1...40 {
                    try tx.insert("tasks", ["id": .int(Int64(id)), "title": .string("s\(id)")])
                    try tx.acknowledge("tasks", key: RowKey(.int(Int64(id))))
                }
            }
        }
        try store.write { tx in
            for _ in 0..<random.below(30) {
                let id = Int64(1 + random.below(60))
                let row = try tx.snapshot.row("tasks", key: RowKey(.int(id)))
                switch (row == nil, random.below(3)) {
                case (true, _): try tx.insert("tasks", ["id": .int(id), "title": .string("local \(id)")])
                case (false, 0): try tx.delete("tasks", key: RowKey(.int(id)))
                default: try tx.update("tasks", key: RowKey(.int(id)), ["title": .string("edit \(id)"), "done": true])
                }
            }
        }
    }

    static func delta(_ random: inout SplitMix64, snapshot: Bool) -> ServerDelta {
        var upserts: [ServerRow] = []
        var deletes: [RowKey] = []
        for id in Set((0..<random.below(120)).map { _ in Int64(1 + random.below(80)) }).sorted() {
            if !snapshot && random.below(5) == 0 {
                deletes.append(RowKey(.int(id)))
            } else if random.below(3) == 0 {
                // The row as `prepare` confirmed it: nothing for a merge or a reset to change.
                upserts.append(ServerRow(["id": .int(id), "title": .string("s\(id)")]))
            } else {
                upserts.append(ServerRow(["id": .int(id), "title": .string("server \(id) \(random.below(3))"), "priority": .int(Int64(random.below(3)))], timestamp: Date(timeIntervalSince1970: 1000)))
            }
        }
        return snapshot
            ? ServerDelta(anchor: "z", mode: .snapshot, tables: [TableDelta("tasks", upserts: upserts)])
            : ServerDelta(since: "a0", anchor: "z", tables: [TableDelta("tasks", upserts: upserts, deletes: deletes)])
    }

    /// Rows and anchor: what must be equal after a streamed and a one-shot merge.
    static func state(_ store: Store) throws -> [String] {
        try store.read { snap in
            try snap.rows("tasks", includingDeleted: true).map(\.description) + ["anchor \(String(describing: try snap.property(SyncClient.anchorProperty)))"]
        }
    }

    /// A delta merged page by page (through `sync`) leaves the store as one merge of the whole
    /// delta does: over page sizes, policies, pending local edits, incremental pulls and
    /// snapshots (streamed when the store holds only local inserts, combined otherwise).
    @Test func aStreamedMergeEqualsAOneShotMerge() async throws {
        var random = SplitMix64(seed: testSeed("aStreamedMergeEqualsAOneShotMerge"))
        for trial in 0..<60 {
            let snapshot = random.below(2) == 0
            let serverRows = !snapshot || random.below(3) == 0
            let policy = Self.policies[random.below(Self.policies.count)]
            let pageSize = 1 + random.below(25)
            let delta = Self.delta(&random, snapshot: snapshot)
            let seed = random.next()
            try await withStoreAsync { streamed in
                try await withStoreAsync { whole in
                    var r1 = SplitMix64(seed: seed), r2 = SplitMix64(seed: seed)
                    // A snapshot is what a store without an anchor pulls.
                    try Self.prepare(streamed, &r1, serverRows: serverRows, anchored: !snapshot)
                    try Self.prepare(whole, &r2, serverRows: serverRows, anchored: !snapshot)
                    let transport = PagingTransport(delta, pageSize: pageSize)
                    // Pushes nothing: only the pull and merge are compared.
                    _ = try await SyncClient(store: streamed, policy: policy).sync(with: transport, maxBatchRows: 1)
                    try SyncClient(store: whole, policy: policy).merge(delta)
                    // `sync` also pushed: acknowledge the same on the other store.
                    let other = SyncClient(store: whole, policy: policy)
                    while let batch = try other.nextBatch(maxRows: 1) { try other.acknowledge(try await transport.push(batch)) }
                    #expect(try Self.state(streamed) == Self.state(whole), "trial \(trial): snapshot \(snapshot), server rows \(serverRows), \(policy.kind), pages of \(pageSize)")
                    #expect(transport.served.load(ordering: .relaxed) == transport.pageCount, "trial \(trial)")
                }
            }
        }
    }

    /// A first sync that stops at a random page (the network gone, or the process killed: what
    /// is merged is committed page by page) resumes at the next page: it fetches no page twice,
    /// and the store ends as a sync that never stopped leaves it.
    @Test func aFirstSyncThatStopsResumesAtTheNextPage() async throws {
        var random = SplitMix64(seed: testSeed("aFirstSyncThatStopsResumesAtTheNextPage"))
        for trial in 0..<30 {
            let delta = Self.delta(&random, snapshot: true)
            let pageSize = 1 + random.below(10)
            let pages = PagingTransport(delta, pageSize: pageSize).pageCount
            let stopAt = random.below(pages + 1)
            try await withStoreAsync { store in
                try await withStoreAsync { reference in
                    let sync = SyncClient(store: store)
                    let broken = PagingTransport(delta, pageSize: pageSize, failFrom: stopAt)
                    if stopAt < pages {
                        await #expect(throws: StrataError.self) { try await sync.sync(with: broken, maxAttempts: 1) }
                        #expect(try sync.anchor() == nil, "trial \(trial): the anchor moves only with the last page")
                    } else {
                        _ = try await sync.sync(with: broken, maxAttempts: 1)
                    }
                    let healed = PagingTransport(delta, pageSize: pageSize)
                    _ = try await sync.sync(with: healed)
                    #expect(broken.served.load(ordering: .relaxed) + healed.served.load(ordering: .relaxed) == pages,
                            "trial \(trial): \(pages) pages, stopped at \(stopAt), then \(healed.served.load(ordering: .relaxed)) fetched")
                    _ = try await SyncClient(store: reference).sync(with: PagingTransport(delta, pageSize: pageSize))
                    #expect(try Self.state(store) == Self.state(reference), "trial \(trial)")
                }
            }
        }
    }

    /// A pull of several pages checkpoints after a page that leaves the overlay over the
    /// client's bound, so a first sync's memory does not grow with the delta; the rows are the
    /// same either way.
    @Test func aPullOfManyPagesKeepsTheOverlayUnderItsBound() async throws {
        let delta = ServerDelta(anchor: "z", mode: .snapshot, tables: [
            TableDelta("tasks", upserts: (1...400).map { ServerRow(["id": .int(Int64($0)), "title": .string("server \($0)")]) }),
        ])
        try await withStoreAsync { bounded in
            try await withStoreAsync { unbounded in
                _ = try await SyncClient(store: bounded, policy: .serverWins, mergesOnRecords: true, pullOverlayBound: 16 << 10).sync(with: PagingTransport(delta, pageSize: 50))
                _ = try await SyncClient(store: unbounded, policy: .serverWins).sync(with: PagingTransport(delta, pageSize: 50))
                #expect(bounded.overlayBytes <= 16 << 10, "the last page's checkpoint leaves at most the bound")
                #expect(unbounded.overlayBytes > 16 << 10, "400 rows fill more than 16 KiB of overlay: the bound above is what emptied it")
                #expect(try Self.state(bounded) == Self.state(unbounded))
            }
        }
    }

    /// A client reset streamed page by page (each page in its own transaction, the rows no page
    /// names swept after the last) leaves the store as a reset with the whole snapshot in hand:
    /// over page sizes, keeping or discarding local edits, a batch in flight or not, and server
    /// rows gone from the snapshot.
    @Test func aStreamedResetEqualsAOneShotReset() async throws {
        var random = SplitMix64(seed: testSeed("aStreamedResetEqualsAOneShotReset"))
        for trial in 0..<60 {
            let keep = random.below(2) == 0
            let pageSize = 1 + random.below(25)
            let inFlight = random.below(2) == 0
            let snapshot = Self.delta(&random, snapshot: true)
            let seed = random.next()
            try await withStoreAsync { streamed in
                try await withStoreAsync { whole in
                    for store in [streamed, whole] {
                        var r = SplitMix64(seed: seed)
                        try Self.prepare(store, &r, serverRows: true, anchored: true)
                        if inFlight, let batch = try SyncClient(store: store).nextBatch(maxRows: 3) { try SyncClient(store: store).markSent(batch) }
                    }
                    let transport = PagingTransport(snapshot, pageSize: pageSize, asksForReset: true)
                    let report = try await SyncClient(store: streamed).sync(with: transport, maxBatchRows: 1, onReset: keep ? .keepLocalChanges : .discardLocalChanges)
                    let other = SyncClient(store: whole)
                    // `sync` sends a batch in flight first, and the server takes it.
                    if let (batch, _) = try other.inFlightBatch() { try other.acknowledge(try await transport.push(batch)) }
                    let applied = try other.reset(with: snapshot, keepLocalChanges: keep).rowsApplied
                    while let batch = try other.nextBatch(maxRows: 1) { try other.acknowledge(try await transport.push(batch)) }
                    let context = "trial \(trial): keep \(keep), in flight \(inFlight), pages of \(pageSize)"
                    #expect(try Self.state(streamed) == Self.state(whole), "\(context)")
                    #expect(report.reset?.merge.rowsApplied == applied, "\(context)")
                    #expect(transport.served.load(ordering: .relaxed) == transport.pageCount, "\(context)")
                }
            }
        }
    }

    /// A client reset that stops at a random page resumes at the next page in the next sync,
    /// whatever that sync's `onReset` (the store holds part of the snapshot): it fetches no page
    /// twice, the anchor stays until the last page, and the store ends as after a reset that
    /// never stopped.
    @Test func aResetThatStopsResumesAtTheNextPage() async throws {
        var random = SplitMix64(seed: testSeed("aResetThatStopsResumesAtTheNextPage"))
        for trial in 0..<30 {
            let snapshot = Self.delta(&random, snapshot: true)
            let pageSize = 1 + random.below(10)
            let pages = PagingTransport(snapshot, pageSize: pageSize).pageCount
            let stopAt = random.below(pages + 1)
            let seed = random.next()
            try await withStoreAsync { store in
                try await withStoreAsync { reference in
                    for s in [store, reference] {
                        var r = SplitMix64(seed: seed)
                        try Self.prepare(s, &r, serverRows: true, anchored: true)
                    }
                    let sync = SyncClient(store: store)
                    let broken = PagingTransport(snapshot, pageSize: pageSize, failFrom: stopAt, asksForReset: true)
                    if stopAt < pages {
                        await #expect(throws: StrataError.self) { try await sync.sync(with: broken, maxAttempts: 1, maxBatchRows: 1) }
                        #expect(try sync.anchor() == "a0", "trial \(trial): the anchor moves only with the last page")
                    } else {
                        _ = try await sync.sync(with: broken, maxAttempts: 1, maxBatchRows: 1)
                    }
                    let healed = PagingTransport(snapshot, pageSize: pageSize, asksForReset: true)
                    // A reset in progress goes on even when the app now says `.fail`.
                    let inProgress = stopAt > 0 && stopAt < pages
                    let report = try await sync.sync(with: healed, maxBatchRows: 1, onReset: inProgress ? .fail : .keepLocalChanges)
                    #expect(stopAt == pages || report.reset != nil, "trial \(trial): the resumed reset is reported")
                    #expect(broken.served.load(ordering: .relaxed) + healed.served.load(ordering: .relaxed) == pages,
                            "trial \(trial): \(pages) pages, stopped at \(stopAt), then \(healed.served.load(ordering: .relaxed)) fetched")
                    _ = try await SyncClient(store: reference).sync(with: PagingTransport(snapshot, pageSize: pageSize, asksForReset: true), maxBatchRows: 1)
                    #expect(try Self.state(store) == Self.state(reference), "trial \(trial)")
                }
            }
        }
    }
}

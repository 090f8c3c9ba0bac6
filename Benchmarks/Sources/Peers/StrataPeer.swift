import Foundation
import Strata
import StrataSync
import StrataWorkload

/// Strata on the reference workload, with full durability.
public final class StrataPeer: Peer {
    public let name = "Strata"
    let folder: String
    public let store: Store
    private var preloadFields: [FieldValues] = []
    private var edits: [StrataEdit] = []

    public init(folder: String, durability: Durability = .full) throws {
        self.folder = folder
        var options = StoreOptions()
        options.durability = durability
        options.initialMapSize = 1 << 30
        // STRATA_FOLD_WORKERS=1 measures the sequential fold against the parallel one in one build.
        if let workers = ProcessInfo.processInfo.environment["STRATA_FOLD_WORKERS"].flatMap(Int.init) { options.foldWorkers = workers }
        // STRATA_OVERLAY_MIB sets StoreOptions.overlayBudget: how often the edit phase checkpoints,
        // against the file's size (a checkpoint's copy-on-write pages set the file's high-water mark).
        if let mib = ProcessInfo.processInfo.environment["STRATA_OVERLAY_MIB"].flatMap(Int.init) { options.overlayBudget = mib << 20 }
        store = try Store(path: folder, options: options)
        if try store.tables.isEmpty { try store.createTable(ReferenceWorkload.schema) }
    }

    public func prepare(_ workload: ReferenceWorkload) {
        preloadFields = workload.strataPreload()
        edits = workload.strataEdits()
    }

    public func preload() throws {
        try store.write { tx in for f in preloadFields { try tx.insert("tasks", f) } }
    }

    public func markPreloadSynced() throws {
        try store.write { tx in for i in 1...preloadFields.count { try tx.acknowledge("tasks", key: RowKey(.int(Int64(i)))) } }
    }

    /// The log's last LSN after each `applyEdits` call, keyed by the edits applied so far: an
    /// edit that changes nothing (a value set to what it is) logs no operation, so edits and
    /// LSNs do not correspond one to one.
    private var lsnAfter: [Int: UInt64] = [:]

    public func applyEdits(_ range: Range<Int>) throws {
        lsnAfter[range.upperBound] = try store.write { tx in
            for e in edits[range] { try e.apply(in: tx) }
            return try tx.snapshot.lastLSN
        }
    }

    /// The pending rows are already coalesced (first originals, last currents, insert+delete
    /// gone): `pendingChangeset` copies them from the stored records into one buffer.
    public func pendingPayload() throws -> Int {
        try store.read { try $0.pendingChangeset("tasks") }.bytes.count
    }

    public func rebuildAndCheck() throws -> Bool {
        try store.verify().isConsistent
    }

    public func row(_ id: Int64, afterEdits edits: Int, batch: Int) throws -> [Value]?? {
        // Before any edit: the preload's inserts and their acknowledgements.
        let lsn = edits == 0 ? UInt64(2 * preloadFields.count) : lsnAfter[edits]!
        let row = try store.read { try $0.row("tasks", key: RowKey(.int(id)), asOf: lsn) }
        return .some(row.map { r in ReferenceWorkload.columns.map { r[$0] } })
    }

    public func editTitles(_ count: Int) throws {
        try store.write { tx in
            for id in 1...Int64(count) { try tx.update("tasks", key: RowKey(.int(id)), ["title": .string(MergeWorkload.localTitle(id))]) }
        }
    }

    /// The delta is built before the clock starts: a sync client receives it decoded.
    public func makeDelta(_ w: MergeWorkload) -> ServerDelta {
        var rows: [ServerRow] = []
        rows.reserveCapacity(w.rows)
        for id in 1...Int64(w.rows) {
            var fields: [String: Value] = ["id": .int(id), "priority": .int(w.serverPriority(id))]
            if let t = w.serverTitle(id) { fields["title"] = .string(t) }
            rows.append(ServerRow(fields))
        }
        return ServerDelta(anchor: "bench", tables: [TableDelta("tasks", upserts: rows)])
    }

    public var delta: ServerDelta?

    public func merge(_ w: MergeWorkload) throws -> Bool {
        _ = try SyncClient(store: store, policy: .serverWins).merge(delta ?? makeDelta(w))
        return true
    }

    public func checkpoint() throws { try store.checkpoint() }

    public func readRow(_ id: Int64) throws -> Bool {
        try store.read { try $0.row("tasks", key: RowKey(.int(id))) } != nil
    }

    public var sizeOnDisk: Int {
        (try? FileManager.default.attributesOfItem(atPath: folder + "/data.mdb")[.size] as? Int) ?? 0
    }
}

import Foundation
import LMDB

extension Store {
    /// Builds a new store at `path` from this store's log up to and including LSN `lsn`: its
    /// tables are this store's tables as they were right after that operation, with the same
    /// schema catalog and a log that ends there.
    ///
    /// This is how a recorded log reproduces a user's bug report, drives a benchmark, or shows a
    /// whole table as of a point in time. The replay is not durable until it returns (it uses
    /// ``Durability/noSync`` and flushes at the end).
    ///
    /// - Throws: ``StrataError`` `io` when `path` already holds a store, `compacted` when `lsn`
    ///   is before the compaction horizon.
    /// - Complexity: O(m log n) for the m operations replayed.
    /// `progress`, if given, is called now and then with the operations replayed so far and the
    /// number to replay.
    @discardableResult
    public func replay(into path: String, through lsn: UInt64 = .max, progress: ((_ done: Int, _ total: Int) -> Void)? = nil) throws -> Store {
        try enterCall()  // fails on a closed Store; counts the call so close() waits for it
        defer { leaveCall() }
        guard !FileManager.default.fileExists(atPath: path + "/data.mdb") else {
            throw StrataError(.io, "'\(path)' already holds a store; replay needs an empty folder")
        }
        let horizon = try read { try $0.horizon }
        guard lsn >= horizon else {
            throw StrataError(.compacted, "cannot replay through LSN \(lsn): the log was compacted through LSN \(horizon), so the store's state before that is gone")
        }
        var options = StoreOptions()
        options.durability = .noSync
        options.initialMapSize = max(env.usedBytes * 2, 16 << 20)
        let target = try Store(path: path, options: options)
        try Store.mappingStorageErrors {
            try env.read { source in
                try target.env.write { txn in
                    // The catalog as it is now: operations name tables and fields by id, and ids
                    // are never reused, so the current catalog reads every older operation.
                    if let catalog = try source.meta(MetaKey.catalog, in: views) {
                        try txn.setMeta(MetaKey.catalog, Array(catalog), in: target.views)
                    }
                    try txn.setMeta(MetaKey.catalogVersion, try source.metaUInt64(MetaKey.catalogVersion, in: views) ?? 0, in: target.views)
                    // A compacted store starts from its base snapshot, which the replay keeps.
                    let catalog = try currentCatalog(source)
                    try txn.setMeta(MetaKey.horizon, horizon, in: target.views)
                    // The operations are copied as they are: those before checksums stay without.
                    try txn.setMeta(MetaKey.checksumsFrom, try source.checksumsFrom(in: views), in: target.views)
                    _ = try Store.fold(
                        from: source, views, into: txn, target.views, catalog: catalog, budget: self.options.foldMemoryLimit, workers: self.options.foldWorkers,
                        through: lsn, copying: true, progress: progress
                    )
                    // The fold wrote the views themselves: they are current through the last
                    // operation copied.
                    try txn.setMeta(MetaKey.viewsLSN, try txn.lastLSN(in: target.views), in: target.views)
                }
            }
        }
        try target.flush()
        return target
    }
}

extension Snapshot {
    /// Field-level blame: for each field of the row, the operation that last set it.
    ///
    /// - Complexity: O(h log m) for h operations on the row.
    public func blame(_ table: String, key: RowKey) throws -> [String: LogEntry] {
        var blame: [String: LogEntry] = [:]
        for entry in try history(table, key: key) {
            for change in entry.changes { blame[change.field] = entry }
        }
        return blame
    }
}

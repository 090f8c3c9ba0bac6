import Foundation
import LMDB

extension Store {
    /// Builds a new store at `path` from this store's log up to and including LSN `lsn`: its
    /// tables are this store's tables as they were right after that operation, with the same
    /// schema catalog and a log that ends there.
    ///
    /// This is how a recorded log reproduces a user's bug report, drives a benchmark, or shows a
    /// whole table as of a point in time.
    ///
    /// The new store is built in a hidden folder inside `path` (`.replay-<pid>-…`) and committed
    /// in steps of a few MiB, so memory stays bounded however long the log is; its `data.mdb`
    /// is moved into `path` only when it is complete and flushed to disk. A replay that fails or
    /// is killed leaves no store at `path` (a later replay into it removes the leftover folder).
    /// The returned store is opened with default ``StoreOptions``.
    ///
    /// - Throws: ``StrataError`` `io` when `path` already holds a store, `compacted` when `lsn`
    ///   is before the compaction horizon, `corruptRecord` when an operation up to `lsn` is
    ///   damaged.
    /// - Complexity: O(m log n) for the m operations replayed.
    /// `progress`, if given, is called now and then with the operations replayed so far and the
    /// number to replay.
    @discardableResult
    public func replay(into path: String, through lsn: UInt64 = .max, progress: ((_ done: Int, _ total: Int) -> Void)? = nil) throws(StrataError) -> Store {
        return try strataErrors {
            try enterCall()  // fails on a closed Store; counts the call so close() waits for it
            defer { leaveCall() }
            guard !FileManager.default.fileExists(atPath: path + "/data.mdb") else {
                throw StrataError(.io, "'\(path)' already holds a store; replay needs an empty folder")
            }
            let horizon = try read { try $0.horizon }
            guard lsn >= horizon else {
                throw StrataError(.compacted, "cannot replay through LSN \(lsn): the log was compacted through LSN \(horizon), so the store's state before that is gone")
            }
            let building = try Store.replayFolder(in: path)
            var completed = false
            defer { if !completed { try? FileManager.default.removeItem(atPath: building) } }
            do {
                var options = StoreOptions()
                options.durability = .noSync
                options.initialMapSize = max(env.usedBytes * 2, 16 << 20)
                let target = try Store(path: building, options: options)
                defer { target.close() }
                // What one step of the target's writes holds: LMDB keeps a write transaction's dirty
                // pages in memory, so one transaction for a long log would hold hundreds of MiB.
                let stepBytes = BulkFold.stepBytes(budget: self.options.foldMemoryLimit)
                try Store.mappingStorageErrors {
                    try env.read { source in
                        let catalog = try currentCatalog(source)
                        try target.env.write { txn in
                            // The catalog as it is now: operations name tables and fields by id, and ids
                            // are never reused, so the current catalog reads every older operation.
                            if let catalog = try source.meta(MetaKey.catalog, in: databases) {
                                try txn.setMeta(MetaKey.catalog, Array(catalog), in: target.databases)
                            }
                            try txn.setMeta(MetaKey.catalogVersion, try source.metaUInt64(MetaKey.catalogVersion, in: databases) ?? 0, in: target.databases)
                            // A compacted store starts from its base snapshot, which the replay keeps.
                            try txn.setMeta(MetaKey.horizon, horizon, in: target.databases)
                            // The operations are copied as they are, under the same LSNs: those before
                            // checksums stay without, those before format 5 with checksums that do
                            // not cover their LSN.
                            let rules = try source.checksumRules(in: databases)
                            try txn.setMeta(MetaKey.checksumsFrom, rules.checksumsFrom, in: target.databases)
                            try txn.setMeta(MetaKey.lsnCoveredFrom, rules.lsnCoveredFrom, in: target.databases)
                        }
                        try Store.copyInSteps(from: source, databases.base, to: target.env, target.databases.base, through: .max, stepBytes: stepBytes)
                        try Store.copyInSteps(from: source, databases.log, to: target.env, target.databases.log, through: lsn, stepBytes: stepBytes)
                        // The fold checks every checksum as it reads: a damaged operation fails the
                        // replay, and the half-built store is removed.
                        var fold = try target.env.write { txn in
                            BulkFold(databases: target.databases, catalog: catalog, into: txn, budget: self.options.foldMemoryLimit, workers: self.options.foldWorkers)
                        }
                        fold.commitsInSteps(target.env)
                        var checks = LogChecks(rules: try source.checksumRules(in: databases))
                        _ = try Store.fold(from: source, databases, into: &fold, through: lsn, checks: &checks, progress: progress)
                        try target.env.write { txn in
                            // The fold wrote the views themselves: they are current through the last
                            // operation copied.
                            try txn.setMeta(MetaKey.viewsLSN, try txn.lastLSN(in: target.databases), in: target.databases)
                        }
                    }
                }
                try target.flush()
                target.close()
            } catch let error as StrataError {
                // Diagnosed here, while the half-built file it looks at is still there.
                throw Store.diagnosingDiskFull(error, writingIn: building)
            }
            try Store.moveReplayedStore(from: building, into: path)
            completed = true
            return try Store(path: path)
        }
    }

    /// Copies the entries of `db` (read through `reader`) whose 8-byte big-endian keys are at
    /// most `through` (any keys with `.max`) into `target`'s `targetDB`, in order, committing every `stepBytes`.
    static func copyInSteps(
        from reader: some ReadableTransaction, _ db: Database, to target: Environment, _ targetDB: Database, through: UInt64, stepBytes: Int
    ) throws(StrataError) {
        var after: [UInt8]? = nil
        while true {
            let resume = after
            // Environment.write runs its closure again when the map had to grow: each attempt
            // starts from the same entry.
            let last: [UInt8]? = try strataErrors {
                try target.write { txn in
                    try reader.scan(db) { c in
                        var e = try resume.map { k in try c.seek(atLeast: k) } ?? c.first()
                        if let r = resume, let entry = e, entry.key.elementsEqual(r) { e = try c.next() }
                        var bytes = 0
                        var copied: [UInt8]? = nil
                        while let entry = e, bytes < stepBytes {
                            if through != .max, try Counter.lsn(key: entry.key) > through { break }
                            try txn.put(entry.key, entry.value, in: targetDB, flags: .append)
                            bytes += entry.key.count + entry.value.count
                            copied = Array(entry.key)
                            e = try c.next()
                        }
                        return copied
                    }
                }
            }
            guard let last else { return }
            after = last
        }
    }

    /// A new hidden folder inside `path` to build a replay in, after removing those a replay that
    /// was killed left behind (their process is gone).
    static func replayFolder(in path: String) throws(StrataError) -> String {
        let fm = FileManager.default
        do {
            try fm.createDirectory(atPath: path, withIntermediateDirectories: true)
            for name in try fm.contentsOfDirectory(atPath: path) where name.hasPrefix(".replay-") {
                guard let pid = Int32(name.dropFirst(".replay-".count).prefix { $0 != "-" }), pid > 0 else { continue }
                if kill(pid, 0) != 0 && errno == ESRCH { try? fm.removeItem(atPath: path + "/" + name) }
            }
        } catch {
            throw StrataError(.io, "cannot prepare '\(path)' for a replay: \(error.localizedDescription)", cause: error)
        }
        return path + "/.replay-\(getpid())-\(UUID().uuidString)"
    }

    /// Moves the finished replay's `data.mdb` into `path` (one rename, so `path` holds the whole
    /// store or none), makes the rename durable, and removes the build folder.
    static func moveReplayedStore(from building: String, into path: String) throws(StrataError) {
        guard rename(building + "/data.mdb", path + "/data.mdb") == 0 else {
            let why = String(cString: strerror(errno))
            throw StrataError(.io, "cannot move the replayed store into '\(path)': \(why)")
        }
        syncDirectory(path)
        try? FileManager.default.removeItem(atPath: building)
    }
}

/// Flushes a directory's entries (a rename in it) to disk, as far as the file system allows.
private func syncDirectory(_ path: String) {
    let dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard dir >= 0 else { return }
    _ = fsync(dir)
    close(dir)
}

extension Snapshot {
    /// Field-level blame: for each field of the row, the operation that last set it.
    ///
    /// - Complexity: O(h log m) for h operations on the row.
    public func blame(_ table: String, key: RowKey) throws(StrataError) -> [String: LogEntry] {
        var blame: [String: LogEntry] = [:]
        for entry in try history(table, key: key) {
            for change in entry.changes { blame[change.field] = entry }
        }
        return blame
    }
}

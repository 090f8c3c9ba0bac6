import Foundation
import LMDB

/// The overlay this process has published for one open store: the newest version, which every
/// new snapshot starts from.
///
/// No lock is held across a transaction. A reader or writer takes the published version and
/// checks it belongs with its LMDB snapshot (same log end, views checkpointed no further than
/// the overlay goes); when it does not — another process wrote, or a writer of this process has
/// committed but not yet published — it folds the log's tail itself (`foldTail`), which is a
/// pure function of the snapshot, and publishes the result. Publishing keeps the newest version
/// by (LSN, base), so the order in which racing publishers arrive does not matter.
final class PublishedOverlay: @unchecked Sendable {
    // @unchecked: `version` is read and replaced only under `lock`; a version is immutable once
    // published (writers change copies, which share nodes copy-on-write).
    private let lock = NSLock()
    private var version: OverlayVersion

    init(_ version: OverlayVersion) { self.version = version }

    var current: OverlayVersion {
        lock.lock()
        defer { lock.unlock() }
        return version
    }

    /// Publishes `candidate` unless a newer version is already published.
    func publish(_ candidate: OverlayVersion) {
        lock.lock()
        defer { lock.unlock() }
        if (candidate.lsn, candidate.base) >= (version.lsn, version.base) { version = candidate }
    }
}

extension Store {
    /// The overlay that completes the LMDB snapshot `txn`: the published version when it belongs
    /// with it, else the log's tail after the checkpointed views folded into a new version
    /// (which is published).
    ///
    /// - Complexity: O(1) when the version belongs (one comparison of transaction ids, or two
    ///   lookups); otherwise O(k log n) for the k operations of the tail.
    func overlayVersion(for txn: LMDB.ReadTransaction) throws(StrataError) -> OverlayVersion {
        var o = overlay.current
        // The committed state the snapshot reads, not `txn.id`: a write transaction's id is the
        // one its commit will have, and a version stamped with it would be taken, unchecked, by
        // a reader of that commit before the writer publishes the commit's own version (or, if
        // the write aborts, by a reader of whichever commit reuses the id).
        let id = txn.snapshotID
        if o.lmdbTxnID == id { return o }
        let end = try txn.lastLSN(in: databases)
        let viewsLSN = try txn.metaUInt64(MetaKey.viewsLSN, in: databases) ?? end
        guard viewsLSN <= end else {
            throw StrataError(.corruptRecord, "the views of the store at '\(path)' claim LSN \(viewsLSN), past the end of its log (\(end))")
        }
        // The version fits when it starts at the checkpointed views and goes no further than
        // the log's end: views ⊕ overlay is then the fold of the whole log. One that starts
        // before them (another process checkpointed) would also read right, but it would keep
        // entries the views already hold, and a process that only reads would never drop them:
        // its overlay would grow with everything the other process writes. So it starts over
        // from the views; the tail to fold is what the other process has not checkpointed,
        // which its own budget bounds.
        if !(o.base == viewsLSN && o.lsn <= end) { o = .empty(at: viewsLSN) }
        if o.lsn < end { o = try foldTail(onto: o, through: end, txn) }
        o.lmdbTxnID = id
        overlay.publish(o)
        return o
    }

    /// Folds the operations after `version.lsn` through `end` into a copy of `version`, with the
    /// same view code the write path runs.
    private func foldTail(onto version: OverlayVersion, through end: UInt64, _ txn: LMDB.ReadTransaction) throws(StrataError) -> OverlayVersion {
        let buffer = OverlayBuffer(version)
        let writer = ViewWriter(reading: txn, databases, overlay: buffer)
        let catalog = try currentCatalog(txn)
        var scratch = ByteWriter(capacity: 512)
        var table: TableInfo? = nil
        let rules = try txn.checksumRules(in: databases)
        try txn.scan(databases.log) { c in
            var e = try c.seek(atLeast: Swift.withUnsafeBytes(of: (version.lsn + 1).bigEndian) { Array($0) })
            var expected = version.lsn + 1
            while let entry = e {
                var r = ByteReader(entry.key)
                let lsn = try r.bigEndian64()
                if lsn > end { break }
                // Read from disk (written by another process, or before the last close), not built
                // here. Checked before the LSN's place: a damaged key is named as such.
                try RecordChecksum.check(entry.value, lsn: lsn, rules: rules)
                guard lsn == expected else {
                    throw StrataError(.corruptRecord, "the log of the store at '\(path)' jumps from LSN \(expected - 1) to \(lsn) after its checkpointed views")
                }
                let header = try OperationHeader(entry.value)
                let target = UnsafeRawBufferPointer(rebasing: entry.value[header.target])
                var tr = ByteReader(target)
                let tableID = try tr.bigEndian32()
                if table?.id != tableID { table = try catalog.table(id: tableID) }
                let old = try lmdb { () throws(LMDBError) in try writer.get(target, in: databases.rows) }.map { (b) throws(StrataError) in try StoredRow(b) }
                // The log passed every unique check when it was written.
                try databases.apply(operation: entry.value, header: header, lsn: lsn, old: old, table: table!, in: writer, scratch: &scratch, checkingUniqueness: false)
                expected += 1
                e = try c.next()
            }
            guard expected > end else {
                throw StrataError(.corruptRecord, "the log of the store at '\(path)' ends at LSN \(expected - 1), before its last operation \(end)")
            }
        }
        buffer.version.lsn = end
        return buffer.version
    }

    /// Writes the overlay into the views in LMDB (a checkpoint of its own, outside any write), so
    /// that the next open has no tail to fold. Nothing happens when the views are already
    /// current (no operation after them, here or in another process).
    public func checkpoint() throws(StrataError) {
        try strataErrors {
            // A snapshot first: it folds a log tail left by another process (or before the last
            // open) into the overlay, which until then does not hold it.
            guard try read({ _ in !overlay.current.isEmpty }) else { return }
            try write { $0.requestCheckpoint() }
        }
    }

    /// Checkpoints when the overlay holds more than `bytes` (a bound tighter than
    /// ``StoreOptions/overlayBudget``): a bulk load of rows nobody reads yet, such as a first
    /// sync's pages, gains nothing from keeping them in memory. After the checkpoint, the pages
    /// of the file that the load's writes mapped leave the process's resident memory too
    /// (`Environment.releaseMappedPages`), so that it stays flat however large the store grows.
    package func checkpoint(ifOverlayExceeds bytes: Int) throws(StrataError) {
        guard overlayBytes > bytes else { return }
        try strataErrors { try write { $0.requestCheckpoint() } }
        env.releaseMappedPages()
    }

    /// The memory the overlay holds, as its budget counts it (entries, their tree's allowance,
    /// and the arena's bytes, whichever is larger).
    package var overlayBytes: Int {
        let version = overlay.current
        return max(version.bytes, version.arena.storedBytes)
    }
}

/// Writing the overlay into LMDB.
enum Checkpoint {
    /// Puts every entry of `version` (deletes every tombstone) into the views of `txn`, in key
    /// order: one pass per database, each page touched once. One LMDB cursor per database
    /// writes them: the next key in order is often on the page of the last, which the cursor
    /// finds without a search from the root.
    static func write(_ version: OverlayVersion, into txn: LMDB.WriteTransaction, _ databases: StoreDatabases) throws(StrataError) {
        for (slot, db) in databases.derived.enumerated() where version.trees[slot].count > 0 {
            try lmdb { () throws(LMDBError) in
                try txn.withWriteCursor(db) { (writer: inout WriteCursor) throws(LMDBError) in
                    var cursor = OverlayCursor(version.trees[slot])
                    var e = cursor.first()
                    while let entry = e {
                        if let value = entry.value {
                            try writer.put(entry.key, value)
                        } else {
                            try writer.delete(entry.key)
                        }
                        e = cursor.next()
                    }
                }
            }
        }
    }
}

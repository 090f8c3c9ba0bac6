import Foundation
import LMDB
import Synchronization

/// How much a commit waits for the disk, and what a crash (power loss, kernel panic) can lose.
/// A crashed *process* loses nothing in any mode: committed data is in the OS's page cache.
public enum Durability: String, Sendable, CaseIterable, Codable {
    /// A commit returns once it is on disk (one `fdatasync`). A crash loses nothing committed.
    case full
    /// Data is synced at commit, LMDB's meta page is not: a crash can roll back the last
    /// committed transaction, never corrupt the store.
    case noMetaSync
    /// Nothing is synced until ``Store/flush()``: a crash can lose every transaction since the
    /// last flush. Meant for bulk loads, benchmarks and scratch stores.
    case noSync

    var syncMode: SyncMode {
        switch self {
        case .full: .full
        case .noMetaSync: .noMetaSync
        case .noSync: .noSync
        }
    }
}

/// Options for opening a ``Store``.
public struct StoreOptions: Sendable {
    /// How much a commit waits for the disk; see ``Durability``. Default: ``Durability/full``.
    public var durability: Durability = .full
    /// The initial map size in bytes; the map grows by itself when full.
    public var initialMapSize: Int = 64 << 20
    /// The most concurrent readers across all processes.
    public var maxReaders: UInt32 = 126
    /// Create the store when the folder holds none (no `data.mdb`). When `false`, opening a
    /// folder without a store fails with ``StrataError/Code/io`` and creates nothing (not even
    /// the folder). Either way, a `data.mdb` that is not a Strata store is refused with
    /// ``StrataError/Code/notAStore`` and never written; see ``Store/init(path:options:)``.
    public var createIfMissing: Bool = true
    /// After every write, re-fold each touched row from its history and check it equals the
    /// live view (slow; meant for tests and debugging).
    public var checkInvariants: Bool = false
    /// The memory `rebuild`, `verify` and `replay` may hold row states in, in bytes. They fold
    /// the log through memory and write each row once, in key order; a store whose rows take
    /// more is folded in several passes over its rows, each written through to the store.
    /// Default: 256 MiB.
    public var foldMemoryLimit: Int = 256 << 20
    /// The threads `rebuild`, `verify` and `replay` fold the log on. Rows are partitioned by the
    /// hash of their key, one partition per thread, while the calling thread reads the log and
    /// writes the result; the result is the same whatever the count. 1 folds on the calling
    /// thread alone. Default: the processors available to the process, at most 8.
    public var foldWorkers: Int = min(8, ProcessInfo.processInfo.activeProcessorCount)
    /// The memory, in bytes, the overlay may hold before a commit also checkpoints it. Commits
    /// write only the log; the view changes they imply wait in memory (the overlay) until a
    /// checkpoint writes them into the views in LMDB, in key order. This bounds that memory, and
    /// with it the log tail another process (or a reopen after a crash) folds before its first
    /// read. Default: 64 MiB.
    public var overlayBudget: Int = 64 << 20
    /// The page check that runs before LMDB maps the store's file, so that a damaged store is
    /// ``StrataError/Code/corruptStore`` rather than a crash inside LMDB; see ``OpenCheck``.
    /// Default: ``OpenCheck/quick`` (a fraction of a millisecond, whatever the store's size). After
    /// an open that did not end in a clean close (a crash, or a process killed, as iOS ends
    /// apps), the next open runs ``OpenCheck/full`` instead, unless this is ``OpenCheck/none``.
    /// Runs at the first open of a folder in the process; a new store is not checked.
    public var checkAtOpen: OpenCheck = .quick

    /// The defaults: full durability, a 64 MiB initial map, 126 readers, stores created when missing.
    public init() {}
}

/// An event-sourced local store: an operation log in LMDB with tables kept as views of it.
///
/// ```swift
/// let store = try Store(path: "/path/to/folder")
/// try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title"), .bool("done", default: false)]))
/// try store.write { tx in
///     try tx.insert("tasks", ["id": 7, "title": "Buy milk"])
///     try tx.update("tasks", key: 7, ["done": true])
/// }
/// let row = try store.read { try $0.row("tasks", key: 7) }
/// ```
///
/// - **Writes** run one at a time (LMDB's single writer), each an atomic transaction that appends
///   to the log and updates every view. A write closure is synchronous; see ``write(_:)-2j629``.
/// - **Reads** are MVCC snapshots that never block the writer, any number at once, from any
///   thread or process.
/// - `Store` is `Sendable`; transactions and snapshots are not and never leave their closure.
public final class Store: Sendable {
    /// The folder holding the store, as given to ``init(path:options:)``.
    public let path: String
    /// The options the store was opened with: those of the first `Store` of this process on the
    /// folder (see ``init(path:options:)``).
    public var options: StoreOptions { core.options }
    /// This device's id, created with the store; batch ids and server records name it.
    public var clientID: String { core.clientID }

    /// The opened store, shared with every other `Store` of this process on the same folder.
    let core: StoreCore
    /// Whether this object was closed, and how many calls on it are running.
    private let usage = Locked(Usage())

    private struct Usage {
        var closed = false
        var running = 0
        /// Whether this object's count on `core` was given back to the registry.
        var released = false
        /// How to end each observation made through this object (`observe`, `changes()`);
        /// `close()` ends them all, since the observers themselves belong to the folder.
        var observations: [UUID: @Sendable () -> Void] = [:]
    }

    var env: Environment { core.env }
    var databases: StoreDatabases { core.databases }
    var observers: Observers { core.observers }
    /// The view changes committed but not yet checkpointed, as of the newest commit.
    var overlay: PublishedOverlay { core.overlay }

    /// The version of the Strata library, as `CHANGELOG.md` lists it and `strata --version`
    /// prints it.
    ///
    /// It sits on `Store`, beside ``formatVersion``, because a top-level `public enum Strata`
    /// would share its name with the module and make module-qualified names such as
    /// `Strata.Store` ambiguous.
    public static let libraryVersion = "0.1.0"

    /// The store format this version of Strata writes. Older formats are migrated when opened
    /// (see `Migration.swift`); newer ones are refused.
    public static let formatVersion: UInt64 = 7

    /// Opens the store in the folder at `path`, creating it (and the folder, with any missing
    /// parent folders) if needed.
    ///
    /// A folder is opened **once per process** (LMDB's locks belong to the process, and a second
    /// environment on the same files would break them). Opening a folder this process has open
    /// already — by the same path, a symlink, a path with `..`, or any other name for the same
    /// folder — returns a new `Store` over the same opened store: the same environment, catalog,
    /// observers and writer lock. Such a second open ignores `options` and takes those of the
    /// first (durability, map size, …); ``options`` says which are in force. The store closes
    /// when its last `Store` object is closed (``close()``) or released.
    ///
    /// Opening an existing store of the current format takes no write transaction, so it does
    /// not wait for a writer in this or another process.
    ///
    /// **Only a missing store is created.** A store is created where the folder is missing or
    /// holds no `data.mdb` (and ``StoreOptions/createIfMissing`` is true). An existing
    /// `data.mdb` must be a Strata store — an LMDB environment whose `meta` database holds the
    /// store's format version — and anything else is refused and left untouched, byte for byte:
    /// an empty file, a file that is not LMDB, another program's LMDB database, a damaged header.
    /// The one exception is an environment in which nothing was ever committed, beside a
    /// `strata.lock` (a Strata process is creating the store, or was stopped while creating
    /// it): a creating open initializes it, under LMDB's writer lock, so that processes creating
    /// one store at once all get the same store.
    ///
    /// **A damaged store is refused before LMDB reads it.** The first open of a folder in the
    /// process checks the pages of its file as ``StoreOptions/checkAtOpen`` says (quick by
    /// default, full after an open that did not end in a clean close; see ``OpenCheck``), so a
    /// damaged store is ``StrataError/Code/corruptStore``, naming the damage, and never a crash
    /// inside LMDB. Recover it with ``salvage(from:into:)``.
    ///
    /// - Throws: ``StrataError`` with code `corruptStore` for a damaged file,
    ///   `formatVersion` for a store written by a newer Strata,
    ///   `io` when the folder holds no store and ``StoreOptions/createIfMissing`` is false,
    ///   `notAStore` when its `data.mdb` is not a Strata store, `diskFull` when the disk has no
    ///   room for the lock file `lock.mdb` that opening needs.
    public init(path: String, options: StoreOptions = StoreOptions()) throws(StrataError) {
        self.path = path
        if !options.createIfMissing && !FileManager.default.fileExists(atPath: path + "/data.mdb") {
            throw StrataError(.io, "no Strata store at '\(path)' (no data.mdb in that folder)")
        }
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        } catch {
            throw StrataError(.io, "cannot create the store's folder '\(path)': \(error.localizedDescription)")
        }
        core = try StoreRegistry.shared.acquire(path: path, options: options)
    }

    deinit {
        // No call can be running: each holds this object.
        let (released, observations) = usage.withLock { ($0.released, $0.observations.values) }
        for end in observations { end() }
        if !released { StoreRegistry.shared.release(core) }
    }

    /// Closes this `Store`. Every later call on it fails with ``StrataError/Code/closed``; calls
    /// running now (a write on another thread, an async write already submitted) finish first,
    /// and the store is closed when the last of them returns, unless other `Store` objects of
    /// this process are open on the same folder: the store closes with the last of them. Open
    /// the folder again with ``init(path:options:)``. Closing twice does nothing.
    ///
    /// Closing also ends the observations made through this `Store` (``observe(_:)``,
    /// ``changes(bufferingPolicy:)``), though other `Store`s on the folder may write on.
    ///
    /// `close()` does not wait, so it may be called from inside a transaction of this store.
    public func close() {
        let (release, observations) = usage.withLock { u -> (Bool, [@Sendable () -> Void]) in
            guard !u.closed else { return (false, []) }
            u.closed = true
            let observations = Array(u.observations.values)
            u.observations = [:]
            guard u.running == 0 else { return (false, observations) }
            u.released = true
            return (true, observations)
        }
        // Outside the lock: ending a `changes()` sequence cancels its token, which takes it.
        for end in observations { end() }
        if release { StoreRegistry.shared.release(core) }
    }

    /// Runs `add` and keeps the observation end it returns under `id`, unless this `Store` is
    /// closed (then `add` does not run). Returns whether it ran. See ``close()``.
    func trackObservation(_ id: UUID, _ add: () -> @Sendable () -> Void) -> Bool {
        usage.withLock { u in
            guard !u.closed else { return false }
            u.observations[id] = add()
            return true
        }
    }

    /// Forgets the observation `id`, ended by its token.
    func untrackObservation(_ id: UUID) {
        _ = usage.withLock { $0.observations.removeValue(forKey: id) }
    }

    /// Whether the store was opened read-only because this process cannot write its files
    /// (a store copied off a device with its permissions, a read-only mount, another user's
    /// store). Reads work; writes fail with ``StrataError/Code/io``. When even `lock.mdb` is
    /// read-only, LMDB runs without its lock file: a writer in another process could then change
    /// pages under a reader, so inspect such a store only while nobody writes it.
    public var isReadOnly: Bool { core.isReadOnly }

    /// Whether ``close()`` was called on this `Store`.
    public var isClosed: Bool { usage.withLock { $0.closed } }

    /// Counts a call on this `Store` as running, or throws `closed` when it was closed. Pair
    /// with ``leaveCall()``.
    func enterCall() throws(StrataError) {
        let open = usage.withLock { u in
            guard !u.closed else { return false }
            u.running += 1
            return true
        }
        guard open else {
            throw StrataError(.closed, "the store at '\(path)' was closed; open it again with Store(path:)")
        }
    }

    /// The end of a call counted by ``enterCall()``; the last call after ``close()`` gives the
    /// store back.
    func leaveCall() {
        let release = usage.withLock { u in
            u.running -= 1
            guard u.closed, u.running == 0, !u.released else { return false }
            u.released = true
            return true
        }
        if release { StoreRegistry.shared.release(core) }
    }

    /// Runs `body` as one call on this `Store` (see ``enterCall()``).
    func checkedCall<R>(_ body: () throws -> R) throws -> R {
        try enterCall()
        defer { leaveCall() }
        return try body()
    }

    // MARK: Transactions

    /// How many times a ``write(_:)-2j629`` closure ran again because the map had to grow, since the
    /// store was opened (see ``write(_:)-2j629``).
    public var writeReruns: Int { env.writeReruns }

    /// Runs `body` in one write transaction and commits it when `body` returns.
    ///
    /// Every edit in `body` appends one operation to the log, so either all of `body` is stored
    /// or none of it. If `body` throws, nothing is stored and the error is rethrown. The commit
    /// makes the log durable; the views it changes are written behind, through the in-memory
    /// overlay (see ``StoreOptions/overlayBudget``), and every read sees them at once.
    ///
    /// `body` is synchronous: LMDB ties a write transaction to its thread, so it must not suspend.
    ///
    /// **Group commit.** Writes from several threads at once share commits: the first runs the
    /// closures waiting meanwhile in the same LMDB transaction, each in a nested transaction of
    /// its own, and commits once; every caller returns after that one durable commit with its
    /// own result or error (a closure that throws rolls back only its own edits). Such a `body`
    /// may therefore run on another caller's thread; a lone writer's runs on its own. Observers
    /// get one change set per committed closure, in commit order, once the callers of its group
    /// are released, so `write` may return before they have seen it (see ``observe(_:)``).
    ///
    /// - Important: **`body` may run more than once.** When the store's memory map fills up during
    ///   the write, LMDB aborts the transaction; the store grows the map and runs `body` again from
    ///   the start. Its edits are then made once (the aborted attempt stored nothing), but anything
    ///   else it does — counting, logging, network calls, appending to an outside array — happens
    ///   again. Keep such side effects out of `body`: compute before the call, act on its result
    ///   after it. The store grows the map ahead of writes (when the room left is under a quarter
    ///   of the map or twice the largest write it has seen), so a rerun is rare: typically once,
    ///   the first time a write larger than any before meets a nearly full map.
    ///   ``writeReruns`` counts them.
    ///
    /// - Complexity: O(edits × log n), plus one `fdatasync` under ``Durability/full``.
    public func write<R>(_ body: (Transaction) throws -> R) throws -> R {
        try checkedCall { try performWrite(body) }
    }

    /// ``write(_:)`` without the check that this `Store` is open.
    func performWrite<R>(_ body: (Transaction) throws -> R) throws -> R {
        guard !core.isReadOnly else {
            throw StrataError(.io, "the store at '\(path)' is read-only: this process cannot write its files; nothing was changed")
        }
        return try withoutActuallyEscaping(body) { body in
            var result: R?
            // The leader clears `run` before it wakes this thread, so `body` does not escape.
            let request = WriteRequest { tx in result = try body(tx) }
            core.writers.runSynchronously(request) { [self] group in commitGroup(group) }
            if let error = request.error { throw error }
            return result!
        }
    }

    /// Commits a group of writes in one LMDB transaction (see `GroupCommit.swift`): a lone
    /// write runs directly in it; several run each in a nested transaction, so that one that
    /// throws rolls back only its own edits. Sets each request's outcome and publishes the
    /// overlay and the catalog. Returns what to tell observers, one change set per committed
    /// closure in commit order; the caller tells them once the group's callers are released.
    func commitGroup(_ group: [WriteRequest]) -> [CommitNotification] {
        var committedOverlay: OverlayVersion?
        var committedCatalog: Catalog?
        /// The catalog of the committed state, with the id the commit takes (`mdb_txn_id`), when
        /// the commit writes something.
        var catalogAtCommit: (catalog: Catalog, id: Int)?
        do {
            try Store.mappingStorageErrors {
                try env.write { txn in
                    for request in group { request.resetOutcome() }
                    committedCatalog = nil
                    let working = OverlayBuffer(try overlayVersion(for: txn.reader))
                    let lsnBefore = working.version.lsn
                    var catalog = try currentCatalog(txn)
                    /// Runs one closure in `t` (the transaction, or a nested one).
                    func run(_ request: WriteRequest, in t: LMDB.WriteTransaction) throws {
                        let tx = try Transaction(store: self, txn: t, overlay: working, catalog: catalog)
                        defer { tx.close() }
                        try request.run!(tx)
                        try tx.finish()
                        request.notification = tx.notification
                        if tx.catalogChanged {
                            catalog = tx.workingCatalog
                            committedCatalog = tx.workingCatalog
                        }
                    }
                    // A cancelled async write that has not started never does, whether or not
                    // it shares the group: checked on every attempt, before any closure runs.
                    let runs = group.filter { request in
                        guard request.cancelled.load(ordering: .relaxed) else { return true }
                        request.error = CancellationError()
                        return false
                    }
                    if runs.count == 1 {
                        try run(runs[0], in: txn)
                    } else {
                        for request in runs {
                            let before = (working.version, catalog, committedCatalog)
                            do {
                                try txn.nested { try run(request, in: $0) }
                            } catch {
                                // Only a failure of the group's own transaction (its map is full,
                                // or the nested commit failed) ends the group: the group then runs
                                // again with a larger map, or fails. Not decided from the error's
                                // type: a closure may throw an LMDBError of another environment.
                                if txn.hasFailed { throw error }
                                (working.version, catalog, committedCatalog) = before
                                request.error = writeError(error)
                                request.notification = nil
                            }
                        }
                    }
                    // Stamped with `txn.id` only when the transaction appended to the log: LMDB
                    // gives that id to this commit only if it writes something (one that changed
                    // nothing commits nothing, and the next commit, perhaps another process's,
                    // takes the id). The version is published only once the commit succeeded, so
                    // a snapshot of that id reads exactly this state. Stamped, the next write and
                    // the next reads take it without reading the log's end; unstamped, the first
                    // snapshot to use it checks it against the log, and stamps it.
                    let appended = working.version.lsn > lsnBefore
                    working.version.lmdbTxnID = appended ? txn.id : 0
                    committedOverlay = working.version
                    // Likewise the catalog (changed, it was written to `meta`): the next write and
                    // reads take it without reading its version.
                    catalogAtCommit = appended || committedCatalog != nil ? (catalog, txn.id) : nil
                }
            }
        } catch {
            let failure = writeError(error)
            for request in group where request.error == nil {
                request.error = failure
                request.notification = nil
            }
            return []
        }
        // Only after the commit, so that no snapshot sees view changes its log does not have.
        if let committedOverlay { overlay.publish(committedOverlay) }
        core.hasWritten.store(true, ordering: .relaxed)
        if let catalogAtCommit { publish(catalogAtCommit.catalog, currentAt: catalogAtCommit.id) }
        // Nothing is told about a closure that rolled back.
        return group.compactMap { $0.error == nil ? $0.notification : nil }
    }

    /// Runs `body` with a consistent read-only snapshot of the store.
    ///
    /// The snapshot sees every transaction committed before it began and nothing after. It never
    /// blocks writers. Rows and values it returns are copies and may be kept.
    ///
    /// - Complexity: O(1) to begin, plus `body`.
    public func read<R>(_ body: (Snapshot) throws -> R) throws -> R {
        try checkedCall { try performRead(body) }
    }

    /// ``read(_:)`` without the check that this `Store` is open.
    func performRead<R>(_ body: (Snapshot) throws -> R) throws -> R {
        try Store.mappingStorageErrors {
            try env.read { txn in
                let reader = ViewReader(txn: txn, databases: databases, overlay: OverlayBuffer(try overlayVersion(for: txn)))
                // The snapshot refuses every use once `body` returns: LMDB frees the transaction.
                let lease = Lease(.read)
                defer { lease.end() }
                return try body(Snapshot(txn: reader, databases: databases, catalog: try currentCatalog(txn), lease: lease))
            }
        }
    }

    /// Creates a table, or does nothing when an identical table exists.
    ///
    /// - Throws: ``StrataError`` `invalidSchema` for a bad definition, `tableExists` when a table
    ///   of that name exists with a different definition.
    public func createTable(_ schema: TableSchema) throws(StrataError) {
        try strataErrors {
            try write { try $0.createTable(schema) }
        }
    }

    /// The tables of the store, in creation order.
    public var tables: [TableSchema] {
        get throws(StrataError) { try strataErrors { try read { try $0.tables } } }
    }

    /// Writes buffered commits to disk. Needed only with ``Durability/noSync``.
    public func flush() throws(StrataError) {
        try strataErrors {
            try checkedCall {
                if core.isReadOnly { return }  // nothing was written
                try Store.mappingStorageErrors { try env.sync() }
            }
        }
    }

    /// Reader slots left by processes that died mid-read, cleared when this process opened the
    /// store (`mdb_reader_check`; a second `Store` on an open folder shares that first open). Such slots would keep old pages from reuse and use up
    /// ``StoreOptions/maxReaders``.
    public var staleReadersCleared: Int { env.staleReadersCleared }

    /// Bytes in use in the store's file; 0 once the store is closed.
    public var sizeInBytes: Int { isClosed ? 0 : env.usedBytes }

    /// What a write's caller gets for `error`, thrown by its closure or by the commit, the same
    /// whether the closure ran alone or in a group: LMDB's errors as ``StrataError`` (see
    /// `StrataError.storage(_:)`), a `storage` error diagnosed for a full disk, others unchanged.
    private func writeError(_ error: any Error) -> any Error {
        let mapped = (error as? LMDBError).map { StrataError.storage($0) } ?? error
        guard let strata = mapped as? StrataError, strata.code == .storage else { return mapped }
        return diagnoseWriteFailure(strata)
    }

    /// A commit cut short by a full disk (or the file size limit) fails in LMDB with `EIO` when
    /// part of a page was written: LMDB reports a short write that way. Such a failure is
    /// reported as `diskFull` when the disk has under 1 MiB free or the file is within 1 MiB of
    /// the process's file size limit; any other `EIO` stays a `storage` error.
    private func diagnoseWriteFailure(_ error: StrataError) -> StrataError {
        Store.diagnosingDiskFull(error, writingIn: path)
    }

    /// `error` as `diskFull` when it is an `EIO` from LMDB (a short write) and the disk holding
    /// `folder` is (nearly) full or the process's file size limit is (nearly) reached; `error`
    /// otherwise. For writes to a store other than a `Store`'s own — a scratch store of
    /// ``verify(progress:)`` in the temporary folder, the new store of ``replay(into:through:progress:)``.
    package static func diagnosingDiskFull(_ error: StrataError, writingIn folder: String) -> StrataError {
        let path = folder
        guard let cause = error.cause as? LMDBError, cause.resultCode == .ioError else { return error }
        let slack: UInt64 = 1 << 20
        var fs = statvfs()
        let diskFull = statvfs(path, &fs) == 0 && UInt64(fs.f_bavail) * UInt64(fs.f_frsize) < slack
        var limit = rlimit()
        // Glibc declares the resources as an enum; Darwin and Musl as plain `Int32` macros.
        #if canImport(Glibc)
        let fileSizeResource = Int32(RLIMIT_FSIZE.rawValue)
        #else
        let fileSizeResource = RLIMIT_FSIZE
        #endif
        // No limit is RLIM_INFINITY: all ones on Linux, 2^63 - 1 on Darwin; no real limit is that high.
        let atLimit = getrlimit(fileSizeResource, &limit) == 0 && limit.rlim_cur < rlim_t(Int64.max)
            && (try? Store.fileSize(path + "/data.mdb")).map { UInt64($0) + slack >= UInt64(limit.rlim_cur) } == true
        guard diskFull || atLimit else { return error }
        let what = diskFull ? "the disk is full" : "the disk is full (the store's file reached the process's file size limit)"
        return StrataError(.diskFull, "\(what): the write was rolled back and the store is unchanged; free space and retry", cause: cause)
    }

    // MARK: Catalog

    /// The catalog as of `txn`: the cached one if its version is current, else reloaded.
    ///
    /// A snapshot the cached catalog is known to be current for takes it without reading `meta`
    /// (the committed state a snapshot id names never changes: LMDB gives a commit's id to no
    /// other commit). A write transaction is asked before it writes, when it still reads its
    /// snapshot's catalog.
    func currentCatalog(_ txn: some ReadableTransaction) throws(StrataError) -> Catalog {
        let snapshot = txn.snapshotID
        let cached = core.cachedCatalog.withLock { $0 }
        if cached.snapshotID == snapshot { return cached.catalog }
        let version = try txn.metaUInt64(MetaKey.catalogVersion, in: databases) ?? 0
        if cached.catalog.version == version {
            core.cachedCatalog.withLock { if $0.catalog.version == version { $0.snapshotID = snapshot } }
            return cached.catalog
        }
        let fresh = try Store.loadCatalog(txn, databases)
        publish(fresh, currentAt: snapshot)
        return fresh
    }

    /// Caches `catalog` unless a newer one is cached; `snapshot` is the snapshot it is known to
    /// be current for, if any.
    func publish(_ catalog: Catalog, currentAt snapshot: Int? = nil) {
        core.cachedCatalog.withLock {
            if catalog.version >= $0.catalog.version { $0 = CachedCatalog(catalog: catalog, snapshotID: snapshot ?? CachedCatalog.unknown) }
        }
    }

    static func loadCatalog(_ txn: some ReadableTransaction, _ databases: StoreDatabases) throws(StrataError) -> Catalog {
        let version = try txn.metaUInt64(MetaKey.catalogVersion, in: databases) ?? 0
        guard let bytes = try txn.meta(MetaKey.catalog, in: databases) else { return Catalog() }
        return try Catalog(decoding: bytes, version: version)
    }

    /// Runs `body`, turning LMDB errors into ``StrataError`` and passing every other error through.
    static func mappingStorageErrors<R>(_ body: () throws -> R) throws -> R {
        do { return try body() } catch let e as LMDBError { throw StrataError.storage(e) }
    }
}

extension Store {
    /// Copies the store to the folder `path` (which must exist and be empty), optionally
    /// compacted. Safe while the store is in use: the copy is one consistent snapshot.
    ///
    /// The overlay is checkpointed first, so the copy opens without a log tail to fold (a
    /// write committed meanwhile still reaches the copy, through its log). A copy that fails
    /// (a full disk) leaves no partial `data.mdb` behind.
    public func copy(to path: String, compact: Bool = true) throws(StrataError) {
        try strataErrors {
            try checkedCall {
                if !isReadOnly { try checkpoint() }
                FileSizeSignal.ignore()
                try Store.mappingStorageErrors {
                    do {
                        try env.copy(to: path, compact: compact)
                    } catch let e as LMDBError where e.code != EEXIST {
                        // LMDB created the file (O_EXCL): what it wrote is a fragment, not a store.
                        unlink(path + "/data.mdb")
                        // The destination, not the storage engine, is at fault: say so.
                        if [ENOENT, ENOTDIR, EACCES, EROFS].contains(e.code) {
                            throw StrataError(.io, "cannot copy the store into '\(path)': \(String(cString: strerror(e.code))) (the folder must exist, be writable and be empty)", cause: e)
                        }
                        throw e
                    } catch let e as LMDBError {
                        throw StrataError(.io, "cannot copy the store into '\(path)': it already holds a data.mdb (the folder must be empty)", cause: e)
                    }
                }
            }
        }
    }
}

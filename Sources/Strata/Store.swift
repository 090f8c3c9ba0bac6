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
    /// Create the store when the folder holds none. When `false`, opening a folder without a
    /// store fails with ``StrataError/Code/io``.
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
///   to the log and updates every view. A write closure is synchronous; see ``write(_:)``.
/// - **Reads** are MVCC snapshots that never block the writer, any number at once, from any
///   thread or process.
/// - `Store` is `Sendable`; transactions and snapshots are not and never leave their closure.
public final class Store: Sendable {
    /// The folder holding the store.
    public let path: String
    /// The options the store was opened with.
    public let options: StoreOptions
    /// This device's id, created with the store; batch ids and server records name it.
    public let clientID: String

    let env: Environment
    let views: Views
    /// The catalog last seen; every transaction checks its version against `meta`.
    let cachedCatalog: Mutex<Catalog>
    let observers = Observers()
    /// The view changes committed but not yet checkpointed, as of the newest commit.
    let overlay: PublishedOverlay
    /// Whether this process committed a write through this store: only then does closing it
    /// checkpoint. A process that only reads never takes the writer's lock, even to close.
    private let hasWritten = Mutex(false)

    /// Shared `flock` on `strata.lock` in the store's folder, held while the store is open, so
    /// that ``reclaimSpace(at:)`` can tell that nobody has it open.
    private let lockFD: Int32

    /// The store format this version of Strata writes. Older formats are migrated when opened
    /// (see `Migration.swift`); newer ones are refused.
    public static let formatVersion: UInt64 = 4

    /// Opens the store in the folder at `path`, creating it (and the folder, with any missing
    /// parent folders) if needed.
    ///
    /// - Throws: ``StrataError`` with code `formatVersion` for a store written by a newer Strata,
    ///   `io` when the folder holds no store and ``StoreOptions/createIfMissing`` is false.
    public init(path: String, options: StoreOptions = StoreOptions()) throws(StrataError) {
        self.path = path
        self.options = options
        if !options.createIfMissing && !FileManager.default.fileExists(atPath: path + "/data.mdb") {
            throw StrataError(.io, "no Strata store at '\(path)' (no data.mdb in that folder)")
        }
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        } catch {
            throw StrataError(.io, "cannot create the store's folder '\(path)': \(error.localizedDescription)")
        }
        lockFD = try Store.lockFolder(path, exclusive: false)
        var envOptions = EnvironmentOptions()
        envOptions.mapSize = options.initialMapSize
        envOptions.maxReaders = options.maxReaders
        envOptions.syncMode = options.durability.syncMode
        envOptions.maxDatabases = 16
        do {
            env = try Environment(path: path, options: envOptions)
        } catch {
            close(lockFD)
            throw StrataError(.io, "cannot open the store at '\(path)': \(error.message)", cause: error)
        }
        let opened: (Views, String, Catalog)
        do {
            try Store.checkFileLength(env, path: path)
            opened = try Store.open(env, path: path)
        } catch {
            close(lockFD)
            throw error
        }
        (views, clientID) = (opened.0, opened.1)
        self.cachedCatalog = Mutex(opened.2)
        overlay = PublishedOverlay(.empty(at: 0))
        do {
            // Folds what the last process left un-checkpointed (a crash, or another process
            // that has the store open), so the first read finds it done.
            _ = try Store.asStrataError { try env.read { txn in try overlayVersion(for: txn) } }
        } catch {
            close(lockFD)
            throw error
        }
    }

    deinit {
        // The log holds everything; this only spares the next open the fold of the tail.
        try? checkpointOnClose()
        close(lockFD)
    }

    /// Writes a non-empty overlay into the views, without a ``Transaction`` (which would hold
    /// on to the store).
    private func checkpointOnClose() throws {
        let version = overlay.current
        guard !version.isEmpty, hasWritten.withLock({ $0 }) else { return }
        try Store.mappingStorageErrors {
            try env.write { txn in
                // Only if the overlay still completes the store: another process may have
                // written or checkpointed since.
                let end = try txn.lastLSN(in: views)
                let viewsLSN = try txn.metaUInt64(MetaKey.viewsLSN, in: views) ?? end
                guard version.lsn == end, version.base <= viewsLSN, viewsLSN < end else { return }
                try Checkpoint.write(version, into: txn, views)
                try txn.setMeta(MetaKey.viewsLSN, end, in: views)
            }
        }
    }

    /// Refuses a file shorter than its own last page says: LMDB maps the file and would read
    /// past its end (a SIGBUS, not an error) at the first touch of a missing page.
    private static func checkFileLength(_ env: Environment, path: String) throws(StrataError) {
        let size = try fileSize(path + "/data.mdb")
        guard size >= env.usedBytes else {
            throw StrataError(.corruptRecord, "the store's file '\(path)/data.mdb' is truncated: it holds \(size) bytes, but its pages reach \(env.usedBytes); restore it from a copy")
        }
    }

    /// In one write transaction: opens the databases, initializes a new store or migrates an
    /// older one, and reads the client id and catalog.
    private static func open(_ env: Environment, path: String) throws(StrataError) -> (Views, String, Catalog) {
        try Store.asStrataError {
            try env.write { txn in
                let views = try Views.open(txn)
                let format = try txn.metaUInt64(MetaKey.format, in: views)
                switch format {
                case nil:
                    if try txn.lastLSN(in: views) != 0 {
                        throw StrataError(.formatVersion, "the store at '\(path)' has a log but no format version; it was not written by Strata")
                    }
                    try txn.setMeta(MetaKey.format, Store.formatVersion, in: views)
                    try txn.setMeta(MetaKey.clientID, Array(UUID().uuidString.utf8), in: views)
                    try txn.setMeta(MetaKey.catalog, try Catalog().encoded(), in: views)
                    try txn.setMeta(MetaKey.catalogVersion, 0, in: views)
                    try txn.setMeta(MetaKey.viewsLSN, 0, in: views)
                case let v? where v > Store.formatVersion:
                    throw StrataError(.formatVersion, "the store at '\(path)' has format \(v), newer than this Strata reads (\(Store.formatVersion)); upgrade Strata to open it")
                case let v? where v < Store.formatVersion:
                    try Migration.upgrade(from: v, txn, views, path: path)
                default: break
                }
                guard let id = try txn.meta(MetaKey.clientID, in: views) else {
                    throw StrataError(.corruptRecord, "the store at '\(path)' has no client id")
                }
                return (views, String(decoding: id, as: UTF8.self), try Store.loadCatalog(txn, views))
            }
        }
    }

    // MARK: Transactions

    /// How many times a ``write(_:)`` closure ran again because the map had to grow, since the
    /// store was opened (see ``write(_:)``).
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
        var committedCatalog: Catalog?
        var notification: CommitNotification?
        var committedOverlay: OverlayVersion?
        let result: R
        do {
            result = try Store.mappingStorageErrors {
                try env.write { txn in
                    let working = OverlayBuffer(try overlayVersion(for: txn.reader))
                    let tx = try Transaction(store: self, txn: txn, overlay: working, catalog: try currentCatalog(txn))
                    defer { tx.close() }
                    let r = try body(tx)
                    try tx.finish()
                    working.version.lmdbTxnID = txn.id
                    committedOverlay = working.version
                    committedCatalog = tx.catalogChanged ? tx.catalog : nil
                    notification = tx.notification
                    return r
                }
            }
        } catch let error as StrataError where error.code == .storage {
            throw diagnoseWriteFailure(error)
        }
        // Only after the commit, so that no snapshot sees view changes its log does not have.
        if let committedOverlay { overlay.publish(committedOverlay) }
        hasWritten.withLock { $0 = true }
        if let committedCatalog { publish(committedCatalog) }
        // After the commit: nothing is told about a transaction that rolled back.
        if let notification { observers.notify(notification) }
        return result
    }

    /// Runs `body` with a consistent read-only snapshot of the store.
    ///
    /// The snapshot sees every transaction committed before it began and nothing after. It never
    /// blocks writers. Rows and values it returns are copies and may be kept.
    ///
    /// - Complexity: O(1) to begin, plus `body`.
    public func read<R>(_ body: (Snapshot) throws -> R) throws -> R {
        try Store.mappingStorageErrors {
            try env.read { txn in
                let reader = ViewReader(txn: txn, views: views, overlay: OverlayBuffer(try overlayVersion(for: txn)))
                return try body(Snapshot(txn: reader, views: views, catalog: try currentCatalog(txn)))
            }
        }
    }

    /// Creates a table, or does nothing when an identical table exists.
    ///
    /// - Throws: ``StrataError`` `invalidSchema` for a bad definition, `tableExists` when a table
    ///   of that name exists with a different definition.
    public func createTable(_ schema: TableSchema) throws {
        try write { try $0.createTable(schema) }
    }

    /// The tables of the store, in creation order.
    public var tables: [TableSchema] {
        get throws { try read { $0.tables } }
    }

    /// Writes buffered commits to disk. Needed only with ``Durability/noSync``.
    public func flush() throws {
        try Store.mappingStorageErrors { try env.sync() }
    }

    /// Reader slots left by processes that died mid-read, cleared when this store was opened
    /// (`mdb_reader_check`). Such slots would keep old pages from reuse and use up
    /// ``StoreOptions/maxReaders``.
    public var staleReadersCleared: Int { env.staleReadersCleared }

    /// Bytes in use in the store's file.
    public var sizeInBytes: Int { env.usedBytes }

    /// A commit cut short by a full disk (or the file size limit) fails in LMDB with `EIO` when
    /// part of a page was written: LMDB reports a short write that way. Such a failure is
    /// reported as `diskFull` when the disk has under 1 MiB free or the file is within 1 MiB of
    /// the process's file size limit; any other `EIO` stays a `storage` error.
    private func diagnoseWriteFailure(_ error: StrataError) -> StrataError {
        guard let cause = error.cause as? LMDBError, cause.code == EIO else { return error }
        let slack: UInt64 = 1 << 20
        var fs = statvfs()
        let diskFull = statvfs(path, &fs) == 0 && UInt64(fs.f_bavail) * UInt64(fs.f_frsize) < slack
        var limit = rlimit()
        let atLimit = getrlimit(Int32(RLIMIT_FSIZE.rawValue), &limit) == 0 && limit.rlim_cur != rlim_t.max
            && (try? Store.fileSize(path + "/data.mdb")).map { UInt64($0) + slack >= UInt64(limit.rlim_cur) } == true
        guard diskFull || atLimit else { return error }
        let what = diskFull ? "the disk is full" : "the disk is full (the store's file reached the process's file size limit)"
        return StrataError(.diskFull, "\(what): the write was rolled back and the store is unchanged; free space and retry", cause: cause)
    }

    // MARK: Catalog

    /// The catalog as of `txn`: the cached one if its version is current, else reloaded.
    func currentCatalog(_ txn: some ReadableTransaction) throws(StrataError) -> Catalog {
        let version = try txn.metaUInt64(MetaKey.catalogVersion, in: views) ?? 0
        let cached = cachedCatalog.withLock { $0 }
        if cached.version == version { return cached }
        let fresh = try Store.loadCatalog(txn, views)
        publish(fresh)
        return fresh
    }

    func publish(_ catalog: Catalog) {
        cachedCatalog.withLock { if catalog.version >= $0.version { $0 = catalog } }
    }

    static func loadCatalog(_ txn: some ReadableTransaction, _ views: Views) throws(StrataError) -> Catalog {
        let version = try txn.metaUInt64(MetaKey.catalogVersion, in: views) ?? 0
        guard let bytes = try txn.meta(MetaKey.catalog, in: views) else { return Catalog() }
        return try Catalog(decoding: bytes, version: version)
    }

    /// Runs `body`, turning LMDB errors into ``StrataError`` and passing every other error through.
    static func mappingStorageErrors<R>(_ body: () throws -> R) throws -> R {
        do { return try body() } catch let e as LMDBError { throw StrataError.storage(e) }
    }

    /// Runs `body`; every error comes out as a ``StrataError``.
    static func asStrataError<R>(_ body: () throws -> R) throws(StrataError) -> R {
        do {
            return try body()
        } catch let e as StrataError {
            throw e
        } catch let e as LMDBError {
            throw StrataError.storage(e)
        } catch {
            throw StrataError(.storage, "\(error)")
        }
    }
}

extension Store {
    /// Copies the store to the folder `path` (which must exist and be empty), optionally
    /// compacted. Safe while the store is in use: the copy is one consistent snapshot.
    ///
    /// The overlay is checkpointed first, so the copy opens without a log tail to fold (a
    /// write committed meanwhile still reaches the copy, through its log).
    public func copy(to path: String, compact: Bool = true) throws {
        try checkpoint()
        try Store.mappingStorageErrors { try env.copy(to: path, compact: compact) }
    }
}

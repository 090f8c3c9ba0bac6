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

    /// Shared `flock` on `strata.lock` in the store's folder, held while the store is open, so
    /// that ``reclaimSpace(at:)`` can tell that nobody has it open.
    private let lockFD: Int32

    /// The store format this version of Strata writes. Older formats are migrated when opened
    /// (see `Migration.swift`); newer ones are refused.
    public static let formatVersion: UInt64 = 2

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
    }

    deinit { close(lockFD) }

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

    /// Runs `body` in one write transaction and commits it when `body` returns.
    ///
    /// Every edit in `body` appends one operation to the log and updates the views in the same
    /// LMDB transaction, so either all of `body` is stored or none of it. If `body` throws, nothing
    /// is stored and the error is rethrown.
    ///
    /// `body` is synchronous: LMDB ties a write transaction to its thread, so it must not suspend.
    /// When the store must grow its map, `body` runs again from the start; keep it free of side
    /// effects outside the transaction.
    ///
    /// - Complexity: O(edits × log n), plus one `fdatasync` under ``Durability/full``.
    public func write<R>(_ body: (Transaction) throws -> R) throws -> R {
        var committedCatalog: Catalog?
        var notification: CommitNotification?
        let result: R
        do {
            result = try Store.mappingStorageErrors {
                try env.write { txn in
                    let tx = try Transaction(store: self, txn: txn, catalog: try currentCatalog(txn))
                    defer { tx.close() }
                    let r = try body(tx)
                    try tx.finish()
                    committedCatalog = tx.catalogChanged ? tx.catalog : nil
                    notification = tx.notification
                    return r
                }
            }
        } catch let error as StrataError where error.code == .storage {
            throw diagnoseWriteFailure(error)
        }
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
                try body(Snapshot(txn: txn, views: views, catalog: try currentCatalog(txn)))
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
    /// A copy that fails (a full disk) leaves no partial `data.mdb` behind.
    public func copy(to path: String, compact: Bool = true) throws {
        FileSizeSignal.ignore()
        try Store.mappingStorageErrors {
            do {
                try env.copy(to: path, compact: compact)
            } catch let e as LMDBError where e.code != EEXIST {
                // LMDB created the file (O_EXCL): what it wrote is a fragment, not a store.
                unlink(path + "/data.mdb")
                throw e
            }
        }
    }
}

import Foundation
import LMDB
import Synchronization

/// The opened state of one store folder, shared by every ``Store`` object of this process that
/// opened it: the LMDB environment, its database handles, the catalog cache, the observers and
/// the shared `flock` on `strata.lock`.
///
/// LMDB's locks belong to the process: a second `mdb_env_open` of the same files in one process,
/// or closing one, drops the locks the first relies on (lost commits, corrupted pages; see the
/// caveats in `lmdb.h` and docs/durability-and-concurrency.md). So a folder is opened once
/// per process: ``StoreRegistry`` hands every `Store(path:)` of an open folder this same object
/// and closes it when the last `Store` over it is closed or released.
///
/// Everything mutable that belongs to a store (rather than to one `Store` object) lives here.
final class StoreCore: @unchecked Sendable {
    // @unchecked: `users` is only touched by ``StoreRegistry`` with its lock held; everything
    // else is immutable or synchronized itself.
    /// The folder as the first opener named it.
    let path: String
    /// The options of the first opener; later opens share them.
    let options: StoreOptions
    let identity: FolderIdentity
    /// The identity of `data.mdb` while this core has it open. The environment keeps the file
    /// open, so no other file can get this inode meanwhile: the registry compares it to tell a
    /// folder that was deleted and recreated (and happens to reuse the folder's inode) from the
    /// folder this core opened.
    let dataFile: FolderIdentity
    let clientID: String
    let env: Environment
    let databases: StoreDatabases
    /// The catalog last seen; a transaction checks its version against `meta`, unless it reads
    /// the snapshot the catalog was last found current for (`Store.currentCatalog`).
    let cachedCatalog: Locked<CachedCatalog>
    let observers = Observers()
    /// Shared `flock` on `strata.lock` in the store's folder, held while the store is open, so
    /// that ``Store/reclaimSpace(at:)`` can tell that nobody has it open.
    private let lockFD: Int32
    /// The `Store` objects over this core (``StoreRegistry`` counts them under its lock).
    var users = 0
    /// Whether the store's files cannot be written by this process, so it was opened read-only.
    let isReadOnly: Bool
    /// The view changes committed but not yet checkpointed, as of the newest commit (see
    /// `Checkpoint.swift`).
    let overlay = PublishedOverlay(.empty(at: 0))
    /// Writes waiting for a group commit (see `GroupCommit.swift`).
    let writers: WriteQueue
    /// Whether this process committed a write to the store: only then does closing it
    /// checkpoint. A process that only reads never takes the writer's lock, even to close.
    let hasWritten = Atomic<Bool>(false)
    /// Whether ``shutdown()`` ran (the descriptor and the environment are closed).
    private let isShutDown = Atomic<Bool>(false)

    /// Opens the store in `path` (which exists): takes the shared folder lock, opens the
    /// environment, and reads (or initializes, or migrates) the store. Frees everything it took
    /// on any failure.
    init(path: String, identity: FolderIdentity, options: StoreOptions) throws(StrataError) {
        self.path = path
        self.options = options
        self.identity = identity
        writers = WriteQueue(observers: observers)
        // Files this process cannot write (a store copied off a device, a read-only mount, another
        // user's store): open read-only, so it can still be inspected.
        let writable = { (file: String) in access(path + "/" + file, W_OK) == 0 || (errno == ENOENT && access(path, W_OK) == 0) }
        isReadOnly = FileManager.default.fileExists(atPath: path + "/data.mdb") && !(writable("data.mdb") && writable("lock.mdb"))
        // Before anything is created in the folder: what was there, and no empty data.mdb
        // (LMDB would write a new environment into it).
        let before = StoreFiles.Before(path)
        try StoreFiles.refuseEmptyDataFile(in: path)
        lockFD = try Store.lockFolder(path, exclusive: false)
        // The page check and the crash-loop guard (Check/OpenMarker.swift), before LMDB maps the
        // file: a damaged store is `corruptStore` and LMDB never reads it. Run by the first open of
        // the folder in this process (the registry shares the environment with later ones),
        // whether or not another process has the store open: a check reads no page a writer may
        // change under it without noticing (see `PageCheck.run`), so another process's commits
        // never make it report damage.
        var markerCreated = false
        do {
            if before.dataFile {
                var check = options.checkAtOpen
                if check != .none && OpenMarker.lastOpenDidNotClose(path) { check = .full }
                try PageCheck.beforeOpening(path, check)
            }
            if !isReadOnly { markerCreated = OpenMarker.create(in: path) }
            if !isReadOnly { try StoreFiles.allocateLockFile(in: path, readers: options.maxReaders) }
        } catch {
            if markerCreated { unlink(OpenMarker.path(path)) }
            closeDescriptor(lockFD)
            if error.code == .corruptStore { StoreFiles.removeCreatedLockFiles(in: path, before: before) }
            throw error
        }
        // A reclaim holds the lock exclusively while it runs, so with the shared lock held none
        // runs: a `reclaim.tmp` here is the leftover of one that was killed.
        if FileManager.default.fileExists(atPath: path + "/reclaim.tmp") {
            try? FileManager.default.removeItem(atPath: path + "/reclaim.tmp")
        }
        var envOptions = EnvironmentOptions()
        envOptions.mapSize = options.initialMapSize
        envOptions.maxReaders = options.maxReaders
        envOptions.syncMode = options.durability.syncMode
        envOptions.maxDatabases = 16
        if isReadOnly {
            envOptions.readOnly = true
            // LMDB needs a writable lock.mdb to register readers; without one it can only run
            // lock-free, which is safe while nobody writes (see `Store.isReadOnly`).
            envOptions.noLock = !writable("lock.mdb")
        }
        do {
            env = try Environment(path: path, options: envOptions)
        } catch {
            if markerCreated { unlink(OpenMarker.path(path)) }
            closeDescriptor(lockFD)
            if error.resultCode == .invalid || error.resultCode == .versionMismatch {
                // LMDB read the header and wrote nothing: not an LMDB file (or not one it reads).
                StoreFiles.removeCreatedLockFiles(in: path, before: before)
                throw StrataError(.notAStore, StoreFiles.notAStoreMessage(path, "its data.mdb is not an LMDB file of a version this Strata reads (\(error.message))"), cause: error)
            }
            throw StrataError(.io, "cannot open the store at '\(path)': \(error.message)", cause: error)
        }
        let opened: (StoreDatabases, String, Catalog)
        do {
            try StoreCore.checkFileLength(env, path: path)
            opened = try StoreCore.open(env, path: path, readOnly: isReadOnly, mayInitialize: options.createIfMissing && before.mayInitializeFresh)
            dataFile = try FolderIdentity(of: path + "/data.mdb")
        } catch {
            env.close()
            if markerCreated { unlink(OpenMarker.path(path)) }
            closeDescriptor(lockFD)
            if error.code == .notAStore { StoreFiles.removeCreatedLockFiles(in: path, before: before) }
            throw error
        }
        (databases, clientID) = (opened.0, opened.1)
        cachedCatalog = Locked(CachedCatalog(catalog: opened.2, snapshotID: CachedCatalog.unknown))
    }

    deinit {
        // A core is shut down by the registry when its last Store goes; this covers a core that
        // never made it into the registry.
        if !isShutDown.load(ordering: .acquiring) { closeDescriptor(lockFD) }
    }

    /// Closes the environment, then releases the folder lock. Called by the registry, under its
    /// lock, once no `Store` uses this core any more: nothing can open the folder meanwhile.
    func shutdown() {
        guard !isShutDown.exchange(true, ordering: .acquiringAndReleasing) else { return }
        // The log holds everything; this only spares the next open the fold of the tail.
        try? checkpointOnClose()
        env.close()
        // A clean close: the next open need not suspect a crash (Check/OpenMarker.swift).
        if !isReadOnly { OpenMarker.removeAtCleanClose(path, lockFD: lockFD) }
        closeDescriptor(lockFD)
    }

    /// Writes a non-empty overlay into the views when this process wrote to the store.
    private func checkpointOnClose() throws {
        let version = overlay.current
        guard !version.isEmpty, !isReadOnly, hasWritten.load(ordering: .relaxed) else { return }
        try Store.mappingStorageErrors {
            try env.write { txn in
                // Only if the overlay still completes the store: another process may have
                // written or checkpointed since.
                let end = try txn.lastLSN(in: databases)
                let viewsLSN = try txn.metaUInt64(MetaKey.viewsLSN, in: databases) ?? end
                guard version.lsn == end, version.base <= viewsLSN, viewsLSN < end else { return }
                try Checkpoint.write(version, into: txn, databases)
                try txn.setMeta(MetaKey.viewsLSN, end, in: databases)
            }
        }
    }

    /// Refuses a file shorter than its own last page says: LMDB maps the file and would read
    /// past its end (a SIGBUS, not an error) at the first touch of a missing page.
    private static func checkFileLength(_ env: Environment, path: String) throws(StrataError) {
        // The pages first, then the file: a commit in another process writes its pages (growing
        // the file) before the meta page that counts them, so read the other way round a
        // commit in between would look like a truncated file.
        let used = env.usedBytes
        let size = try Store.fileSize(path + "/data.mdb")
        guard size >= used else {
            throw StrataError(.corruptRecord, "the store's file '\(path)/data.mdb' is truncated: it holds \(size) bytes, but its pages reach \(used); restore it from a copy")
        }
    }

    /// Opens the databases and reads the client id and catalog. An existing store of the current
    /// format is opened with read transactions only, so opening never waits for a writer (an app
    /// in the middle of a long write, in this process or another). A new store, or one of an
    /// older format, needs one write transaction to initialize or migrate it.
    ///
    /// Nothing is written to an environment that is not a Strata store (see `StoreFiles`): a
    /// fresh one (no transaction ever committed) is initialized only when `mayInitialize`,
    /// anything else is refused with `notAStore`.
    private static func open(_ env: Environment, path: String, readOnly: Bool, mayInitialize: Bool) throws(StrataError) -> (StoreDatabases, String, Catalog) {
        if let current = try openCurrent(env, path: path) { return current }
        // Not a current store: an older one, a fresh environment, or something else. Decided
        // with a read transaction first, so that something else is never written to.
        switch try inspect(env, path: path) {
        case .strata: break
        case .fresh:
            guard mayInitialize else {
                throw StrataError(.notAStore, StoreFiles.notAStoreMessage(path, "its data.mdb is an empty LMDB environment, not (yet) a store; a Strata process may be creating it right now, else it was left by one that was stopped while creating it (open it with Store(path:) to create the store), or another program made it"))
            }
        case .foreign(let found):
            throw StrataError(.notAStore, StoreFiles.notAStoreMessage(path, found))
        }
        if readOnly {
            throw StrataError(.io, "the store at '\(path)' must be written to open (it is new or of an older format), but its files are read-only to this process")
        }
        return try strataErrors {
            try env.write { txn in
                // Again under LMDB's writer lock, which orders this open against another process
                // creating the store: if that one committed first, this finds its store.
                let format: UInt64?
                // Probed in the main database first: a failed mdb_dbi_open would fail the whole
                // write transaction (see `WriteTransaction`).
                let main = try txn.openDatabase(nil, create: false)
                let hasMeta = try txn.get(Array(StoreDatabases.names.meta.utf8), in: main) != nil
                switch try metaFormat(txn.reader, meta: hasMeta ? try txn.openDatabase(StoreDatabases.names.meta, create: false) : nil) {
                case .some(let v): format = v
                case .none where txn.id == 1 && mayInitialize: format = nil  // still fresh
                case .none:
                    throw StrataError(.notAStore, StoreFiles.notAStoreMessage(path, "its data.mdb is an LMDB database without Strata's metadata (another program wrote to it meanwhile)"))
                }
                let databases = try StoreDatabases.open(txn)
                switch format {
                case nil:
                    try txn.setMeta(MetaKey.format, Store.formatVersion, in: databases)
                    try txn.setMeta(MetaKey.clientID, Array(UUID().uuidString.utf8), in: databases)
                    try txn.setMeta(MetaKey.catalog, try Catalog().encoded(), in: databases)
                    try txn.setMeta(MetaKey.catalogVersion, 0, in: databases)
                    try txn.setMeta(MetaKey.viewsLSN, 0, in: databases)
                    try txn.setMeta(MetaKey.checksumsFrom, 1, in: databases)
                    try txn.setMeta(MetaKey.lsnCoveredFrom, 1, in: databases)
                case let v? where v > Store.formatVersion:
                    throw StrataError(.formatVersion, "the store at '\(path)' has format \(v), newer than this Strata reads (\(Store.formatVersion)); upgrade Strata to open it")
                case let v? where v < Store.formatVersion:
                    try Migration.upgrade(from: v, txn, databases, path: path)
                default: break
                }
                guard let id = try txn.meta(MetaKey.clientID, in: databases) else {
                    throw StrataError(.corruptRecord, "the store at '\(path)' has no client id")
                }
                return (databases, String(decoding: id, as: UTF8.self), try Store.loadCatalog(txn, databases))
            }
        }
    }

    /// What an environment that is not a current store holds.
    enum Content {
        /// A Strata store (of an older format, to migrate).
        case strata
        /// No transaction was ever committed: nothing to lose.
        case fresh
        /// Anything else, described for the error.
        case foreign(String)
    }

    /// Tells a Strata store from a fresh environment and from anything else, in a read
    /// transaction: writes nothing. An LMDB error (a damaged root page) counts as foreign.
    static func inspect(_ env: Environment, path: String) throws(StrataError) -> Content {
        do {
            let main = try env.openDatabase(nil, create: false)
            // `meta` is looked up in one read transaction and read in the next: a Strata process
            // creating the store may commit in between (seen under AddressSanitizer's timing),
            // leaving its databases in the second snapshot but no `meta` handle from the first.
            // Then the lookup is made again, so that a store being created is never taken for
            // another program's database.
            for attempt in 1... {
                var meta: Database?
                do {
                    meta = try env.openDatabase(StoreDatabases.names.meta, create: false)
                } catch let error as LMDBError where error.resultCode == .notFound {
                    meta = nil
                }
                let content = try env.read { txn -> Content? in
                    if try metaFormat(txn, meta: meta) != nil { return .strata }
                    if meta == nil, attempt < 3, try txn.get(Array(StoreDatabases.names.meta.utf8), in: main) != nil { return nil }
                    let entries = try txn.stats(main).entries
                    if txn.id == 0 && entries == 0 { return .fresh }
                    return .foreign("its data.mdb is an LMDB database without Strata's metadata (\(entries) entries in its main database, no 'meta' database with a format version): another program's database, or a store whose header is damaged (try `strata salvage`)")
                }
                if let content { return content }
            }
            fatalError("unreachable: the third attempt always decides")
        } catch let error as StrataError {
            throw error
        } catch let error as LMDBError where error.isDamage {
            return .foreign("its data.mdb is an LMDB file whose list of databases cannot be read (\(error.message)): a damaged store (try `strata salvage`), or not a Strata store")
        } catch let error as LMDBError {
            throw StrataError.storage(error)
        } catch {
            throw StrataError(.storage, "\(error)")
        }
    }

    /// The format version in `meta`, or `nil` when there is no `meta` database or no version in
    /// it. A version of the wrong length is corrupt (the store is Strata's, but damaged).
    private static func metaFormat(_ txn: ReadTransaction, meta: Database?) throws(StrataError) -> UInt64? {
        guard let meta else { return nil }
        guard let bytes = try lmdb({ () throws(LMDBError) in try txn.get(Array(MetaKey.format.utf8), in: meta) }) else { return nil }
        return try Counter.decode(bytes, database: StoreDatabases.names.meta, key: MetaKey.format)
    }

    /// The read-only way in: `nil` when the store is not an initialized store of the current
    /// format (a database missing, no format, an older format), which the write path handles.
    private static func openCurrent(_ env: Environment, path: String) throws(StrataError) -> (StoreDatabases, String, Catalog)? {
        func database(_ name: String) throws(StrataError) -> Database? {
            do {
                return try env.openDatabase(name, create: false)
            } catch let error as LMDBError where error.resultCode == .notFound || error.isDamage {
                // Damage too: `inspect` says what the file is, without writing to it.
                return nil
            } catch let error as LMDBError {
                throw StrataError.storage(error)
            } catch {
                throw StrataError(.storage, "\(error)")
            }
        }
        let n = StoreDatabases.names
        guard let log = try database(n.log), let rows = try database(n.rows), let pending = try database(n.pending),
              let gone = try database(n.gone), let index = try database(n.index), let view = try database(n.view),
              let base = try database(n.base), let meta = try database(n.meta)
        else { return nil }
        let databases = StoreDatabases(log: log, rows: rows, pending: pending, gone: gone, index: index, view: view, base: base, meta: meta)
        return try strataErrors {
            try env.read { txn -> (StoreDatabases, String, Catalog)? in
                let format = try txn.metaUInt64(MetaKey.format, in: databases)
                if let format, format > Store.formatVersion {
                    throw StrataError(.formatVersion, "the store at '\(path)' has format \(format), newer than this Strata reads (\(Store.formatVersion)); upgrade Strata to open it")
                }
                guard format == Store.formatVersion, let id = try txn.meta(MetaKey.clientID, in: databases) else { return nil }
                return (databases, String(decoding: id, as: UTF8.self), try Store.loadCatalog(txn, databases))
            }
        }
    }
}

/// A file or folder's device and inode: what identifies it whatever path names it (symlinks,
/// `..`, relative paths).
struct FolderIdentity: Hashable, Sendable {
    let device: UInt64
    let inode: UInt64

    init(of path: String) throws(StrataError) {
        var st = stat()
        guard stat(path, &st) == 0 else {
            throw StrataError(.io, "cannot stat '\(path)': \(String(cString: strerror(errno)))")
        }
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
    }
}

/// The stores open in this process, by folder identity. Opening and closing run under one lock,
/// so a folder's environment is never opened while another of its environments is still open or
/// closing.
final class StoreRegistry: @unchecked Sendable {
    // @unchecked: `open` and every core's `users` are only touched with `lock` held.
    static let shared = StoreRegistry()

    private let lock = NSLock()
    private var open: [FolderIdentity: StoreCore] = [:]

    /// The core of the store in `path` (an existing folder): the open one, counted once more,
    /// or a newly opened one.
    ///
    /// Opening runs under the registry's lock. It takes no write transaction for an existing
    /// store of the current format, so it does not wait for writers.
    func acquire(path: String, options: StoreOptions) throws(StrataError) -> StoreCore {
        lock.lock()
        defer { lock.unlock() }
        let identity = try FolderIdentity(of: path)
        if let core = open[identity] {
            if (try? FolderIdentity(of: path + "/data.mdb")) == core.dataFile {
                core.users += 1
                return core
            }
            // The folder that core opened was deleted, and this one reuses its inode: the old
            // core stays with its users, but is no longer found by path.
            open[identity] = nil
        }
        let core = try StoreCore(path: path, identity: identity, options: options)
        core.users = 1
        open[identity] = core
        return core
    }

    /// One `Store` over `core` is done with it; the last one closes it, before any other open of
    /// the folder can start.
    func release(_ core: StoreCore) {
        lock.lock()
        defer { lock.unlock() }
        core.users -= 1
        guard core.users == 0 else { return }
        if open[core.identity] === core { open[core.identity] = nil }
        core.shutdown()
    }

    /// Whether this process has the store in the folder at `path` open.
    func isOpen(_ path: String) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        guard let identity = try? FolderIdentity(of: path), let core = open[identity] else { return false }
        return (try? FolderIdentity(of: path + "/data.mdb")) == core.dataFile
    }
}

/// `close(2)` under a name that `Store.close()` does not shadow inside `Store`'s extensions.
func closeDescriptor(_ fd: Int32) {
    _ = close(fd)
}

/// A store's catalog, and the LMDB snapshot (`snapshotID`) it is known to be current for.
struct CachedCatalog {
    /// No snapshot id is negative.
    static let unknown = -1
    var catalog: Catalog
    var snapshotID: Int
}

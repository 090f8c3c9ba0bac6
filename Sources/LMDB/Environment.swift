import CLMDB
import StrataLibc
import Synchronization

/// How much a commit waits for the disk.
public enum SyncMode: String, Sendable, CaseIterable, Codable {
    /// Every commit is on disk when it returns (one `fdatasync` per commit). The default.
    case full
    /// `MDB_NOMETASYNC`: the data is synced, the meta page is not. A crash can roll back the
    /// last committed transaction, never corrupt the store.
    case noMetaSync
    /// `MDB_NOSYNC`: a commit does not sync; data reaches the disk when the system writes it back
    /// or the environment is synced (`mdb_env_sync`, which Strata's `flush()` calls). A crash can lose every
    /// transaction since the last sync (the store stays consistent on ext4/xfs, but not on
    /// every file system).
    case noSync
}

/// Options for opening an ``Environment``.
public struct EnvironmentOptions: Sendable {
    /// The initial map size in bytes. The map grows by itself when full, so this is a hint.
    public var mapSize: Int = 64 << 20
    /// The most named databases the environment can hold (`mdb_env_set_maxdbs`).
    package var maxDatabases: UInt32 = 32
    /// The most concurrent read transactions across all processes (`mdb_env_set_maxreaders`).
    package var maxReaders: UInt32 = 126
    /// Commit durability; see ``SyncMode``.
    public var syncMode: SyncMode = .full
    /// Open the environment read-only.
    package var readOnly: Bool = false
    /// Use no lock file (`MDB_NOLOCK`): for read-only access to files this process cannot
    /// write, `lock.mdb` included. The caller must make sure no writer changes the files
    /// meanwhile: without the lock, LMDB cannot keep a writer off the pages a reader uses.
    package var noLock: Bool = false
    /// The permissions of newly created files.
    package var fileMode: mode_t = 0o644
    /// Make the lock that map growth takes exclusively writer-preferring on Linux too, as it is
    /// on Darwin: a growth waiting for it holds back new transactions. For tests, which meet the
    /// waits of Darwin's lock this way; glibc's default lock prefers readers.
    package var growthLockPrefersWriters = false

    /// The defaults: a 64 MiB map, 32 named databases, 126 readers, full sync, read-write, with locking.
    public init() {}
}

/// Statistics of a database or of the whole environment (`MDB_stat`).
package struct DatabaseStats: Sendable, Hashable {
    /// The size of a database page in bytes (`ms_psize`).
    package var pageSize: Int
    /// The depth of the B-tree (`ms_depth`).
    package var depth: Int
    /// Internal (non-leaf) pages (`ms_branch_pages`).
    package var branchPages: Int
    /// Leaf pages (`ms_leaf_pages`).
    package var leafPages: Int
    /// Overflow pages, which hold large values (`ms_overflow_pages`).
    package var overflowPages: Int
    /// Entries (`ms_entries`).
    package var entries: Int

    init(_ s: MDB_stat) {
        pageSize = Int(s.ms_psize)
        depth = Int(s.ms_depth)
        branchPages = s.ms_branch_pages
        leafPages = s.ms_leaf_pages
        overflowPages = s.ms_overflow_pages
        entries = s.ms_entries
    }
}

/// An LMDB environment: one memory-mapped store holding any number of named databases.
///
/// Transactions are closure-scoped: `read(_:)` and ``write(_:)`` begin one, hand it to the
/// closure, and end it when the closure returns. A write commits on normal return and aborts when
/// the closure throws. Neither kind may escape its closure.
///
/// The map grows by itself. When a write runs out of map space, the transaction is aborted, the
/// map is doubled while no transaction of this process is alive, and the whole closure runs
/// again — so **a write closure may run more than once** and must not have side effects outside
/// its transaction. Callers never see `MDB_MAP_FULL`.
///
/// ```swift
/// let env = try Environment(path: "/tmp/store")
/// let items = try env.openDatabase("items")
/// try env.write { txn in try txn.put([1], [42], in: items) }
/// let value = try env.read { txn in txn.get([1], in: items).map(Array.init) }
/// ```
///
/// Rules LMDB imposes and this type enforces:
/// - Environments are opened with `MDB_NOTLS`, so read transactions are not tied to a thread.
/// - A write transaction must end on the thread that began it; write closures are synchronous.
/// - Nesting a write inside another write on the same thread is a programming error (it would
///   deadlock on LMDB's writer lock) and traps.
public final class Environment: @unchecked Sendable {
    // @unchecked: the MDB_env handle is thread-safe under MDB_NOTLS (LMDB serialises writers
    // with its own mutex); `writerStatus` is only touched by the thread that holds LMDB's writer
    // lock; map resizing is guarded by `resizeLock`; `isClosed` is written only under
    // `resizeLock` held exclusively and read under it held shared.

    /// The raw `MDB_env*`, for code that needs an `mdb_*` call this wrapper does not offer.
    package let handle: OpaquePointer
    /// The folder the environment lives in.
    public let path: String
    /// The options it was opened with.
    package let options: EnvironmentOptions

    private let resizeLock: ReadWriteLock
    /// Set by ``close()``; every later transaction fails with ``LMDBError/ResultCode/closed``.
    private var isClosed = false
    /// Per thread, how many transactions of this environment it holds (to refuse, rather than
    /// deadlock, a map resize requested while the same thread still holds a transaction).
    private let depthKey: pthread_key_t
    /// The first LMDB error seen inside the current write transaction.
    private let writerStatus: UnsafeMutablePointer<Int32>
    private let pageSize: Int
    /// Where the map lies, to check what transactions lend (see ``LMDBError/ResultCode/valueOutsideFile``).
    private let bounds: MapBounds
    /// Reader slots of dead processes that `mdb_reader_check` cleared when this environment was
    /// opened. Such slots would otherwise pin old pages (the file grows) and use up slots.
    package let staleReadersCleared: Int
    /// The most bytes one write transaction was seen to need: the growth of the used pages of a
    /// committed write, or the room a write ran out of. The map is kept at least twice this
    /// much ahead of the used pages (see `growIfNearlyFull`).
    private let largestWrite = Atomic<Int>(0)
    private let reruns = Atomic<Int>(0)

    /// How many times a write closure ran again because the map was full (its transaction was
    /// aborted, the map grown, and the closure run from the start). Growing ahead of writes
    /// keeps this rare: typically once, the first time a write larger than any before fills the map.
    package var writeReruns: Int { reruns.load(ordering: .relaxed) }

    /// Opens (creating if needed) the environment in the folder at `path`.
    ///
    /// Stale reader slots left by dead processes are cleared on open (`mdb_reader_check`).
    public init(path: String, options: EnvironmentOptions = EnvironmentOptions()) throws(LMDBError) {
        if !options.readOnly {
            // The folder must exist before mdb_env_open; an existing one is fine.
            _ = mkdir(path, 0o755)
        }
        var env: OpaquePointer?
        var dead: Int32 = 0
        try check(mdb_env_create(&env), "mdb_env_create")
        guard let env else { throw LMDBError(code: ENOMEM, operation: "mdb_env_create") }
        do {
            try check(mdb_env_set_maxdbs(env, MDB_dbi(options.maxDatabases)), "mdb_env_set_maxdbs")
            try check(mdb_env_set_maxreaders(env, options.maxReaders), "mdb_env_set_maxreaders")
            try check(mdb_env_set_mapsize(env, options.mapSize), "mdb_env_set_mapsize")
            var flags = UInt32(MDB_NOTLS)
            switch options.syncMode {
            case .full: break
            case .noMetaSync: flags |= UInt32(MDB_NOMETASYNC)
            case .noSync: flags |= UInt32(MDB_NOSYNC)
            }
            if options.readOnly { flags |= UInt32(MDB_RDONLY) }
            if options.noLock { flags |= UInt32(MDB_NOLOCK) }
            try check(mdb_env_open(env, path, flags, options.fileMode), "mdb_env_open(\(path))")
            try check(mdb_reader_check(env, &dead), "mdb_reader_check")
        } catch {
            // lmdb.h: "If this function fails, mdb_env_close() must be called to discard the
            // MDB_env handle" — and that holds for any failure after mdb_env_create.
            mdb_env_close(env)
            throw error
        }
        var stat = MDB_stat()
        mdb_env_stat(env, &stat)
        self.pageSize = Int(stat.ms_psize)
        self.staleReadersCleared = Int(dead)
        self.bounds = MapBounds(env: env)
        self.handle = env
        self.path = path
        self.options = options
        self.resizeLock = ReadWriteLock(preferWriters: options.growthLockPrefersWriters)
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        self.depthKey = key
        self.writerStatus = .allocate(capacity: 1)
        writerStatus.initialize(to: 0)
    }

    deinit {
        if !isClosed { mdb_env_close(handle) }
        pthread_key_delete(depthKey)
        writerStatus.deallocate()
    }

    // MARK: Transactions

    /// Runs `body` in a read-only snapshot transaction.
    ///
    /// The snapshot is consistent and never blocks the writer. Memory lent by the transaction
    /// (values returned by `get` and cursors) is valid only inside `body`.
    ///
    /// - Complexity: O(1) to begin and end, plus whatever `body` does.
    package func read<R>(_ body: (ReadTransaction) throws -> R) throws -> R {
        while true {
            enter()
            if isClosed {
                leave()
                throw LMDBError(.closed, operation: "mdb_txn_begin(read)")
            }
            var txn: OpaquePointer?
            let rc = mdb_txn_begin(handle, nil, UInt32(MDB_RDONLY), &txn)
            if rc == MDB_MAP_RESIZED {
                leave()
                try adoptResizedMap()
                continue
            }
            guard rc == 0, let txn else {
                leave()
                throw LMDBError(code: rc, operation: "mdb_txn_begin(read)")
            }
            defer {
                mdb_txn_abort(txn)
                leave()
            }
            return try body(ReadTransaction(handle: txn, lent: LentMemory(bounds: bounds, writing: false)))
        }
    }

    /// Runs `body` in a write transaction: commits when it returns, aborts when it throws.
    ///
    /// If the map fills up, the transaction is aborted, the map grows, and `body` runs again from
    /// the start; `body` must therefore be free of side effects outside the transaction.
    ///
    /// - Complexity: O(1) plus `body`, plus one `fdatasync` under ``SyncMode/full``.
    public func write<R>(_ body: (WriteTransaction) throws -> R) throws -> R {
        precondition(depth & 1 == 0, "LMDB: a write transaction was begun inside another write transaction on the same thread")
        var attempt = 0
        while true {
            let (mapSize, usedBefore) = try growIfNearlyFull()
            // A rerun needs more room than the map had free; each further one asks for more,
            // so that one very large write costs few reruns.
            func ranOutOfRoom() throws {
                attempt += 1
                reruns.add(1, ordering: .relaxed)
                largestWrite.max(max(0, mapSize - usedBefore) << attempt, ordering: .relaxed)
                try grow(from: mapSize, toFit: usedBefore)
            }
            enter(writing: true)
            if isClosed {
                leave(writing: true)
                throw LMDBError(.closed, operation: "mdb_txn_begin(write)")
            }
            var txn: OpaquePointer?
            var rc = mdb_txn_begin(handle, nil, 0, &txn)
            if rc == MDB_MAP_RESIZED {
                leave(writing: true)
                try adoptResizedMap()
                continue
            }
            guard rc == 0, let txn else {
                leave(writing: true)
                throw LMDBError(code: rc, operation: "mdb_txn_begin(write)")
            }
            writerStatus.pointee = 0
            let result: R
            do {
                result = try body(WriteTransaction(handle: txn, status: writerStatus, lent: LentMemory(bounds: bounds, writing: true)))
            } catch {
                let status = writerStatus.pointee
                mdb_txn_abort(txn)
                leave(writing: true)
                if status == MDB_MAP_FULL {
                    try ranOutOfRoom()
                    continue
                }
                throw error
            }
            let status = writerStatus.pointee
            if status != 0 {
                // The closure swallowed an LMDB error: the transaction is unusable, so nothing
                // of it may be committed.
                mdb_txn_abort(txn)
                leave(writing: true)
                if status == MDB_MAP_FULL {
                    try ranOutOfRoom()
                    continue
                }
                throw LMDBError(code: status, operation: "write transaction")
            }
            // mdb_txn_commit frees the transaction whether or not it succeeds: never abort after it.
            rc = mdb_txn_commit(txn)
            leave(writing: true)
            if rc == MDB_MAP_FULL {
                try ranOutOfRoom()
                continue
            }
            try check(rc, "mdb_txn_commit")
            largestWrite.max(usedBytes - usedBefore, ordering: .relaxed)
            return result
        }
    }

    /// Opens (or creates) a named database; `nil` names the main database.
    ///
    /// Database handles stay valid for the life of the environment.
    public func openDatabase(_ name: String?, create: Bool = true) throws -> Database {
        if create && !options.readOnly {
            return try write { try $0.openDatabase(name, create: true) }
        }
        // A handle opened in a read-only transaction survives only if that transaction is
        // committed (an abort closes it), so this one does not go through `read`.
        var txn: OpaquePointer?
        while true {
            enter()
            guard !isClosed else {
                leave()
                throw LMDBError(.closed, operation: "mdb_dbi_open(\(name ?? "main"))")
            }
            let rc = mdb_txn_begin(handle, nil, UInt32(MDB_RDONLY), &txn)
            if rc == MDB_MAP_RESIZED {
                // Another process grew the map since this one opened it (as in `read`).
                leave()
                try adoptResizedMap()
                continue
            }
            guard rc == 0 else {
                leave()
                throw LMDBError(code: rc, operation: "mdb_txn_begin(read)")
            }
            break
        }
        defer { leave() }
        var dbi = MDB_dbi()
        let rc = mdb_dbi_open(txn, name, 0, &dbi)
        if rc != 0 {
            mdb_txn_abort(txn)
            throw LMDBError(code: rc, operation: "mdb_dbi_open(\(name ?? "main"))")
        }
        try check(mdb_txn_commit(txn), "mdb_txn_commit")
        return Database(dbi: dbi, name: name)
    }

    // MARK: Maintenance

    /// Flushes buffered commits to disk (`mdb_env_sync` with force), for ``SyncMode/noSync``.
    package func sync() throws(LMDBError) {
        let locked = lockSharedUnlessHeld()
        defer { if locked { resizeLock.unlock() } }
        guard !isClosed else { throw LMDBError(.closed, operation: "mdb_env_sync") }
        try check(mdb_env_sync(handle, 1), "mdb_env_sync")
    }

    /// Closes the environment now (`mdb_env_close`) instead of when it is released: waits for
    /// the transactions of this process to end, then closes. Every later transaction, copy or
    /// sync fails with ``LMDBError/ResultCode/closed``; sizes read as 0. Closing twice does nothing.
    ///
    /// LMDB's locks belong to the process, so the files must not be opened again in this process
    /// before this returns (see the caveats in `lmdb.h`, and docs/durability-and-concurrency.md).
    ///
    /// - Precondition: the calling thread holds no transaction of this environment.
    public func close() {
        precondition(depth == 0, "LMDB: an environment was closed by a thread that holds one of its transactions")
        resizeLock.lockExclusive()
        defer { resizeLock.unlock() }
        guard !isClosed else { return }
        isClosed = true
        mdb_env_close(handle)
    }

    /// Whether ``close()`` was called.
    package var closed: Bool {
        let locked = lockSharedUnlessHeld()
        defer { if locked { resizeLock.unlock() } }
        return isClosed
    }

    /// Takes the resize lock shared unless this thread holds it already (it does while it holds
    /// a transaction): taking a read-write lock shared twice on one thread can deadlock when a
    /// writer is waiting in between. Returns whether it took the lock.
    private func lockSharedUnlessHeld() -> Bool {
        guard depth == 0 else { return false }
        resizeLock.lockShared()
        return true
    }

    /// Copies the environment to the (existing, empty) folder `path`, optionally compacting it
    /// (free pages are omitted and the copy renumbered). Safe while the environment is in use.
    package func copy(to path: String, compact: Bool = true) throws(LMDBError) {
        let locked = lockSharedUnlessHeld()
        defer { if locked { resizeLock.unlock() } }
        guard !isClosed else { throw LMDBError(.closed, operation: "mdb_env_copy2(\(path))") }
        try check(mdb_env_copy2(handle, path, compact ? UInt32(MDB_CP_COMPACT) : 0), "mdb_env_copy2(\(path))")
    }

    /// Takes the data file's pages out of this process's resident memory: `madvise(MADV_DONTNEED)`
    /// over the part of the map the file backs. Returns whether it did (it does nothing where the
    /// map's address is unknown: not Linux, see ``MapBounds``).
    ///
    /// For a bulk load, such as a first sync: every page a write reads on its way down the trees
    /// stays mapped, so a process's resident size grows with the store even though its own memory
    /// does not. Those pages are clean copies of the file (LMDB writes with `pwrite`, not through
    /// the map), so dropping them loses nothing; the next read of one maps it again from the page
    /// cache. Safe beside readers in other threads for the same reason, and under the resize lock
    /// so that the map cannot move while this runs.
    @discardableResult
    package func releaseMappedPages() -> Bool {
        let locked = lockSharedUnlessHeld()
        defer { if locked { resizeLock.unlock() } }
        guard !isClosed, bounds.base != 0, let map = UnsafeMutableRawPointer(bitPattern: bounds.base) else { return false }
        var i = MDB_envinfo()
        mdb_env_info(handle, &i)
        let (pages, overflow) = i.me_last_pgno.multipliedReportingOverflow(by: pageSize)
        let length = overflow ? Int(bounds.mapSize) : min(Int(bounds.mapSize), pages + pageSize)
        return madvise(map, length, MADV_DONTNEED) == 0
    }

    /// Statistics of the main database: page size, depth, page counts.
    package func stats() -> DatabaseStats {
        var s = MDB_stat()
        let locked = lockSharedUnlessHeld()
        defer { if locked { resizeLock.unlock() } }
        if !isClosed { mdb_env_stat(handle, &s) }
        return DatabaseStats(s)
    }

    /// The page of the data file that `pointer` — memory lent by a transaction of this
    /// environment — lies in, or `nil` when it is not in the map (a write transaction's dirty
    /// page) or the map's address is unknown (see ``LMDBError/ResultCode/valueOutsideFile``). For reports
    /// that say where in the file something is.
    package func page(of pointer: UnsafeRawPointer) -> Int? {
        let p = UInt(bitPattern: pointer)
        guard bounds.base != 0, p >= bounds.base, p - bounds.base < bounds.mapSize else { return nil }
        return Int((p - bounds.base) / UInt(pageSize))
    }

    /// The size of a page, in bytes.
    package var pageBytes: Int { pageSize }

    /// The current map size in bytes.
    package var mapSize: Int { info().me_mapsize }

    /// The bytes in use: pages up to the last one written.
    package var usedBytes: Int {
        let i = info()
        guard i.me_mapsize != 0 else { return 0 }
        // The last page number comes from the file: a damaged meta page may hold any number
        // (2^60 was seen), and the product must saturate, not trap.
        let (pages, o1) = i.me_last_pgno.addingReportingOverflow(1)
        let (bytes, o2) = pages.multipliedReportingOverflow(by: pageSize)
        return o1 || o2 ? Int.max : bytes
    }

    /// Environment info; zeros once closed. `locked`: the caller holds the resize lock
    /// (exclusively) already.
    private func info(locked: Bool = false) -> MDB_envinfo {
        var i = MDB_envinfo()
        let took = locked ? false : lockSharedUnlessHeld()
        defer { if took { resizeLock.unlock() } }
        if !isClosed { mdb_env_info(handle, &i) }
        return i
    }

    // MARK: Map growth

    private var depth: Int {
        get { Int(bitPattern: pthread_getspecific(depthKey)) }
        set { pthread_setspecific(depthKey, UnsafeRawPointer(bitPattern: newValue)) }
    }

    /// Counts the transaction in this thread's depth (bit 0: a write is open; higher bits:
    /// number of reads), taking the resize lock shared for the thread's first one only. A
    /// thread holding a transaction holds the lock already, and taking it again could wait
    /// behind a growth queued meanwhile (a writer-preferring lock, as Darwin's) — a growth that
    /// waits for this thread's first transaction to end: a deadlock.
    private func enter(writing: Bool = false) {
        if depth == 0 { resizeLock.lockShared() }
        depth += writing ? 1 : 2
    }

    /// Ends what ``enter(writing:)`` began; the thread's last transaction releases the lock.
    private func leave(writing: Bool = false) {
        depth -= writing ? 1 : 2
        if depth == 0 { resizeLock.unlock() }
    }

    /// Grows the map before a write when the room left is less than a quarter of the map or
    /// twice the largest write seen, so that a write closure almost never has to run again.
    /// Returns the map size the write starts with and the bytes then in use.
    ///
    /// Only when no transaction of this process is alive: growing ahead is a convenience, not
    /// worth waiting for readers (who may be waiting for this write), nor holding back new
    /// transactions meanwhile. A write that then runs out of room grows the map on the way to
    /// its rerun, waiting as it must.
    private func growIfNearlyFull() throws -> (mapSize: Int, used: Int) {
        let i = info()
        let used = (i.me_last_pgno + 1) * pageSize
        if used + headroom(i.me_mapsize) > i.me_mapsize, try grow(from: i.me_mapsize, toFit: used, waiting: false) {
            let j = info()
            return (j.me_mapsize, (j.me_last_pgno + 1) * pageSize)
        }
        return (i.me_mapsize, used)
    }

    /// Whether a map growth is under way, or waiting for the transactions of this process to
    /// end and (with a lock that prefers writers: ``EnvironmentOptions/growthLockPrefersWriters``,
    /// or Darwin's) holding back new ones. For tests, to know a growth is queued without
    /// waiting for it.
    package var growthIsWaiting: Bool {
        guard resizeLock.tryLockShared() else { return true }
        resizeLock.unlock()
        return false
    }

    private func headroom(_ mapSize: Int) -> Int { max(mapSize / 4, 2 * largestWrite.load(ordering: .relaxed)) }

    /// Doubles the map until `used` plus the headroom fits, unless another writer already grew
    /// it past `size`. Without `waiting`, does nothing (and returns false) when a transaction
    /// of this process is alive.
    @discardableResult
    private func grow(from size: Int, toFit used: Int = 0, waiting: Bool = true) throws -> Bool {
        try exclusively(waiting: waiting) {
            let current = info(locked: true).me_mapsize
            guard current <= size else { return }
            var new = current * 2
            while used + headroom(new) > new { new *= 2 }
            try check(mdb_env_set_mapsize(handle, new), "mdb_env_set_mapsize")
            // LMDB mapped the file again, most likely elsewhere.
            bounds.locate()
        }
    }

    /// Another process grew the map: adopt its size (`mdb_env_set_mapsize(env, 0)`).
    private func adoptResizedMap() throws {
        try exclusively {
            try check(mdb_env_set_mapsize(handle, 0), "mdb_env_set_mapsize(0)")
            bounds.locate()
        }
    }

    /// Runs `body` holding the resize lock exclusively. Without `waiting`, returns false at
    /// once, `body` not run, when the lock is held (or this thread holds a transaction).
    @discardableResult
    private func exclusively(waiting: Bool = true, _ body: () throws -> Void) throws -> Bool {
        guard depth == 0 else {
            if !waiting { return false }
            // Waiting for the exclusive lock would wait for ourselves.
            throw LMDBError(code: MDB_MAP_FULL, operation: "map resize while this thread holds a transaction of the same store")
        }
        if waiting {
            resizeLock.lockExclusive()
        } else if !resizeLock.tryLockExclusive() {
            return false
        }
        defer { resizeLock.unlock() }
        guard !isClosed else { throw LMDBError(.closed, operation: "mdb_env_set_mapsize") }
        try body()
        return true
    }
}

import Foundation
import LMDB

/// The checks that keep `Store(path:)` from writing over a file that is not a Strata store, and
/// from crashing on a full disk, made before (and right after) LMDB opens the folder.
///
/// **What counts as a Strata store.** An LMDB environment whose main database holds the named
/// database `meta`, and in it the key `format` (the store format version, ``Store/formatVersion``
/// for a current store, lower for one to migrate). Strata writes both in the very transaction
/// that creates a store, so no Strata store, however old, lacks them.
///
/// **What may be made into a store.** Only a folder with no `data.mdb`, or one whose `data.mdb`
/// is an LMDB environment in which no transaction was ever committed *and* that a Strata process
/// made: `strata.lock` was there before this open. Every Strata open creates `strata.lock`
/// before LMDB creates `data.mdb`, and LMDB writes a new file's two meta pages inside
/// `mdb_env_open`, before the first transaction; so a second Strata process opening the folder
/// while the first one is creating the store finds exactly that state. Under LMDB's writer lock
/// only one of them initializes it (see `StoreCore.open`): the other then sees the store.
///
/// Everything else is refused with ``StrataError/Code/notAStore`` and not written: a zero-length
/// `data.mdb` (unless an LMDB process is creating it right now), a file without LMDB's header,
/// another program's LMDB database, an environment whose root was damaged so that the Strata
/// metadata cannot be found.
enum StoreFiles {
    /// The files of `folder` that exist before an open, so that what a refused open created can
    /// be taken away again.
    struct Before {
        let dataFile: Bool
        let strataLock: Bool
        let lmdbLock: Bool

        init(_ folder: String) {
            let fm = FileManager.default
            dataFile = fm.fileExists(atPath: folder + "/data.mdb")
            strataLock = fm.fileExists(atPath: folder + "/strata.lock")
            lmdbLock = fm.fileExists(atPath: folder + "/lock.mdb")
        }

        /// Whether a fresh (never committed) environment in the folder may be initialized.
        var mayInitializeFresh: Bool { !dataFile || strataLock }
    }

    /// Refuses a zero-length `data.mdb` before anything touches the folder: LMDB takes an empty
    /// file for a new environment and writes its header into it. The one empty `data.mdb` that
    /// is not refused is one an LMDB process is creating right now (it holds its lock on
    /// `lock.mdb` until the header is written); `mdb_env_open` then waits for it.
    static func refuseEmptyDataFile(in folder: String) throws(StrataError) {
        var st = stat()
        guard stat(folder + "/data.mdb", &st) == 0, st.st_size == 0 else { return }
        if lmdbLockIsHeld(in: folder) { return }
        throw StrataError(.notAStore, notAStoreMessage(folder, "its data.mdb is empty (0 bytes)"))
    }

    /// The message of every refusal: what was found, that nothing was written, and what to do.
    static func notAStoreMessage(_ folder: String, _ found: String) -> String {
        "'\(folder)' does not hold a Strata store: \(found). Nothing was written to it. Strata creates a store only in a folder without a data.mdb; restore the store from a copy, or give another folder"
    }

    /// Whether a process other than this one has the LMDB environment in `folder` open: LMDB
    /// holds an `fcntl` lock on byte 0 of `lock.mdb` (exclusive while it initializes the files,
    /// shared afterwards) for as long as the environment is open.
    static func lmdbLockIsHeld(in folder: String) -> Bool {
        let fd = open(folder + "/lock.mdb", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        // Closing a descriptor drops this process's fcntl locks on the file, but this process
        // has no environment on this folder (the registry opens a folder once per process).
        defer { closeDescriptor(fd) }
        var lock = flock()
        lock.l_type = Int16(F_WRLCK)
        lock.l_whence = Int16(SEEK_SET)
        lock.l_start = 0
        lock.l_len = 1
        guard fcntl(fd, F_GETLK, &lock) == 0 else { return false }
        return lock.l_type != Int16(F_UNLCK)
    }

    /// Creates `lock.mdb` with its blocks allocated, when it is missing and the folder is
    /// writable. LMDB would create it with `ftruncate`, a file with no blocks, and then write
    /// its header through the memory map: on a full disk that write is a SIGBUS, not an error.
    /// Here a full disk is ``StrataError/Code/diskFull``.
    ///
    /// The file is filled under a temporary name and linked into place, so that no other
    /// process ever opens a half-written lock file; if one appeared meanwhile, it is kept.
    static func allocateLockFile(in folder: String, readers: UInt32) throws(StrataError) {
        let target = folder + "/lock.mdb"
        if access(target, F_OK) == 0 || access(folder, W_OK) != 0 { return }
        // LMDB's lock file is a header and one 64-byte slot per reader; it truncates the file to
        // its size, so a little more than needed is harmless.
        let size = Int(readers) * 64 + 4096
        let temporary = folder + "/lock.mdb.\(getpid()).tmp"
        let fd = open(temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }  // LMDB reports whatever stops it from creating the file
        var failure: Int32 = 0
        let zeros = [UInt8](repeating: 0, count: size)
        let written = zeros.withUnsafeBytes { pwrite(fd, $0.baseAddress, size, 0) }
        // No fsync: the file's content is LMDB's runtime state, rebuilt on every first open;
        // what matters is that its blocks are reserved, and a write reserves them (a full disk
        // fails it with ENOSPC).
        if written != size { failure = written < 0 ? errno : ENOSPC }
        closeDescriptor(fd)
        if failure == 0 && link(temporary, target) != 0 && errno != EEXIST { failure = errno }
        unlink(temporary)
        guard failure != 0 else { return }
        if failure == ENOSPC || failure == EDQUOT || failure == EFBIG {
            throw StrataError(.diskFull, "the disk is full: cannot create the lock file '\(target)' that opening the store needs (\(String(cString: strerror(failure)))); nothing was changed, free space and retry")
        }
        throw StrataError(.io, "cannot create the lock file '\(target)': \(String(cString: strerror(failure)))")
    }

    /// After a refused open: removes the lock files this open created, unless another process
    /// uses them meanwhile, so that the folder is left as it was found.
    static func removeCreatedLockFiles(in folder: String, before: Before) {
        if !before.lmdbLock && !lmdbLockIsHeld(in: folder) {
            unlink(folder + "/lock.mdb")
        }
        if !before.strataLock {
            let path = folder + "/strata.lock"
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { return }
            // Removed only while nobody else holds it: an exclusive lock proves that. A child
            // this process forks meanwhile shares the descriptor (and its lock) until it execs,
            // so a failure is retried for a moment.
            for _ in 0..<20 {
                if flock(fd, LOCK_EX | LOCK_NB) == 0 {
                    unlink(path)
                    break
                }
                usleep(2_000)
            }
            closeDescriptor(fd)
        }
    }
}

// `package`, not public: only the strata CLI opens a store's files with LMDB directly.
extension Store {
    /// Throws ``StrataError/Code/notAStore`` when the `data.mdb` in `folder` is empty (0 bytes)
    /// and no LMDB process is creating it. For tools that open a store's files with LMDB
    /// directly (`strata check`): LMDB would take such a file for a new environment.
    package static func refuseEmptyDataFile(in folder: String) throws(StrataError) {
        try StoreFiles.refuseEmptyDataFile(in: folder)
    }

    /// Removes `lock.mdb` from `folder` unless a process has the environment there open. For
    /// tools that open a folder's files with LMDB directly and must leave the folder as they
    /// found it (`strata check` on a folder that had no lock file).
    package static func removeUnusedLockFile(in folder: String) {
        if !StoreFiles.lmdbLockIsHeld(in: folder) { unlink(folder + "/lock.mdb") }
    }

    /// Creates `lock.mdb` in `folder` with its blocks allocated, when it is missing and the
    /// folder is writable, so that LMDB opening the folder on a full disk fails with
    /// ``StrataError/Code/diskFull`` instead of dying of SIGBUS. For tools that open a folder's
    /// files with LMDB directly (`strata check`); ``Store/init(path:options:)`` does it itself.
    package static func allocateLockFile(in folder: String, maxReaders: UInt32 = 126) throws(StrataError) {
        try StoreFiles.allocateLockFile(in: folder, readers: maxReaders)
    }
}

import Foundation
import LMDB

extension Store {
    /// Shrinks the store's file to the pages in use: writes a compacted copy next to it, syncs it,
    /// and renames it over `data.mdb` (an atomic swap: a crash leaves the old file or the new one,
    /// never a mix). Returns the file's size before and after, in bytes.
    ///
    /// LMDB reuses the pages freed by ``compact(retaining:)`` and by other writes, so a store's
    /// file stops growing without this; call it to give the space back to the disk.
    ///
    /// The store must be closed everywhere: every ``Store`` on the folder holds a shared lock on
    /// `strata.lock` there, and this call takes it exclusively (trying for up to a quarter of a
    /// second, since a closed store's lock can linger in a child process being started). Stores
    /// opened meanwhile wait.
    ///
    /// - Throws: ``StrataError`` `busy` when the store is open (in this process or another),
    ///   `io` when there is no store at `path`, `diskFull` when the copy does not fit.
    @discardableResult
    public static func reclaimSpace(at path: String) throws(StrataError) -> (before: Int, after: Int) {
        return try strataErrors {
            let data = path + "/data.mdb"
            guard FileManager.default.fileExists(atPath: data) else {
                throw StrataError(.io, "no Strata store at '\(path)' (no data.mdb in that folder)")
            }
            // Never rewrite a file that is not a Strata store (see `StoreFiles`).
            let found = StoreFiles.Before(path)
            try StoreFiles.refuseEmptyDataFile(in: path)
            let fd = try lockFolder(path, exclusive: true)
            do {
                let result = try reclaimSpace(at: path, locked: ())
                closeDescriptor(fd)
                return result
            } catch {
                closeDescriptor(fd)
                if (error as? StrataError)?.code == .notAStore { StoreFiles.removeCreatedLockFiles(in: path, before: found) }
                throw error
            }
        }
    }

    /// ``reclaimSpace(at:)`` with the folder locked exclusively.
    private static func reclaimSpace(at path: String, locked: Void) throws -> (before: Int, after: Int) {
        let data = path + "/data.mdb"
        FileSizeSignal.ignore()
        let scratch = path + "/reclaim.tmp"
        // A leftover from a reclaim that crashed before its rename: the store itself is intact.
        try? FileManager.default.removeItem(atPath: scratch)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        guard mkdir(scratch, 0o755) == 0 else {
            throw StrataError(.io, "cannot create '\(scratch)': \(String(cString: strerror(errno)))")
        }
        let before = try fileSize(data)
        try mappingStorageErrors {
            var options = EnvironmentOptions()
            options.maxDatabases = 16
            options.mapSize = max(before, 1 << 20)
            // Scoped so the environment is closed before its file is replaced.
            let env: Environment
            do {
                env = try Environment(path: path, options: options)
            } catch let error as LMDBError where error.resultCode == .invalid || error.resultCode == .versionMismatch {
                throw StrataError(.notAStore, StoreFiles.notAStoreMessage(path, "its data.mdb is not an LMDB file of a version this Strata reads (\(error.message))"), cause: error)
            }
            defer { env.close() }
            switch try StoreCore.inspect(env, path: path) {
            case .strata: break
            case .fresh: throw StrataError(.notAStore, StoreFiles.notAStoreMessage(path, "its data.mdb is an empty LMDB environment, not a store"))
            case .foreign(let found): throw StrataError(.notAStore, StoreFiles.notAStoreMessage(path, found))
            }
            try env.copy(to: scratch, compact: true)
        }
        try syncFile(scratch + "/data.mdb")
        guard rename(scratch + "/data.mdb", data) == 0 else {
            throw StrataError(.io, "cannot move the compacted copy over '\(data)': \(String(cString: strerror(errno)))")
        }
        try syncFile(path)
        // The reader table describes the old file; nobody has it open, so LMDB makes a new one.
        try? FileManager.default.removeItem(atPath: path + "/lock.mdb")
        return (before, try fileSize(data))
    }

    /// Opens `strata.lock` in `folder` and takes a shared (open stores) or exclusive
    /// (``reclaimSpace(at:)``, waiting a quarter of a second at most) `flock` on it. Returns the
    /// descriptor holding it.
    static func lockFolder(_ folder: String, exclusive: Bool) throws(StrataError) -> Int32 {
        var fd = open(folder + "/strata.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        if fd < 0 && !exclusive && (errno == EACCES || errno == EROFS || errno == EPERM) {
            // A store this process may only read: a read-only descriptor takes a shared flock as
            // well; with no lock file at all (and no right to create one), nothing can be locked,
            // and nothing can be reclaimed by this process either.
            fd = open(folder + "/strata.lock", O_RDONLY | O_CLOEXEC)
            if fd < 0 { return -1 }
        }
        guard fd >= 0 else {
            throw StrataError(.io, "cannot open '\(folder)/strata.lock': \(String(cString: strerror(errno)))")
        }
        // A shared lock can outlive its Store for a moment: a child process that another
        // thread of this process is starting holds a copy of every descriptor until it runs its
        // program (close-on-exec closes it only then). So the exclusive lock is tried for a
        // quarter of a second before the store is reported open.
        var tries = 0
        while flock(fd, exclusive ? LOCK_EX | LOCK_NB : LOCK_SH) != 0 {
            let error = errno
            if error == EINTR { continue }
            if error == EWOULDBLOCK && tries < 25 {
                tries += 1
                usleep(10_000)
                continue
            }
            closeDescriptor(fd)
            if error == EWOULDBLOCK {
                throw StrataError(.busy, "the store at '\(folder)' is open (in this or another process); close every Store on it first")
            }
            throw StrataError(.io, "cannot lock '\(folder)/strata.lock': \(String(cString: strerror(error)))")
        }
        return fd
    }

    /// The size of the file at `path`, in bytes.
    static func fileSize(_ path: String) throws(StrataError) -> Int {
        var st = stat()
        guard stat(path, &st) == 0 else { throw StrataError(.io, "cannot stat '\(path)': \(String(cString: strerror(errno)))") }
        return Int(st.st_size)
    }

    /// `fsync` on a file or folder (a folder's, so that a rename in it is durable).
    private static func syncFile(_ path: String) throws(StrataError) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0, fsync(fd) == 0 else {
            let message = String(cString: strerror(errno))
            if fd >= 0 { closeDescriptor(fd) }
            throw StrataError(.io, "cannot sync '\(path)': \(message)")
        }
        closeDescriptor(fd)
    }
}

extension Store {
    /// Throws `busy` when the store in `path` is open, in this process or another (the check of
    /// ``reclaimSpace(at:)``, without reclaiming anything): lets a caller find out before it
    /// changes anything that a reclaim would be refused. Another process may open the store
    /// right after the check; `reclaimSpace` checks again.
    package static func checkNotOpen(at path: String) throws(StrataError) {
        guard FileManager.default.fileExists(atPath: path + "/data.mdb") else {
            throw StrataError(.io, "no Strata store at '\(path)' (no data.mdb in that folder)")
        }
        // Every open of a store creates strata.lock: without one, no Store has it open (and a
        // check must not leave one in a folder that may hold no store).
        guard FileManager.default.fileExists(atPath: path + "/strata.lock") else { return }
        closeDescriptor(try lockFolder(path, exclusive: true))
    }
}

import Foundation

/// The crash-loop guard: `strata-open.marker` in a store's folder says that a process opened the
/// store and has not closed it cleanly yet.
///
/// The first open of a folder in a process writes it, before LMDB maps the file; the clean close
/// of the last process that has the store open (``StoreCore/shutdown()``, when the last `Store`
/// of the process is closed or released) removes it. So an open that finds it while no other
/// process has the store open knows that the last run ended without a clean close: it crashed
/// (perhaps inside LMDB, on a damaged page), or it was killed, as iOS ends apps. That open runs
/// the full page check, whatever ``StoreOptions/checkAtOpen`` chose (unless it chose
/// ``OpenCheck/none``), so that an app that crashed inside LMDB does not crash again at the next
/// launch for the same reason: the damage is ``StrataError/Code/corruptStore`` instead.
///
/// Which processes have the store open is told by locks the kernel drops when a process dies:
/// LMDB's `fcntl` lock on `lock.mdb` (held while an environment is open; see
/// ``StoreFiles/lmdbLockIsHeld(in:)``) at open, and Strata's shared `flock` on `strata.lock` at
/// close (the marker is removed only when an exclusive lock can be had: no other process has the
/// store open). A marker found while another process has the store open may be that process's,
/// so it does not count. Limits: a crash of one process while another keeps the store open is
/// forgotten when the other closes cleanly; a clean close that races another process's open
/// may leave the marker (one full check too many, never one too few for the last process
/// that ran alone).
enum OpenMarker {
    static let fileName = "strata-open.marker"

    static func path(_ folder: String) -> String { folder + "/" + fileName }

    /// Whether the folder's last open did not end in a clean close: its marker is there and no
    /// other process has the store open.
    static func lastOpenDidNotClose(_ folder: String) -> Bool {
        access(path(folder), F_OK) == 0 && !StoreFiles.lmdbLockIsHeld(in: folder)
    }

    /// Writes the marker unless it is there; returns whether this call created it. Not synced:
    /// a process that dies leaves its files to the kernel, which keeps them; only a power loss
    /// could take the marker away, and that is no crash inside LMDB.
    @discardableResult
    static func create(in folder: String) -> Bool {
        let fd = open(path(folder), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return false }
        // For whoever finds it: which process, and when.
        let note = Array("opened by process \(getpid()) at \(Date().timeIntervalSince1970); removed at a clean close\n".utf8)
        _ = note.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        closeDescriptor(fd)
        return true
    }

    /// Removes the marker if no other process has the store open. `lockFD` is this process's
    /// descriptor of `strata.lock`, holding a shared `flock`; its environment is closed.
    static func removeAtCleanClose(_ folder: String, lockFD: Int32) {
        // Shared to exclusive: granted only when no other process holds the lock. The lock is
        // released with the descriptor right after. A child process that another thread is
        // starting holds a copy of the descriptor until it runs its program (see
        // `Store.lockFolder`), so a refusal is tried again for a few milliseconds; a process that
        // really has the store open keeps the marker, and costs this close those milliseconds.
        guard lockFD >= 0 else { return }
        for attempt in 0..<5 {
            if flock(lockFD, LOCK_EX | LOCK_NB) == 0 {
                unlink(path(folder))
                return
            }
            if attempt < 4 { usleep(2_000) }
        }
    }
}

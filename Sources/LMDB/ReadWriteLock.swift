import StrataLibc

/// A pthread read-write lock.
///
/// A thread holding transactions holds it shared (once, however many it holds); resizing the
/// map holds it exclusively, because `mdb_env_set_mapsize` is only safe while no transaction of
/// this process is alive.
final class ReadWriteLock: @unchecked Sendable {
    // @unchecked: the pthread lock is the synchronisation primitive itself; its storage is
    // allocated once, never moved, and only touched through pthread calls.
    private let lock: UnsafeMutablePointer<pthread_rwlock_t>

    /// `preferWriters`: a waiting exclusive locker holds back new shared lockers. Darwin's lock
    /// always does; glibc's does only when asked (its default prefers readers), so tests on
    /// Linux ask, to meet the waits Darwin has.
    init(preferWriters: Bool = false) {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_rwlock_t())
        #if canImport(Glibc)
        if preferWriters {
            var attr = pthread_rwlockattr_t()
            pthread_rwlockattr_init(&attr)
            pthread_rwlockattr_setkind_np(&attr, Int32(PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP))
            pthread_rwlock_init(lock, &attr)
            pthread_rwlockattr_destroy(&attr)
            return
        }
        #endif
        pthread_rwlock_init(lock, nil)
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deallocate()
    }

    func lockShared() { pthread_rwlock_rdlock(lock) }
    func lockExclusive() { pthread_rwlock_wrlock(lock) }
    /// Takes the lock exclusively if nobody holds it; never waits.
    func tryLockExclusive() -> Bool { pthread_rwlock_trywrlock(lock) == 0 }
    /// Takes the lock shared if that needs no wait; never waits.
    func tryLockShared() -> Bool { pthread_rwlock_tryrdlock(lock) == 0 }
    func unlock() { pthread_rwlock_unlock(lock) }
}

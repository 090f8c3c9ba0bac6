#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A pthread read-write lock.
///
/// Every transaction holds it shared; resizing the map holds it exclusively, because
/// `mdb_env_set_mapsize` is only safe while no transaction of this process is alive.
final class ReadWriteLock: @unchecked Sendable {
    // @unchecked: the pthread lock is the synchronisation primitive itself; its storage is
    // allocated once, never moved, and only touched through pthread calls.
    private let lock: UnsafeMutablePointer<pthread_rwlock_t>

    init() {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_rwlock_t())
        pthread_rwlock_init(lock, nil)
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deallocate()
    }

    func lockShared() { pthread_rwlock_rdlock(lock) }
    func lockExclusive() { pthread_rwlock_wrlock(lock) }
    func unlock() { pthread_rwlock_unlock(lock) }
}

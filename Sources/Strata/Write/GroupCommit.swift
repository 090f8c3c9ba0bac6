import Dispatch
import Foundation
import LMDB
import Synchronization

// Group commit (docs/durability-and-concurrency.md). Concurrent writes of one store queue here; one
// leader runs the queued closures in a single LMDB write transaction, each closure in a nested
// transaction of its own, and commits once: every caller returns after that one durable commit,
// so many writers share one fsync. A lone writer runs its closure directly in the transaction,
// as before, and pays only a lock round trip. Observers are told only after the group's callers
// are released and the lead has passed on (see `lead(first:_:)`).

/// One `write` waiting for, or taking part in, a group commit.
final class WriteRequest: @unchecked Sendable {
    // @unchecked: the fields are written by the leader's thread while it runs the group, and read
    // by the caller only after `finish()` (a semaphore signal or a continuation resume), which
    // orders the two.

    /// The caller's closure, storing its result on the caller's side. Cleared before the caller
    /// is woken: a synchronous caller lends its closure without letting it escape.
    var run: ((Transaction) throws -> Void)?
    /// The outcome: `nil` when the closure's edits were committed.
    var error: (any Error)?
    /// What the closure changed, for observers (only when some are registered).
    var notification: CommitNotification?
    /// Set when an async caller's task is cancelled: if the closure has not started, it never does.
    let cancelled = Atomic<Bool>(false)

    /// How the caller is told: a sleeping thread, or an async continuation.
    private let semaphore: DispatchSemaphore?
    private let completion: (@Sendable (WriteRequest) -> Void)?
    /// Set before a sleeping caller is woken: whether it was woken to lead the next group.
    fileprivate var leads = false

    /// A request whose caller waits on its own thread.
    init(run: @escaping (Transaction) throws -> Void) {
        self.run = run
        semaphore = DispatchSemaphore(value: 0)
        completion = nil
    }

    /// A request whose caller is resumed by `completion` (async writes: no thread waits).
    init(run: @escaping (Transaction) throws -> Void, completion: @escaping @Sendable (WriteRequest) -> Void) {
        self.run = run
        semaphore = nil
        self.completion = completion
    }

    var isAsync: Bool { completion != nil }

    /// Forgets the outcome of an earlier attempt (the group runs again when the map grew).
    func resetOutcome() {
        error = nil
        notification = nil
    }

    /// Tells the caller its write is done.
    fileprivate func finish() {
        run = nil
        if let semaphore { semaphore.signal() } else { completion!(self) }
    }

    /// Wakes a sleeping caller to lead the next group.
    fileprivate func wakeToLead() {
        leads = true
        semaphore!.signal()
    }

    fileprivate func sleep() { semaphore!.wait() }
}

/// Commits a group and returns the change sets to tell observers, in commit order.
typealias GroupCommit = @Sendable ([WriteRequest]) -> [CommitNotification]

/// The writers of one store waiting for a group commit, and who leads.
final class WriteQueue: @unchecked Sendable {
    // @unchecked: every field is read and changed under `lock`; `observers` is thread-safe.
    // A condition as well as a lock: a leader gathering its group waits on it for writers to
    // arrive (see `gather()`).
    private let lock = NSCondition()
    private var waiting: [WriteRequest] = []
    /// Whether a leader is running a group (or is about to).
    private var leading = false
    /// How many writers took part in, or queued during, the last commit: the writers that are
    /// active now, as far as the queue can tell. 1 for a lone writer.
    private var recentWriters = 1
    /// How long the last commit took (the closures and the durable commit).
    private var lastCommit: Duration = .zero
    /// The longest a leader waits for recent writers to come back, whatever the commit costs.
    static let maxGather: Duration = .microseconds(200)
    /// The thread of the running leader: a write from inside a write closure would wait for
    /// itself, so it traps instead.
    private var leaderThread: pthread_t?

    /// The most closures in one group: a bound on how long the first of them waits.
    static let maxGroup = 256

    /// Told of each group's commit once its callers are released.
    private let observers: Observers

    init(observers: Observers) {
        self.observers = observers
    }

    /// How many writes wait for the next group (for tests that need a write to be queued).
    var waitingCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return waiting.count
    }

    /// Runs `request` to completion: as the leader of a group when no other write runs, else as
    /// a follower of the current leader's next group. Returns when its commit is durable (or it
    /// failed: see `request.error`).
    func runSynchronously(_ request: WriteRequest, _ commit: @escaping GroupCommit) {
        lock.lock()
        if let leaderThread, pthread_equal(leaderThread, pthread_self()) != 0 {
            lock.unlock()
            preconditionFailure("Strata: a write was begun inside a write closure on the same thread; it would wait for itself")
        }
        if leading {
            waiting.append(request)
            lock.signal()
            lock.unlock()
            request.sleep()
            guard request.leads else { return }
        } else {
            leading = true
            lock.unlock()
        }
        lead(first: request, commit)
    }

    /// Starts `request` without blocking the caller: it is queued for the current leader, or, if
    /// none runs, leads a group on a thread of its own. `request`'s completion reports the end.
    func submit(_ request: WriteRequest, _ commit: @escaping GroupCommit) {
        lock.lock()
        if leading {
            waiting.append(request)
            lock.signal()
            lock.unlock()
            return
        }
        leading = true
        lock.unlock()
        DispatchQueue.global().async { self.lead(first: request, commit) }
    }

    /// Waits, with `lock` held, for the writers of the last commit to come back before the
    /// group is taken: half the last commit's time at most (and never more than `maxGather`).
    ///
    /// Why: the callers a commit releases write again at once, but the next leader is woken
    /// first and would take only those that queued meanwhile, so eight busy writers settle into
    /// groups of about three. Waiting a moment gathers them all into one group and one fsync.
    /// A lone writer (`recentWriters == 1`) never waits; when writers stop coming, one leader
    /// waits in vain once, and the count falls to what it found.
    private func gather() {
        let wanted = min(recentWriters, Self.maxGroup)
        guard 1 + waiting.count < wanted else { return }
        let wait = min(lastCommit / 2, Self.maxGather)
        let seconds = Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18
        let deadline = Date(timeIntervalSinceNow: seconds)
        while 1 + waiting.count < wanted && lock.wait(until: deadline) {}
    }

    /// Runs a group led by `first`, hands the lead to the next waiting request (or gives it
    /// up), and then tells observers.
    ///
    /// Observers come last: while this thread is the leader or its callers wait, a write from
    /// an observer would wait for itself (on this thread, or on a thread the observer waits
    /// for), and every writer would wait for the observers too. The change sets are posted
    /// before the lead passes on, so that they queue in commit order; whichever thread then
    /// finds nobody delivering delivers them (`Observers.deliverPosted()`).
    private func lead(first: WriteRequest, _ commit: @escaping GroupCommit) {
        lock.lock()
        leaderThread = pthread_self()
        gather()
        let taken = min(waiting.count, Self.maxGroup - 1)
        let group = [first] + waiting.prefix(taken)
        waiting.removeFirst(taken)
        lock.unlock()

        let clock = ContinuousClock()
        let start = clock.now
        let notifications = commit(group)
        let took = start.duration(to: clock.now)
        observers.post(notifications)

        lock.lock()
        lastCommit = took
        recentWriters = group.count + waiting.count
        leaderThread = nil
        let next = waiting.isEmpty ? nil : waiting.removeFirst()
        if next == nil { leading = false }
        lock.unlock()
        for request in group { request.finish() }
        if let next {
            if next.isAsync {
                DispatchQueue.global().async { self.lead(first: next, commit) }
            } else {
                next.wakeToLead()
            }
        }
        observers.deliverPosted()
    }
}

/// A value behind an `NSLock`, for state that many threads contend for. ThreadSanitizer follows
/// a pthread mutex; it does not see the futex a contended `Synchronization.Mutex` waits on on
/// Linux, and reports the accesses it orders as races.
package final class Locked<Value>: @unchecked Sendable {
    // @unchecked: `value` is only touched inside `withLock`, under `lock`.
    private let lock = NSLock()
    private var value: Value

    package init(_ value: Value) { self.value = value }

    package func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

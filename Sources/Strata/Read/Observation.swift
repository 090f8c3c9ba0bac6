import Foundation
import Synchronization

/// One row changed by a committed transaction.
public struct RowChangeEvent: Sendable, Hashable {
    /// What happened to the row, as the app sees it.
    public enum Kind: String, Sendable, Hashable {
        /// The row appeared (inserted, restored, or revived).
        case inserted
        /// Fields of the row changed.
        case updated
        /// The row disappeared from reads (removed, or deleted locally pending upload).
        case deleted
    }

    /// The table of the row.
    public let table: String
    /// The row's primary key.
    public let key: RowKey
    /// What happened to the row.
    public let kind: Kind
    /// Whether the change was made on this device or came from the server.
    public let origin: LogEntry.Origin
    /// Whether the row's current values (what the app reads) changed: always for an insert or a
    /// delete; `false` for an ``Kind/updated`` change of the row's sync state alone — the
    /// acknowledgement of an upload, a server value equal to the local one, a conflict marked
    /// or resolved with the values kept — which changes the row's ``Row/status`` or originals.
    /// A live query (``Store/observe(_:includingSyncState:)``) skips such changes.
    public let valuesChanged: Bool

    init(table: String, key: RowKey, kind: Kind, origin: LogEntry.Origin, valuesChanged: Bool = true) {
        self.table = table
        self.key = key
        self.kind = kind
        self.origin = origin
        self.valuesChanged = valuesChanged
    }
}

/// What one committed write transaction changed.
public struct CommitNotification: Sendable, Hashable {
    /// The LSNs of the transaction's operations.
    public let lsns: ClosedRange<UInt64>
    /// Every row the transaction changed, in the order of its operations (a row changed twice is
    /// listed twice).
    public let changes: [RowChangeEvent]
}

/// Keeps an observation alive; the observer is removed when this is cancelled or deallocated.
public final class ObservationToken: Sendable {
    private let cancelAction: @Sendable () -> Void
    init(_ cancel: @escaping @Sendable () -> Void) { cancelAction = cancel }
    /// Stops the observation.
    public func cancel() { cancelAction() }
    deinit { cancelAction() }
}

/// The observers of a store.
final class Observers: Sendable {
    /// One callback. `active` is cleared when it is removed, so that a delivery that listed it
    /// before then does not call it afterwards.
    private final class Observer: Sendable {
        let callback: @Sendable (CommitNotification) -> Void
        let active = Atomic<Bool>(true)
        init(_ callback: @escaping @Sendable (CommitNotification) -> Void) { self.callback = callback }
    }
    private let callbacks = Locked<[UUID: Observer]>([:])
    private let count = Atomic<Int>(0)

    /// Whether anyone is listening: transactions collect changes only then.
    var isEmpty: Bool { count.load(ordering: .relaxed) == 0 }

    func add(_ id: UUID, _ callback: @escaping @Sendable (CommitNotification) -> Void) {
        callbacks.withLock {
            $0[id] = Observer(callback)
            count.store($0.count, ordering: .relaxed)
        }
    }

    /// Removes the callback `id`, if it is there; no delivery calls it once this returns, but
    /// one running now may still be in it.
    func remove(_ id: UUID) {
        callbacks.withLock {
            $0.removeValue(forKey: id)?.active.store(false, ordering: .releasing)
            count.store($0.count, ordering: .relaxed)
        }
    }

    func notify(_ n: CommitNotification) {
        for observer in callbacks.withLock({ Array($0.values) }) where observer.active.load(ordering: .acquiring) {
            observer.callback(n)
        }
    }

    /// Change sets posted by commits and not yet delivered, oldest first, and whether a thread
    /// is delivering them.
    private struct Mailbox {
        var batches: [[CommitNotification]] = []
        var delivering = false
    }
    private let mailbox = Locked(Mailbox())

    /// Queues the change sets of one commit. Commits post in commit order (a leader posts
    /// before it passes the lead on), so that is the order of delivery.
    func post(_ batch: [CommitNotification]) {
        guard !batch.isEmpty else { return }
        mailbox.withLock { $0.batches.append(batch) }
    }

    /// Delivers the posted change sets in order, unless another thread is delivering: that
    /// thread delivers these too before it stops, since it stops only when none are left.
    ///
    /// Never waits for the delivering thread: it may be running an observer that waits for
    /// this very thread's write (directly, or from the delivering thread itself when the
    /// observer wrote). Such a write's change set is delivered after that observer returns.
    func deliverPosted() {
        let starts = mailbox.withLock { m in
            guard !m.delivering, !m.batches.isEmpty else { return false }
            m.delivering = true
            return true
        }
        guard starts else { return }
        while let batch = mailbox.withLock({ m -> [CommitNotification]? in
            guard !m.batches.isEmpty else {
                m.delivering = false
                return nil
            }
            return m.batches.removeFirst()
        }) {
            for n in batch { notify(n) }
        }
    }
}

extension Store {
    /// Calls `body` after every committed write transaction with the rows it changed: once per
    /// committed write closure, one call at a time, in commit order. Nothing is delivered for a
    /// transaction that rolled back.
    ///
    /// `body` runs after the commit, once its callers were released and the next writers may
    /// commit, on a thread of this process that writes the store (usually the one that led the
    /// commit; a thread that is delivering also delivers the commits made meanwhile). So a
    /// `write` may return before `body` saw it; a lone synchronous writer delivers on its own
    /// thread before its `write` returns, unless another thread is delivering at that moment.
    /// `body` may read the store and may write it, also through another thread it waits for:
    /// such a write commits on its own and its change set is delivered after `body` returns.
    /// `body` should return quickly: the thread it runs on may be a writer whose `write` waits for it.
    ///
    /// Keep the returned token: the observation ends when it is cancelled or released, or when
    /// this `Store` is closed (``close()``) or released; after that, `body` is not called again,
    /// except by a delivery that was already starting the call at that moment (a call running
    /// then finishes).
    ///
    /// The observation sees the commits of every `Store` of this process on the folder. On a
    /// closed `Store` it observes nothing.
    public func observe(_ body: @escaping @Sendable (CommitNotification) -> Void) -> ObservationToken {
        addObservation(body, onEnd: {}) ?? ObservationToken {}
    }

    /// Every committed write transaction's changes, as an asynchronous sequence (delivered as
    /// to ``observe(_:)``). The sequence ends, after the changes delivered before, when this
    /// `Store` is closed (``close()``) or released; it stops when the consuming task is
    /// cancelled. On a closed `Store` it ends at once.
    ///
    /// Writers never wait for the consumer: change sets it has not taken yet are buffered.
    /// With the default `.unbounded` a consumer slower than the writers holds every change set
    /// it is behind on. `.bufferingNewest(n)` bounds that memory: when the buffer is full, the
    /// oldest change set is dropped, so a consumer that must not miss a change (rather than
    /// only learn that something changed) keeps the default, or compares
    /// ``CommitNotification/lsns`` with the last one it saw and reads the store for the gap.
    ///
    /// - Parameter bufferingPolicy: how many change sets to keep for a consumer that falls behind.
    public func changes(
        bufferingPolicy: AsyncStream<CommitNotification>.Continuation.BufferingPolicy = .unbounded
    ) -> AsyncStream<CommitNotification> {
        AsyncStream(bufferingPolicy: bufferingPolicy) { continuation in
            guard let token = addObservation({ continuation.yield($0) }, onEnd: { continuation.finish() }) else {
                return continuation.finish()
            }
            continuation.onTermination = { _ in token.cancel() }
        }
    }

    /// Registers `body` with the store's observers and as an observation of this `Store`,
    /// which ``close()`` ends: it removes `body` and calls `onEnd`. `nil` when this `Store` is closed.
    func addObservation(
        _ body: @escaping @Sendable (CommitNotification) -> Void, onEnd: @escaping @Sendable () -> Void
    ) -> ObservationToken? {
        let id = UUID()
        let observers = self.observers
        let added = trackObservation(id) {
            // Under this `Store`'s lock: a close() either came before (nothing is added) or
            // comes after, and finds the observation to end.
            observers.add(id, body)
            return {
                observers.remove(id)
                onEnd()
            }
        }
        guard added else { return nil }
        return ObservationToken { [weak self, weak observers] in
            observers?.remove(id)
            self?.untrackObservation(id)
        }
    }
}

import Foundation
@testable import Strata
import StrataWorkload
import Testing

/// When observers are called: after the group's callers are released and the lead has passed on,
/// one change set per committed closure, in commit order, so that an observer may write.
@Suite struct ObserverDeliveryTests {
    /// The first key a notification names, as an integer.
    static func firstKey(_ n: CommitNotification) -> Int { Int(n.changes[0].key.values[0].intValue!) }

    /// An observer that writes on its own thread: the write commits (it used to trap, the thread
    /// still being the group's leader), and its change set arrives after the one that caused it.
    @Test func anObserverCanWriteOnItsOwnThread() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let seen = Locked<[Int]>([])
            let failures = Locked<[String]>([])
            let token = store.observe { n in
                let key = Self.firstKey(n)
                seen.withLock { $0.append(key) }
                // Each of the first two writes makes one more.
                guard key < 3 else { return }
                do {
                    try store.write { try $0.insert("tasks", ["id": .int(Int64(key + 1)), "title": "follow-up"]) }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            }
            defer { token.cancel() }
            try store.write { try $0.insert("tasks", ["id": 1, "title": "first"]) }
            // The writing thread delivers every change set posted while it delivers, its
            // observer's own writes among them, before its `write` returns.
            #expect(failures.withLock { $0 } == [])
            #expect(seen.withLock { $0 } == [1, 2, 3])
            #expect(try store.read { try $0.rows("tasks").map(\.key) } == [1, 2, 3])
        }
    }

    /// An observer that waits for a write made on another thread: that write neither waits for
    /// the observer (it used to wait for the leader, which was running the observer: a
    /// deadlock) nor is lost; its change set arrives once the observer returns.
    @Test func anObserverCanWaitForAWriteOnAnotherThread() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let seen = Locked<[Int]>([])
            let failures = Locked<[String]>([])
            let token = store.observe { n in
                let key = Self.firstKey(n)
                seen.withLock { $0.append(key) }
                guard key == 1 else { return }
                let done = DispatchSemaphore(value: 0)
                Thread {
                    do {
                        try store.write { try $0.insert("tasks", ["id": 2, "title": "from another thread"]) }
                    } catch {
                        failures.withLock { $0.append("\(error)") }
                    }
                    done.signal()
                }.start()
                done.wait()
            }
            defer { token.cancel() }
            try store.write { try $0.insert("tasks", ["id": 1, "title": "first"]) }
            #expect(failures.withLock { $0 } == [])
            #expect(seen.withLock { $0 } == [1, 2])
            #expect(try store.read { try $0.count("tasks") } == 2)
        }
    }

    /// Threads write at once (so closures share groups) while an observer writes a follow-up
    /// row for some of the change sets it gets: every committed closure, the observer's own
    /// included, is seen exactly once, and in the order of the log.
    @Test func observerWritesAmongConcurrentWritersKeepCommitOrder() throws {
        let seed = testSeed("ObserverDeliveryTests")
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let threads = 6
            let perThread = 40
            let followUp = 1_000_000
            let seen = Locked<[Int]>([])
            let failures = Locked<[String]>([])
            let token = store.observe { n in
                let key = Self.firstKey(n)
                seen.withLock { $0.append(key) }
                guard key < followUp, key % 3 == 0 else { return }
                do {
                    try store.write { try $0.insert("tasks", ["id": .int(Int64(followUp + key)), "title": "follow-up"]) }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            }
            defer { token.cancel() }
            let start = DispatchSemaphore(value: 0)
            let group = DispatchGroup()
            for t in 0..<threads {
                group.enter()
                Thread {
                    defer { group.leave() }
                    var g = SplitMix64(seed: seed &+ UInt64(t))
                    start.wait()
                    for n in 0..<perThread {
                        let key = t * 1_000 + n
                        // Some closures throw: they are not seen, and leave no follow-up.
                        let refuse = g.next() % 5 == 0
                        struct Refused: Error {}
                        do {
                            try store.write { tx in
                                try tx.insert("tasks", ["id": .int(Int64(key)), "title": "w"])
                                if refuse { throw Refused() }
                            }
                        } catch is Refused {
                        } catch {
                            failures.withLock { $0.append("\(error)") }
                        }
                    }
                }.start()
            }
            for _ in 0..<threads { start.signal() }
            group.wait()
            #expect(failures.withLock { $0 } == [])
            let logOrder = try store.read { try $0.operations() }.filter { $0.table == "tasks" }.map { Int($0.key.values[0].intValue!) }
            #expect(seen.withLock { $0 } == logOrder)
            let stored = Set(try store.read { try $0.rows("tasks") }.map { Int($0.key.values[0].intValue!) })
            let originals = stored.filter { $0 < followUp }
            #expect(stored == originals.union(originals.filter { $0 % 3 == 0 }.map { followUp + $0 }))
            #expect(try store.verify().isConsistent)
        }
    }
}

/// `close()` ends the `Store`'s observations, though other `Store`s on the folder write on.
@Suite struct ObservationCloseTests {
    /// A callback registered before `close()` is not called for commits made afterwards
    /// through another `Store` of the folder (it used to be: the observers are the folder's).
    @Test func closeEndsTheObservationsOfThatStore() throws {
        try withStore { first, path in
            try first.createTable(tasksSchema)
            let second = try Store(path: path)
            defer { second.close() }
            let seenByFirst = Locked(0)
            let seenBySecond = Locked(0)
            let token = first.observe { _ in seenByFirst.withLock { $0 += 1 } }
            let kept = second.observe { _ in seenBySecond.withLock { $0 += 1 } }
            defer { token.cancel(); kept.cancel() }
            try first.write { try $0.insert("tasks", ["id": 1, "title": "before close"]) }
            first.close()
            try second.write { try $0.insert("tasks", ["id": 2, "title": "after close"]) }
            #expect(seenByFirst.withLock { $0 } == 1)
            #expect(seenBySecond.withLock { $0 } == 2)
        }
    }

    /// A `for await` loop over `changes()` ends once its `Store` is closed (it never did),
    /// after the change sets delivered before; writes through another `Store` do not keep it
    /// going.
    @Test func closeEndsTheChangesSequence() async throws {
        try await withTemporaryFolderAsync { path in
            var options = StoreOptions()
            options.durability = .noSync
            let first = try Store(path: path, options: options)
            let second = try Store(path: path)
            defer { second.close() }
            try first.createTable(tasksSchema)
            let stream = first.changes()
            let received = DispatchSemaphore(value: 0)
            let consumer = Task {
                var keys: [RowKey] = []
                for await n in stream {
                    keys += n.changes.map(\.key)
                    received.signal()
                }
                return keys
            }
            try await first.write { try $0.insert("tasks", ["id": 1, "title": "before close"]) }
            await waitOffThePool(received)
            first.close()
            try await second.write { try $0.insert("tasks", ["id": 2, "title": "after close"]) }
            #expect(await consumer.value == [1])
        }
    }

    /// Releasing a `Store` without closing it ends its observations too, like `close()`.
    @Test func releasingAStoreEndsItsObservations() async throws {
        try await withTemporaryFolderAsync { path in
            var options = StoreOptions()
            options.durability = .noSync
            let second = try Store(path: path, options: options)
            defer { second.close() }
            try second.createTable(tasksSchema)
            var first: Store? = try Store(path: path)
            let stream = first!.changes()
            let seen = Locked(0)
            let token = first!.observe { _ in seen.withLock { $0 += 1 } }
            defer { token.cancel() }
            let consumer = Task {
                var count = 0
                for await _ in stream { count += 1 }
                return count
            }
            first = nil
            try await second.write { try $0.insert("tasks", ["id": 1, "title": "after release"]) }
            #expect(await consumer.value == 0)
            #expect(seen.withLock { $0 } == 0)
        }
    }
}

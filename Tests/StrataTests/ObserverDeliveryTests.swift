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

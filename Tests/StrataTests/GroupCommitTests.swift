import Foundation
import LMDB
@testable import Strata
import StrataWorkload
import Synchronization
import Testing

/// Group commit: concurrent writes share one LMDB transaction, each closure in a nested one.
@Suite struct GroupCommitTests {
    struct Refused: Error, Equatable { let thread: Int; let n: Int }

    /// Threads write their own rows at once, and some closures throw after editing: every
    /// successful closure's edits are there, no failed one's; each caller got its own outcome;
    /// observers saw one change set per successful closure, in log order; the log holds each
    /// closure's operations contiguously, in commit order.
    @Test func concurrentWritersKeepWholeClosuresAndTheirOwnErrors() throws {
        let seed = testSeed("GroupCommitTests")
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let threads = 8
            let perThread = 60
            // Per thread: the outcome of each write (true: committed), and the error it got.
            let outcomes = Locked([[Bool]](repeating: [], count: threads))
            let errors = Locked([[Refused]](repeating: [], count: threads))
            let seen = Locked([CommitNotification]())
            let token = store.observe { n in seen.withLock { $0.append(n) } }
            defer { token.cancel() }
            let group = DispatchGroup()
            for t in 0..<threads {
                group.enter()
                Thread {
                    defer { group.leave() }
                    var g = SplitMix64(seed: seed &+ UInt64(t))
                    for n in 0..<perThread {
                        let fail = g.next() % 4 == 0
                        do {
                            try store.write { tx in
                                for part in 0..<3 {
                                    try tx.insert("tasks", ["id": .int(Int64(t * 10_000 + n * 10 + part)), "title": .string("t\(t) n\(n)")])
                                }
                                if fail { throw Refused(thread: t, n: n) }
                            }
                            outcomes.withLock { $0[t].append(true) }
                        } catch let e as Refused {
                            outcomes.withLock { $0[t].append(false) }
                            errors.withLock { $0[t].append(e) }
                        } catch {
                            Issue.record("thread \(t) write \(n): unexpected \(error)")
                        }
                    }
                }.start()
            }
            group.wait()
            let rows = try store.read { try $0.rows("tasks") }
            var byWrite: [Int: Int] = [:]
            for row in rows { byWrite[Int(row.key.values[0].intValue!) / 10, default: 0] += 1 }
            for t in 0..<threads {
                let o = outcomes.withLock { $0[t] }
                #expect(o.count == perThread)
                for (n, ok) in o.enumerated() {
                    let count = byWrite[t * 1_000 + n] ?? 0
                    #expect(count == (ok ? 3 : 0), "thread \(t) write \(n): \(count) rows, committed \(ok)")
                }
                // Each failed caller got exactly its own error.
                let failed = o.enumerated().filter { !$0.element }.map { Refused(thread: t, n: $0.offset) }
                #expect(errors.withLock { $0[t] } == failed)
            }
            // The log: each closure's three operations together, and the notifications in the
            // same order, one per committed closure.
            let ops = try store.read { try $0.operations() }.filter { $0.table == "tasks" }
            var closures: [Int] = []
            for chunk in stride(from: 0, to: ops.count, by: 3) {
                let ids = ops[chunk..<min(chunk + 3, ops.count)].map { Int($0.key.values[0].intValue!) / 10 }
                #expect(Set(ids).count == 1, "operations of different closures interleave at \(chunk)")
                closures.append(ids[0])
            }
            let notified = seen.withLock { $0 }.map { n in Int(n.changes[0].key.values[0].intValue!) / 10 }
            #expect(notified == closures)
            #expect(closures.count == outcomes.withLock { $0.flatMap { $0 }.filter { $0 }.count })
            #expect(try store.verify().isConsistent)
        }
    }

    /// A lone writer's closure runs in the transaction itself, on the caller's thread.
    @Test func aLoneWriterRunsOnItsOwnThread() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let caller = pthread_self()
            let same = try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "a"])
                return pthread_equal(pthread_self(), caller) != 0
            }
            #expect(same)
        }
    }

    /// Async writes join the group commit too; a task cancelled before its closure runs never
    /// runs it.
    @Test func asyncWritersCommitAndCancelledOnesDoNotRun() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(tasksSchema)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for i in 0..<40 {
                    group.addTask { try await store.write { tx in try tx.insert("tasks", ["id": .int(Int64(i)), "title": "x"]) } }
                }
                try await group.waitForAll()
            }
            #expect(try await store.read { try $0.count("tasks") } == 40)
            final class Flag: Sendable { let value = Atomic<Bool>(false) }
            let ran = Flag()
            let task = Task {
                // Cancelled before it starts: the closure must not run.
                withUnsafeCurrentTask { $0?.cancel() }
                try await store.write { tx in
                    ran.value.store(true, ordering: .relaxed)
                    try tx.insert("tasks", ["id": 1000, "title": "late"])
                }
            }
            let outcome = await task.result
            guard case .failure(let e) = outcome else {
                Issue.record("a cancelled write ran")
                return
            }
            #expect(e is CancellationError)
            let didRun = ran.value.load(ordering: .relaxed)
            #expect(!didRun)
            #expect(try await store.read { try $0.row("tasks", key: 1000) } == nil)
        }
    }

    /// An async write queued behind a busy writer and cancelled there never runs its closure,
    /// though it then leads a group of its own (only closures in a group of several used to be
    /// checked), and gets `CancellationError`.
    @Test func aCancelledWriteQueuedBehindABusyWriterNeverRuns() async throws {
        try await withTemporaryFolderAsync { path in
            var options = StoreOptions()
            options.durability = .noSync
            let store = try Store(path: path, options: options)
            try store.createTable(tasksSchema)
            let entered = DispatchSemaphore(value: 0)
            let release = DispatchSemaphore(value: 0)
            let busyDone = DispatchSemaphore(value: 0)
            Thread {
                do {
                    try store.write { tx in
                        entered.signal()
                        release.wait()
                        try tx.insert("tasks", ["id": 1, "title": "busy"])
                    }
                } catch {
                    Issue.record("the busy write failed: \(error)")
                }
                busyDone.signal()
            }.start()
            await waitOffThePool(entered)
            final class Flag: Sendable { let value = Atomic<Bool>(false) }
            let ran = Flag()
            let task = Task {
                try await store.write { tx in
                    ran.value.store(true, ordering: .relaxed)
                    try tx.insert("tasks", ["id": 2, "title": "cancelled"])
                }
            }
            // Queued behind the busy writer (whose group was taken before its closure began).
            while store.core.writers.waitingCount < 1 { await Task.yield() }
            task.cancel()
            release.signal()
            let outcome = await task.result
            await waitOffThePool(busyDone)
            guard case .failure(let e) = outcome else {
                Issue.record("the cancelled write committed")
                return
            }
            #expect(e is CancellationError, "\(e)")
            let didRun = ran.value.load(ordering: .relaxed)
            #expect(!didRun, "the cancelled write's closure ran")
            #expect(try await store.read { try $0.rows("tasks").map(\.key) } == [1])
        }
    }

    /// Runs `bodies` as synchronous writes of their own threads in one group: a writer held
    /// inside its closure keeps them queued, in order, until all wait. Returns each write's
    /// error (nil: committed) and whether all closures ran on one thread (one group).
    static func inOneGroup(_ store: Store, _ bodies: [@Sendable (Transaction) throws -> Void]) -> (errors: [(any Error)?], grouped: Bool) {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let done = DispatchGroup()
        done.enter()
        Thread {
            defer { done.leave() }
            do {
                try store.write { _ in
                    entered.signal()
                    release.wait()
                }
            } catch {
                Issue.record("the holding write failed: \(error)")
            }
        }.start()
        entered.wait()
        let errors = Locked([(any Error)?](repeating: nil, count: bodies.count))
        let ranOn = Locked([pthread_t]())
        for (i, body) in bodies.enumerated() {
            done.enter()
            Thread {
                defer { done.leave() }
                do {
                    try store.write { tx in
                        ranOn.withLock { $0.append(pthread_self()) }
                        try body(tx)
                    }
                } catch {
                    errors.withLock { $0[i] = error }
                }
            }.start()
            // One at a time, so that they queue in order.
            while store.core.writers.waitingCount < i + 1 { sched_yield() }
        }
        release.signal()
        done.wait()
        let threads = ranOn.withLock { $0 }
        return (errors.withLock { $0 }, threads.allSatisfy { pthread_equal($0, threads[0]) != 0 })
    }

    /// A closure that swallows an LMDB error of the store's transaction gets the same error
    /// alone and in a group: `StrataError` `storage` (a group used to hand it LMDB's raw error).
    @Test func aSwallowedStorageErrorIsTheSameAloneAndGrouped() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let swallow: @Sendable (Transaction) throws -> Void = { tx in
                // A key over LMDB's limit: MDB_BAD_VALSIZE, which marks the transaction failed.
                let writer = try tx.writer
                _ = try? writer.writeTxn!.put([UInt8](repeating: 7, count: 600), [1], in: writer.databases.meta)
            }
            let alone = #expect(throws: StrataError.self) { try store.write(swallow) }
            #expect(alone?.code == .storage)
            let (errors, grouped) = Self.inOneGroup(store, [
                swallow,
                { tx in try tx.insert("tasks", ["id": 1, "title": "kept"]) },
            ])
            #expect(grouped, "the two writes did not run as one group")
            let inGroup = errors[0] as? StrataError
            #expect(inGroup?.code == .storage, "grouped: \(String(describing: errors[0]))")
            #expect((inGroup?.cause as? LMDBError)?.resultCode == (alone?.cause as? LMDBError)?.resultCode)
            #expect(errors[1] == nil, "the other write of the group: \(String(describing: errors[1]))")
            #expect(try store.read { try $0.rows("tasks").map(\.key) } == [1])
        }
    }

    /// An `LMDBError.mapFull` that a closure throws without the store's map being full (from
    /// another environment) fails only that closure, alone or grouped: the group is not
    /// aborted, nor run again (it used to fail every write of the group).
    @Test func aForeignMapFullFailsOnlyItsOwnWrite() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let foreign: @Sendable (Transaction) throws -> Void = { tx in
                try tx.insert("tasks", ["id": 99, "title": "rolled back"])
                throw LMDBError(.mapFull, operation: "another environment's mdb_put")
            }
            let reruns = store.writeReruns
            let alone = #expect(throws: StrataError.self) { try store.write(foreign) }
            #expect(alone?.code == .storage)
            let (errors, grouped) = Self.inOneGroup(store, [
                foreign,
                { tx in try tx.insert("tasks", ["id": 1, "title": "kept"]) },
            ])
            #expect(grouped, "the two writes did not run as one group")
            let inGroup = errors[0] as? StrataError
            #expect(inGroup?.code == .storage, "grouped: \(String(describing: errors[0]))")
            #expect((inGroup?.cause as? LMDBError)?.resultCode == .mapFull)
            #expect(errors[1] == nil, "the other write of the group: \(String(describing: errors[1]))")
            #expect(store.writeReruns == reruns)
            #expect(try store.read { try $0.rows("tasks").map(\.key) } == [1])
        }
    }

    /// A group whose transaction fills the map runs again, whole, with a larger map: every
    /// closure's outcome is that of the last attempt, and a closure that throws still fails alone.
    @Test func aGroupThatFillsTheMapRunsAgainWhole() throws {
        struct Refused: Error {}
        var options = StoreOptions()
        options.initialMapSize = 256 << 10
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            let text = String(repeating: "x", count: 2_000)
            let reruns = store.writeReruns
            let (errors, grouped) = Self.inOneGroup(store, [
                { tx in try tx.insert("tasks", ["id": 1, "title": "small"]) },
                { tx in
                    try tx.insert("tasks", ["id": 2, "title": "refused"])
                    throw Refused()
                },
                { tx in
                    // About 8 MB: far more than the map.
                    for i in 0..<2_000 {
                        try tx.insert("tasks", ["id": .int(Int64(10_000 + i)), "title": .string(text), "notes": .string(text)])
                    }
                },
            ])
            #expect(grouped, "the writes did not run as one group")
            #expect(store.writeReruns > reruns, "the map never filled")
            #expect(errors[0] == nil && errors[2] == nil, "\(errors)")
            #expect(errors[1] is Refused, "\(String(describing: errors[1]))")
            #expect(try store.read { try $0.count("tasks") } == 2_001)
            #expect(try store.read { try $0.row("tasks", key: 2) } == nil)
            #expect(try store.verify().isConsistent)
        }
    }

    /// The async `write` and `read` take non-escaping closures: a function can pass its own
    /// non-escaping closure parameter straight through (this test compiles only if they do), and
    /// many concurrent calls, some throwing, return each caller its own outcome (the closures are
    /// lent through `withoutActuallyEscaping`, whose runtime check traps if one is still held
    /// when its call returns).
    @Test func asyncCallsLendTheirClosuresWithoutEscaping() async throws {
        struct Refused: Error, Equatable { let id: Int }
        func edit(_ store: Store, _ body: @Sendable (Transaction) throws -> Void) async throws {
            try await store.write { tx in try body(tx) }
        }
        func count(_ store: Store, _ body: @Sendable (Snapshot) throws -> Int) async throws -> Int {
            try await store.read { snapshot in try body(snapshot) }
        }
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(tasksSchema)
            let outcomes = try await withThrowingTaskGroup(of: (Int, Bool).self) { group in
                for i in 0..<200 {
                    group.addTask {
                        do {
                            try await edit(store) { tx in
                                try tx.insert("tasks", ["id": .int(Int64(i)), "title": "x"])
                                if i % 3 == 0 { throw Refused(id: i) }
                            }
                            return (i, true)
                        } catch let error as Refused {
                            #expect(error == Refused(id: i))
                            return (i, false)
                        }
                    }
                    if i % 10 == 0 {
                        group.addTask { (-1, try await count(store) { try $0.count("tasks") } >= 0) }
                    }
                }
                var committed: Set<Int> = []
                for try await (i, ok) in group where i >= 0 && ok { committed.insert(i) }
                return committed
            }
            #expect(outcomes == Set((0..<200).filter { $0 % 3 != 0 }))
            let stored = try await count(store) { try $0.count("tasks") }
            #expect(stored == outcomes.count)
            for i in [0, 3, 198] {
                #expect(try await store.read { try $0.row("tasks", key: RowKey(.int(Int64(i)))) } == nil)
            }
        }
    }
}

@Suite struct OverlayBudgetTests {
    /// The bytes of writes that rolled back stay in the overlay's memory (its arena) until a
    /// checkpoint starts over; the budget counts them, so the next write that succeeds
    /// checkpoints, and a loop of failing writes does not grow the process without bound.
    @Test func writesThatRollBackCountAgainstTheBudget() throws {
        struct Refused: Error {}
        var options = StoreOptions()
        options.overlayBudget = 256 << 10
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            for round in 0..<8 {
                #expect(throws: Refused.self) {
                    try store.write { tx in
                        for i in 0..<500 { try tx.insert("tasks", ["id": .int(Int64(round * 1000 + i)), "title": .string(String(repeating: "x", count: 100))]) }
                        throw Refused()
                    }
                }
            }
            #expect(store.overlay.current.arena.storedBytes > options.overlayBudget, "the rolled-back writes' bytes are in the arena")
            try store.write { try $0.insert("tasks", ["id": 1, "title": "kept"]) }
            let after = store.overlay.current
            #expect(after.isEmpty && after.arena.storedBytes == 0, "the write that succeeded did not checkpoint: \(after.arena.storedBytes) bytes held")
            #expect(try store.read { try $0.rows("tasks").map(\.key) } == [1])
            #expect(try store.verify().isConsistent)
        }
    }
}

/// Waits for `semaphore` on a thread outside Swift's cooperative pool, which a blocked task
/// would hold up.
func waitOffThePool(_ semaphore: DispatchSemaphore) async {
    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
        DispatchQueue.global().async {
            semaphore.wait()
            done.resume()
        }
    }
}

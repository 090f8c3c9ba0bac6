import Foundation
import Strata
import Synchronization
import Testing

/// A `Transaction` or `Snapshot` kept after the closure that lent it returned: LMDB's transaction
/// under it has been committed (or aborted) and freed. Every public method and property must
/// throw `invalidOperation` instead of reading or writing through it, and the store must be
/// exactly as before.
///
/// The two member lists below are meant to be complete: 23 members of `Transaction` and 33 of
/// `Snapshot`, as `swift-symbolgraph-extract -module-name Strata -minimum-access-level public`
/// lists them (overloads counted apart). A new public member belongs in its list.
@Suite struct EscapedTransactionTests {
    /// Holds what a closure smuggles out, from the write's (or read's) thread back to the caller
    /// after the call returned.
    ///
    /// Behind a lock: an async call hands back by resuming a continuation on the thread that ran
    /// the closure, which orders the two accesses, but ThreadSanitizer once reported them as a
    /// race in CI (written on the group commit's leader thread, read in the resumed task): it does
    /// not always see that resumption as ordering them. The lock makes the order one it sees.
    final class Kept<T>: @unchecked Sendable {
        // @unchecked: `stored` is only touched under `lock`.
        private let lock = NSLock()
        private var stored: T?

        var value: T? {
            get { lock.withLock { stored } }
            set { lock.withLock { stored = newValue } }
        }
    }

    struct Task: Codable {
        var id: Int
        var title: String
    }

    /// A store with a synced and changed row, a new row, an index, a named view, a property and
    /// a log pin, so that every call below would change something if it went through.
    private func prepared(_ body: (Store) throws -> Void) throws {
        try withStore { store, _ in
            try fill(store)
            try body(store)
        }
    }

    /// ``prepared(_:)`` for the async tests.
    private func prepared(_ body: (Store) async throws -> Void) async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-test-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        var options = StoreOptions()
        options.durability = .noSync
        let store = try Store(path: path, options: options)
        try fill(store)
        try await body(store)
    }

    private func fill(_ store: Store) throws {
        try store.createTable(tasksSchema)
        try store.write { tx in
            try tx.insert("tasks", ["id": 1, "title": "synced", "notes": "n"])
            try tx.acknowledge("tasks", key: 1)
            try tx.update("tasks", key: 1, ["title": "changed"])
            try tx.insert("tasks", ["id": 2, "title": "new", "priority": 3])
            try tx.createIndex("byPriority", on: "tasks", fields: ["priority"])
            try tx.createView("open", Query("tasks", where: .equals("done", false), orderBy: [.ascending("priority")]))
            try tx.setProperty("anchor", "v1")
            try tx.pinLog("batch", after: 1)
        }
    }

    /// Everything a user can observe of the store: tables, rows with their state, the log,
    /// properties, pins, indexes and named views.
    private func state(_ store: Store) throws -> [String] {
        try store.read { snap in
            var out = ["lastLSN \(try snap.lastLSN)", "horizon \(try snap.horizon)", "pins \(try snap.logPins.sorted { $0.key < $1.key })"]
            out.append("properties \(try snap.properties().sorted { $0.key < $1.key })")
            out.append("views \(try snap.namedViews.map { "\($0.name) \($0.query)" })")
            for t in try snap.tables {
                out.append("table \(t)")
                out += try snap.rows(t.name, includingDeleted: true).map(\.description)
                out += try snap.fieldNames(t.name)
                out += try snap.indexes(t.name).map { "index \($0)" }
            }
            out += try snap.operations().map { "\($0.lsn) \($0.kind) \($0.key) \($0.origin)" }
            return out
        }
    }

    /// Every public method and property of `Transaction` (Sources/Strata: Transaction.swift,
    /// Transaction+Properties/+RowState/+Schema/+Indexes.swift, NamedView.swift,
    /// RecordCoding.swift, Compaction.swift), called with arguments that would succeed inside
    /// the closure.
    static var transactionMembers: [(String, (Transaction) throws -> Void)] { [
        ("createTable", { try $0.createTable(.fixed("other", fields: [.int("id")])) }),
        ("insert", { try $0.insert("tasks", ["id": 3, "title": "three"]) }),
        ("insert(_:into:)", { try $0.insert(Task(id: 4, title: "four"), into: "tasks") }),
        ("update", { try $0.update("tasks", key: 2, ["title": "renamed"]) }),
        ("upsert", { try $0.upsert("tasks", ["id": 5, "title": "five"]) }),
        ("upsert(_:into:)", { try $0.upsert(Task(id: 2, title: "coded"), into: "tasks") }),
        ("delete", { try $0.delete("tasks", key: 2) }),
        ("revert(_:key:field:)", { try $0.revert("tasks", key: 1, field: "title") }),
        ("revert(_:key:)", { try $0.revert("tasks", key: 1) }),
        ("revertAll", { _ = try $0.revertAll("tasks") }),
        ("acknowledge", { try $0.acknowledge("tasks", key: 2) }),
        ("mergeServerValues", { tx in
            _ = try tx.mergeServerValues("tasks", key: 1, ["notes": "server"], kind: .serverChange, decide: { _ in (.takeServer, 1) }) { _, _ in }
        }),
        ("snapshot", { _ = try $0.snapshot }),
        ("row", { _ = try $0.row("tasks", key: 1) }),
        ("setRowState", { try $0.setRowState("tasks", key: 2, nil, kind: .serverDelete, origin: .server) }),
        ("addField", { try $0.addField(.string("tag", nullable: true), to: "tasks") }),
        ("dropField", { try $0.dropField("notes", from: "tasks") }),
        ("setProperty", { try $0.setProperty("anchor", "v2") }),
        ("property", { _ = try $0.property("anchor") }),
        ("createIndex", { try $0.createIndex("byTitle", on: "tasks", fields: ["title"]) }),
        ("createView", { try $0.createView("all", Query("tasks", orderBy: [.ascending("title")])) }),
        ("pinLog", { try $0.pinLog("other", after: 2) }),
        ("unpinLog", { try $0.unpinLog("batch") }),
    ] }

    /// Every public method and property of `Snapshot` (Sources/Strata: Snapshot.swift,
    /// Snapshot+Streaming/+TimeTravel.swift, Snapshot+Query.swift, RecordCoding.swift,
    /// NamedView.swift, Changeset.swift, Replay.swift, Compaction.swift,
    /// Transaction+Properties/+Indexes.swift).
    static var snapshotMembers: [(String, (Snapshot) throws -> Void)] { [
        ("tables", { _ = try $0.tables }),
        ("schema", { _ = try $0.schema("tasks") }),
        ("fieldNames", { _ = try $0.fieldNames("tasks") }),
        ("lastLSN", { _ = try $0.lastLSN }),
        ("row(_:key:)", { _ = try $0.row("tasks", key: 1) }),
        ("row(_:key:asOf:)", { _ = try $0.row("tasks", key: 1, asOf: 1) }),
        ("row(_:where:equals:)", { _ = try $0.row("tasks", where: "priority", equals: 3) }),
        ("row(_:keyOrAlternateID:)", { _ = try $0.row("tasks", keyOrAlternateID: 1) }),
        ("forEachRow", { try $0.forEachRow("tasks") { _ in true } }),
        ("rows(_:)", { _ = try $0.rows("tasks") }),
        ("count(_:)", { _ = try $0.count("tasks") }),
        ("pendingRows", { _ = try $0.pendingRows() }),
        ("forEachPendingRow", { try $0.forEachPendingRow { _ in true } }),
        ("forEachOperation", { try $0.forEachOperation { _ in true } }),
        ("operations", { _ = try $0.operations() }),
        ("history", { _ = try $0.history("tasks", key: 1) }),
        ("forEachInHistory", { try $0.forEachInHistory("tasks", key: 1) { _ in true } }),
        ("blame", { _ = try $0.blame("tasks", key: 1) }),
        ("rows(Query)", { _ = try $0.rows(Query("tasks", orderBy: [.ascending("priority")])) }),
        ("count(Query)", { _ = try $0.count(Query("tasks")) }),
        ("page(Query)", { _ = try $0.page(Query("tasks", orderBy: [.ascending("priority")]), size: 10) }),
        ("explain", { _ = try $0.explain(Query("tasks", where: .equals("priority", 3))) }),
        ("record", { _ = try $0.record(Task.self, from: "tasks", key: 1) }),
        ("records", { _ = try $0.records(Task.self, Query("tasks")) }),
        ("namedViews", { _ = try $0.namedViews }),
        ("page(view:)", { _ = try $0.page(view: "open", size: 10) }),
        ("rows(view:)", { _ = try $0.rows(view: "open") }),
        ("indexes", { _ = try $0.indexes("tasks") }),
        ("property", { _ = try $0.property("anchor") }),
        ("properties", { _ = try $0.properties() }),
        ("horizon", { _ = try $0.horizon }),
        ("logPins", { _ = try $0.logPins }),
        ("pendingChangeset", { _ = try $0.pendingChangeset("tasks") }),
    ] }

    /// Calls every member on the kept value and expects each to throw the "used after its
    /// closure" error.
    private func expectEveryMemberRefused<T>(_ kept: T, _ members: [(String, (T) throws -> Void)], what: String, _ source: String) {
        for (name, call) in members {
            do {
                try call(kept)
                Issue.record("\(source): \(name) on a kept \(what) did not throw")
            } catch let error as StrataError {
                #expect(error.code == .invalidOperation, "\(source): \(name): \(error)")
                #expect(error.message.contains("a \(what) was used after"), "\(source): \(name): \(error)")
            } catch {
                Issue.record("\(source): \(name) threw \(error), not a StrataError")
            }
        }
    }

    /// The members work inside their closure: the lists hold calls that succeed, so a refusal
    /// afterwards is the escape, not a bad argument. Rolled back by throwing.
    struct RollBack: Error {}

    @Test func theMemberListsSucceedInsideTheirClosure() throws {
        try prepared { store in
            let before = try state(store)
            for (name, call) in Self.transactionMembers {
                do {
                    try store.write { tx in
                        try call(tx)
                        throw RollBack()
                    }
                } catch is RollBack {
                } catch {
                    Issue.record("\(name) failed inside its closure: \(error)")
                }
            }
            try store.read { snap in
                for (name, call) in Self.snapshotMembers {
                    do { try call(snap) } catch { Issue.record("\(name) failed inside its closure: \(error)") }
                }
            }
            #expect(try state(store) == before)
        }
    }

    @Test func aTransactionKeptAfterWriteRefusesEveryMember() throws {
        try prepared { store in
            let before = try state(store)
            var kept: Transaction?
            var keptSnapshot: Snapshot?
            try store.write { tx in
                kept = tx
                keptSnapshot = try tx.snapshot
            }
            expectEveryMemberRefused(kept!, Self.transactionMembers, what: "Transaction", "sync write")
            // A snapshot of the transaction ends with it.
            expectEveryMemberRefused(keptSnapshot!, Self.snapshotMembers, what: "Transaction", "snapshot of a sync write")
            // Kept from a write that threw (rolled back): refused the same way.
            do {
                try store.write { tx in
                    kept = tx
                    try tx.insert("tasks", ["id": 9, "title": "rolled back"])
                    throw RollBack()
                }
            } catch is RollBack {}
            expectEveryMemberRefused(kept!, Self.transactionMembers, what: "Transaction", "rolled-back write")
            #expect(try state(store) == before)
            #expect(try store.verify().isConsistent)
            // The store still takes writes.
            try store.write { try $0.insert("tasks", ["id": 10, "title": "after"]) }
            #expect(try store.read { try $0.row("tasks", key: 10) }?["title"] == "after")
        }
    }

    @Test func aTransactionKeptAfterAnAsyncWriteRefusesEveryMember() async throws {
        try await prepared { store in
            let before = try state(store)
            let kept = Kept<Transaction>()
            try await store.write { tx in kept.value = tx }
            expectEveryMemberRefused(kept.value!, Self.transactionMembers, what: "Transaction", "async write")
            #expect(try state(store) == before)
            #expect(try store.verify().isConsistent)
        }
    }

    /// Three writers at once: the first holds its closure open until the other two wait, so the
    /// other two run as one group, each in a nested LMDB transaction, on one thread. Their kept
    /// transactions are refused like any other.
    @Test func aTransactionKeptAfterANestedGroupCommitWriteRefusesEveryMember() throws {
        try prepared { store in
            var observedNested = false
            for attempt in 0..<10 where !observedNested {
                let before = try state(store)
                let kept = Kept<[Transaction]>()
                kept.value = []
                let lock = NSLock()
                let firstInside = DispatchSemaphore(value: 0)
                let releaseFirst = DispatchSemaphore(value: 0)
                // Per follower: the thread it called from, and the one its closure ran on.
                let threads = Locked([pthread_t?](repeating: nil, count: 4))
                let done = DispatchGroup()
                func start(_ i: Int, _ body: @escaping @Sendable () -> Void) {
                    done.enter()
                    Thread {
                        defer { done.leave() }
                        body()
                    }.start()
                }
                start(0) {
                    try? store.write { _ in
                        firstInside.signal()
                        releaseFirst.wait()
                    }
                }
                firstInside.wait()
                for i in 1...2 {
                    start(i) {
                        let caller = pthread_self()
                        do {
                            try store.write { tx in
                                let inner = pthread_self()
                                threads.withLock { $0[i * 2 - 2] = caller; $0[i * 2 - 1] = inner }
                                lock.withLock { kept.value!.append(tx) }
                            }
                        } catch {
                            Issue.record("follower \(i): \(error)")
                        }
                    }
                }
                // Let both followers queue behind the first writer (longer on each attempt).
                Thread.sleep(forTimeInterval: 0.02 * Double(attempt + 1))
                releaseFirst.signal()
                done.wait()
                let t = threads.withLock { $0 }
                // A closure run on a thread other than its caller's ran in another caller's
                // group of two: nested.
                observedNested = (0..<2).contains { pthread_equal(t[$0 * 2]!, t[$0 * 2 + 1]!) == 0 }
                for tx in lock.withLock({ kept.value! }) {
                    expectEveryMemberRefused(tx, Self.transactionMembers, what: "Transaction", "group-commit write, attempt \(attempt)")
                }
                #expect(try state(store) == before)
            }
            #expect(observedNested, "the two followers never ran as one group")
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func aSnapshotKeptAfterReadRefusesEveryMember() throws {
        try prepared { store in
            let before = try state(store)
            var kept: Snapshot?
            try store.read { kept = $0 }
            expectEveryMemberRefused(kept!, Self.snapshotMembers, what: "Snapshot", "sync read")
            #expect(try state(store) == before)
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func aSnapshotKeptAfterAnAsyncReadRefusesEveryMember() async throws {
        try await prepared { store in
            let before = try state(store)
            let keptAsync = Kept<Snapshot>()
            try await store.read { keptAsync.value = $0 }
            expectEveryMemberRefused(keptAsync.value!, Self.snapshotMembers, what: "Snapshot", "async read")
            #expect(try state(store) == before)
            #expect(try store.verify().isConsistent)
        }
    }
}

import Foundation
import Observation
@testable import Strata
import Testing

/// A new store with the tasks table, for `async` tests; removed afterwards.
private func withTasksStore<R>(isolation: isolated (any Actor)? = #isolation, _ body: (Store) async throws -> R) async throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-live-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    var options = StoreOptions()
    options.durability = .noSync
    let store = try Store(path: path, options: options)
    defer { store.close() }
    try store.createTable(tasksSchema)
    return try await body(store)
}

private func titles(_ rows: [Row]?) -> [String] { (rows ?? []).map { $0["title"].stringValue ?? "?" } }

/// Live queries: `Store.observe(_:)` and the `LiveQuery` model follow the store's commits.
@Suite(.timeLimit(.minutes(1))) struct LiveQueryTests {
    static let open = Query("tasks", where: .equals("done", false), orderBy: [.ascending("priority")])

    /// The sequence yields the current results, then the results after each commit that changed
    /// them: an insert, an update that reorders, one that leaves the condition, a delete.
    @Test func followsLocalEdits() async throws {
        try await withTasksStore { store in
            try await store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a", "priority": 2]) }
            var results = store.observe(Self.open).makeAsyncIterator()
            #expect(titles(try await results.next()) == ["a"])

            try await store.write { tx in try tx.insert("tasks", ["id": 2, "title": "b", "priority": 1]) }
            #expect(titles(try await results.next()) == ["b", "a"])

            try await store.write { tx in try tx.update("tasks", key: 2, ["priority": 3]) }
            #expect(titles(try await results.next()) == ["a", "b"])

            try await store.write { tx in try tx.update("tasks", key: 1, ["done": true]) }
            #expect(titles(try await results.next()) == ["b"])

            try await store.write { tx in try tx.delete("tasks", key: 2) }
            #expect(titles(try await results.next()) == [])
        }
    }

    /// A commit that does not change the results yields nothing: the next result is the one of
    /// the next commit that does (a row outside the condition, then one inside).
    @Test func aCommitThatChangesNoResultYieldsNothing() async throws {
        try await withTasksStore { store in
            var results = store.observe(Self.open).makeAsyncIterator()
            #expect(titles(try await results.next()) == [])
            try await store.write { tx in try tx.insert("tasks", ["id": 1, "title": "finished", "done": true]) }
            try await store.write { tx in try tx.update("tasks", key: 1, ["title": "finished, renamed"]) }
            try await store.write { tx in try tx.insert("tasks", ["id": 2, "title": "open"]) }
            #expect(titles(try await results.next()) == ["open"])
        }
    }

    /// Which commits prompt a read: the query's table only; within it, only rows whose key the
    /// condition's key bounds admit (a row's key never changes); a change of sync state alone
    /// only when asked for.
    @Test func onlyCommitsThatMayChangeTheResultsPromptARead() {
        func change(_ table: String, _ key: Int64, valuesChanged: Bool = true) -> RowChangeEvent {
            RowChangeEvent(table: table, key: RowKey(.int(key)), kind: .updated, origin: .local, valuesChanged: valuesChanged)
        }
        let ranged = Relevance(
            query: Query("tasks", where: .and([.between("id", 10, 20), .equals("done", false), .not(.equals("id", 15))])),
            keyFields: ["id"], includingSyncState: false)
        #expect(ranged.concerns(change("tasks", 12)))
        #expect(!ranged.concerns(change("tasks", 9)))
        #expect(!ranged.concerns(change("tasks", 21)))
        #expect(!ranged.concerns(change("tasks", 15)))
        #expect(!ranged.concerns(change("lists", 12)))
        #expect(!ranged.concerns(change("tasks", 12, valuesChanged: false)))

        // A condition on other fields, or an `or` mixing key and other fields, bounds no key.
        let unbounded = Relevance(
            query: Query("tasks", where: .or([.equals("id", 1), .equals("done", true)])), keyFields: ["id"], includingSyncState: true)
        #expect(unbounded.concerns(change("tasks", 99)))
        #expect(unbounded.concerns(change("tasks", 99, valuesChanged: false)))
        #expect(!unbounded.concerns(change("other", 99)))
    }

    /// An acknowledgement moves originals and status, not values: observers are told it changed
    /// no value, and a live query yields nothing for it unless asked to follow sync state.
    @Test func anAcknowledgementChangesNoValue() async throws {
        try await withTasksStore { store in
            try await store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a"]) }
            var values = store.observe(Self.open).makeAsyncIterator()
            var states = store.observe(Self.open, includingSyncState: true).makeAsyncIterator()
            #expect(try await values.next()?.map(\.status) == [.inserted])
            #expect(try await states.next()?.map(\.status) == [.inserted])
            var commits = store.changes().makeAsyncIterator()

            try await store.write { tx in try tx.acknowledge("tasks", key: 1) }
            let ack = try #require(await commits.next())
            #expect(ack.changes.map(\.kind) == [.updated] && ack.changes.map(\.valuesChanged) == [false])
            #expect(try await states.next()?.map(\.status) == [.unchanged])

            try await store.write { tx in try tx.update("tasks", key: 1, ["title": "b"]) }
            let edit = try #require(await commits.next())
            #expect(edit.changes.map(\.valuesChanged) == [true])
            // The value-following sequence skipped the acknowledgement: its next result is the edit.
            let next = try #require(try await values.next())
            #expect(titles(next) == ["b"] && next.map(\.status) == [.updated])
        }
    }

    /// A query that cannot run throws a clear error; the sequence ends when the store closes.
    @Test func aBadQueryThrowsAndClosingEnds() async throws {
        try await withTasksStore { store in
            var missing = store.observe(Query("nope")).makeAsyncIterator()
            await #expect { try await missing.next() } throws: { ($0 as? StrataError)?.code == .tableNotFound }
            let afterError = try await missing.next()
            #expect(afterError == nil)
            var field = store.observe(Query("tasks", where: .equals("colour", "red"))).makeAsyncIterator()
            await #expect { try await field.next() } throws: { ($0 as? StrataError)?.code == .fieldNotFound }

            var results = store.observe(Self.open).makeAsyncIterator()
            let first = try await results.next()
            #expect(first == [])
            store.close()
            let after = try await results.next()
            #expect(after == nil)
        }
    }

    /// Waits, on the main actor, until `model` satisfies `predicate`, woken by Observation.
    @MainActor static func until(_ model: LiveQuery, _ predicate: (LiveQuery) -> Bool) async {
        while !predicate(model) {
            // Registered and checked on the main actor, where the model changes: no change between.
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                withObservationTracking { _ = model.rows; _ = model.error } onChange: { c.resume() }
            }
        }
    }

    /// The observable model follows edits, and tells Observation (as SwiftUI would be told).
    @MainActor @Test func theModelFollowsEdits() async throws {
        try await withTasksStore { store in
            try await store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a", "priority": 2]) }
            let model = LiveQuery(store, Self.open)
            await Self.until(model) { $0.isLoaded }
            #expect(titles(model.rows) == ["a"])
            try await store.write { tx in try tx.insert("tasks", ["id": 2, "title": "b", "priority": 1]) }
            await Self.until(model) { $0.rows.count == 2 }
            #expect(titles(model.rows) == ["b", "a"])
            try await store.write { tx in try tx.update("tasks", key: 2, ["done": true]) }
            await Self.until(model) { $0.rows.count == 1 }
            #expect(titles(model.rows) == ["a"] && model.error == nil)

            let broken = LiveQuery(store, Query("tasks", where: .equals("colour", "red")))
            await Self.until(broken) { $0.error != nil }
            #expect(broken.error?.code == .fieldNotFound && !broken.isLoaded)
        }
    }
}

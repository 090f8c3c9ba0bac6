/// The results of a query as they change: the current rows first, then the new rows after each
/// commit that changed them. Made by ``Store/observe(_:includingSyncState:)``.
///
/// ```swift
/// for try await rows in store.observe(Query("tasks", where: .equals("done", false), orderBy: [.ascending("title")])) {
///     show(rows)
/// }
/// ```
///
/// Each result is read from the store after the commit that prompted it was delivered to
/// observers, so it reflects that commit (and possibly later ones): the log is durable at
/// commit and every read sees the views as of the log it reads.
///
/// A commit prompts a new read only when it changed a row of the query's table whose values
/// could be in the results:
/// - changes to other tables are skipped without reading;
/// - a row whose key falls outside the condition's bounds on key fields (`.equals("id", 7)`,
///   `.between("id", 10, 20)`, `.isIn(…)` on a key field, alone or in an `.and`) is skipped
///   without reading, since a row's key never changes;
/// - a change of a row's sync state alone (``RowChangeEvent/valuesChanged`` is `false`: an
///   acknowledged upload) is skipped, unless the results were asked for `includingSyncState`;
/// - a read whose rows equal the last result (same keys, same values, same order) yields
///   nothing.
///
/// A consumer slower than the writers gets the latest results, not every intermediate one:
/// commits made while it is busy prompt one read when it asks for the next result.
///
/// The sequence ends when the ``Store`` is closed or released, or when the consuming task is
/// cancelled. It throws ``StrataError`` when the query cannot run (`tableNotFound`,
/// `fieldNotFound`, a negative limit), at once or after a schema change.
public struct QueryResults: AsyncSequence, Sendable {
    /// One result: the query's rows, in its order.
    public typealias Element = [Row]
    /// What the sequence throws: a query that cannot run.
    public typealias Failure = StrataError

    let store: Store
    /// The query whose results the sequence yields.
    public let query: Query
    /// Whether a change of a row's sync state alone (status, conflict, originals) yields new results.
    public let includingSyncState: Bool

    /// An iterator over the results; iterate a sequence once per consumer.
    public func makeAsyncIterator() -> Iterator {
        Iterator(store: store, query: query, includingSyncState: includingSyncState)
    }

    /// Reads each new result when asked for it.
    public struct Iterator: AsyncIteratorProtocol {
        /// One result: the query's rows, in its order.
        public typealias Element = [Row]
        /// What the iterator throws: a query that cannot run.
        public typealias Failure = StrataError

        let store: Store
        let query: Query
        let includingSyncState: Bool
        /// Set up on the first call: one element per prompt, prompts arriving meanwhile merged.
        private var prompts: AsyncStream<Void>.Iterator? = nil
        /// Keeps the store observation alive as long as the iterator.
        private var token: ObservationToken? = nil
        private var last: [Row]? = nil
        private var finished = false

        init(store: Store, query: Query, includingSyncState: Bool) {
            self.store = store
            self.query = query
            self.includingSyncState = includingSyncState
        }

        /// The current results on the first call; then the next results that differ from the
        /// last ones, once a commit changed them; `nil` when the store was closed or the task
        /// cancelled.
        public mutating func next() async throws(StrataError) -> [Row]? {
            try await next(isolation: nil)
        }

        /// See ``next()``.
        public mutating func next(isolation actor: isolated (any Actor)?) async throws(StrataError) -> [Row]? {
            if finished { return nil }
            do {
                return try await advance(isolation: actor)
            } catch {
                // After an error the sequence is over, as an iterator's contract asks.
                _ = finish()
                throw error
            }
        }

        private mutating func advance(isolation actor: isolated (any Actor)?) async throws(StrataError) -> [Row]? {
            if prompts == nil {
                // Observe before the first read, so that no commit after that read goes unseen.
                let (stream, continuation) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
                prompts = stream.makeAsyncIterator()
                guard !store.isClosed else { return finish() }
                let relevance = try await Self.relevance(store, query, includingSyncState)
                token = store.addObservation({ commit in
                    if relevance.concerns(commit) { continuation.yield() }
                }, onEnd: { continuation.finish() })
                guard token != nil else { return finish() }
                guard let rows = try await Self.read(store, query) else { return finish() }
                last = rows
                return rows
            }
            while true {
                guard await prompts!.next(isolation: actor) != nil, !Task.isCancelled else { return finish() }
                guard let rows = try await Self.read(store, query) else { return finish() }
                if let last, same(last, rows) { continue }
                last = rows
                return rows
            }
        }

        private mutating func finish() -> [Row]? {
            finished = true
            prompts = nil
            token = nil
            return nil
        }

        /// What decides whether a commit concerns the query: its table's key fields, read once.
        private static func relevance(_ store: Store, _ query: Query, _ includingSyncState: Bool) async throws(StrataError) -> Relevance {
            do {
                let keyFields = try await store.read { try $0.schema(query.table).primaryKey }
                return Relevance(query: query, keyFields: keyFields, includingSyncState: includingSyncState)
            } catch {
                throw strataError(error)
            }
        }

        /// The query's rows; `nil` when the store was closed meanwhile (the sequence then ends).
        private static func read(_ store: Store, _ query: Query) async throws(StrataError) -> [Row]? {
            do {
                return try await store.read { try $0.rows(query) }
            } catch {
                let e = strataError(error)
                if e.code == .closed { return nil }
                throw e
            }
        }

        /// Whether two results show the same thing: with sync state, equal rows; without, the same
        /// keys with the same values in the same order.
        private func same(_ a: [Row], _ b: [Row]) -> Bool {
            if includingSyncState { return a == b }
            return a.count == b.count && zip(a, b).allSatisfy { $0.key == $1.key && $0.fieldNames == $1.fieldNames && $0.currents == $1.currents }
        }

        static func strataError(_ error: any Error) -> StrataError {
            error as? StrataError ?? StrataError(.invalidOperation, "the query could not be read: \(error)")
        }
    }
}

/// Decides, on the thread that delivers a commit, whether the commit may change a query's results.
struct Relevance: Sendable {
    let table: String
    let includingSyncState: Bool
    /// The conditions a row's key alone decides, with the position of each key field.
    let keyConditions: [Condition]
    let keyPositions: [String: Int]

    init(query: Query, keyFields: [String], includingSyncState: Bool) {
        table = query.table
        self.includingSyncState = includingSyncState
        keyConditions = query.filter?.keyOnlyConjuncts(Set(keyFields)) ?? []
        keyPositions = Dictionary(keyFields.enumerated().map { ($1, $0) }, uniquingKeysWith: { a, _ in a })
    }

    func concerns(_ commit: CommitNotification) -> Bool {
        commit.changes.contains(where: concerns)
    }

    func concerns(_ change: RowChangeEvent) -> Bool {
        // Names compare by their bytes, as the store compares them.
        guard change.table.utf8.elementsEqual(table.utf8), includingSyncState || change.valuesChanged else { return false }
        let values = change.key.values
        return keyConditions.allSatisfy { c in
            c.matches { field in keyPositions[field].map { $0 < values.count ? values[$0] : .null } ?? .null }
        }
    }
}

extension Store {
    /// The results of `query` as they change: the current rows, then the new rows after each
    /// commit that changed them (see ``QueryResults`` for what prompts a new result).
    ///
    /// ```swift
    /// let open = Query("tasks", where: .equals("done", false), orderBy: [.ascending("title")])
    /// for try await rows in store.observe(open) {
    ///     print(rows.map { $0["title"] })
    /// }
    /// ```
    ///
    /// For SwiftUI, ``LiveQuery`` holds the latest results as an observable model.
    ///
    /// - Parameters:
    ///   - query: the query to follow.
    ///   - includingSyncState: whether a change of only a row's sync state (its ``Row/status``,
    ///     ``Row/isConflicted`` or originals, as when an upload is acknowledged) yields new
    ///     results. `false` by default: a list that does not show sync state is not redrawn
    ///     for an acknowledgement, and the rows it holds keep the status they were read with.
    /// - Complexity: each result is one ``Snapshot/rows(_:)`` of the query.
    public func observe(_ query: Query, includingSyncState: Bool = false) -> QueryResults {
        QueryResults(store: self, query: query, includingSyncState: includingSyncState)
    }
}

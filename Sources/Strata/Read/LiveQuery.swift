import Observation

/// The latest results of a query, as an observable model a SwiftUI view can hold: ``rows``
/// follows the store's commits (through ``Store/observe(_:includingSyncState:)``), and a view
/// that reads it is redrawn when the results change.
///
/// ```swift
/// struct OpenTasks: View {
///     @State private var tasks: LiveQuery
///     init(store: Store) {
///         _tasks = State(initialValue: LiveQuery(store, Query("tasks", where: .equals("done", false))))
///     }
///     var body: some View {
///         List(tasks.rows, id: \.key) { row in Text(row["title"].description) }
///     }
/// }
/// ```
///
/// The model lives on the main actor, and updates its properties there. It follows the store
/// until it is released or the store is closed.
@MainActor
@Observable
public final class LiveQuery {
    /// The query the model follows.
    public let query: Query
    /// The latest results; empty until the first read has finished (``isLoaded``).
    public private(set) var rows: [Row] = []
    /// Whether ``rows`` holds the results of a read yet.
    public private(set) var isLoaded = false
    /// Why the query stopped: it could not run (a table or field it names is missing). The
    /// model is not updated after an error.
    public private(set) var error: StrataError? = nil

    @ObservationIgnored private var task: Task<Void, Never>? = nil

    /// A model of the results of `query` in `store`; the first results arrive shortly after.
    ///
    /// - Parameters:
    ///   - store: the store to follow.
    ///   - query: the query whose results the model holds.
    ///   - includingSyncState: see ``Store/observe(_:includingSyncState:)``.
    public init(_ store: Store, _ query: Query, includingSyncState: Bool = false) {
        self.query = query
        let results = store.observe(query, includingSyncState: includingSyncState)
        // Holds the model weakly: releasing the model cancels the task (deinit), which ends
        // the sequence and its store observation.
        task = Task { [weak self] in
            do {
                for try await rows in results {
                    guard let self else { return }
                    self.rows = rows
                    self.isLoaded = true
                }
            } catch {
                self?.error = QueryResults.Iterator.strataError(error)
            }
        }
    }

    deinit { task?.cancel() }
}

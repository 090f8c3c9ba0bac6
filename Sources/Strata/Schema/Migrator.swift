import Foundation

/// Named schema changes, each run once per store, in the order they were registered — in the
/// spirit of GRDB's `DatabaseMigrator`.
///
/// ```swift
/// var migrator = Migrator()
/// migrator.registerMigration("v1: tasks") { tx in
///     try tx.createTable(.fixed("tasks", primaryKey: ["id"], fields: [.int("id"), .string("title")]))
/// }
/// migrator.registerMigration("v2: notes") { tx in
///     try tx.addField(.string("notes", nullable: true), to: "tasks")
/// }
/// try migrator.migrate(store)      // at every launch: runs only the steps this store has not run
/// ```
///
/// Each step runs in its own write transaction, together with the record that it ran, kept in
/// the store's own metadata (not among its properties). A step that throws rolls back: the
/// store is as it was before that step, the steps before it stay applied, and `migrate` throws
/// the step's error. Running `migrate` again runs nothing that has run; two processes migrating
/// at once run each step once (a step already recorded when its transaction starts is skipped).
///
/// Never rename, reorder or change a step once released: a store remembers steps by name, in
/// order, and one that ran steps this migrator does not know (a newer version of the app
/// migrated it) is refused rather than migrated further.
public struct Migrator: Sendable {
    private var steps: [(name: String, body: @Sendable (Transaction) throws -> Void)] = []

    /// The name under which the applied steps are kept with the store.
    static let recordName = "migrations"

    /// A migrator with no steps.
    public init() {}

    /// The names of the registered steps, in order.
    public var migrations: [String] { steps.map(\.name) }

    /// Adds a step named `name`, run after the steps registered before it. `body` changes the
    /// schema (``Transaction/createTable(_:)``, ``Transaction/addField(_:to:)``, indexes) and may
    /// edit rows, in the step's transaction.
    ///
    /// A name registered twice is refused by ``migrate(_:)``.
    public mutating func registerMigration(_ name: String, _ body: @escaping @Sendable (Transaction) throws -> Void) {
        steps.append((name, body))
    }

    /// Runs, in order, each registered step this store has not run yet, and returns their names.
    ///
    /// - Throws: ``StrataError`` `invalidOperation` (a name registered twice or empty, or a store
    ///   that ran steps this migrator lacks or in another order); for a failing step, which left
    ///   the store as before it, an error naming the step, with the step's error as its
    ///   ``StrataError/cause`` (a `StrataError` thrown by the step keeps its code; any other
    ///   error is `invalidOperation`).
    /// - Complexity: one write transaction per step to run; none when every step has run.
    @discardableResult
    public func migrate(_ store: Store) throws(StrataError) -> [String] {
        try checkNames()
        try Self.check(try appliedMigrations(in: store), against: migrations)
        var ran: [String] = []
        for step in steps {
            let didRun = try strataErrors {
                try store.write { tx -> Bool in
                    var applied = try Self.applied(tx.libraryValue(Self.recordName))
                    try Self.check(applied, against: migrations)
                    guard !applied.contains(where: { $0.utf8.elementsEqual(step.name.utf8) }) else { return false }
                    do { try step.body(tx) } catch { throw Self.failure(of: step.name, error) }
                    applied.append(step.name)
                    try tx.setLibraryValue(Self.recordName, Self.encode(applied))
                    return true
                }
            }
            if didRun { ran.append(step.name) }
        }
        return ran
    }

    /// A step's error, saying which step failed and that it was rolled back: a `StrataError`
    /// keeps its code; any other error is `invalidOperation`, with the error as its cause.
    private static func failure(of name: String, _ error: any Error) -> StrataError {
        let what = "migration step '\(name)' failed and was rolled back (the steps before it stay applied)"
        if let e = error as? StrataError { return StrataError(e.code, "\(what): \(e.message)", cause: e) }
        return StrataError(.invalidOperation, "\(what): \(error)", cause: error)
    }

    /// The names of the steps this store has run, in the order they ran.
    ///
    /// - Throws: ``StrataError`` `corruptRecord` when the record is unreadable.
    public func appliedMigrations(in store: Store) throws(StrataError) -> [String] {
        try strataErrors { try store.read { try Self.applied($0.libraryValue(Self.recordName)) } }
    }

    /// Whether every registered step has run on this store.
    ///
    /// - Throws: as ``migrate(_:)`` does for a store that ran steps this migrator lacks.
    public func hasCompletedMigrations(in store: Store) throws(StrataError) -> Bool {
        let applied = try appliedMigrations(in: store)
        try Self.check(applied, against: migrations)
        return applied.count == steps.count
    }

    private func checkNames() throws(StrataError) {
        var seen = Set<[UInt8]>()
        for name in migrations {
            guard !name.isEmpty else { throw StrataError(.invalidOperation, "a migration step has an empty name; give each step a name that never changes") }
            guard seen.insert(Array(name.utf8)).inserted else {
                throw StrataError(.invalidOperation, "the migrator registers step '\(name)' twice; each step needs its own name")
            }
        }
    }

    /// Refuses a store whose applied steps are not the first steps of `registered`, in order.
    private static func check(_ applied: [String], against registered: [String]) throws(StrataError) {
        for (i, name) in applied.enumerated() {
            guard i < registered.count, registered[i].utf8.elementsEqual(name.utf8) else {
                let known = registered.contains { $0.utf8.elementsEqual(name.utf8) }
                throw StrataError(.invalidOperation, known
                    ? "the store ran migration step '\(name)' as step \(i + 1), where this migrator registers it at another place; steps must keep their order once released"
                    : "the store ran migration step '\(name)', which this migrator does not register (a newer version of the app migrated it?); nothing was run")
            }
        }
    }

    private static func applied(_ bytes: [UInt8]?) throws(StrataError) -> [String] {
        guard let bytes else { return [] }
        do {
            return try JSONDecoder().decode([String].self, from: Data(bytes))
        } catch {
            throw StrataError(.corruptRecord, "the store's record of migration steps is not readable: \(error)")
        }
    }

    private static func encode(_ names: [String]) throws(StrataError) -> [UInt8] {
        do { return Array(try JSONEncoder().encode(names)) } catch {
            throw StrataError(.invalidValue, "the migration steps' names cannot be recorded: \(error)")
        }
    }
}

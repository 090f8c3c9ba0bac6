import Logging
import PostgresNIO

/// A statement that the server runs on every request, prepared once on each connection of the
/// pool (PostgresNIO's `execute`), then run by name with its values bound.
///
/// Why: `query(_:)` sends every statement as an unnamed one, which PostgreSQL parses and plans
/// each time; planning the push's one-statement write alone took about 0.6 ms a batch. Every
/// statement here has fixed text and takes its lists as array values, so after five runs
/// PostgreSQL keeps the generic plan (`plan_cache_mode` auto), which `EXPLAIN EXECUTE` showed to
/// be the custom plans' shape (index lookups per element of the `unnest`, 2026-11-28).
///
/// Its rows are handed over as they are (`Row` is `PostgresRow`), to be read with ``Cells``.
///
/// PostgresNIO remembers a failed preparation on its connection for good (its
/// `PreparedStatementStateMachine`), so a statement must not be run first inside a transaction
/// that has already failed: every caller stops at the first error and rolls back.
protocol PreparedRows: PostgresPreparedStatement where Row == PostgresRow {}

extension PreparedRows {
    func decodeRow(_ row: PostgresRow) -> PostgresRow { row }
}

/// A statement without values or rows (`BEGIN`, `COMMIT`), prepared as ``PreparedRows`` is.
protocol PreparedCommand: PostgresPreparedStatement where Row == () {}

extension PreparedCommand {
    func makeBindings() -> PostgresBindings { PostgresBindings() }
    func decodeRow(_ row: PostgresRow) {}
}

/// `BEGIN`, prepared: it is one of the four round trips of every push.
struct Begin: PreparedCommand {
    static let name = "strata_begin"
    static let sql = "BEGIN"
}

/// `COMMIT`, prepared (see ``Begin``).
struct Commit: PreparedCommand {
    static let name = "strata_commit"
    static let sql = "COMMIT"
}

extension PostgresConnection {
    /// Runs a ``PreparedCommand`` to its end.
    func run<C: PreparedCommand>(_ command: C, logger: Logger) async throws {
        // Read as rows (there are none), not through the `execute` that answers the command
        // tag: PostgresNIO 1.33's asks for the tag before the result is read, and traps.
        for try await _ in try await execute(command, logger: logger) {}
    }
}

import Crypto
import Foundation
import Logging
import PostgresNIO
import Strata
import StrataSync

/// Everything the server knows lives in PostgreSQL; this type holds no state of its own but the
/// connection pool, so any number of server processes can serve one database.
///
/// Tables:
/// - `strata_rows`: one row per (table, key) with its fields (wire-format JSON), a tombstone flag
///   and the version of its last change, drawn from the one sequence `strata_version`.
/// - `strata_batches`: the acknowledgement of every batch id applied, written in the batch's own
///   transaction, the SHA-256 of its payload (`digest`), and the order the batches committed in
///   (`seq`).
/// - `strata_tokens`: SHA-256 of each bearer token and the client id it stands for.
/// - `strata_meta`: the schema version, the tables file last started with, and the horizon (the
///   oldest anchor still served after tombstones were pruned).
struct Database: Sendable {
    let client: PostgresClient
    let tables: TableConfig
    let logger: Logger
    /// The rules every batch is decided by, shared with `InMemorySyncServer`.
    let rules: ServerRules

    init(client: PostgresClient, tables: TableConfig, logger: Logger) {
        self.client = client
        self.tables = tables
        self.logger = logger
        self.rules = ServerRules(tables)
    }

    static let schemaVersion = 3
    /// The advisory lock under which versions are drawn and committed (see `apply`).
    static let versionLock: Int64 = 0x5354_5241_5441
    static let migrationLock: Int64 = 0x5354_5241_5442

    /// Parses `postgres://user:password@host:port/database`: the pool's configuration, and a
    /// single connection's (for the migration, made before the pool runs).
    static func configuration(url: String) throws -> (pool: PostgresClient.Configuration, connection: PostgresConnection.Configuration) {
        guard let c = URLComponents(string: url), c.scheme == "postgres" || c.scheme == "postgresql", let host = c.host, !host.isEmpty else {
            throw ServerError("the PostgreSQL URL '\(url)' is not of the form postgres://user:password@host:port/database")
        }
        let database = c.path.isEmpty ? nil : String(c.path.dropFirst())
        var pool = PostgresClient.Configuration(
            host: host, port: c.port ?? 5432, username: c.user ?? "postgres", password: c.password, database: database, tls: .disable)
        pool.options.maximumConnections = 20
        let connection = PostgresConnection.Configuration(
            host: host, port: c.port ?? 5432, username: c.user ?? "postgres", password: c.password, database: database, tls: .disable)
        return (pool, connection)
    }

    // MARK: Schema

    /// Creates or migrates the server's tables, under an advisory lock so that two processes
    /// starting at once do not race on `CREATE … IF NOT EXISTS`.
    ///
    /// It runs on a connection of its own (`connection`), not one of the pool's: the pool's
    /// `run()` starts in a task beside this one, and a lease before it has started logs a
    /// warning at every start.
    func migrate(over connection: PostgresConnection.Configuration) async throws {
        let tablesJSON = String(decoding: try JSONEncoder().encode(tables), as: UTF8.self)
        let c = try await PostgresConnection.connect(configuration: connection, id: 0, logger: logger)
        do {
            try await c.query("BEGIN", logger: logger)
            do {
                try await c.query("SELECT pg_advisory_xact_lock(\(Self.migrationLock))", logger: logger)
                for sql: PostgresQuery in [
                    "CREATE SEQUENCE IF NOT EXISTS strata_version",
                    "CREATE SEQUENCE IF NOT EXISTS strata_keys",
                    """
                    CREATE TABLE IF NOT EXISTS strata_rows (tbl text NOT NULL, key text NOT NULL, fields text NOT NULL,
                      deleted boolean NOT NULL DEFAULT false, version bigint NOT NULL,
                      updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tbl, key))
                    """,
                    "CREATE INDEX IF NOT EXISTS strata_rows_version ON strata_rows (version)",
                    """
                    CREATE TABLE IF NOT EXISTS strata_batches (id text PRIMARY KEY, client_id text NOT NULL, ack text,
                      applied_at timestamptz NOT NULL DEFAULT now())
                    """,
                    """
                    CREATE TABLE IF NOT EXISTS strata_tokens (token_sha256 text PRIMARY KEY, client_id text NOT NULL,
                      created_at timestamptz NOT NULL DEFAULT now())
                    """,
                    "CREATE TABLE IF NOT EXISTS strata_meta (name text PRIMARY KEY, value text NOT NULL)",
                    // Schema 1 → 2: the order in which batches committed, for audits and tests.
                    "CREATE SEQUENCE IF NOT EXISTS strata_batch_order",
                    "ALTER TABLE strata_batches ADD COLUMN IF NOT EXISTS seq bigint",
                    "INSERT INTO strata_meta VALUES ('horizon', '0') ON CONFLICT DO NOTHING",
                    // Schema 2 → 3: the SHA-256 of each batch's payload, so that an id that comes
                    // back with other changes is refused (a batch stored before has none), and the
                    // index that finds a client's highest batch number for that refusal.
                    "ALTER TABLE strata_batches ADD COLUMN IF NOT EXISTS digest text",
                    "CREATE INDEX IF NOT EXISTS strata_batches_client ON strata_batches (client_id)",
                ] {
                    try await c.query(sql, logger: logger)
                }
                let found = try await c.query("SELECT value FROM strata_meta WHERE name = 'schemaVersion'", logger: logger).collect()
                if let v = try found.first?.decode(String.self), let n = Int(v), n > Self.schemaVersion {
                    throw ServerError("the database holds schema version \(n), newer than this server's \(Self.schemaVersion)")
                }
                try await c.query("""
                    INSERT INTO strata_meta VALUES ('schemaVersion', \(String(Self.schemaVersion)))
                    ON CONFLICT (name) DO UPDATE SET value = excluded.value
                    """, logger: logger)
                // The tables file the server last started with, for whoever inspects the database
                // (the admin commands run without one).
                if !tables.tables.isEmpty {
                    try await c.query("""
                        INSERT INTO strata_meta VALUES ('tables', \(tablesJSON)) ON CONFLICT (name) DO UPDATE SET value = excluded.value
                        """, logger: logger)
                }
                try await c.query("COMMIT", logger: logger)
            } catch {
                _ = try? await c.query("ROLLBACK", logger: logger)
                throw error
            }
            try await c.close()
        } catch {
            try? await c.close()
            throw error
        }
    }

    // MARK: Tokens

    /// The client id a bearer token stands for, or `nil`.
    ///
    /// Looked up in PostgreSQL on every request, with no cache: a token deleted from
    /// `strata_tokens` is refused from the next request on.
    func clientID(token: String) async throws -> String? {
        var found: String?
        // Every row is read (there is at most one): the pool takes the connection back when the
        // rows end.
        for try await row in try await client.execute(TokenLookup(hash: Self.tokenHash(token)), logger: logger) {
            var cells = Cells(row)
            found = try cells.next(String.self)
        }
        return found
    }

    /// Makes a new random token for `clientID`; only its hash is stored.
    func createToken(clientID: String) async throws -> String {
        var rng = SystemRandomNumberGenerator()
        let token = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &rng)) }.joined()
        try await client.query(
            "INSERT INTO strata_tokens (token_sha256, client_id) VALUES (\(Self.tokenHash(token)), \(clientID))",
            logger: logger)
        return token
    }

    /// What `strata_tokens` stores of a token: the SHA-256 of its UTF-8, in lowercase hex (as
    /// PostgreSQL's `encode(sha256(convert_to(token, 'UTF8')), 'hex')` wrote it for the tokens
    /// made before it was computed here). Hashed in the process, so that the lookup is a plain
    /// index probe.
    static func tokenHash(_ token: String) -> String {
        hex(SHA256.hash(data: Data(token.utf8)))
    }

    /// The token lookup of ``clientID(token:)``.
    private struct TokenLookup: PreparedRows {
        static let name = "strata_token"
        static let sql = "SELECT client_id FROM strata_tokens WHERE token_sha256 = $1"
        var hash: String

        func makeBindings() -> PostgresBindings {
            var b = PostgresBindings(capacity: 1)
            b.append(hash)
            return b
        }
    }

    // MARK: Changes

    /// One page of changes, and whether more follow.
    ///
    /// - Incremental (`since` given): the rows whose version is in `(since, until]`, in version
    ///   order, deletes as tombstones. `until` is fixed by the first page (the latest committed
    ///   version), so that a row changed while a client pages shows up once, in the next pull.
    ///   Each page's anchor is the version of its last row (`until` on the last page): every page
    ///   can be merged on its own.
    /// - Snapshot (no `since`): the live rows in (table, key) order after the cursor `after`, with
    ///   the anchor `until`. The pages of a snapshot are one delta: a client combines them before
    ///   it merges.
    ///
    /// The horizon, the latest version and the rows are read by one statement, so from one
    /// snapshot (what a statement sees in PostgreSQL's READ COMMITTED): read in two statements, a
    /// `prune` committing between them could remove tombstones after `since` that the horizon
    /// read before it let through, and the client would never learn of those deletes. `prune`
    /// deletes the tombstones and raises the horizon in one transaction, so this snapshot holds
    /// both or neither. One statement also needs no `BEGIN` and `COMMIT`: a page is one round trip.
    func changes(since: String?, until: String?, after: (table: String, key: String)?, limit: Int) async throws -> Page {
        func version(_ s: String, _ what: String) throws(RequestError) -> Int64 {
            guard let v = Int64(s), v >= 0 else { throw .bad("the \(what) '\(s)' is not one this server hands out") }
            return v
        }
        let from = try since.map { try version($0, "anchor") }
        let asked = try until.map { try version($0, "until") }
        let rows = if let from {
            try await client.execute(ChangesSince(since: from, until: asked, limit: Int64(limit) + 1), logger: logger)
        } else {
            try await client.execute(SnapshotPage(afterTable: after?.table ?? "", afterKey: after?.key ?? "", limit: Int64(limit) + 1), logger: logger)
        }

        // The page is written from the stored JSON of each row, its values never decoded
        // (`DeltaPageWriter`).
        var writer = DeltaPageWriter(tables: tables.tables.map { t in
            DeltaPageWriter.Table(name: t.name, keyFields: t.primaryKey,
                                  fields: t.isPropertyBag ? [] : t.fields.map(\.name).filter { !t.primaryKey.contains($0) })
        })
        // The tables' names as bytes: a row's table is found by comparing its cell's bytes, with
        // no string made per row.
        let names = tables.tables.map { Array($0.name.utf8) }
        var page = Page(body: [], until: 0)
        var count = 0
        var last: (table: ByteBuffer, key: ByteBuffer, version: Int64)?
        var first = true
        for try await row in rows {
            if first {
                // Every row ends with the horizon and the latest committed version: versions
                // commit in order (see `apply`), so every version up to the highest visible one
                // is committed. Read from the first row only: the other rows' are never reached.
                first = false
                var meta = Cells(row)
                meta.skip(6)
                let horizon = try meta.next(Int64.self), upper = try meta.next(Int64.self)
                page.until = asked ?? upper
                guard page.until <= upper else { throw RequestError.bad("'until' \(page.until) is ahead of the server (\(upper))") }
                if let from, from > upper {
                    throw RequestError(410, "unknownClient", "the anchor \(from) is ahead of this server (at \(upper)): its data was replaced")
                }
                if let from, from < horizon {
                    throw RequestError(410, "anchorExpired", "the anchor \(from) is older than the oldest this server keeps (\(horizon))")
                }
            }
            var cells = Cells(row)
            // The statement answers one row of nulls when no row of data follows.
            guard let tbl = try cells.nextBytes() else { continue }
            count += 1
            if count > limit { page.more = true; continue }
            let key = try cells.nextBytes() ?? ByteBuffer()
            let fields = try cells.nextBytes(), deleted = try cells.next(Bool.self), version = try cells.next(Int64.self)
            let stamp = try cells.nextTimestamp()
            last = (tbl, key, version)
            // A table since dropped from the tables file is not served.
            guard let i = tbl.withUnsafeReadableBytes({ t in names.firstIndex { $0.elementsEqual(t) } }) else { continue }
            try key.withUnsafeReadableBytes { k in
                if deleted {
                    try writer.delete(table: i, key: k)
                } else {
                    guard let fields else { throw RequestError(500, "internal", "a stored row of table '\(tables.tables[i].name)' has no fields") }
                    try fields.withUnsafeReadableBytes { f in try writer.upsert(table: i, key: k, fields: f, version: version, timestamp: stamp) }
                }
            }
        }
        guard !first else { throw ServerError("PostgreSQL answered no row for a page (is strata_meta's horizon missing?)") }

        if let since {
            // A page cut short ends at its last row's version; the last page at `until`.
            let anchor = page.more ? String(last?.version ?? page.until) : String(page.until)
            page.body = writer.finish(since: since, anchor: anchor, mode: .incremental)
        } else {
            // Where the next page starts: strings of the last row only.
            if let last { page.after = (String(buffer: last.table), String(buffer: last.key)) }
            // A snapshot lists every table, so that a client deletes rows of a table now empty.
            page.body = writer.finish(since: nil, anchor: String(page.until), mode: .snapshot, listingEveryTable: true)
        }
        return page
    }

    /// What both page statements read first: the horizon, and the latest version the server
    /// has (`upper`: the latest version in `strata_rows`, or the horizon when all after it were
    /// pruned). Materialized, so that it is read once: inlined, PostgreSQL evaluated it once for
    /// each place it is named.
    private static let pageMeta = """
        m AS MATERIALIZED (
          SELECT horizon, greatest(horizon, coalesce((SELECT max(version) FROM strata_rows), 0)) AS upper
          FROM (SELECT (SELECT value FROM strata_meta WHERE name = 'horizon')::bigint AS horizon) h)
        """

    /// An incremental page (see ``changes(since:until:after:limit:)``): each row is a row's
    /// table, key, fields, tombstone flag, version and time of change (nulls when no row of data
    /// follows), then the horizon and `upper` (see `pageMeta`). Last, so that the rows after
    /// the first are read without passing over them (each cell passed costs the server retains).
    ///
    /// Rows are read only when the anchor is one the horizon still serves and `until` is not
    /// ahead of the server: a refused pull reads none. `$2` is `until` (null: the latest).
    private struct ChangesSince: PreparedRows {
        static let name = "strata_changes"
        static let sql = """
            WITH \(Database.pageMeta)
            SELECT r.tbl, r.key, r.fields, r.deleted, r.version, r.updated_at, m.horizon, m.upper
            FROM m LEFT JOIN LATERAL (
              SELECT tbl, key, fields, deleted, version, updated_at FROM strata_rows
              WHERE version > $1::bigint AND version <= coalesce($2::bigint, m.upper)
                AND $1::bigint BETWEEN m.horizon AND m.upper AND coalesce($2::bigint, 0) <= m.upper
              ORDER BY version LIMIT $3::bigint) r ON true
            """
        var since: Int64
        var until: Int64?
        var limit: Int64

        func makeBindings() -> PostgresBindings {
            var b = PostgresBindings(capacity: 3)
            b.append(since)
            b.append(until)
            b.append(limit)
            return b
        }
    }

    /// A snapshot page (see ``changes(since:until:after:limit:)``): the live rows after
    /// (`$1`, `$2`) in (table, key) order, each followed by the horizon and `upper`, as
    /// ``ChangesSince`` answers them.
    private struct SnapshotPage: PreparedRows {
        static let name = "strata_snapshot"
        static let sql = """
            WITH \(Database.pageMeta)
            SELECT r.tbl, r.key, r.fields, r.deleted, r.version, r.updated_at, m.horizon, m.upper
            FROM m LEFT JOIN LATERAL (
              SELECT tbl, key, fields, deleted, version, updated_at FROM strata_rows
              WHERE (tbl, key) > ($1::text, $2::text) AND NOT deleted ORDER BY tbl, key LIMIT $3::bigint) r ON true
            """
        var afterTable: String
        var afterKey: String
        var limit: Int64

        func makeBindings() -> PostgresBindings {
            var b = PostgresBindings(capacity: 3)
            b.append(afterTable)
            b.append(afterKey)
            b.append(limit)
            return b
        }
    }

    /// A page of ``changes(since:until:after:limit:)``.
    struct Page {
        /// The page: a `ServerDelta` in the wire format.
        var body: [UInt8]
        var until: Int64
        var more = false
        /// The last row of a snapshot page, where the next page starts.
        var after: (table: String, key: String)?
    }

    // MARK: Prune

    /// Removes tombstones up to `version`; anchors older than that get `anchorExpired` from now on.
    func prune(through version: Int64) async throws -> Int {
        try await client.withConnection { c in
            try await c.query("BEGIN", logger: logger)
            do {
                let gone = try await c.query("DELETE FROM strata_rows WHERE deleted AND version <= \(version) RETURNING 1", logger: logger).collect().count
                try await c.query("""
                    UPDATE strata_meta SET value = greatest(value::bigint, \(version))::text WHERE name = 'horizon'
                    """, logger: logger)
                try await c.query("COMMIT", logger: logger)
                return gone
            } catch {
                _ = try? await c.query("ROLLBACK", logger: logger)
                throw error
            }
        }
    }
}

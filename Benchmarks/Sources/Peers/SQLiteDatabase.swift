import CSQLite
@_spi(ValueCoding) import Strata

struct SQLiteError: Error, CustomStringConvertible {
    let description: String
}

/// A thin owner of a `sqlite3*` connection and its prepared statements.
final class SQLiteDatabase {
    let handle: OpaquePointer
    private var statements: [OpaquePointer] = []

    /// SQLITE_TRANSIENT: SQLite copies bound text and blobs. The macro does not import into Swift.
    static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    init(path: String) throws {
        var db: OpaquePointer?
        let rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil)
        guard rc == SQLITE_OK, let db else {
            // sqlite3_open_v2 allocates a handle even on failure; it must be closed.
            sqlite3_close_v2(db)
            throw SQLiteError(description: "cannot open \(path): \(rc)")
        }
        handle = db
    }

    deinit {
        for s in statements { sqlite3_finalize(s) }
        sqlite3_close_v2(handle)
    }

    func check(_ rc: Int32, _ what: String) throws {
        guard rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW else {
            throw SQLiteError(description: "\(what) failed (\(rc)): \(String(cString: sqlite3_errmsg(handle)))")
        }
    }

    func exec(_ sql: String) throws {
        try check(sqlite3_exec(handle, sql, nil, nil, nil), sql)
    }

    func prepare(_ sql: String) throws -> OpaquePointer {
        var stmt: OpaquePointer?
        try check(sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &stmt, nil), sql)
        statements.append(stmt!)
        return stmt!
    }

    /// Runs a statement that returns no rows, then resets it for reuse.
    func step(_ stmt: OpaquePointer) throws {
        let rc = sqlite3_step(stmt)
        sqlite3_reset(stmt)
        guard rc == SQLITE_DONE else { try check(rc, "sqlite3_step"); return }
    }

    func query(_ sql: String, _ row: (OpaquePointer) throws -> Void) throws {
        var stmt: OpaquePointer?
        try check(sqlite3_prepare_v2(handle, sql, -1, &stmt, nil), sql)
        defer { sqlite3_finalize(stmt) }
        while true {
            let rc = sqlite3_step(stmt)
            if rc == SQLITE_DONE { return }
            try check(rc, sql)
            try row(stmt!)
        }
    }

    func scalar(_ sql: String) throws -> Int64 {
        var v: Int64 = 0
        try query(sql) { v = sqlite3_column_int64($0, 0) }
        return v
    }

    /// A digest of every row a query returns, to compare two tables.
    func digest(_ sql: String) throws -> [UInt8] {
        var bytes: [UInt8] = []
        try query(sql) { stmt in
            for c in 0..<sqlite3_column_count(stmt) { ValueCoding.append(Self.column(stmt, c), to: &bytes) }
        }
        return bytes
    }

    static func bind(_ value: Value, to stmt: OpaquePointer, at i: Int32) {
        switch value {
        case .null: sqlite3_bind_null(stmt, i)
        case .bool(let b): sqlite3_bind_int64(stmt, i, b ? 1 : 0)
        case .int(let v): sqlite3_bind_int64(stmt, i, v)
        case .double(let d): sqlite3_bind_double(stmt, i, d)
        case .string(let s): sqlite3_bind_text(stmt, i, s, -1, transient)
        case .bytes(let b): sqlite3_bind_blob(stmt, i, b, Int32(b.count), transient)
        case .timestamp(let d): sqlite3_bind_double(stmt, i, d.timeIntervalSince1970)
        }
    }

    static func column(_ stmt: OpaquePointer, _ i: Int32) -> Value {
        switch sqlite3_column_type(stmt, i) {
        case SQLITE_INTEGER: .int(sqlite3_column_int64(stmt, i))
        case SQLITE_FLOAT: .double(sqlite3_column_double(stmt, i))
        case SQLITE_TEXT: .string(String(cString: sqlite3_column_text(stmt, i)))
        case SQLITE_BLOB: .bytes(Array(UnsafeRawBufferPointer(start: sqlite3_column_blob(stmt, i), count: Int(sqlite3_column_bytes(stmt, i)))))
        default: .null
        }
    }

    /// A `sqlite3_value` (from a changeset) as a ``Value``.
    static func value(_ v: OpaquePointer) -> Value {
        switch sqlite3_value_type(v) {
        case SQLITE_INTEGER: .int(sqlite3_value_int64(v))
        case SQLITE_FLOAT: .double(sqlite3_value_double(v))
        case SQLITE_TEXT: .string(String(cString: sqlite3_value_text(v)))
        case SQLITE_BLOB: .bytes(Array(UnsafeRawBufferPointer(start: sqlite3_value_blob(v), count: Int(sqlite3_value_bytes(v)))))
        default: .null
        }
    }
}

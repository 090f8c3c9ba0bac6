import CSQLite
import Foundation
@_spi(ValueCoding) import Strata
import StrataWorkload

/// SQLite used the way a Swift developer would for the same job, through its C API (a faster
/// peer than any wrapper): WAL mode with full sync, prepared statements, and
///
/// - `.trigger`: triggers append the old and new values of each edit to a `changelog` table;
/// - `.session`: the session extension records each transaction's changeset in `changesets`;
/// - `.plain`: no change tracking at all (the floor for durable single edits).
public final class SQLitePeer: Peer {
    public enum Kind: String, Sendable { case trigger, session, plain }

    public let kind: Kind
    public var name: String { "SQLite \(kind.rawValue)" }
    let folder: String
    var db: SQLiteDatabase
    private var insert: OpaquePointer!
    private var delete: OpaquePointer!
    private var saveChangeset: OpaquePointer!
    /// Update statements by column set: `c1` alone at index c1, the pair (c1, c2) at 5 + c1 * 5 + c2.
    private var updates: [OpaquePointer?] = Array(repeating: nil, count: 30)
    private var workload: ReferenceWorkload!
    /// The last change-log sequence number of the preload.
    private var preloadSeq: Int64 = 0

    public init(_ kind: Kind, folder: String) throws {
        self.kind = kind
        self.folder = folder
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        db = try SQLiteDatabase(path: folder + "/tasks.db")
        try db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;")
        try Self.createSchema(db, kind: kind)
        insert = try db.prepare("INSERT INTO tasks VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
        delete = try db.prepare("DELETE FROM tasks WHERE id = ?1")
        for c1 in 0..<5 {
            let name1 = ReferenceWorkload.columns[c1]
            updates[c1] = try db.prepare("UPDATE tasks SET \(name1) = ?1 WHERE id = ?3")
            for c2 in 0..<5 where c2 != c1 {
                updates[5 + c1 * 5 + c2] = try db.prepare("UPDATE tasks SET \(name1) = ?1, \(ReferenceWorkload.columns[c2]) = ?2 WHERE id = ?3")
            }
        }
        if kind == .session { saveChangeset = try db.prepare("INSERT INTO changesets(data) VALUES (?1)") }
        select = try db.prepare("SELECT title, priority, done, notes, updated FROM tasks WHERE id = ?1")
    }

    private var select: OpaquePointer!

    public func checkpoint() throws { try db.exec("PRAGMA wal_checkpoint(TRUNCATE)") }

    /// A point read in autocommit mode: one implicit read transaction per statement.
    public func readRow(_ id: Int64) throws -> Bool {
        sqlite3_bind_int64(select, 1, id)
        defer { sqlite3_reset(select) }
        let rc = sqlite3_step(select)
        if rc == SQLITE_ROW {
            _ = (0..<5).map { SQLiteDatabase.column(select, Int32($0)) }
            return true
        }
        guard rc == SQLITE_DONE else { try db.check(rc, "sqlite3_step"); return false }
        return false
    }

    static func createSchema(_ db: SQLiteDatabase, kind: Kind) throws {
        try db.exec("CREATE TABLE tasks (id INTEGER PRIMARY KEY, title TEXT, priority INTEGER, done INTEGER, notes TEXT, updated REAL)")
        switch kind {
        case .plain: break
        case .session: try db.exec("CREATE TABLE changesets (seq INTEGER PRIMARY KEY, data BLOB)")
        case .trigger:
            let cols = ReferenceWorkload.columns
            let oldNew = cols.map { "old_\($0), new_\($0)" }.joined(separator: ", ")
            try db.exec("CREATE TABLE changelog (seq INTEGER PRIMARY KEY, op TEXT, id INTEGER, \(oldNew))")
            try createTriggers(db)
        }
    }

    static func createTriggers(_ db: SQLiteDatabase) throws {
            let cols = ReferenceWorkload.columns
            let newCols = cols.map { "new_\($0)" }.joined(separator: ", ")
            let oldCols = cols.map { "old_\($0)" }.joined(separator: ", ")
            try db.exec("""
                CREATE TRIGGER tasks_insert AFTER INSERT ON tasks BEGIN
                  INSERT INTO changelog (op, id, \(newCols)) VALUES ('i', new.id, \(cols.map { "new.\($0)" }.joined(separator: ", ")));
                END;
                CREATE TRIGGER tasks_update AFTER UPDATE ON tasks BEGIN
                  INSERT INTO changelog (op, id, \(oldCols), \(newCols)) VALUES ('u', new.id, \(cols.map { "old.\($0)" }.joined(separator: ", ")), \(cols.map { "new.\($0)" }.joined(separator: ", ")));
                END;
                CREATE TRIGGER tasks_delete AFTER DELETE ON tasks BEGIN
                  INSERT INTO changelog (op, id, \(oldCols)) VALUES ('d', old.id, \(cols.map { "old.\($0)" }.joined(separator: ", ")));
                END;
                """)
    }

    public func prepare(_ workload: ReferenceWorkload) { self.workload = workload }

    public func preload() throws {
        try transaction {
            for (i, row) in workload.preload.enumerated() { try insertRow(Int64(i + 1), row) }
        }
    }

    public func markPreloadSynced() throws {
        preloadSeq = try lastSeq()
    }

    public func applyEdits(_ range: Range<Int>) throws {
        try transaction {
            for e in workload.edits[range] {
                switch e {
                case .insert(let id, let values): try insertRow(id, values)
                case .update(let id, let cols, let values):
                    let stmt = cols.count == 1 ? updates[cols[0]]! : updates[5 + cols[0] * 5 + cols[1]]!
                    for (i, v) in values.enumerated() { SQLiteDatabase.bind(v, to: stmt, at: Int32(i + 1)) }
                    sqlite3_bind_int64(stmt, 3, id)
                    try db.step(stmt)
                case .delete(let id):
                    sqlite3_bind_int64(delete, 1, id)
                    try db.step(delete)
                }
            }
        }
    }

    private func insertRow(_ id: Int64, _ values: [Value]) throws {
        sqlite3_bind_int64(insert, 1, id)
        for (i, v) in values.enumerated() { SQLiteDatabase.bind(v, to: insert, at: Int32(i + 2)) }
        try db.step(insert)
    }

    /// One write transaction; the session peer records its changeset inside it.
    private func transaction(_ body: () throws -> Void) throws {
        try db.exec("BEGIN")
        var session: OpaquePointer?
        if kind == .session {
            try db.check(sqlite3session_create(db.handle, "main", &session), "sqlite3session_create")
            try db.check(sqlite3session_attach(session, "tasks"), "sqlite3session_attach")
        }
        try body()
        if let session {
            var size: Int32 = 0
            var buffer: UnsafeMutableRawPointer?
            try db.check(sqlite3session_changeset(session, &size, &buffer), "sqlite3session_changeset")
            sqlite3_bind_blob(saveChangeset, 1, buffer, size, SQLiteDatabase.transient)
            try db.step(saveChangeset)
            sqlite3_free(buffer)
            sqlite3session_delete(session)
        }
        try db.exec("COMMIT")
    }

    private func lastSeq() throws -> Int64 {
        switch kind {
        case .plain: 0
        case .trigger: try db.scalar("SELECT coalesce(max(seq), 0) FROM changelog")
        case .session: try db.scalar("SELECT coalesce(max(seq), 0) FROM changesets")
        }
    }

    // MARK: Pending payload

    public func pendingPayload() throws -> Int {
        switch kind {
        case .plain: return 0
        case .session:
            // The session extension's own coalescing: a changegroup of every changeset since the preload.
            var group: OpaquePointer?
            try db.check(sqlite3changegroup_new(&group), "sqlite3changegroup_new")
            defer { sqlite3changegroup_delete(group) }
            try db.query("SELECT data FROM changesets WHERE seq > \(preloadSeq) ORDER BY seq") { stmt in
                try db.check(sqlite3changegroup_add(group, sqlite3_column_bytes(stmt, 0), UnsafeMutableRawPointer(mutating: sqlite3_column_blob(stmt, 0))), "sqlite3changegroup_add")
            }
            var size: Int32 = 0
            var buffer: UnsafeMutableRawPointer?
            try db.check(sqlite3changegroup_output(group, &size, &buffer), "sqlite3changegroup_output")
            sqlite3_free(buffer)
            return Int(size)
        case .trigger:
            // Fold the change log per row: first old values, last new values, insert+delete dropped.
            struct Net { var op: UInt8; var old: [Value]?; var new: [Value]? }
            var net: [Int64: Net] = [:]
            try db.query("SELECT op, id, \(ReferenceWorkload.columns.map { "old_\($0), new_\($0)" }.joined(separator: ", ")) FROM changelog WHERE seq > \(preloadSeq) ORDER BY seq") { stmt in
                let op = sqlite3_column_text(stmt, 0)![0]
                let id = sqlite3_column_int64(stmt, 1)
                let old = op == UInt8(ascii: "i") ? nil : (0..<5).map { SQLiteDatabase.column(stmt, Int32(2 + $0 * 2)) }
                let new = op == UInt8(ascii: "d") ? nil : (0..<5).map { SQLiteDatabase.column(stmt, Int32(3 + $0 * 2)) }
                if var n = net[id] {
                    n.new = new
                    if op == UInt8(ascii: "d") && n.op == UInt8(ascii: "i") { net[id] = nil } else {
                        if op == UInt8(ascii: "d") { n.op = op }
                        net[id] = n
                    }
                } else {
                    net[id] = Net(op: op, old: old, new: new)
                }
            }
            var buffer: [UInt8] = []
            for (id, n) in net {
                buffer.append(n.op)
                ValueCoding.append(.int(id), to: &buffer)
                for v in n.old ?? [] { ValueCoding.append(v, to: &buffer) }
                for v in n.new ?? [] { ValueCoding.append(v, to: &buffer) }
            }
            return buffer.count
        }
    }

    // MARK: Rebuild

    /// Replays the change log into an empty database and checks it equals the live table.
    public func rebuildAndCheck() throws -> Bool {
        let path = folder + "/rebuilt.db"
        try? FileManager.default.removeItem(atPath: path)
        let fresh = try SQLiteDatabase(path: path)
        // The scratch copy is not durable, as Strata's scratch store is not.
        try fresh.exec("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;")
        try Self.createSchema(fresh, kind: .plain)
        try fresh.exec("BEGIN")
        switch kind {
        case .plain: return true
        case .session:
            try db.query("SELECT data FROM changesets ORDER BY seq") { stmt in
                let conflict: @convention(c) (UnsafeMutableRawPointer?, Int32, OpaquePointer?) -> Int32 = { _, _, _ in SQLITE_CHANGESET_ABORT }
                try fresh.check(sqlite3changeset_apply(fresh.handle, sqlite3_column_bytes(stmt, 0), UnsafeMutableRawPointer(mutating: sqlite3_column_blob(stmt, 0)), nil, conflict, nil), "sqlite3changeset_apply")
            }
        case .trigger:
            let ins = try fresh.prepare("INSERT INTO tasks VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            let upd = try fresh.prepare("UPDATE tasks SET title = ?2, priority = ?3, done = ?4, notes = ?5, updated = ?6 WHERE id = ?1")
            let del = try fresh.prepare("DELETE FROM tasks WHERE id = ?1")
            try db.query("SELECT op, id, \(ReferenceWorkload.columns.map { "new_\($0)" }.joined(separator: ", ")) FROM changelog ORDER BY seq") { stmt in
                let op = sqlite3_column_text(stmt, 0)![0]
                let target = op == UInt8(ascii: "i") ? ins : op == UInt8(ascii: "u") ? upd : del
                sqlite3_bind_int64(target, 1, sqlite3_column_int64(stmt, 1))
                if op != UInt8(ascii: "d") {
                    for c in 0..<5 { sqlite3_bind_value(target, Int32(c + 2), sqlite3_column_value(stmt, Int32(c + 2))) }
                }
                try fresh.step(target)
            }
        }
        try fresh.exec("COMMIT")
        let a = try db.digest("SELECT * FROM tasks ORDER BY id")
        let b = try fresh.digest("SELECT * FROM tasks ORDER BY id")
        return a == b
    }

    // MARK: Time travel

    /// Trigger: the row's last change-log entry at or before the point (the log has no index on
    /// `id`, as in the edit phase: an index would slow every edit). Session: the row folded from
    /// the changesets up to the point.
    public func row(_ id: Int64, afterEdits edits: Int, batch: Int) throws -> [Value]?? {
        switch kind {
        case .plain: return nil
        case .trigger:
            // Change-log sequence numbers: the preload's inserts, then one entry per edit.
            let seq = preloadSeq + Int64(edits)
            var result: [Value]? = nil
            try db.query("SELECT op, \(ReferenceWorkload.columns.map { "new_\($0)" }.joined(separator: ", ")) FROM changelog WHERE id = \(id) AND seq <= \(seq) ORDER BY seq DESC LIMIT 1") { stmt in
                if sqlite3_column_text(stmt, 0)![0] != UInt8(ascii: "d") { result = (0..<5).map { SQLiteDatabase.column(stmt, Int32(1 + $0)) } }
            }
            return .some(result)
        case .session:
            // Changesets: the preload's, then one per transaction of `batch` edits.
            var row: [Value]? = nil
            try db.query("SELECT data FROM changesets WHERE seq <= \(preloadSeq + Int64(edits / batch)) ORDER BY seq") { stmt in
                var iter: OpaquePointer?
                try db.check(sqlite3changeset_start(&iter, sqlite3_column_bytes(stmt, 0), UnsafeMutableRawPointer(mutating: sqlite3_column_blob(stmt, 0))), "sqlite3changeset_start")
                defer { sqlite3changeset_finalize(iter) }
                while sqlite3changeset_next(iter) == SQLITE_ROW {
                    var table: UnsafePointer<CChar>?
                    var columns: Int32 = 0
                    var op: Int32 = 0
                    var indirect: Int32 = 0
                    sqlite3changeset_op(iter, &table, &columns, &op, &indirect)
                    var key: OpaquePointer?
                    sqlite3changeset_old(iter, 0, &key)
                    if op == SQLITE_INSERT { sqlite3changeset_new(iter, 0, &key) }
                    guard sqlite3_value_int64(key) == id else { continue }
                    switch op {
                    case SQLITE_DELETE: row = nil
                    default:
                        var values = row ?? Array(repeating: .null, count: 5)
                        for c in 0..<5 {
                            var v: OpaquePointer?
                            // An update carries new values only for the columns it changed.
                            if sqlite3changeset_new(iter, Int32(c + 1), &v) == SQLITE_OK, let v { values[c] = SQLiteDatabase.value(v) }
                        }
                        row = values
                    }
                }
            }
            return .some(row)
        }
    }

    // MARK: Merge

    public func editTitles(_ count: Int) throws {
        try transaction {
            let stmt = updates[0]!
            for id in 1...Int64(count) {
                SQLiteDatabase.bind(.string(MergeWorkload.localTitle(id)), to: stmt, at: 1)
                sqlite3_bind_int64(stmt, 3, id)
                try db.step(stmt)
            }
        }
    }

    /// The trigger peer merges the way an app on SQLite would: coalesce the change log since the
    /// last sync to know each row's original values and changed columns, apply the server rows
    /// with the triggers off (server values are not local edits), and rebase the pending log
    /// entries of the fields the server won. The session peer has no merge here (its rebaser
    /// would be the tool).
    public func merge(_ w: MergeWorkload) throws -> Bool {
        guard kind == .trigger else { return false }
        try db.exec("BEGIN")
        // Pending state: per row, its change-log entries and the columns they changed.
        var pending: [Int64: (seqs: [Int64], changed: Set<Int>)] = [:]
        try db.query("SELECT seq, id, \(ReferenceWorkload.columns.map { "old_\($0), new_\($0)" }.joined(separator: ", ")) FROM changelog WHERE seq > \(preloadSeq)") { stmt in
            let id = sqlite3_column_int64(stmt, 1)
            var entry = pending[id] ?? ([], [])
            entry.seqs.append(sqlite3_column_int64(stmt, 0))
            for c in 0..<5 where SQLiteDatabase.column(stmt, Int32(2 + c * 2)) != SQLiteDatabase.column(stmt, Int32(3 + c * 2)) { entry.changed.insert(c) }
            pending[id] = entry
        }
        try db.exec("DROP TRIGGER tasks_insert; DROP TRIGGER tasks_update; DROP TRIGGER tasks_delete;")
        let setPriority = try db.prepare("UPDATE tasks SET priority = ?1 WHERE id = ?2")
        let setBoth = try db.prepare("UPDATE tasks SET priority = ?1, title = ?3 WHERE id = ?2")
        let rebaseTitle = try db.prepare("UPDATE changelog SET old_title = ?1, new_title = ?1 WHERE seq = ?2")
        for id in 1...Int64(w.rows) {
            let local = pending[id]
            // A server field the device did not change is taken; one it changed is a conflict,
            // which the server wins.
            let stmt = w.serverTitle(id) == nil ? setPriority : setBoth
            sqlite3_bind_int64(stmt, 1, w.serverPriority(id))
            sqlite3_bind_int64(stmt, 2, id)
            if let title = w.serverTitle(id) { SQLiteDatabase.bind(.string(title), to: stmt, at: 3) }
            try db.step(stmt)
            if let title = w.serverTitle(id), let local, local.changed.contains(0) {
                for seq in local.seqs {
                    SQLiteDatabase.bind(.string(title), to: rebaseTitle, at: 1)
                    sqlite3_bind_int64(rebaseTitle, 2, seq)
                    try db.step(rebaseTitle)
                }
            }
        }
        try Self.createTriggers(db)
        try db.exec("COMMIT")
        return true
    }

    public var sizeOnDisk: Int {
        ["tasks.db", "tasks.db-wal"].reduce(0) { total, f in
            total + ((try? FileManager.default.attributesOfItem(atPath: folder + "/" + f)[.size] as? Int) ?? 0)
        }
    }
}

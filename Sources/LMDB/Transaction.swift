import CLMDB

/// A named database inside an ``Environment``. The handle is valid for the environment's life.
public struct Database: Sendable, Hashable {
    /// The raw `MDB_dbi`.
    @usableFromInline package let dbi: MDB_dbi
    /// The name it was opened with; `nil` for the main database.
    package let name: String?

    init(dbi: MDB_dbi, name: String?) {
        self.dbi = dbi
        self.name = name
    }
}

/// Flags for ``WriteTransaction/put(_:_:in:flags:)``.
public struct PutFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// Fail with `MDB_KEYEXIST` instead of replacing an existing key.
    package static let noOverwrite = PutFlags(rawValue: UInt32(MDB_NOOVERWRITE))
    /// The key is greater than every key in the database (`MDB_APPEND`): a fast append to the
    /// last page. A key out of order fails with `MDB_KEYEXIST`.
    public static let append = PutFlags(rawValue: UInt32(MDB_APPEND))
}

/// A key-value pair lent by LMDB. The memory is valid until the transaction ends or, in a write
/// transaction, until the next write.
package typealias Entry = (key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)

@inline(__always)
@usableFromInline
func mdbVal(_ buffer: UnsafeRawBufferPointer) -> MDB_val {
    MDB_val(mv_size: buffer.count, mv_data: UnsafeMutableRawPointer(mutating: buffer.baseAddress))
}

@inline(__always)
func bytes(_ val: MDB_val) -> UnsafeRawBufferPointer {
    UnsafeRawBufferPointer(start: val.mv_data, count: val.mv_size)
}

/// Lends the bytes of `array` to `body`, keeping `body`'s typed error.
@inlinable
package func withBytes<R, E: Error>(_ array: [UInt8], _ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
    let result: Result<R, E> = array.withUnsafeBytes { b in Result { () throws(E) in try body(b) } }
    return try result.get()
}

/// Read operations, shared by read-only and write transactions.
package protocol ReadableTransaction {
    /// The raw `MDB_txn*`. Valid only inside the closure that lent the transaction.
    var handle: OpaquePointer { get }
    /// How to check memory that LMDB lends this transaction (see ``LMDBError/ResultCode/valueOutsideFile``).
    var lent: LentMemory { get }
}

extension ReadableTransaction {
    /// The value stored under `key`, or `nil` when there is none.
    ///
    /// The returned memory points into the map: it is valid until the transaction ends (and in
    /// a write transaction, until the next write). Copy it out to keep it.
    ///
    /// A value that lies outside the data file (a damaged page) throws
    /// ``LMDBError/ResultCode/valueOutsideFile`` instead of being lent.
    ///
    /// - Complexity: O(log n).
    package func get(_ key: UnsafeRawBufferPointer, in db: Database) throws(LMDBError) -> UnsafeRawBufferPointer? {
        var k = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
        var v = MDB_val()
        let rc = mdb_get(handle, db.dbi, &k, &v)
        if rc == MDB_NOTFOUND { return nil }
        try check(rc, "mdb_get")
        try lent.check(MDB_val(), v, "mdb_get", db)
        return UnsafeRawBufferPointer(start: v.mv_data, count: v.mv_size)
    }

    /// The value stored under `key`, or `nil`; see ``get(_:in:)-(UnsafeRawBufferPointer,_)``.
    package func get(_ key: [UInt8], in db: Database) throws(LMDBError) -> UnsafeRawBufferPointer? {
        try withBytes(key) { (k) throws(LMDBError) in try get(k, in: db) }
    }

    /// Runs `body` with a cursor over `db`; the cursor is closed when `body` returns.
    package func withCursor<R>(_ db: Database, _ body: (inout Cursor) throws -> R) throws -> R {
        var c: OpaquePointer?
        try check(mdb_cursor_open(handle, db.dbi, &c), "mdb_cursor_open")
        // A write transaction's commit frees its cursors, so the cursor is closed here, before
        // the transaction can end.
        defer { mdb_cursor_close(c) }
        var cursor = Cursor(handle: c!, lent: lent, db: db)
        return try body(&cursor)
    }

    /// The transaction's id (`mdb_txn_id`): for a read transaction, the id of the last write it
    /// sees; for a write transaction, the id its commit will have.
    package var id: Int { mdb_txn_id(handle) }

    /// The id of the committed transaction whose state this one reads: a read transaction's own
    /// id; for a write transaction (or its ``WriteTransaction/reader``), the last commit, one
    /// below the id its own commit will have.
    package var snapshotID: Int { lent.writing ? id - 1 : id }

    /// Statistics of `db`, including its number of entries.
    package func stats(_ db: Database) throws(LMDBError) -> DatabaseStats {
        var s = MDB_stat()
        try check(mdb_stat(handle, db.dbi, &s), "mdb_stat")
        return DatabaseStats(s)
    }
}

/// A read-only snapshot transaction, lent by ``Environment/read(_:)``. Never let it escape.
package struct ReadTransaction: ReadableTransaction {
    package let handle: OpaquePointer
    package let lent: LentMemory
}

@available(*, unavailable, message: "transactions never leave their closure")
extension ReadTransaction: Sendable {}

/// A write transaction, lent by ``Environment/write(_:)``. Never let it escape.
///
/// Any LMDB error in a write marks the transaction failed: it will be aborted even if the
/// closure catches the error, so a half-applied write can never be committed.
public struct WriteTransaction: ReadableTransaction {
    @usableFromInline package let handle: OpaquePointer
    let status: UnsafeMutablePointer<Int32>
    package let lent: LentMemory

    /// Whether an LMDB error hit this transaction (or a nested one failed for want of map
    /// space): it can only be aborted. Not the same as an `LMDBError` passing through a closure,
    /// which may come from another transaction or environment.
    package var hasFailed: Bool { status.pointee != 0 }

    /// Records the first failure of this transaction, then throws it.
    @usableFromInline
    func fail(_ rc: Int32, _ operation: String) throws(LMDBError) -> Never {
        if status.pointee == 0 { status.pointee = rc }
        throw LMDBError(code: rc, operation: operation)
    }

    /// Stores `value` under `key`.
    ///
    /// - Complexity: O(log n); O(1) amortised with `.append`.
    @inlinable
    public func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer, in db: Database, flags: PutFlags = []) throws(LMDBError) {
        var k = mdbVal(key)
        var v = mdbVal(value)
        let rc = mdb_put(handle, db.dbi, &k, &v, flags.rawValue)
        if rc != 0 { try fail(rc, "mdb_put") }
    }

    /// Stores `value` under `key`; see ``put(_:_:in:flags:)-(UnsafeRawBufferPointer,_,_,_)``.
    package func put(_ key: [UInt8], _ value: [UInt8], in db: Database, flags: PutFlags = []) throws(LMDBError) {
        try withBytes(key) { (k) throws(LMDBError) in
            try withBytes(value) { (v) throws(LMDBError) in try put(k, v, in: db, flags: flags) }
        }
    }

    /// Deletes `key`. Returns `false` when there was no such key.
    ///
    /// - Complexity: O(log n).
    @discardableResult
    @inlinable
    package func delete(_ key: UnsafeRawBufferPointer, in db: Database) throws(LMDBError) -> Bool {
        var k = mdbVal(key)
        let rc = mdb_del(handle, db.dbi, &k, nil)
        if rc == MDB_NOTFOUND { return false }
        if rc != 0 { try fail(rc, "mdb_del") }
        return true
    }

    /// Deletes `key`; see ``delete(_:in:)-(UnsafeRawBufferPointer,_)``.
    @discardableResult
    package func delete(_ key: [UInt8], in db: Database) throws(LMDBError) -> Bool {
        try withBytes(key) { (k) throws(LMDBError) in try delete(k, in: db) }
    }

    /// Runs `body` with a cursor that writes into `db`; the cursor is closed when `body` returns.
    ///
    /// For many writes in key order: a cursor's put or delete whose key lies on the page the
    /// cursor is already on skips the search from the root that every `mdb_put` makes.
    package func withWriteCursor<R>(_ db: Database, _ body: (inout WriteCursor) throws(LMDBError) -> R) throws(LMDBError) -> R {
        var c: OpaquePointer?
        let rc = mdb_cursor_open(handle, db.dbi, &c)
        if rc != 0 { try fail(rc, "mdb_cursor_open") }
        // The commit frees a write transaction's cursors: closed here, before it can end.
        defer { mdb_cursor_close(c) }
        var cursor = WriteCursor(handle: c!, transaction: self)
        return try body(&cursor)
    }

    /// Removes every entry of `db`, keeping the database itself.
    package func clear(_ db: Database) throws(LMDBError) {
        let rc = mdb_drop(handle, db.dbi, 0)
        if rc != 0 { try fail(rc, "mdb_drop") }
    }

    /// Opens (or creates) a named database. The handle is usable by every transaction once this
    /// one commits.
    package func openDatabase(_ name: String?, create: Bool = true) throws(LMDBError) -> Database {
        var dbi = MDB_dbi()
        let rc = mdb_dbi_open(handle, name, create ? UInt32(MDB_CREATE) : 0, &dbi)
        if rc != 0 { try fail(rc, "mdb_dbi_open(\(name ?? "main"))") }
        return Database(dbi: dbi, name: name)
    }

    /// A view of this transaction as a reader, for code written against ``ReadTransaction``.
    package var reader: ReadTransaction { ReadTransaction(handle: handle, lent: lent) }

    /// Runs `body` in a nested transaction of this one: its writes join this transaction when
    /// `body` returns, and are discarded, alone, when it throws (or an LMDB error hit it). This
    /// transaction must not be used while `body` runs (LMDB's rule for a parent transaction).
    ///
    /// A full map fails this whole transaction, not only the nested one: the closure that owns
    /// it must run again with a larger map.
    package func nested<R>(_ body: (WriteTransaction) throws -> R) throws -> R {
        var child: OpaquePointer?
        var rc = mdb_txn_begin(mdb_txn_env(handle), handle, 0, &child)
        guard rc == 0, let child else { try fail(rc, "mdb_txn_begin(nested)") }
        let childStatus = UnsafeMutablePointer<Int32>.allocate(capacity: 1)
        childStatus.initialize(to: 0)
        defer { childStatus.deallocate() }
        let result: R
        do {
            result = try body(WriteTransaction(handle: child, status: childStatus, lent: lent))
        } catch {
            mdb_txn_abort(child)
            if childStatus.pointee == MDB_MAP_FULL { status.pointee = MDB_MAP_FULL }
            throw error
        }
        if childStatus.pointee != 0 {
            mdb_txn_abort(child)
            if childStatus.pointee == MDB_MAP_FULL { status.pointee = MDB_MAP_FULL }
            throw LMDBError(code: childStatus.pointee, operation: "nested write transaction")
        }
        // Like every commit, this frees the child whether or not it succeeds.
        rc = mdb_txn_commit(child)
        if rc != 0 { try fail(rc, "mdb_txn_commit(nested)") }
        return result
    }
}

@available(*, unavailable, message: "transactions never leave their closure")
extension WriteTransaction: Sendable {}

/// A cursor that writes into one database, lent by ``WriteTransaction/withWriteCursor(_:_:)``.
/// Any failure marks the transaction failed, as the transaction's own writes do.
package struct WriteCursor {
    let handle: OpaquePointer
    let transaction: WriteTransaction

    /// Stores `value` under `key`.
    ///
    /// - Complexity: O(log n); O(1) when `key` lies on the page of the cursor's last write.
    package mutating func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) throws(LMDBError) {
        var k = mdbVal(key)
        var v = mdbVal(value)
        let rc = mdb_cursor_put(handle, &k, &v, 0)
        if rc != 0 { try transaction.fail(rc, "mdb_cursor_put") }
    }

    /// Deletes `key`. Returns `false` when there was no such key.
    ///
    /// - Complexity: as ``put(_:_:)``.
    @discardableResult
    package mutating func delete(_ key: UnsafeRawBufferPointer) throws(LMDBError) -> Bool {
        var k = mdbVal(key)
        var v = MDB_val()
        var rc = mdb_cursor_get(handle, &k, &v, MDB_SET)
        if rc == MDB_NOTFOUND { return false }
        if rc != 0 { try transaction.fail(rc, "mdb_cursor_get(MDB_SET)") }
        rc = mdb_cursor_del(handle, 0)
        if rc != 0 { try transaction.fail(rc, "mdb_cursor_del") }
        return true
    }
}

/// A cursor over one database, lent by ``ReadableTransaction/withCursor(_:_:)``.
///
/// Positioning methods return the entry under the cursor, or `nil` when there is none. The
/// memory of an entry is valid until the cursor moves or the transaction writes. An entry that
/// lies outside the data file (a damaged page) throws ``LMDBError/ResultCode/valueOutsideFile``.
package struct Cursor {
    let handle: OpaquePointer
    let lent: LentMemory
    let db: Database

    @inline(__always)
    private func get(_ op: MDB_cursor_op) throws(LMDBError) -> Entry? {
        var k = MDB_val()
        var v = MDB_val()
        let rc = mdb_cursor_get(handle, &k, &v, op)
        if rc == MDB_NOTFOUND { return nil }
        try check(rc, "mdb_cursor_get")
        try lent.check(k, v, "mdb_cursor_get", db)
        return (bytes(k), bytes(v))
    }

    /// Moves to the first entry. - Complexity: O(log n).
    package mutating func first() throws(LMDBError) -> Entry? { try get(MDB_FIRST) }
    /// Moves to the last entry. - Complexity: O(log n).
    package mutating func last() throws(LMDBError) -> Entry? { try get(MDB_LAST) }
    /// Moves to the next entry. - Complexity: amortised O(1).
    package mutating func next() throws(LMDBError) -> Entry? { try get(MDB_NEXT) }
    /// Moves to the previous entry. - Complexity: amortised O(1).
    package mutating func previous() throws(LMDBError) -> Entry? { try get(MDB_PREV) }
    /// The entry under the cursor.
    package func current() throws(LMDBError) -> Entry? { try get(MDB_GET_CURRENT) }

    /// Moves to the first entry whose key is greater than or equal to `key` (`MDB_SET_RANGE`).
    ///
    /// - Complexity: O(log n).
    package mutating func seek(atLeast key: UnsafeRawBufferPointer) throws(LMDBError) -> Entry? {
        var k = mdbVal(key)
        var v = MDB_val()
        let rc = mdb_cursor_get(handle, &k, &v, MDB_SET_RANGE)
        if rc == MDB_NOTFOUND { return nil }
        try check(rc, "mdb_cursor_get(MDB_SET_RANGE)")
        try lent.check(k, v, "mdb_cursor_get(MDB_SET_RANGE)", db)
        return (bytes(k), bytes(v))
    }

    /// Moves to the first entry whose key is greater than or equal to `key`.
    package mutating func seek(atLeast key: [UInt8]) throws(LMDBError) -> Entry? {
        try withBytes(key) { (k) throws(LMDBError) in try seek(atLeast: k) }
    }
}

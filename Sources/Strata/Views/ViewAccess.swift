import Foundation
import LMDB

// Every read and write of the store's databases goes through these two types. For the derived
// databases (`rows`, `pending`, `gone`, `index`, `view`) they put the overlay on top of LMDB:
// a read sees `views ⊕ overlay`, a write lands in the overlay. The log, `meta` and `base` are
// LMDB's alone. Rows, pending, indexes and named views are written by one implementation each,
// unaware of which layer they write to.

/// Reads the store as of one snapshot: an LMDB read (or write) transaction, and the overlay that
/// belongs with it.
struct ViewReader {
    /// The LMDB transaction, for the databases the overlay never holds.
    let txn: LMDB.ReadTransaction
    let databases: StoreDatabases
    /// `nil`: the views are LMDB's alone (a scratch store, or the checkpointed views).
    let overlay: OverlayBuffer?

    /// The value under `key` in `db`, or `nil`. The bytes are valid until the transaction ends
    /// (in a write transaction, until the next write).
    @inline(__always)
    func get(_ key: UnsafeRawBufferPointer, in db: Database) throws(LMDBError) -> UnsafeRawBufferPointer? {
        if let overlay, let slot = databases.derivedSlot(db), let entry = overlay.find(key, slot: slot) {
            return entry
        }
        return try txn.get(key, in: db)
    }

    func get(_ key: [UInt8], in db: Database) throws(LMDBError) -> UnsafeRawBufferPointer? {
        try withBytes(key) { (k) throws(LMDBError) in try get(k, in: db) }
    }

    /// Runs a cursor-based body over `db` as this snapshot sees it, wrapping errors as
    /// ``StrataError``.
    func scan<R>(_ db: Database, _ body: (inout ViewCursor) throws -> R) throws(StrataError) -> R {
        let tree: OverlayTree? = overlay.flatMap { o in databases.derivedSlot(db).map { o.version.trees[$0] } }.flatMap { $0.count == 0 ? nil : $0 }
        return try txn.scan(db) { (c: inout Cursor) in
            var cursor = ViewCursor(lmdb: c, overlay: tree.map(OverlayCursor.init))
            return try body(&cursor)
        }
    }

    /// Entry counts and page figures of LMDB's copy of `db` (the overlay not counted): for sizing
    /// buffers, never for answers.
    func stats(_ db: Database) throws(LMDBError) -> DatabaseStats { try txn.stats(db) }

    func meta(_ key: String, in databases: StoreDatabases) throws(StrataError) -> UnsafeRawBufferPointer? { try txn.meta(key, in: databases) }
    func metaUInt64(_ key: String, in databases: StoreDatabases) throws(StrataError) -> UInt64? { try txn.metaUInt64(key, in: databases) }
    func lastLSN(in databases: StoreDatabases) throws(StrataError) -> UInt64 { try txn.lastLSN(in: databases) }
    func lastLSN(of log: Database) throws(StrataError) -> UInt64 { try txn.lastLSN(of: log) }
    func horizon(in databases: StoreDatabases) throws(StrataError) -> UInt64 { try txn.horizon(in: databases) }
    func checksumRules(in databases: StoreDatabases) throws(StrataError) -> ChecksumRules { try txn.checksumRules(in: databases) }
}

/// A forward cursor over one database as a ``ViewReader`` sees it: LMDB's entries merged with the
/// overlay's, the overlay winning on equal keys and its tombstones hiding LMDB's entries.
///
/// The bytes of an entry are valid until the cursor moves or the transaction writes.
struct ViewCursor {
    private var lmdb: Cursor
    private var overlay: OverlayCursor?
    /// The candidates: the entry under each cursor, not yet passed.
    private var l: Entry?
    private var o: EntryRef?
    /// Which candidates the current entry consumed, to step past on `next()`.
    private var takeL = false
    private var takeO = false
    private var current: Entry?

    init(lmdb: Cursor, overlay: OverlayCursor?) {
        self.lmdb = lmdb
        self.overlay = overlay
    }

    /// Moves to the first entry. - Complexity: O(log n).
    mutating func first() throws(LMDBError) -> Entry? {
        guard overlay != nil else { return try lmdb.first() }
        l = try lmdb.first()
        o = overlay!.first()
        return try settle()
    }

    /// Moves to the first entry whose key is at least `key`. - Complexity: O(log n).
    mutating func seek(atLeast key: UnsafeRawBufferPointer) throws(LMDBError) -> Entry? {
        guard overlay != nil else { return try lmdb.seek(atLeast: key) }
        l = try lmdb.seek(atLeast: key)
        o = overlay!.seek(atLeast: key)
        return try settle()
    }

    mutating func seek(atLeast key: [UInt8]) throws(LMDBError) -> Entry? {
        try withBytes(key) { (k) throws(LMDBError) in try seek(atLeast: k) }
    }

    /// Moves to the next entry. - Complexity: amortised O(1).
    mutating func next() throws(LMDBError) -> Entry? {
        guard overlay != nil else { return try lmdb.next() }
        if takeL { l = try lmdb.next() }
        if takeO { o = overlay!.next() }
        return try settle()
    }

    /// Moves to the last entry. Only for databases the overlay does not hold (the log).
    mutating func last() throws(LMDBError) -> Entry? {
        precondition(overlay == nil, "Strata: a backward step over a view with an overlay")
        return try lmdb.last()
    }

    /// Picks the smaller candidate as the current entry, passing tombstones.
    private mutating func settle() throws(LMDBError) -> Entry? {
        while true {
            guard let oe = o else {
                (takeL, takeO) = (true, false)
                current = l
                return l
            }
            let order = l.map { compareBytes($0.key, oe.key) } ?? 1
            if order < 0 {
                (takeL, takeO) = (true, false)
                current = l
                return l
            }
            if let value = oe.value {
                (takeL, takeO) = (order == 0, true)
                current = (oe.key, value)
                return current
            }
            // A tombstone: the key is gone, from LMDB's side too.
            if order == 0 { l = try lmdb.next() }
            o = overlay!.next()
        }
    }
}

/// Writes a transaction's changes: derived databases into the overlay (or, with no overlay,
/// straight into LMDB), everything else into LMDB. Reads see the transaction's own writes.
struct ViewWriter {
    let reader: ViewReader
    /// `nil` while folding the log's tail into a reader's overlay: only derived writes happen.
    let writeTxn: LMDB.WriteTransaction?

    var databases: StoreDatabases { reader.databases }

    /// A writer into `overlay` over the LMDB write transaction `txn`.
    init(_ txn: LMDB.WriteTransaction, _ databases: StoreDatabases, overlay: OverlayBuffer?) {
        reader = ViewReader(txn: txn.reader, databases: databases, overlay: overlay)
        writeTxn = txn
    }

    /// A writer that changes only the overlay, over a read transaction.
    init(reading txn: LMDB.ReadTransaction, _ databases: StoreDatabases, overlay: OverlayBuffer) {
        reader = ViewReader(txn: txn, databases: databases, overlay: overlay)
        writeTxn = nil
    }

    private func lmdbWriter(_ what: String) throws(LMDBError) -> LMDB.WriteTransaction {
        guard let writeTxn else { throw LMDBError(.accessDenied, operation: "\(what) in a read transaction") }
        return writeTxn
    }

    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer, in db: Database, flags: PutFlags = []) throws(LMDBError) {
        if let overlay = reader.overlay, let slot = databases.derivedSlot(db) {
            overlay.set(key, value, slot: slot)
        } else {
            try lmdbWriter("put").put(key, value, in: db, flags: flags)
        }
    }

    func put(_ key: [UInt8], _ value: [UInt8], in db: Database, flags: PutFlags = []) throws(LMDBError) {
        try withBytes(key) { (k) throws(LMDBError) in
            try withBytes(value) { (v) throws(LMDBError) in try put(k, v, in: db, flags: flags) }
        }
    }

    /// Deletes `key`. In the overlay this writes a tombstone, whether or not LMDB has the key.
    func delete(_ key: UnsafeRawBufferPointer, in db: Database) throws(LMDBError) {
        if let overlay = reader.overlay, let slot = databases.derivedSlot(db) {
            overlay.set(key, nil, slot: slot)
        } else {
            _ = try lmdbWriter("delete").delete(key, in: db)
        }
    }

    func delete(_ key: [UInt8], in db: Database) throws(LMDBError) {
        try withBytes(key) { (k) throws(LMDBError) in try delete(k, in: db) }
    }

    func get(_ key: UnsafeRawBufferPointer, in db: Database) throws(LMDBError) -> UnsafeRawBufferPointer? { try reader.get(key, in: db) }
    func get(_ key: [UInt8], in db: Database) throws(LMDBError) -> UnsafeRawBufferPointer? { try reader.get(key, in: db) }
    func scan<R>(_ db: Database, _ body: (inout ViewCursor) throws -> R) throws(StrataError) -> R { try reader.scan(db, body) }

    func meta(_ key: String, in databases: StoreDatabases) throws(StrataError) -> UnsafeRawBufferPointer? { try reader.meta(key, in: databases) }
    func metaUInt64(_ key: String, in databases: StoreDatabases) throws(StrataError) -> UInt64? { try reader.metaUInt64(key, in: databases) }
    func lastLSN(in databases: StoreDatabases) throws(StrataError) -> UInt64 { try reader.lastLSN(in: databases) }
    func horizon(in databases: StoreDatabases) throws(StrataError) -> UInt64 { try reader.horizon(in: databases) }
    func checksumRules(in databases: StoreDatabases) throws(StrataError) -> ChecksumRules { try reader.checksumRules(in: databases) }

    func setMeta(_ key: String, _ value: [UInt8], in databases: StoreDatabases) throws(StrataError) {
        try lmdb { () throws(LMDBError) in try lmdbWriter("setMeta").put(Array(key.utf8), value, in: databases.meta) }
    }

    func setMeta(_ key: String, _ value: UInt64, in databases: StoreDatabases) throws(StrataError) {
        var w = ByteWriter(capacity: 8)
        w.appendBigEndian(value)
        try setMeta(key, w.bytes, in: databases)
    }
}

import LMDB

/// Every named database of a store — the log, the views derived from it, `base` and `meta` —
/// and the maintenance of the views as operations are folded in.
///
/// | database | key | value |
/// |---|---|---|
/// | `log` | LSN, 8 bytes big-endian | operation record |
/// | `rows` | table id (4 bytes BE) + row key | row state record |
/// | `pending` | table id + row key | LSN that made the row pending (8 bytes BE) |
/// | `gone` | table id + row key | LSN of the operation that removed the row (8 bytes BE) |
/// | `index` | index id + indexed values + row key | empty (see `Index.swift`) |
/// | `view` | view id + sort values + row key | row key (see `NamedView.swift`) |
/// | `base` | table id + row key | row state as of the compaction horizon (see `Compaction.swift`) |
/// | `meta` | ASCII name | store metadata (format, catalog, counters, client id, horizon) |
struct StoreDatabases: Sendable {
    let log: Database
    let rows: Database
    let pending: Database
    /// The last LSN of rows that no longer exist, so that their history (a chain through the
    /// log that starts at a row's last LSN) stays reachable and continues if the key comes back.
    let gone: Database
    /// Every secondary index.
    let index: Database
    /// Every named view's rows.
    let view: Database
    /// The state, as of the horizon, of every row that existed then: the fold of the operations
    /// compaction removed from the log. Not derived: rebuild starts from it.
    let base: Database
    let meta: Database

    static let names = (log: "log", rows: "rows", pending: "pending", gone: "gone", index: "index", view: "view", base: "base", meta: "meta")

    static func open(_ txn: LMDB.WriteTransaction) throws(LMDBError) -> StoreDatabases {
        StoreDatabases(
            log: try txn.openDatabase(names.log),
            rows: try txn.openDatabase(names.rows),
            pending: try txn.openDatabase(names.pending),
            gone: try txn.openDatabase(names.gone),
            index: try txn.openDatabase(names.index),
            view: try txn.openDatabase(names.view),
            base: try txn.openDatabase(names.base),
            meta: try txn.openDatabase(names.meta)
        )
    }

    /// The databases derived from the log, which ``Store/rebuild()`` drops and refills and the
    /// overlay holds entries of, in this order (an ``OverlayVersion``'s trees).
    var derived: [Database] { [rows, pending, gone, index, view] }

    /// The position of `db` in ``derived``, `nil` for the log, `meta` and `base`.
    @inline(__always)
    func derivedSlot(_ db: Database) -> Int? {
        switch db.dbi {
        case rows.dbi: 0
        case pending.dbi: 1
        case gone.dbi: 2
        case index.dbi: 3
        case view.dbi: 4
        default: nil
        }
    }

    /// Folds one operation into `rows`, `pending`, `gone` and the table's indexes.
    ///
    /// `old` is the row's current state (or `nil`); it is read completely before the first write,
    /// since a write may invalidate memory lent by LMDB. `oldIsPending` is whether `old` is
    /// pending (``StoredRow/isPending``), when the caller knows it. `scratch` is a reusable buffer.
    ///
    /// - Complexity: O(log n) per database touched, plus the size of the row.
    func apply(
        operation op: UnsafeRawBufferPointer, header: OperationHeader, lsn: UInt64, old: StoredRow?, oldIsPending: Bool? = nil,
        table: TableInfo, in txn: ViewWriter, scratch: inout ByteWriter, checkingUniqueness: Bool = true
    ) throws(StrataError) {
        let wasPending = if let oldIsPending { oldIsPending } else { try old?.isPending ?? false }
        let step = try FoldStep.fold(old: old, wasPending: wasPending, op: op, header: header, lsn: lsn, into: &scratch)
        let target = UnsafeRawBufferPointer(rebasing: op[header.target])
        // Before any row is written: a unique index, or an entry over LMDB's key limit, may still
        // refuse the change.
        if !table.indexes.isEmpty || !table.views.isEmpty {
            let newRow = step.isPending == nil ? nil : scratch.bytes
            try withBytes(newRow ?? []) { (n) throws(StrataError) in
                try updateIndexesAndViews(table, target: target, old: old?.bytes, new: newRow == nil ? nil : n, in: txn, checkingUniqueness: checkingUniqueness)
            }
        }
        try lmdb { () throws(LMDBError) in
            if step.isPending == nil {
                try txn.delete(target, in: rows)
            } else {
                try scratch.withUnsafeBytes { (b) throws(LMDBError) in try txn.put(target, b, in: rows) }
            }
            try Self.write(step.gone, target, in: gone, txn)
            try Self.write(step.pending, target, in: pending, txn)
        }
    }

    /// Applies a ``FoldStep/Change`` to the LSN entry of `target` in `db`.
    private static func write(_ change: FoldStep.Change, _ target: UnsafeRawBufferPointer, in db: Database, _ txn: ViewWriter) throws(LMDBError) {
        switch change {
        case .keep: break
        case .clear: try txn.delete(target, in: db)
        case .set(let lsn):
            var be = lsn.bigEndian
            try withUnsafeBytes(of: &be) { (b) throws(LMDBError) in try txn.put(target, b, in: db) }
        }
    }
}

/// Meta keys.
enum MetaKey {
    static let format = "format"
    static let catalog = "catalog"
    static let catalogVersion = "catalogVersion"
    static let lastTxn = "lastTxn"
    /// The LSN the views in LMDB reflect: operations after it are folded into the overlay (in
    /// the process that wrote them) but not yet checkpointed.
    static let viewsLSN = "viewsLSN"
    static let clientID = "clientID"
    /// The compaction horizon: every operation up to this LSN is folded into `base`.
    static let horizon = "horizon"
    /// The first LSN whose operation carries a checksum (operation format 3): 1 for a store
    /// created with store format 5 or later, the LSN after the last operation for one migrated
    /// to it. Operations before it (formats 1 and 2) carry none.
    static let checksumsFrom = "checksumsFrom"
    /// The first LSN whose operation's checksum covers its LSN (operation format 5): 1 for a
    /// store created with store format 7 or later, the LSN after the last operation for one
    /// migrated to it. Operations before it (formats 3 and 4) have checksums of their content only.
    static let lsnCoveredFrom = "lsnCoveredFrom"
    /// Prefix of log pins (see ``Transaction/pinLog(_:after:)``).
    static let pinPrefix = "pin:"
    /// Prefix of what Strata's own modules keep in the store for themselves, apart from the
    /// app's properties (`p:`): a migrator's applied steps, a sync client's associations.
    static let libraryPrefix = "lib:"
}

extension ReadableTransaction {
    func meta(_ key: String, in databases: StoreDatabases) throws(StrataError) -> UnsafeRawBufferPointer? {
        // The keys are literals, already contiguous UTF-8: read in place, no array per read.
        var key = key
        let value = key.withUTF8 { k in
            Result { () throws(LMDBError) in try get(UnsafeRawBufferPointer(k), in: databases.meta) }
        }
        return try lmdb { () throws(LMDBError) in try value.get() }
    }

    /// A counter kept in `meta`: exactly 8 bytes, at most ``Counter/limit`` (else corruptRecord).
    func metaUInt64(_ key: String, in databases: StoreDatabases) throws(StrataError) -> UInt64? {
        guard let b = try meta(key, in: databases) else { return nil }
        return try Counter.decode(b, database: StoreDatabases.names.meta, key: key)
    }

    /// The LSN of the last operation ever written: the log's last, or the compaction horizon
    /// when compaction emptied the log. 0 for a new store.
    func lastLSN(in databases: StoreDatabases) throws(StrataError) -> UInt64 {
        max(try lastLSN(of: databases.log), try horizon(in: databases))
    }

    /// The compaction horizon: operations up to it live only in `base`. 0 when never compacted.
    func horizon(in databases: StoreDatabases) throws(StrataError) -> UInt64 {
        try metaUInt64(MetaKey.horizon, in: databases) ?? 0
    }

    /// The last LSN of the log database `log`, 0 when it is empty.
    func lastLSN(of log: Database) throws(StrataError) -> UInt64 {
        try scan(log) { c in
            guard let last = try c.last() else { return 0 }
            return try Counter.lsn(key: last.key)
        }
    }
}

extension LMDB.WriteTransaction {
    func setMeta(_ key: String, _ value: [UInt8], in databases: StoreDatabases) throws(StrataError) {
        try lmdb { () throws(LMDBError) in try put(Array(key.utf8), value, in: databases.meta) }
    }

    func setMeta(_ key: String, _ value: UInt64, in databases: StoreDatabases) throws(StrataError) {
        var w = ByteWriter(capacity: 8)
        w.appendBigEndian(value)
        try setMeta(key, w.bytes, in: databases)
    }
}

extension ReadableTransaction {
    /// Runs a cursor-based body, wrapping errors as ``StrataError``.
    func scan<R>(_ db: Database, _ body: (inout Cursor) throws -> R) throws(StrataError) -> R {
        try strataErrors { try withCursor(db, body) }
    }
}

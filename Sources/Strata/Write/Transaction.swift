import Foundation
import LMDB

/// A write transaction, lent by ``Store/write(_:)-2j629``. It never leaves that closure.
///
/// Each edit validates its input completely before writing anything, then appends one operation
/// to the log and updates the views. An edit that fails throws a ``StrataError`` and leaves the
/// transaction as it was, so the closure may catch the error and go on.
///
/// An edit that changes nothing — an update to the current values, a revert of an unchanged
/// field — logs nothing.
public final class Transaction {
    let store: Store
    /// Writes the log and `meta` into LMDB and the views into `overlay`; reached through
    /// ``writer``, which checks that the transaction is live.
    private let rawWriter: ViewWriter
    /// The working copy of the overlay, published when the transaction commits.
    let overlay: OverlayBuffer
    let databases: StoreDatabases
    /// The catalog with this transaction's changes. Read it through ``catalog`` (which checks
    /// that the transaction is live); change it here, after such a read.
    var workingCatalog: Catalog {
        // Without a reference to `oldValue`, a mutation of the catalog still happens in place.
        didSet { lastTable = nil }
    }
    /// The table the last edit named, while `workingCatalog` is unchanged: a run of edits on
    /// one table looks it up once (``table(named:)``). Unchecked, as the buffers below are.
    @exclusivity(unchecked) private var lastTable: TableRef? = nil
    /// Ends when the closure that lent the transaction returns (``close()``).
    let lease = Lease(.write)
    private(set) var catalogChanged = false
    private let baseCatalogVersion: UInt64
    // The counters and buffers below are touched several times per edit. Their accesses skip
    // the dynamic exclusivity check (about 8% of an edit's instructions, measured with callgrind
    // on `profile build`): a transaction is confined to the thread running its closure (it is
    // not `Sendable`), and each method lends a buffer only to code that uses the other buffers,
    // which the checked debug runs of the test suite confirmed before the checks were dropped.
    @exclusivity(unchecked) private var nextLSN: UInt64
    /// The LSN of the transaction's first logged operation, which is its id and carries its
    /// header (``TransactionHeader``); 0 until an operation is logged.
    @exclusivity(unchecked) private var txnStart: UInt64 = 0
    /// The schema version of that operation.
    @exclusivity(unchecked) private var txnSchema: UInt64 = 0
    private let timestampMicros: UInt64

    // Reusable buffers: after the first few edits, an edit allocates nothing here.
    @exclusivity(unchecked) private var keyBuf = ByteWriter(capacity: 64)
    @exclusivity(unchecked) var valBuf = ByteWriter(capacity: 256)
    @exclusivity(unchecked) var newValues: [NewValue] = []
    @exclusivity(unchecked) private var opBuf = ByteWriter(capacity: 512)
    @exclusivity(unchecked) private var rowBuf = ByteWriter(capacity: 512)
    /// Per field id, whether the field holds a value after a merge (`mergeServerValues`).
    @exclusivity(unchecked) var valued: [Bool] = []
    /// The field ids of the values a merge on a stored record was given (`mergeServerValues`).
    @exclusivity(unchecked) var fieldIDs: [Int] = []
    /// The entries of the stored row a merge on a stored record reads (`mergeServerValues`).
    @exclusivity(unchecked) var storedEntries: [FieldEntry] = []
    /// The fields a merge on a stored record decided (`mergeServerValues`).
    @exclusivity(unchecked) var decided: [(id: Int, base: Range<Int>?, local: Range<Int>?, new: Range<Int>, action: ServerFieldAction, tag: UInt8)] = []
    /// The decisions a merge on a stored record recorded and their values' places
    /// (`mergeServerValues`), reused from row to row.
    @exclusivity(unchecked) var serverDecisions: [ServerFieldDecision] = []
    @exclusivity(unchecked) var serverRanges: [(base: Range<Int>?, local: Range<Int>?, server: Range<Int>)] = []
    /// The annotation a merge on a stored record writes (`mergeServerValues`), reused from row
    /// to row: one array fewer to allocate and free per merged row.
    @exclusivity(unchecked) var annotationBuf: [UInt8] = []
    /// Rows touched, kept only when invariant checks are on.
    private var touched: Set<[UInt8]> = []
    /// Changes for observers, collected only when the store has any. Read at every logged edit:
    /// unchecked, as the buffers above (a checked read cost about 70 instructions an edit).
    @exclusivity(unchecked) private var changes: [RowChangeEvent]? = nil
    private var firstLSN: UInt64 = 0

    /// Whether the commit also checkpoints: writes the overlay into the views in LMDB.
    private var checkpointRequested = false
    /// Set while ``deferringUniqueness(of:_:)`` runs: edits skip the unique-index check.
    var uniquenessDeferred = false

    init(store: Store, txn: LMDB.WriteTransaction, overlay: OverlayBuffer, catalog: Catalog) throws(StrataError) {
        self.store = store
        self.rawWriter = ViewWriter(txn, store.databases, overlay: overlay)
        self.overlay = overlay
        self.databases = store.databases
        self.workingCatalog = catalog
        self.baseCatalogVersion = catalog.version
        // The overlay a write starts from reaches the log's end (`Store.overlayVersion(for:)`),
        // and each closure of a group moves it on: no need to read the log's last key.
        self.nextLSN = overlay.version.lsn + 1
        if store.options.checkInvariants {
            let end = try rawWriter.lastLSN(in: store.databases)
            guard end == overlay.version.lsn else {
                throw StrataError(.corruptRecord, "invariant: the overlay ends at LSN \(overlay.version.lsn), the log at \(end)")
            }
        }
        self.firstLSN = nextLSN
        if !store.observers.isEmpty { changes = [] }
        self.timestampMicros = UInt64(max(0, (Date().timeIntervalSince1970 * 1_000_000).rounded()))
        newValues.reserveCapacity(16)
    }

    /// Ends the transaction's use: called when the write closure has returned (or thrown).
    func close() { lease.end() }

    /// `catalog.table(named:)`, remembered for the next edit: hashing the table's name costs
    /// more than comparing it with the last one.
    ///
    /// - Throws: ``StrataError`` `tableNotFound`, or `invalidOperation` once the lending closure
    ///   has returned.
    func table(named name: String) throws(StrataError) -> TableInfo {
        try tableRef(named: name).info
    }

    /// ``table(named:)`` in a box. Each copy of a `TableInfo` is a dozen retains and releases
    /// of its arrays; the optional it was kept in cost a second copy per lookup, which the box
    /// saves (about 3% of a server row's merge, measured with callgrind on `profile merge`).
    func tableRef(named name: String) throws(StrataError) -> TableRef {
        try lease.check()
        if let t = lastTable, t.info.schema.name.sameBytes(name) { return t }
        let t = TableRef(try workingCatalog.table(named: name))
        lastTable = t
        return t
    }

    /// The field of `table` that `name` names in another Unicode form (equal under Swift's `==`,
    /// other bytes), if any: a merge refuses a server row that names it so.
    package func fieldTwin(_ table: String, of name: String) throws(StrataError) -> String? {
        try self.table(named: table).twin(of: name)
    }

    /// Marks the catalog as changed, to be stored at commit.
    func markCatalogChanged() { catalogChanged = true }

    // Every method reaches LMDB and the catalog through these two accessors, so this is the one
    // place that refuses a transaction kept past its closure: by then LMDB has committed or
    // aborted the transaction and freed it, and a write through it would corrupt memory.

    /// The writer over LMDB's transaction; throws once the lending closure has returned.
    var writer: ViewWriter {
        @inline(__always) get throws(StrataError) {
            try lease.check()
            return rawWriter
        }
    }

    /// The catalog with this transaction's changes; throws once the lending closure has returned.
    var catalog: Catalog {
        @inline(__always) get throws(StrataError) {
            try lease.check()
            return workingCatalog
        }
    }

    // MARK: Schema

    /// Creates a table, or does nothing when an identical one exists.
    ///
    /// - Throws: ``StrataError`` `invalidSchema`, or `tableExists` when a table of that name
    ///   exists with another definition: the message says what differs and how to change the
    ///   table (``addField(_:to:)``, ``dropField(_:from:)``, run once per store by a ``Migrator``).
    public func createTable(_ schema: TableSchema) throws(StrataError) {
        try schema.validate()
        let catalog = try self.catalog
        if let id = catalog.tableIDs[schema.name] {
            let existing = catalog.tables[id]!.schema
            guard existing.name.sameBytes(schema.name) else {
                throw StrataError(.tableExists, "table '\(schema.name)' (\(schema.name.codePoints)) cannot be created: the table '\(existing.name)' (\(existing.name.codePoints)) differs from it only in Unicode form; Strata compares table names by their bytes, and a store holds one of two such names")
            }
            guard existing.isIdentical(to: schema) else {
                throw StrataError(.tableExists, "table '\(schema.name)' exists with a different definition: \(SchemaChange.advice(from: existing, to: schema))")
            }
            return
        }
        _ = workingCatalog.add(schema)
        catalogChanged = true
    }

    /// Adds field names a property bag has not used yet, in the given order. No effect on a
    /// fixed table (its fields are declared).
    func registerFields(_ table: String, _ names: [String]) throws {
        var t = try catalog.table(named: table)
        guard t.isPropertyBag else { return }
        var changed = false
        for name in names where !name.isEmpty && t.fieldID(name) == nil {
            _ = try t.addNewField(name)
            changed = true
        }
        if changed {
            workingCatalog.tables[t.id] = t
            catalogChanged = true
        }
    }

    // MARK: Edits

    /// Inserts a row. Fields not given take their default (or `null` when nullable).
    ///
    /// Inserting the key of a row deleted locally but not yet uploaded revives that row: the
    /// server will receive an update of the fields that differ from its values.
    ///
    /// - Throws: ``StrataError`` `tableNotFound`, `fieldNotFound`, `typeMismatch`,
    ///   `nullNotAllowed`, `missingField` (a required or key field not given), `duplicateKey`,
    ///   `invalidValue` (a value that makes an index or named-view entry longer than LMDB's key
    ///   limit: text and bytes count up to 200 bytes each, plus the row key).
    /// - Complexity: O(log n) per database touched.
    public func insert(_ table: String, _ fields: FieldValues) throws(StrataError) {
        var t = try self.table(named: table)
        let key = try keyFromFields(fields, t)
        try encodeKey(key, t)
        let grown = try encodeValues(fields, t, key: key, defaults: true)
        if let grown { t = grown }
        let old = try storedRow()
        if let old, !old.flags.contains(.deleted) {
            throw StrataError(.duplicateKey, "table '\(table)' already has a row with key \(key)")
        }
        try logEdit(.insert, t, tableChanged: grown != nil, old: old) { (op) throws(StrataError) in
            try valBuf.withUnsafeBytes { (v) throws(StrataError) in
                try EditRules.insert(old: old, values: v, new: newValues, into: &op)
            }
        }
    }

    /// Sets the given fields of an existing row; other fields keep their values.
    ///
    /// - Throws: ``StrataError`` `rowNotFound`, `fieldNotFound`, `typeMismatch`, `nullNotAllowed`,
    ///   `invalidOperation` (a primary key field given a different value), `invalidValue` (a value
    ///   that makes an index or named-view entry longer than LMDB's key limit).
    /// - Complexity: O(log n) per database touched.
    public func update(_ table: String, key: RowKey, _ fields: FieldValues) throws(StrataError) {
        var t = try self.table(named: table)
        try encodeKey(key, t)
        let grown = try encodeValues(fields, t, key: key, defaults: false)
        if let grown { t = grown }
        let old = try liveRow(t, key)
        try logEdit(.update, t, tableChanged: grown != nil, old: old) { (op) throws(StrataError) in
            try valBuf.withUnsafeBytes { (v) throws(StrataError) in
                try EditRules.update(old: old, values: v, new: newValues, into: &op)
            }
        }
    }

    /// Updates the row with the key found in `fields` if it exists, inserts it otherwise.
    public func upsert(_ table: String, _ fields: FieldValues) throws(StrataError) {
        let t = try catalog.table(named: table)
        let key = try keyFromFields(fields, t)
        try encodeKey(key, t)
        if let old = try storedRow(), !old.flags.contains(.deleted) {
            try update(table, key: key, fields)
        } else {
            try insert(table, fields)
        }
    }

    /// Deletes a row. A row inserted locally disappears; a row the server knows stays as a
    /// pending delete (holding its server values) until the server acknowledges it.
    ///
    /// - Throws: ``StrataError`` `rowNotFound`.
    public func delete(_ table: String, key: RowKey) throws(StrataError) {
        let t = try self.table(named: table)
        try encodeKey(key, t)
        let old = try liveRow(t, key)
        try logEdit(.delete, t, old: old) { (op) throws(StrataError) in try EditRules.delete(old: old, into: &op) }
    }

    /// Reverts one field of a row to its original (server-confirmed) value.
    ///
    /// - Throws: ``StrataError`` `rowNotFound`, `fieldNotFound`; `invalidOperation` for a row
    ///   inserted locally (it has no originals: revert the row instead), a row deleted locally
    ///   (revert the row to undo the delete), or a primary key field.
    public func revert(_ table: String, key: RowKey, field: String) throws(StrataError) {
        let t = try catalog.table(named: table)
        try encodeKey(key, t)
        guard let id = t.fieldID(field) else { throw t.unknownField(field) }
        guard !t.isKeyField(id) else {
            throw StrataError(.invalidOperation, "'\(field)' is a primary key field of table '\(table)'; key fields cannot be reverted")
        }
        guard let old = try storedRow() else { throw notFound(t, key) }
        let flags = old.flags
        if flags.contains(.deleted) {
            throw StrataError(.invalidOperation, "row \(key) of table '\(table)' is deleted locally; revert the row to undo the delete")
        }
        if flags.contains(.inserted) {
            throw StrataError(.invalidOperation, "row \(key) of table '\(table)' was inserted locally and has no original values; revert the row to cancel the insert")
        }
        try logEdit(.revertField, t, old: old) { (op) throws(StrataError) in
            try EditRules.revertField(old: old, field: id, into: &op)
        }
    }

    /// Reverts every local change of a row: a local insert is removed, a local delete undone,
    /// every changed field set back to its original value.
    ///
    /// - Throws: ``StrataError`` `rowNotFound`.
    public func revert(_ table: String, key: RowKey) throws(StrataError) {
        let t = try catalog.table(named: table)
        try encodeKey(key, t)
        guard let old = try storedRow() else { throw notFound(t, key) }
        try logEdit(.revertRow, t, old: old) { (op) throws(StrataError) in try EditRules.revertRow(old: old, into: &op) }
    }

    /// Reverts every pending row of a table (see ``revert(_:key:)-(_,RowKey)``). Returns how many rows changed.
    ///
    /// - Complexity: O(p log n) for p pending rows of the table.
    @discardableResult
    public func revertAll(_ table: String) throws(StrataError) -> Int {
        let t = try catalog.table(named: table)
        var prefix = ByteWriter(capacity: 4)
        prefix.appendBigEndian(t.id)
        // Collect first: the writes below would invalidate a cursor over `pending`.
        let keys: [[UInt8]] = try writer.scan(databases.pending) { c in
            var keys: [[UInt8]] = []
            var e = try c.seek(atLeast: prefix.bytes)
            while let entry = e, entry.key.starts(with: prefix.bytes) {
                keys.append(Array(entry.key))
                e = try c.next()
            }
            return keys
        }
        var count = 0
        for k in keys {
            keyBuf.reset()
            keyBuf.append(k)
            guard let old = try storedRow() else { continue }
            let before = nextLSN
            try logEdit(.revertTable, t, old: old) { (op) throws(StrataError) in try EditRules.revertRow(old: old, into: &op) }
            if nextLSN != before { count += 1 }
        }
        return count
    }

    // MARK: Server confirmation

    /// Records that the server accepted the row as it is now: its current values become its
    /// originals, a local insert becomes a server row, and a local delete removes the row.
    ///
    /// Sync code calls this when an upload of the row succeeded. The operation's origin is
    /// ``LogEntry/Origin/server``.
    ///
    /// - Throws: ``StrataError`` `rowNotFound`.
    public func acknowledge(_ table: String, key: RowKey) throws(StrataError) {
        let t = try catalog.table(named: table)
        try encodeKey(key, t)
        guard let old = try storedRow() else { throw notFound(t, key) }
        try logEdit(.acknowledge, t, origin: .server, old: old) { (op) throws(StrataError) in
            try EditRules.acknowledge(old: old, into: &op)
        }
    }

    // MARK: Reading inside the transaction

    /// A snapshot of this transaction's state, including its own uncommitted edits.
    ///
    /// The snapshot ends with the transaction: kept after the write closure returned, it throws
    /// like the transaction does.
    public var snapshot: Snapshot {
        get throws(StrataError) { Snapshot(txn: try writer.reader, databases: databases, catalog: try catalog, lease: lease) }
    }

    /// The row as this transaction sees it; see ``Snapshot/row(_:key:includingDeleted:)-(_,RowKey,_)``.
    public func row(_ table: String, key: RowKey, includingDeleted: Bool = false) throws(StrataError) -> Row? {
        try snapshot.row(table, key: key, includingDeleted: includingDeleted)
    }

    // MARK: The log append

    /// Builds the operation with `rules`, then applies it to the views and appends it to the log.
    /// Logs nothing when the operation would change nothing.
    func logEdit(
        _ kind: LogEntry.Kind, _ t: TableInfo, tableChanged: Bool = false, origin: LogEntry.Origin = .local,
        annotation: [UInt8] = [], old: StoredRow?, oldIsPending: Bool? = nil,
        _ rules: (inout ByteWriter) throws(StrataError) -> RowFlags
    ) throws(StrataError) {
        let lsn = nextLSN
        let schema = baseCatalogVersion + (catalogChanged || tableChanged ? 1 : 0)
        // The first operation logged carries the transaction's header; an edit that logs
        // nothing, or fails, leaves that to the next one.
        let carries = txnStart == 0
        if carries {
            // Transaction ids increase with the log; read, the counter also proves itself whole.
            let last = try writer.metaUInt64(MetaKey.lastTxn, in: databases) ?? 0
            guard last < lsn else {
                throw StrataError(.corruptRecord, "the meta entry 'lastTxn' (\(last)) is not below the next LSN (\(lsn)): the store is damaged")
            }
        }
        // The builder returns the header with the bytes: the views fold the record without
        // parsing it back.
        var header = OperationHeader.start(
            kind, origin: origin, transactionOffset: carries ? 0 : lsn - txnStart,
            carried: carries ? (timestampMicros, schema) : nil,
            // A schema version only moves up within a transaction, by one (`baseCatalogVersion`).
            schemaBump: !carries && schema != txnSchema,
            target: keyBuf.bytes, prevLSN: try previousLSN(old), annotation: annotation, into: &opBuf
        )
        let entriesStart = header.entriesStart
        let flags = try rules(&opBuf)
        let oldFlags = old?.flags
        if opBuf.count == entriesStart && flags == oldFlags && annotation.isEmpty { return }
        header.seal(&opBuf, flags: flags, lsn: lsn)
        // Worked out before the views change, while `old` still shows the stored row.
        let valuesChanged = changes == nil ? true : try changesCurrentValues(entriesStart, old)

        try opBuf.withUnsafeBytes { (op) throws(StrataError) in
            // Debug builds (the test suite) hold the builder to the parser at every edit.
            assert((try? OperationHeader(op)) == header, "the builder's header differs from the record's")
            let writer = try self.writer
            try databases.apply(operation: op, header: header, lsn: lsn, old: old, oldIsPending: oldIsPending, table: t, in: writer, scratch: &rowBuf, checkingUniqueness: !uniquenessDeferred)
            try lmdb { () throws(LMDBError) in
                var k = lsn.bigEndian
                try withUnsafeBytes(of: &k) { (kb) throws(LMDBError) in try writer.put(kb, op, in: databases.log, flags: .append) }
            }
        }
        // Only now that the edit is applied (a unique index may still have refused it) do its
        // new property-bag fields enter the catalog.
        if tableChanged {
            workingCatalog.tables[t.id] = t
            catalogChanged = true
        }
        if carries {
            txnStart = lsn
            txnSchema = schema
            try writer.setMeta(MetaKey.lastTxn, lsn, in: databases)
        }
        if store.options.checkInvariants { touched.insert(keyBuf.bytes) }
        if changes != nil {
            try recordChange(t, origin: origin, wasVisible: oldFlags.map { !$0.contains(.deleted) } ?? false, flags: flags, valuesChanged: valuesChanged)
        }
        nextLSN += 1
    }

    /// Logs the operation that turns the stored row at `target` into the one described by
    /// `wanted` (complete field entries, by id) and `flags`: only differing entries are recorded.
    func writeRowState(
        _ t: TableInfo, target: [UInt8], wanted: [(id: Int, entry: [UInt8])], flags: RowFlags,
        kind: LogEntry.Kind, origin: LogEntry.Origin, annotation: [UInt8], tableChanged: Bool
    ) throws(StrataError) {
        keyBuf.reset()
        keyBuf.append(target)
        let old = try storedRow()
        if old == nil && flags.contains(.gone) && annotation.isEmpty { return }
        try logEdit(kind, t, tableChanged: tableChanged, origin: origin, annotation: annotation, old: old) { (op) throws(StrataError) in
            if flags.contains(.gone) { return flags }
            var oldEntries: [(id: Int, whole: Range<Int>)] = []
            if let old {
                var r = old.entries
                while let e = try r.nextEntry() { oldEntries.append((e.id, e.whole)) }
            }
            var i = 0
            var j = 0
            while i < oldEntries.count || j < wanted.count {
                if j == wanted.count || (i < oldEntries.count && oldEntries[i].id < wanted[j].id) {
                    // The field is no longer wanted: it becomes null.
                    op.appendVarint(UInt64(oldEntries[i].id))
                    op.append(0)
                    op.append(ValueTag.null)
                    i += 1
                } else if i == oldEntries.count || wanted[j].id < oldEntries[i].id {
                    op.append(wanted[j].entry)
                    j += 1
                } else {
                    let same = withBytes(wanted[j].entry) { EditRules.same($0, old![oldEntries[i].whole]) }
                    if !same { op.append(wanted[j].entry) }
                    i += 1
                    j += 1
                }
            }
            return flags
        }
    }

    /// The LSN the new operation on the row at `keyBuf` follows: the row's last one, or, for a
    /// key with no row, the operation that removed an earlier row with that key (0 if none).
    private func previousLSN(_ old: StoredRow?) throws(StrataError) -> UInt64 {
        if let old { return old.header.lastLSN }
        return try writer.reader.goneLSN(keyBuf.bytes, databases: databases)
    }

    /// Whether the operation in `opBuf` (its field entries from `entriesStart`) gives a field of
    /// the row `old` another current value, rather than moving only originals or flags (an
    /// acknowledgement, a server value equal to the local one).
    private func changesCurrentValues(_ entriesStart: Int, _ old: StoredRow?) throws(StrataError) -> Bool {
        guard let old else { return true }
        var stored: [(id: Int, current: Range<Int>)] = []
        var r = old.entries
        while let e = try r.nextEntry() { stored.append((e.id, e.current)) }
        return try opBuf.withUnsafeBytes { (op) throws(StrataError) -> Bool in
            var o = ByteReader(op, offset: entriesStart)
            while let e = try o.nextEntry() {
                let new = UnsafeRawBufferPointer(rebasing: op[e.current])
                // A row's entries are in field id order.
                var (low, high) = (0, stored.count)
                while low < high {
                    let mid = (low + high) / 2
                    if stored[mid].id < e.id { low = mid + 1 } else { high = mid }
                }
                if low < stored.count, stored[low].id == e.id {
                    if !old[stored[low].current].elementsEqual(new) { return true }
                } else if new.count != 1 || new[0] != ValueTag.null {
                    return true  // a field the row did not hold now holds a value
                }
            }
            return false
        }
    }

    /// Notes the change of the row at `keyBuf` for observers.
    private func recordChange(_ t: TableInfo, origin: LogEntry.Origin, wasVisible: Bool, flags: RowFlags, valuesChanged: Bool) throws(StrataError) {
        let isVisible = !flags.contains(.gone) && !flags.contains(.deleted)
        let kind: RowChangeEvent.Kind
        switch (wasVisible, isVisible) {
        case (false, true): kind = .inserted
        case (true, false): kind = .deleted
        case (true, true): kind = .updated
        case (false, false): return  // a change to a row the app cannot see (a pending delete's originals)
        }
        let key = try keyBuf.withUnsafeBytes { (k) throws(StrataError) in try t.decodeKey(k) }
        changes!.append(RowChangeEvent(table: t.name, key: key, kind: kind, origin: origin, valuesChanged: kind != .updated || valuesChanged))
    }

    /// What this transaction changed, for observers; `nil` when nobody observes or nothing changed.
    var notification: CommitNotification? {
        guard let changes, !changes.isEmpty, nextLSN > firstLSN else { return nil }
        return CommitNotification(lsns: firstLSN...(nextLSN - 1), changes: changes)
    }

    /// Persists catalog changes and, when enabled, checks the invariants. Called before commit.
    func finish() throws(StrataError) {
        if catalogChanged {
            workingCatalog.version = baseCatalogVersion + 1
            let bytes: [UInt8]
            do { bytes = try workingCatalog.encoded() } catch {
                throw StrataError(.invalidSchema, "the catalog cannot be encoded: \(error)")
            }
            try writer.setMeta(MetaKey.catalog, bytes, in: databases)
            try writer.setMeta(MetaKey.catalogVersion, workingCatalog.version, in: databases)
        }
        if store.options.checkInvariants {
            for target in touched {
                try Invariants.checkRow(target, txn: writer, databases: databases)
            }
        }
        overlay.version.lsn = nextLSN - 1
        // The arena's bytes too: those of failed writes stay in it until a checkpoint starts a
        // new one, and a process whose writes keep failing must not grow without bound.
        let budget = store.options.overlayBudget
        if checkpointRequested || overlay.version.bytes > budget || overlay.version.arena.storedBytes > budget {
            try checkpoint()
        }
    }

    /// The last LSN this transaction wrote, or the log's end before it when it wrote nothing.
    var lastLSN: UInt64 { nextLSN - 1 }

    /// Makes the commit a checkpoint too: the overlay is written into the views in LMDB.
    ///
    /// Operations that change views without logging anything (an index or a named view built
    /// from existing rows, a rebuild, a compaction) call this, so that another process, which
    /// folds the log after the checkpointed views into its own overlay, never needs to
    /// reproduce them.
    func requestCheckpoint() { checkpointRequested = true }

    /// Writes the overlay into the views in LMDB, in key order, and records the LSN they now
    /// reflect; the overlay starts over, empty.
    private func checkpoint() throws(StrataError) {
        guard let lmdbTxn = try writer.writeTxn else { return }
        try Checkpoint.write(overlay.version, into: lmdbTxn, databases)
        try writer.setMeta(MetaKey.viewsLSN, lastLSN, in: databases)
        overlay.version = .empty(at: lastLSN)
    }

    // MARK: Input validation and encoding

    /// The stored row state at `keyBuf` (live or deleted), lent by LMDB until the next write.
    func storedRow() throws(StrataError) -> StoredRow? {
        let writer = try self.writer
        let bytes = try lmdb { () throws(LMDBError) in try keyBuf.withUnsafeBytes { (k) throws(LMDBError) in try writer.get(k, in: databases.rows) } }
        return try bytes.map { (b) throws(StrataError) in try StoredRow(b) }
    }

    private func notFound(_ t: TableInfo, _ key: RowKey) -> StrataError {
        StrataError(.rowNotFound, "table '\(t.name)' has no row with key \(key)")
    }

    /// The live (not locally deleted) row at `keyBuf`.
    private func liveRow(_ t: TableInfo, _ key: RowKey) throws(StrataError) -> StoredRow {
        guard let old = try storedRow() else { throw notFound(t, key) }
        if old.flags.contains(.deleted) {
            throw StrataError(.rowNotFound, "row \(key) of table '\(t.name)' is deleted locally")
        }
        return old
    }

    private func keyFromFields(_ fields: FieldValues, _ t: TableInfo) throws(StrataError) -> RowKey {
        var values: [Value] = []
        values.reserveCapacity(t.keyFieldIDs.count)
        for id in t.keyFieldIDs {
            let name = t.fieldNames[id]
            guard let v = fields[name] else {
                throw StrataError(.missingField, "a row of table '\(t.name)' needs its primary key field '\(name)'")
            }
            values.append(v)
        }
        return RowKey(values)
    }

    func encodeKey(_ key: RowKey, _ t: TableInfo, oneIntKey: Bool? = nil) throws(StrataError) {
        try t.encodeKey(key, into: &keyBuf, oneIntKey: oneIntKey)
    }

    /// Encodes the non-key fields into `valBuf`/`newValues`, sorted by field id. Returns the
    /// table with the property-bag fields the edit adds, if it adds any (to be stored in the
    /// catalog if the edit is logged).
    private func encodeValues(_ fields: FieldValues, _ table: TableInfo, key: RowKey, defaults: Bool) throws(StrataError) -> TableInfo? {
        // A property bag first takes the names it has not seen; the catalog keeps them only
        // if the edit is logged (`logEdit`).
        if table.isPropertyBag {
            var t = table
            for (name, _) in fields.pairs where t.fieldID(name) == nil {
                guard !name.isEmpty else { throw StrataError(.fieldNotFound, "a field name cannot be empty") }
                _ = try t.addNewField(name)
            }
            if t.fieldNames.count != table.fieldNames.count {
                try encodeFields(fields, t, key: key, defaults: defaults)
                return t
            }
        }
        try encodeFields(fields, table, key: key, defaults: defaults)
        return nil
    }

    private func encodeFields(_ fields: FieldValues, _ t: TableInfo, key: RowKey, defaults: Bool) throws(StrataError) {
        valBuf.reset()
        newValues.removeAll(keepingCapacity: true)
        for (name, value) in fields.pairs {
            guard let fid = t.fieldID(name) else {
                throw t.unknownField(name, detail: " (fields: \(t.fieldNames.joined(separator: ", ")))")
            }
            if let k = t.keyFieldIDs.firstIndex(of: fid) {
                let v = try t.coerce(value, t.definitions[fid]!)
                guard v == (try t.coerce(key.values[k], t.definitions[fid]!)) else {
                    throw StrataError(.invalidOperation, "the primary key field '\(name)' of table '\(t.name)' cannot be changed; delete the row and insert a new one")
                }
                continue
            }
            let v = try t.admit(value, field: fid, name: name)
            guard !newValues.contains(where: { $0.id == fid }) else {
                throw StrataError(.invalidOperation, "field '\(name)' is given twice")
            }
            let start = valBuf.count
            valBuf.appendValue(v)
            newValues.append(NewValue(id: fid, range: start..<valBuf.count))
        }
        if defaults {
            for (fid, def) in t.definitions.enumerated() {
                guard let def, !t.isKeyField(fid), !newValues.contains(where: { $0.id == fid }) else { continue }
                if let d = def.defaultValue {
                    let start = valBuf.count
                    valBuf.appendValue(d)
                    newValues.append(NewValue(id: fid, range: start..<valBuf.count))
                } else if !def.isNullable {
                    throw StrataError(.missingField, "field '\(def.name)' of table '\(t.name)' is required: it is not nullable and has no default")
                }
            }
        }
        sortNewValues()
    }

    /// Sorts `newValues` by field id. An insertion sort: a handful of fields, usually already
    /// in order.
    func sortNewValues() {
        for i in newValues.indices.dropFirst() {
            var j = i
            let x = newValues[i]
            while j > 0 && newValues[j - 1].id > x.id {
                newValues[j] = newValues[j - 1]
                j -= 1
            }
            newValues[j] = x
        }
    }
}

/// A table as a transaction last looked it up (``Transaction/tableRef(named:)``).
final class TableRef {
    /// Never changed. A `var` only so that the server merge can lend it `inout`, which passes
    /// its address: `let t = ref.info`, or passing `ref.info` as an argument, copied the table
    /// (a dozen retains and releases, about 560 instructions per merged row). Unchecked: a
    /// checked access costs about 75 instructions, and nothing writes it.
    @exclusivity(unchecked) var info: TableInfo
    /// The live, declared, non-key fields that may not be null, in id order: what a merge on a
    /// stored record checks after its decisions, worked out once per table rather than from
    /// each definition (a copy of each) per row.
    let requiredFieldIDs: [Int]
    /// ``TableInfo/hasOneIntKey``, worked out once.
    let oneIntKey: Bool
    /// The declared type of each live field, by id (`nil`: a property-bag field, or dropped),
    /// worked out once: see ``admitsAsIs(_:field:)``.
    let fieldTypes: [ValueType?]

    init(_ info: TableInfo) {
        self.info = info
        oneIntKey = info.hasOneIntKey
        fieldTypes = info.definitions.map { $0?.type }
        requiredFieldIDs = info.definitions.indices.filter { id in
            guard let def = info.definitions[id] else { return false }
            return !def.isNullable && !info.isKeyField(id) && !info.dropped.contains(id)
        }
    }

    /// Whether `value` passes ``TableInfo/admit(_:field:name:nullable:)`` for the field `id`
    /// unchanged, whatever `nullable`: a bool, int, string or bytes (whose finiteness nothing
    /// checks) of the field's declared type. Most values a server sends are, and this tells
    /// without `admit`'s copies of the field's definition (about 120 instructions a value).
    @inline(__always)
    func admitsAsIs(_ value: Value, field id: Int) -> Bool {
        guard id < fieldTypes.count, let type = fieldTypes[id] else { return false }
        switch value {
        case .bool: return type == .bool
        case .int: return type == .int
        case .string: return type == .string
        case .bytes: return type == .bytes
        default: return false
        }
    }
}

@available(*, unavailable, message: "transactions never leave their closure")
extension Transaction: Sendable {}

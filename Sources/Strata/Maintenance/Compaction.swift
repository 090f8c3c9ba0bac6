import Foundation
import LMDB

/// How much of the log ``Store/compact(retaining:)`` keeps. Each limit that is set keeps the
/// operations it names; an operation is folded only when no limit keeps it.
///
/// Whatever the limits, compaction never folds
/// - an operation at or after the oldest pending row's first pending operation (local edits not
///   yet acknowledged, conflicts, rows set aside), nor
/// - an operation after a log pin (the sync client of `StrataSync` pins the operations made
///   while an upload batch is in flight; ``Snapshot/logPins`` lists the pins).
///
/// `Retention()` sets no limit: everything that may be folded is.
public struct Retention: Sendable, Hashable {
    /// Keep at least the last `operations` operations.
    public var operations: Int?
    /// Keep every operation written less than `age` seconds ago (by its timestamp).
    public var age: TimeInterval?
    /// Keep every operation after this LSN.
    public var after: UInt64?

    /// A retention of the given limits; each limit left `nil` keeps nothing by itself.
    public init(operations: Int? = nil, age: TimeInterval? = nil, after: UInt64? = nil) {
        self.operations = operations
        self.age = age
        self.after = after
    }

    /// Keep at least the last `n` operations.
    public static func operations(_ n: Int) -> Retention { Retention(operations: n) }
    /// Keep every operation younger than `seconds`.
    public static func age(_ seconds: TimeInterval) -> Retention { Retention(age: seconds) }
    /// Keep every operation after `lsn`.
    public static func after(_ lsn: UInt64) -> Retention { Retention(after: lsn) }
}

/// What ``Store/compact(retaining:)`` did.
public struct CompactionReport: Sendable, Hashable, CustomStringConvertible {
    /// Operations folded into the base snapshot and removed from the log.
    public let foldedOperations: Int
    /// The horizon before and after: every operation up to it lives only in the base snapshot.
    public let previousHorizon: UInt64
    /// The horizon after this compaction.
    public let horizon: UInt64
    /// Operations left in the log.
    public let remainingOperations: Int
    /// Rows in the base snapshot.
    public let baseRows: Int
    /// What held the horizon back, when it is short of what the retention alone allowed.
    public let heldBy: Hold?

    /// What kept operations in the log that the retention alone would have folded.
    public enum Hold: Sendable, Hashable, CustomStringConvertible {
        /// An edit not yet acknowledged by the server: the operations from it on stay, so that
        /// its upload and acknowledgement can still be checked against them.
        case pendingEdits
        /// A log pin of that name (sync code pins the log while a batch is in flight).
        case pin(String)

        /// `pending`, or `pin:<name>` (as the `strata compact` command prints it).
        public var description: String {
            switch self {
            case .pendingEdits: "pending"
            case .pin(let name): "pin:" + name
            }
        }
    }

    public var description: String {
        var s = "folded \(foldedOperations) operations; horizon \(previousHorizon) → \(horizon); \(remainingOperations) operations left in the log, \(baseRows) rows in the base"
        if let heldBy { s += "; held back by \(heldBy)" }
        return s
    }
}

extension Store {
    /// Folds the operations that `retention` lets go into the base snapshot and removes them
    /// from the log, in one write transaction; the log stays bounded while rows, pending state,
    /// history and time travel after the horizon are unchanged.
    ///
    /// - Rows, `pending`, indexes and views are not touched: they already are the fold of the
    ///   whole log. ``rebuild(progress:)``, ``verify(progress:)`` and ``replay(into:through:progress:)``
    ///   start from the base snapshot.
    /// - ``Snapshot/history(_:key:)-(_,RowKey)`` returns the operations after the horizon;
    ///   ``Snapshot/row(_:key:asOf:includingDeleted:)`` and ``replay(into:through:progress:)`` before it
    ///   throw ``StrataError/Code-swift.struct/compacted``.
    /// - The space the removed operations used is reused by later writes, so the file stops
    ///   growing; to shrink the file itself, call ``Store/reclaimSpace(at:)`` with the store closed.
    ///
    /// Safe with concurrent readers: a snapshot begun before the compaction still sees the log it
    /// began with.
    ///
    /// - Complexity: O(k log n) for the k operations folded.
    @discardableResult
    public func compact(retaining retention: Retention = Retention()) throws(StrataError) -> CompactionReport {
        return try strataErrors {
            try write { tx in
                let writer = try tx.writer
                let reader = writer.reader
                // The log after the checkpointed views must stay whole (other processes fold it), so
                // the commit that moves the horizon also checkpoints.
                tx.requestCheckpoint()
                let previous = try reader.horizon(in: databases)
                let last = try reader.lastLSN(in: databases)
                var target = last
                if let n = retention.operations {
                    guard n >= 0 else { throw StrataError(.invalidOperation, "retention of \(n) operations: the count must not be negative") }
                    target = min(target, last - min(UInt64(n), last))
                }
                if let after = retention.after { target = min(target, after) }
                if let age = retention.age {
                    guard age >= 0, age.isFinite else { throw StrataError(.invalidOperation, "retention age \(age) s: it must be a finite number of seconds, not negative") }
                    let cutoff = UInt64(max(0, (Date().timeIntervalSince1970 - age) * 1_000_000))
                    if let young = try firstOperation(after: previous, newerThan: cutoff, reader) { target = min(target, young - 1) }
                }
                var heldBy: CompactionReport.Hold? = nil
                if let oldestPending = try oldestPendingLSN(reader), oldestPending - 1 < target {
                    target = oldestPending - 1
                    heldBy = .pendingEdits
                }
                for (name, pin) in try tx.snapshot.logPins where pin < target {
                    target = pin
                    heldBy = .pin(name)
                }
                var folded = 0
                if target > previous {
                    folded = try fold(through: target, writer)
                    try writer.setMeta(MetaKey.horizon, target, in: databases)
                } else {
                    target = previous
                }
                return CompactionReport(
                    foldedOperations: folded, previousHorizon: previous, horizon: target,
                    remainingOperations: try lmdb { () throws(LMDBError) in try reader.stats(databases.log).entries },
                    baseRows: try lmdb { () throws(LMDBError) in try reader.stats(databases.base).entries }, heldBy: heldBy)
            }
        }
    }

    /// The LSN of the first operation after `lsn` whose timestamp is after `cutoff` (µs).
    private func firstOperation(after lsn: UInt64, newerThan cutoff: UInt64, _ reader: ViewReader) throws -> UInt64? {
        let rules = try reader.checksumRules(in: databases)
        let (txn, log) = (reader.txn, databases.log)
        var cache: TransactionHeader? = nil
        return try txn.scan(log) { c in
            var e = try c.seek(atLeast: Swift.withUnsafeBytes(of: (lsn + 1).bigEndian) { Array($0) })
            while let entry = e {
                let at = try Counter.lsn(key: entry.key)
                // A damaged timestamp must not choose the horizon.
                try RecordChecksum.check(entry.value, lsn: at, rules: rules)
                let header = try OperationHeader(entry.value)
                let transaction = try txn.transactionHeader(of: header, at: at, log: log, rules: rules, cache: &cache)
                // Clocks can step back, so the first young operation ends the foldable prefix.
                if transaction.timestampMicros > cutoff {
                    return at
                }
                e = try c.next()
            }
            return nil
        }
    }

    /// The smallest LSN that made a row pending, `nil` when no row is pending.
    private func oldestPendingLSN(_ reader: ViewReader) throws -> UInt64? {
        var oldest: UInt64? = nil
        try reader.scan(databases.pending) { c in
            var e = try c.first()
            while let entry = e {
                let lsn = try Counter.decode(entry.value, database: StoreDatabases.names.pending, key: "a pending row's LSN")
                // `compact` subtracts one from it.
                guard lsn > 0 else { throw StrataError(.corruptRecord, "the store is damaged: a row of the pending database was made pending at LSN 0") }
                oldest = min(oldest ?? lsn, lsn)
                e = try c.next()
            }
        }
        return oldest
    }

    /// Moves the operations up to `horizon` from the log into `base`; removes the `gone` entries
    /// they leave dangling. Returns the number of operations folded.
    private func fold(through horizon: UInt64, _ txn: ViewWriter) throws -> Int {
        var folded = 0
        var state = ByteWriter(capacity: 512)
        // Folded operations leave the log for good: a damaged one must stop the compaction.
        let rules = try txn.reader.checksumRules(in: databases)
        // Read before the log loses the transaction's first operation.
        let carrier = try carrierAfter(horizon, txn, rules: rules)
        while true {
            // A chunk at a time, copied out, so that no cursor is open while the log shrinks.
            var chunk: [(lsn: UInt64, record: [UInt8])] = []
            try txn.reader.scan(databases.log) { c in
                var e = try c.first()
                while let entry = e, chunk.count < 1_000 {
                    let lsn = try Counter.lsn(key: entry.key)
                    if lsn > horizon { break }
                    chunk.append((lsn, Array(entry.value)))
                    e = try c.next()
                }
            }
            if chunk.isEmpty { break }
            for (lsn, record) in chunk {
                try withBytes(record) { (op) throws(StrataError) in
                    try RecordChecksum.check(op, lsn: lsn, rules: rules)
                    let header = try OperationHeader(op)
                    let target = UnsafeRawBufferPointer(rebasing: op[header.target])
                    let old = try lmdb { () throws(LMDBError) in try txn.get(target, in: databases.base).map { Array($0) } }
                    // The base snapshot keeps row states only: no `gone` or `pending` entries.
                    let result = try withBytes(old ?? []) { (o) throws(StrataError) -> Bool? in
                        try FoldStep.fold(old: old == nil ? nil : try StoredRow(o), wasPending: false, op: op, header: header, lsn: lsn, into: &state).isPending
                    }
                    try lmdb { () throws(LMDBError) in
                        if result == nil {
                            try txn.delete(target, in: databases.base)
                        } else {
                            try state.withUnsafeBytes { (b) throws(LMDBError) in try txn.put(target, b, in: databases.base) }
                        }
                        var key = lsn.bigEndian
                        try Swift.withUnsafeBytes(of: &key) { (k) throws(LMDBError) in try txn.delete(k, in: databases.log) }
                    }
                }
            }
            folded += chunk.count
        }
        if let (key, record) = carrier {
            try lmdb { () throws(LMDBError) in try txn.put(key, record, in: databases.log) }
        }
        // A removed row whose last operation was folded has no history left to reach.
        var dangling: [[UInt8]] = []
        try txn.reader.scan(databases.gone) { c in
            var e = try c.first()
            while let entry = e {
                if try Counter.decode(entry.value, database: StoreDatabases.names.gone, key: "a removed row's LSN") <= horizon { dangling.append(Array(entry.key)) }
                e = try c.next()
            }
        }
        try lmdb { () throws(LMDBError) in for key in dangling { try txn.delete(key, in: databases.gone) } }
        return folded
    }

    /// When the horizon splits a transaction, the operation after it becomes the first of its
    /// transaction in the log, so it must carry the transaction's header, which the folded first
    /// operation carried (``RecordFormat``): that operation rewritten so, with its key; `nil`
    /// when the horizon splits no transaction. Only the header moves: the rewritten record and
    /// the old one describe the same operation.
    private func carrierAfter(_ horizon: UInt64, _ txn: ViewWriter, rules: ChecksumRules) throws -> (key: [UInt8], record: [UInt8])? {
        let reader = txn.reader.txn
        // The first operation after the horizon, wherever it is: not always at horizon + 1, since
        // a salvaged log has gaps where records were lost.
        let start = Swift.withUnsafeBytes(of: (horizon + 1).bigEndian) { Array($0) }
        let found: (key: [UInt8], record: [UInt8])? = try reader.scan(databases.log) { c in
            try c.seek(atLeast: start).map { (Array($0.key), Array($0.value)) }
        }
        guard let (key, next) = found else { return nil }
        let lsn = try withBytes(key) { (k) throws(StrataError) in try Counter.lsn(key: k) }
        let header = try withBytes(next) { (b) throws(StrataError) in
            try RecordChecksum.check(b, lsn: lsn, rules: rules)
            return try OperationHeader(b)
        }
        if header.carriesTransaction { return nil }
        // A transaction that starts after the horizon is not split: its header is not folded.
        guard try header.transactionID(at: lsn) <= horizon else { return nil }
        var cache: TransactionHeader? = nil
        let transaction = try reader.transactionHeader(of: header, at: lsn, log: databases.log, rules: rules, cache: &cache)
        return (key, try withBytes(next) { (b) throws(StrataError) in try OperationRecord.carrying(transaction, b, lsn: lsn) })
    }

    /// Folds every row state of `base` (read through `reader`) into `fold`, as rebuild does
    /// before folding the log; with `copyTo`, also copies each into that transaction's base.
    /// Returns the number of rows.
    static func foldBase(
        from reader: some ReadableTransaction, base: Database, into fold: inout BulkFold, copyTo: (txn: LMDB.WriteTransaction, base: Database)? = nil
    ) throws(StrataError) -> Int {
        var count = 0
        try reader.scan(base) { c in
            var e = try c.first()
            while let entry = e {
                try fold.base(entry.key, state: entry.value)
                if let copyTo {
                    try lmdb { () throws(LMDBError) in try copyTo.txn.put(entry.key, entry.value, in: copyTo.base, flags: .append) }
                }
                count += 1
                e = try c.next()
            }
        }
        return count
    }
}

extension Transaction {
    /// Keeps every operation after `lsn` out of compaction until ``unpinLog(_:)`` removes the
    /// pin named `name` (setting a pin again moves it). Pins are stored with the transaction.
    ///
    /// For code that will read a stretch of history later: the sync client pins the operations
    /// made while an upload batch is in flight, since its acknowledgement must see them.
    package func pinLog(_ name: String, after lsn: UInt64) throws {
        try writer.setMeta(MetaKey.pinPrefix + name, lsn, in: databases)
    }

    /// Removes the log pin `name`; nothing happens when there is none.
    package func unpinLog(_ name: String) throws {
        let writer = try self.writer
        try lmdb { () throws(LMDBError) in try writer.delete(Array((MetaKey.pinPrefix + name).utf8), in: databases.meta) }
    }
}

extension Snapshot {
    /// The compaction horizon: every operation up to this LSN has been folded into the base
    /// snapshot and is no longer in the log. 0 when the store was never compacted.
    public var horizon: UInt64 {
        get throws(StrataError) { try txn.horizon(in: databases) }
    }

    /// The log pins: name → LSN after which compaction keeps every operation. `StrataSync`
    /// sets one while an upload batch is in flight, since its acknowledgement must see the
    /// operations merged meanwhile.
    public var logPins: [String: UInt64] {
        get throws(StrataError) {
            var pins: [String: UInt64] = [:]
            let prefix = Array(MetaKey.pinPrefix.utf8)
            try txn.scan(databases.meta) { c in
                var e = try c.seek(atLeast: prefix)
                while let entry = e, entry.key.starts(with: prefix) {
                    let name = String(decoding: entry.key.dropFirst(prefix.count), as: UTF8.self)
                    pins[name] = try Counter.decode(entry.value, database: StoreDatabases.names.meta, key: MetaKey.pinPrefix + name)
                    e = try c.next()
                }
            }
            return pins
        }
    }
}

import Foundation
import LMDB
import StrataLibc

/// What ``Store/verify(progress:)`` found.
public struct VerifyReport: Sendable, CustomStringConvertible {
    /// One entry that differs between the live views and the views rebuilt from the log.
    public struct Difference: Sendable, Hashable, CustomStringConvertible {
        /// A database derived from the log.
        public enum View: String, Sendable, Hashable, CaseIterable {
            /// The rows, with their original and current values.
            case rows
            /// The pending rows: what must be uploaded.
            case pending
            /// The rows removed, with the operation that removed them.
            case gone
            /// Secondary indexes.
            case index
            /// Named views.
            case view
        }

        /// How the live entry differs from the one folded from the log.
        public enum Kind: String, Sendable, Hashable, CaseIterable {
            /// The fold has the entry, the live view does not.
            case missing
            /// The live view has the entry, the fold does not.
            case extra
            /// Both have it, with different content.
            case different
        }

        /// The database that differs.
        public let view: View
        /// Whether the difference is in the checkpointed views alone (the views in the file
        /// without the overlay, against the fold up to the checkpoint), not in what reads see.
        public let inCheckpointedViews: Bool
        /// The row, as `table key`.
        public let entry: String
        /// How it differs.
        public let kind: Kind

        /// A difference of `kind` at `entry` of `view`.
        public init(view: View, inCheckpointedViews: Bool = false, entry: String, kind: Kind) {
            self.view = view
            self.inCheckpointedViews = inCheckpointedViews
            self.entry = entry
            self.kind = kind
        }

        /// `view: entry kind`, with `@checkpoint` after the view for the checkpointed views.
        public var description: String { "\(view.rawValue)\(inCheckpointedViews ? "@checkpoint" : ""): \(entry) \(kind.rawValue)" }
    }

    /// Operations folded from the log.
    public let operations: Int
    /// Per view, the number of entries and a 64-bit digest of the live content.
    public let live: [String: (entries: Int, digest: UInt64)]
    /// The same for the views rebuilt from the log.
    public let rebuilt: [String: (entries: Int, digest: UInt64)]
    /// The differing entries (at most ``maxDifferences``).
    public let differences: [Difference]

    /// An operation of the log that is damaged: its checksum does not match its content or the
    /// LSN it is stored under, or it lacks one (or one that covers its LSN) where every
    /// operation carries one. When the log has one, the views are not
    /// compared with its fold (``differences`` is empty): `rebuild` refuses such a log, and
    /// ``Store/salvage(from:into:)`` recovers the rest of it.
    public struct DamagedOperation: Sendable, Hashable, CustomStringConvertible {
        /// Where it is in the log.
        public let lsn: UInt64
        /// What is wrong with it.
        public let reason: String

        public var description: String { "LSN \(lsn): \(reason)" }
    }

    /// The damaged operations of the log, in LSN order (all of them).
    public internal(set) var damagedOperations: [DamagedOperation] = []
    /// Operations written before log records carried checksums (operation formats 1 and 2, by a
    /// Strata before store format 5): their damage cannot be detected.
    public internal(set) var operationsWithoutChecksum = 0
    /// Operations whose checksum covers their content but not their LSN (operation formats 3
    /// and 4, by a Strata before store format 7): a damaged key (LSN) of theirs cannot be
    /// detected.
    public internal(set) var operationsWithoutLSNInChecksum = 0

    /// The most differences a report lists.
    public static let maxDifferences = 100

    /// Whether every operation is intact and the live views equal the log's fold, byte for byte.
    public var isConsistent: Bool {
        damagedOperations.isEmpty && differences.isEmpty && live.keys.allSatisfy { live[$0]! == rebuilt[$0]! }
    }

    public var description: String {
        var lines: [String]
        if isConsistent {
            lines = ["consistent: \(operations) operations, views equal the log's fold"]
        } else {
            lines = ["INCONSISTENT: \(damagedOperations.count) damaged operation(s), \(differences.count) difference(s):"]
            lines += damagedOperations.map { "  damaged: \($0)" }
            lines += differences.map { "  \($0)" }
            if !damagedOperations.isEmpty {
                lines.append("the views were not compared with the log's fold, which stops at a damaged operation; salvage recovers the intact ones")
            }
        }
        if operationsWithoutChecksum > 0 {
            lines.append("\(operationsWithoutChecksum) operation(s) from before log format 3 carry no checksum")
        }
        if operationsWithoutLSNInChecksum > 0 {
            lines.append("\(operationsWithoutLSNInChecksum) operation(s) from before log format 5 carry a checksum that does not cover their LSN")
        }
        return lines.joined(separator: "\n")
    }
}

extension Store {
    /// Drops the views (`rows`, `pending`, `gone`, indexes, named views) and folds the whole log
    /// again — from the base snapshot when the store was compacted — in one write transaction.
    /// Returns the number of operations folded.
    ///
    /// - Complexity: O(m + n log n) for m operations in the log and n rows; memory is bounded
    ///   (see `BulkFold`).
    ///
    /// `progress`, if given, is called now and then with the operations folded so far and the
    /// length of the log.
    @discardableResult
    public func rebuild(progress: ((_ done: Int, _ total: Int) -> Void)? = nil) throws(StrataError) -> Int {
        return try strataErrors {
            try write { tx in
                let txn = try tx.writer.writeTxn!
                // Straight into LMDB: the overlay is dropped, and the commit records the views as
                // current through the log's end.
                tx.overlay.version = .empty(at: tx.lastLSN)
                tx.requestCheckpoint()
                try Store.mappingStorageErrors { try databases.derived.forEach { try txn.clear($0) } }
                return try Store.fold(from: txn.reader, databases, into: txn, databases, catalog: tx.catalog, budget: options.foldMemoryLimit, workers: options.foldWorkers, progress: progress)
            }
        }
    }

    /// Rebuilds the views from the base snapshot and the log into a scratch store and compares them with the live
    /// views, entry by entry. The live store is only read; writers may go on meanwhile (the
    /// comparison uses one snapshot).
    ///
    /// The live views are those every read sees: the checkpointed views in LMDB with the overlay
    /// on top. When the overlay holds entries, the checkpointed views alone are also compared with
    /// the fold of the log up to the LSN they reflect; their differences are reported under the
    /// view's name with `@checkpoint` appended.
    ///
    /// `progress`, if given, is called now and then with the operations folded so far and the
    /// length of the log.
    ///
    /// - Complexity: O(m + n log n + v) for m operations, n rows and v view entries.
    public func verify(progress: ((_ done: Int, _ total: Int) -> Void)? = nil) throws(StrataError) -> VerifyReport {
        return try strataErrors {
            try enterCall()  // fails on a closed Store; counts the call so close() waits for it
            defer { leaveCall() }
            let scratchPath = Store.newScratchFolder("verify")
            defer { try? FileManager.default.removeItem(atPath: scratchPath) }
            var options = EnvironmentOptions()
            options.syncMode = .noSync
            options.mapSize = max(env.usedBytes * 2, 16 << 20)
            return try Store.mappingStorageErrors {
                let scratch = try Environment(path: scratchPath, options: options)
                let scratchDatabases = try scratch.write { try StoreDatabases.open($0) }
                return try env.read { txn in
                    let catalog = try currentCatalog(txn)
                    let version = try overlayVersion(for: txn)
                    var liveSums: [String: (entries: Int, digest: UInt64)] = [:]
                    var rebuiltSums = liveSums
                    var differences: [VerifyReport.Difference] = []
                    /// Folds the log through `lsn` into the (empty) scratch views and compares them
                    /// with the live views as `live` reads them.
                    func check(_ live: ViewReader, through lsn: UInt64, checkpointed: Bool) throws -> Int {
                        let suffix = checkpointed ? "@checkpoint" : ""
                        // The scratch store is committed in steps: one transaction would keep all of
                        // its dirty pages in memory.
                        let target = try scratch.write { target in
                            try databases.derived.forEach { try target.clear($0) }
                            return BulkFold(databases: scratchDatabases, catalog: catalog, into: target, budget: self.options.foldMemoryLimit, workers: self.options.foldWorkers)
                        }
                        var fold = target
                        fold.commitsInSteps(scratch)
                        var checks = LogChecks(rules: try txn.checksumRules(in: databases))
                        // The scan below checked every checksum through the overlay's LSN, in this
                        // same read transaction.
                        checks.checkedThrough = version.lsn
                        let count = try Store.fold(from: txn, databases, into: &fold, through: lsn, checks: &checks, progress: suffix.isEmpty ? progress : nil)
                        try scratch.read { rebuilt in
                            let databases: [(VerifyReport.Difference.View, Database, Database)] = [
                                (.rows, databases.rows, scratchDatabases.rows), (.pending, databases.pending, scratchDatabases.pending), (.gone, databases.gone, scratchDatabases.gone),
                                (.index, databases.index, scratchDatabases.index), (.view, databases.view, scratchDatabases.view),
                            ]
                            for (view, a, b) in databases {
                                let (l, r) = try compare(view, checkpointed: checkpointed, live, a, rebuilt, b, catalog: catalog, into: &differences)
                                liveSums[view.rawValue + suffix] = l
                                rebuiltSums[view.rawValue + suffix] = r
                            }
                        }
                        return count
                    }
                    // Every checksum first, every damaged operation named: the fold would stop at the
                    // first, and could not fold the rows it touched without it.
                    let scan = try Store.checkLog(from: txn, databases, through: version.lsn)
                    guard scan.damaged.isEmpty else {
                        var report = VerifyReport(operations: scan.operations, live: [:], rebuilt: [:], differences: [])
                        report.damagedOperations = scan.damaged.map { .init(lsn: $0.lsn, reason: $0.why) }
                        report.operationsWithoutChecksum = scan.unchecksummed
                        report.operationsWithoutLSNInChecksum = scan.lsnUncovered
                        return report
                    }
                    let count = try check(ViewReader(txn: txn, databases: databases, overlay: OverlayBuffer(version)), through: version.lsn, checkpointed: false)
                    if !version.isEmpty {
                        let viewsLSN = try txn.metaUInt64(MetaKey.viewsLSN, in: databases) ?? version.lsn
                        _ = try check(ViewReader(txn: txn, databases: databases, overlay: nil), through: viewsLSN, checkpointed: true)
                    }
                    var report = VerifyReport(operations: count, live: liveSums, rebuilt: rebuiltSums, differences: differences)
                    report.operationsWithoutChecksum = scan.unchecksummed
                    report.operationsWithoutLSNInChecksum = scan.lsnUncovered
                    return report
                }
            }
        }
    }

    /// Folds the base snapshot and the log of `source` (read through `reader`), up to LSN
    /// `through`, into the empty derived views `target` of `txn`; with `copying`, also copies the
    /// base snapshot and the operations into `target`'s, on `workers` threads (see `BulkFold`).
    /// Returns the number of operations.
    static func fold(
        from reader: some ReadableTransaction, _ source: StoreDatabases, into txn: LMDB.WriteTransaction, _ target: StoreDatabases, catalog: Catalog, budget: Int, workers: Int = 1,
        through: UInt64 = .max, copying: Bool = false, progress: ((_ done: Int, _ total: Int) -> Void)? = nil
    ) throws(StrataError) -> Int {
        var fold = BulkFold(databases: target, catalog: catalog, into: txn, budget: budget, workers: workers)
        _ = try foldBase(from: reader, base: source.base, into: &fold, copyTo: copying ? (txn, target.base) : nil)
        var checks = LogChecks(rules: try reader.checksumRules(in: source))
        let count = try foldLog(from: reader, log: source.log, into: &fold, through: through, checks: &checks, copyTo: copying ? (txn, target.log) : nil, progress: progress)
        try fold.finish()
        return count
    }

    /// Folds the base snapshot and the log of `source` (read through `reader`), up to LSN
    /// `through`, into `fold`, which writes a scratch store in steps. Returns the number of
    /// operations.
    static func fold(
        from reader: some ReadableTransaction, _ source: StoreDatabases, into fold: inout BulkFold, through: UInt64, checks: inout LogChecks,
        progress: ((_ done: Int, _ total: Int) -> Void)?
    ) throws(StrataError) -> Int {
        _ = try foldBase(from: reader, base: source.base, into: &fold)
        let count = try foldLog(from: reader, log: source.log, into: &fold, through: through, checks: &checks, progress: progress)
        try fold.finish()
        return count
    }

    /// Checks the checksum of every operation of `databases`' log (read through `reader`) up to
    /// LSN `through`, collecting the damaged ones rather than stopping at the first; and that
    /// each operation's transaction header is where readers look for it (``RecordFormat``: in
    /// the first operation of its transaction in the log, and a transaction's operations are
    /// consecutive, so in the last operation before it that carries one).
    ///
    /// - Complexity: O(b) for b bytes of operations.
    static func checkLog(from reader: some ReadableTransaction, _ databases: StoreDatabases, through: UInt64) throws(StrataError) -> LogChecks {
        var checks = LogChecks(rules: try reader.checksumRules(in: databases))
        var carried: UInt64? = nil
        // After a damaged record, which may have been a transaction's first, the rest of its
        // transaction is not blamed for a header it could not read.
        var afterDamage = false
        try reader.scan(databases.log) { c in
            var e = try c.first()
            while let entry = e {
                let lsn = try Counter.lsn(key: entry.key)
                if lsn > through { break }
                checks.operations += 1
                switch RecordChecksum.status(entry.value, lsn: lsn, rules: checks.rules) {
                case .valid: break
                case .validWithoutLSN: checks.lsnUncovered += 1
                case .absent: checks.unchecksummed += 1
                case .damaged(let why):
                    checks.damaged.append((lsn, why))
                    afterDamage = true
                    e = try c.next()
                    continue
                }
                // A record that does not parse is left to the fold, which names what is wrong.
                if let header = try? OperationHeader(entry.value), let id = try? header.transactionID(at: lsn) {
                    if header.carriesTransaction {
                        carried = id
                        afterDamage = false
                    } else if carried != id && !afterDamage {
                        checks.damaged.append((lsn, "it belongs to transaction \(id), but no operation of that transaction before it in the log carries the transaction's header"))
                    }
                }
                e = try c.next()
            }
        }
        return checks
    }

    /// Folds every operation of `log` (read through `reader`) up to LSN `through` into `fold`;
    /// with `copyTo`, also appends each operation to that transaction's log.
    ///
    /// Each operation's checksum is checked first (``RecordChecksum``): a damaged one is a
    /// `corruptRecord` error naming its LSN.
    static func foldLog(
        from reader: some ReadableTransaction, log: Database, into fold: inout BulkFold,
        through: UInt64 = .max, checks: inout LogChecks, copyTo: (txn: LMDB.WriteTransaction, log: Database)? = nil, progress: ((_ done: Int, _ total: Int) -> Void)? = nil
    ) throws(StrataError) -> Int {
        var count = 0
        // The log being folded is `log` (of `reader`), not the target's, which may be a scratch store's.
        let total = progress == nil ? 0 : Int(min(try reader.lastLSN(of: log), through))
        var previous: UInt64 = 0
        do throws(StrataError) {
            try reader.scan(log) { c in
                var e = try c.first()
                while let entry = e {
                    let lsn = try Counter.lsn(key: entry.key)
                    // The checksum first (when the LSN is not past the end): a key out of order
                    // because it is damaged is named as such.
                    if lsn > checks.checkedThrough && (lsn <= through || lsn <= previous) {
                        switch RecordChecksum.status(entry.value, lsn: lsn, rules: checks.rules) {
                        case .valid: break
                        case .validWithoutLSN: checks.lsnUncovered += 1
                        case .absent: checks.unchecksummed += 1
                        case .damaged(let why): throw RecordChecksum.damaged(lsn, why)
                        }
                    }
                    guard lsn > previous else { throw StrataError(.corruptRecord, "the log is out of order at LSN \(lsn)") }
                    if lsn > through { break }
                    previous = lsn
                    // The fold writes only when it flushes, between operations, and never to the
                    // log: the record the cursor lends stays valid while it is folded.
                    try fold.apply(operation: entry.value, lsn: lsn)
                    if let copyTo {
                        try lmdb { () throws(LMDBError) in
                            var k = lsn.bigEndian
                            try Swift.withUnsafeBytes(of: &k) { (kb) throws(LMDBError) in try copyTo.txn.put(kb, entry.value, in: copyTo.log, flags: .append) }
                        }
                    }
                    count += 1
                    if let progress, count % 10_000 == 0 { progress(count, total) }
                    e = try c.next()
                }
            }
        } catch {
            // The fold may still hold operations read before the failure: one of them failing
            // is the first failure in log order.
            try fold.settle()
            throw error
        }
        progress?(count, max(total, count))
        return count
    }

    /// Merge-walks two databases in key order, recording differences and digesting both.
    private func compare(
        _ view: VerifyReport.Difference.View, checkpointed: Bool, _ liveTxn: ViewReader, _ liveDB: Database, _ rebuiltTxn: ReadTransaction, _ rebuiltDB: Database,
        catalog: Catalog, into differences: inout [VerifyReport.Difference]
    ) throws -> ((Int, UInt64), (Int, UInt64)) {
        var liveDigest = ViewDigest()
        var rebuiltDigest = ViewDigest()
        var liveCount = 0
        var rebuiltCount = 0
        func note(_ key: UnsafeRawBufferPointer, _ kind: VerifyReport.Difference.Kind) {
            guard differences.count < VerifyReport.maxDifferences else { return }
            differences.append(.init(view: view, inCheckpointedViews: checkpointed, entry: catalog.describe(rowsKey: key), kind: kind))
        }
        try liveTxn.scan(liveDB) { a in
            try rebuiltTxn.withCursor(rebuiltDB) { b in
                var x = try a.first()
                var y = try b.first()
                while x != nil || y != nil {
                    let order: Int
                    if let l = x, let r = y {
                        order = compareBytes(l.key, r.key)
                    } else {
                        order = x != nil ? -1 : 1
                    }
                    if order <= 0, let l = x {
                        liveDigest.add(l)
                        liveCount += 1
                    }
                    if order >= 0, let r = y {
                        rebuiltDigest.add(r)
                        rebuiltCount += 1
                    }
                    switch order {
                    case -1: note(x!.key, .extra)
                    case 1: note(y!.key, .missing)
                    default: if compareBytes(x!.value, y!.value) != 0 { note(x!.key, .different) }
                    }
                    if order <= 0 { x = try a.next() }
                    if order >= 0 { y = try b.next() }
                }
            }
        }
        return ((liveCount, liveDigest.value), (rebuiltCount, rebuiltDigest.value))
    }
}

/// What a scan or a fold of a log found of its operations' checksums (see ``RecordChecksum``).
struct LogChecks {
    /// Where operations must carry a checksum, and one that covers their LSN.
    var rules: ChecksumRules
    /// Operations checked.
    var operations = 0
    /// The damaged operations: LSN and what is wrong.
    var damaged: [(lsn: UInt64, why: String)] = []
    /// Operations written before checksums (formats 1 and 2).
    var unchecksummed = 0
    /// Operations whose checksum does not cover their LSN (formats 3 and 4).
    var lsnUncovered = 0
    /// Operations up to this LSN were found intact by ``Store/checkLog(from:_:through:)`` in the
    /// same read transaction: a fold that follows skips their checksums (`verify` would compute
    /// each one twice otherwise).
    var checkedThrough: UInt64 = 0
}

/// Compares two byte strings in LMDB's default key order: bytewise, a prefix first. -1, 0 or 1.
@inline(__always)
func compareBytes(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Int {
    let n = min(a.count, b.count)
    if n > 0 {
        let c = memcmp(a.baseAddress!, b.baseAddress!, n)
        if c != 0 { return c < 0 ? -1 : 1 }
    }
    return a.count == b.count ? 0 : a.count < b.count ? -1 : 1
}

/// The digest of a view in a ``VerifyReport``: a 64-bit multiply-xor hash over length-prefixed
/// keys and values, eight bytes at a time (a view is hashed twice per verify, so speed matters;
/// the value is only ever compared within one report).
struct ViewDigest {
    private(set) var value: UInt64 = 0xcbf2_9ce4_8422_2325

    mutating func add(_ bytes: UnsafeRawBufferPointer) {
        mix(UInt64(bytes.count))
        var i = 0
        while i + 8 <= bytes.count {
            mix(UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self)))
            i += 8
        }
        var tail: UInt64 = 0
        while i < bytes.count {
            tail = tail << 8 | UInt64(bytes[i])
            i += 1
        }
        mix(tail)
    }

    mutating func add(_ entry: Entry) {
        add(entry.key)
        add(entry.value)
    }

    @inline(__always)
    private mutating func mix(_ word: UInt64) {
        value = (value ^ word) &* 0x9E37_79B9_7F4A_7C15
        value ^= value >> 31
    }
}

/// FNV-1a, 64 bits, over length-prefixed keys and values.
struct Digest {
    private(set) var value: UInt64 = 0xcbf2_9ce4_8422_2325

    mutating func add(_ bytes: UnsafeRawBufferPointer) {
        withUnsafeBytes(of: UInt64(bytes.count).littleEndian) { for b in $0 { mix(b) } }
        for b in bytes { mix(b) }
    }

    mutating func add(_ entry: Entry) {
        add(entry.key)
        add(entry.value)
    }

    @inline(__always)
    private mutating func mix(_ b: UInt8) {
        value = (value ^ UInt64(b)) &* 0x100_0000_01b3
    }
}

/// The invariant check behind ``StoreOptions/checkInvariants``.
enum Invariants {
    /// Re-folds the row `target` from its chain of operations and checks the live `rows` and
    /// `pending` entries equal the result.
    static func checkRow(_ target: [UInt8], txn: ViewWriter, databases: StoreDatabases) throws(StrataError) {
        let (state, pending) = try strataErrors { try txn.reader.foldChain(of: target, databases: databases) }
        let live = try lmdb { () throws(LMDBError) in try txn.get(target, in: databases.rows).map { Array($0) } }
        guard live == state else {
            throw StrataError(.corruptRecord, "invariant: the live row differs from the fold of its operations")
        }
        let livePending = try lmdb { () throws(LMDBError) in try txn.get(target, in: databases.pending) } != nil
        guard livePending == pending else {
            throw StrataError(.corruptRecord, "invariant: the pending view says \(livePending), the fold says \(pending)")
        }
    }
}

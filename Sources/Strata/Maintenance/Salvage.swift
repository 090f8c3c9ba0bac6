import Foundation
import LMDB

/// What ``Store/salvage(from:into:)`` recovered and what it could not.
public struct SalvageReport: Sendable, CustomStringConvertible {
    /// A row whose history lost operations: it was rebuilt from the operations after the gap.
    public struct RowGap: Sendable, CustomStringConvertible {
        /// The row's table.
        public var table: String
        /// The row's primary key.
        public var key: RowKey
        /// The first operation kept for the row; the one it names as its predecessor is lost.
        public var keptFrom: UInt64
        /// The lost predecessor's LSN.
        public var missing: UInt64
        /// Whether the predecessor is at or before the damaged store's compaction horizon: the
        /// row's state up to there was in the base snapshot, which salvage does not recover, so
        /// the row holds only what its operations from `keptFrom` on wrote. Otherwise the
        /// predecessor was unreadable.
        public var beforeHorizon = false
        public var description: String {
            beforeHorizon
                ? "\(table) \(key): rebuilt from LSN \(keptFrom) on only; its state up to the compaction horizon (LSN \(missing) and before) was in the base snapshot, not recovered"
                : "\(table) \(key): history before LSN \(keptFrom) lost (LSN \(missing) unreadable)"
        }
    }

    /// Operations recovered into the new store.
    public var recoveredOperations = 0
    /// The LSNs recovered, lowest and highest (`nil` when none).
    public var recoveredRange: ClosedRange<UInt64>?
    /// LSN ranges between the horizon and the last recovered operation that could not be read.
    public var lostRanges: [ClosedRange<UInt64>] = []
    /// Rows whose chain of operations has a gap: a lost operation, or (``RowGap/beforeHorizon``)
    /// an update whose predecessor was folded into the base snapshot by a compaction.
    public var rowsWithGaps: [RowGap] = []
    /// Readable operations left out because they sit on a row's history before a gap.
    public var operationsBeforeGaps = 0
    /// LSNs up to the last recovered one whose operation was found but is damaged (its checksum
    /// does not match, see ``VerifyReport/DamagedOperation``) and has no intact copy in the file:
    /// skipped, so also in ``lostRanges``.
    public var damagedOperations: [UInt64] = []
    /// Operations recovered without the first operation of their transaction, which holds the
    /// transaction's time: they were given the time of the transaction before them (or, with
    /// none before, of the first one recovered whole).
    public var operationsWithEstimatedTime = 0
    /// Pages of the damaged file that did not parse as LMDB pages (zeroed or overwritten).
    public var unreadablePages = 0
    /// Pages of the file in all.
    public var pages = 0
    /// The damaged store's compaction horizon: operations up to it were folded into a base
    /// snapshot, which salvage does not recover.
    public var horizon: UInt64 = 0
    /// Rows left pending (local edits still to upload) in the new store.
    public var pendingRows = 0
    /// Whether the damaged store's `meta` database (client id, counters, properties, log pins)
    /// may not have been recovered whole as of its last transaction: a page of its B-tree, or
    /// one of LMDB's two meta pages, was unreadable. Entries may then be missing, or hold the
    /// value of the transaction before (see docs/damaged-stores.md). A sync client's state is
    /// kept in properties: check it (its batch number in particular) before syncing.
    public var metaIncomplete = false

    public var description: String {
        var lines = ["recovered \(recoveredOperations) operations" + (recoveredRange.map { " (LSN \($0.lowerBound)…\($0.upperBound))" } ?? "")
            + "; \(pendingRows) rows still pending; \(unreadablePages) of \(pages) pages unreadable"]
        if lostRanges.isEmpty {
            lines.append("no operation lost up to the last one recovered")
        } else {
            lines.append("lost LSNs: " + lostRanges.map { $0.count == 1 ? "\($0.lowerBound)" : "\($0.lowerBound)…\($0.upperBound)" }.joined(separator: ", "))
        }
        if horizon > 0 {
            lines.append("the store was compacted through LSN \(horizon): rows not changed since are not in the log and were not recovered")
        }
        if !damagedOperations.isEmpty {
            lines.append("failed their checksum (skipped): LSN " + damagedOperations.map(String.init).joined(separator: ", "))
        }
        for gap in rowsWithGaps { lines.append("gap: \(gap)") }
        if operationsWithEstimatedTime > 0 {
            lines.append("\(operationsWithEstimatedTime) operation(s) lost the first operation of their transaction and were given the time of the transaction before")
        }
        if operationsBeforeGaps > 0 { lines.append("\(operationsBeforeGaps) readable operations before those gaps were left out") }
        if metaIncomplete {
            lines.append("the store's meta database was damaged: its properties, log pins and client id may be missing or older than its last transaction")
        }
        return lines.joined(separator: "\n")
    }
}

extension Store {
    /// Recovers what is readable of a damaged store into a new one.
    ///
    /// Reads the damaged `data.mdb` page by page, without LMDB (which trusts its file and can
    /// crash on damage): every page that parses as an LMDB leaf page is searched for `log`
    /// entries (8-byte LSN keys whose values decode as operations). The `meta` entries (schema
    /// catalog, client id, properties, log pins) are read down `meta`'s B-tree from LMDB's newer
    /// meta page, so that each is the last committed transaction's and not an older copy LMDB
    /// left in the file; where that tree is unreadable, from the transaction before
    /// (``SalvageReport/metaIncomplete`` says when). Pages that do not parse are skipped. The
    /// operations are written in LSN order into a new store at `path`, with the damaged store's
    /// catalog, client id and properties, and the views are rebuilt from them, so pending local
    /// edits that survive stay pending and can still be uploaded.
    ///
    /// A row whose history lost an operation is rebuilt from the operations after the gap (the
    /// earlier ones would not fold onto it); the report lists such rows and the LSN ranges lost.
    /// So is a row of a compacted store updated after the horizon: its state at the horizon was
    /// in the base snapshot, which salvage does not recover (``SalvageReport/RowGap/beforeHorizon``).
    ///
    /// The new store is built in a hidden folder inside `path` (`.replay-<pid>-…`, as
    /// ``replay(into:through:progress:)`` does) and its `data.mdb` moved into `path` only when its
    /// views are built: a salvage that fails or is killed leaves no store at `path`, so it can be
    /// run again (which removes a leftover folder of a killed one).
    ///
    /// - Throws: ``StrataError`` `io` when `damaged` has no `data.mdb` or `path` already holds a
    ///   store; `corruptRecord` when no schema catalog can be found.
    /// - Complexity: O(file size + k log k) for k operations recovered.
    public static func salvage(from damaged: String, into path: String) throws(StrataError) -> SalvageReport {
        try salvage(from: damaged, into: path, beforeBuildingViews: {})
    }

    /// ``salvage(from:into:)``, calling `beforeBuildingViews` once the new store's log is written
    /// and before its views are built: a test makes it throw, to stand for a failure (or a kill)
    /// between the two.
    static func salvage(
        from damaged: String, into path: String, beforeBuildingViews: () throws(StrataError) -> Void
    ) throws(StrataError) -> SalvageReport {
        return try strataErrors {
            let file = damaged + "/data.mdb"
            guard let data = FileManager.default.contents(atPath: file) else {
                throw StrataError(.io, "no Strata store at '\(damaged)' (cannot read data.mdb in that folder)")
            }
            if FileManager.default.fileExists(atPath: path + "/data.mdb") {
                throw StrataError(.io, "'\(path)' already holds a store; salvage writes into a new folder")
            }
            let scan = RawPages(Array(data))
            var report = SalvageReport()
            report.pages = scan.pageCount
            report.unreadablePages = scan.unreadable

            // `meta` as the last committed transaction left it, read down its B-tree from LMDB's
            // meta pages (see `RawPages.readMeta`). When they lead to no catalog, the leaf page
            // holding one with the highest lastTxn, then horizon, then catalog version (each only
            // grows; a compaction changes only the horizon, and the page it replaced is often
            // still in the file): which copies of the other leaves are current cannot be told
            // then, so only that page's entries are taken, and the report says `meta` may be
            // incomplete.
            report.metaIncomplete = !scan.metaTreeComplete
            guard let meta = scan.metaTree ?? scan.metaCandidates.max(by: { ($0.lastTxn, $0.horizon, $0.catalogVersion) < ($1.lastTxn, $1.horizon, $1.catalogVersion) }),
                  let catalogBytes = meta.entries[MetaKey.catalog]
            else {
                throw StrataError(.corruptRecord, "no readable schema catalog in '\(damaged)': the meta pages are damaged, so nothing can be salvaged")
            }
            // A newer Strata's store may hold records this one would misread: refused, as every
            // other way in refuses it. (A format entry damaged past any real version is damage,
            // not a newer store, and salvage goes on.)
            if let f = meta.entries[MetaKey.format], f.count == 8 {
                let format = RawPages.u64be(f)
                if format > Store.formatVersion && format <= 1000 {
                    throw StrataError(.formatVersion, "the store at '\(damaged)' has format \(format), newer than this Strata reads (\(Store.formatVersion)); salvage it with a Strata that reads it")
                }
            }
            let catalog = try withBytes(catalogBytes) { (b) throws(StrataError) in try Catalog(decoding: b, version: meta.catalogVersion) }
            report.horizon = meta.horizon

            // Every operation whose checksum holds (when it has one) and that decodes; the first
            // such copy of an LSN wins (LMDB leaves older copies of pages behind, and intact copies
            // agree: an operation is rewritten only when compaction moves its transaction's header
            // into it, and then a copy that carries the header wins over one that does not). Without the damaged store's `checksumsFrom`,
            // operations without a checksum are taken at any LSN: recovering more is the point
            // here; so are operations whose checksum does not cover their LSN without its
            // `lsnCoveredFrom`. A record whose checksum covers its LSN is always checked against
            // the key it was found under, so a damaged key or a record under another key is skipped.
            let rules = ChecksumRules(checksumsFrom: meta.checksumsFrom ?? .max, lsnCoveredFrom: meta.lsnCoveredFrom ?? .max)
            var operations: [UInt64: [UInt8]] = [:]
            var damaged = Set<UInt64>()
            func carries(_ record: [UInt8]) -> Bool { withBytes(record) { (b) -> Bool in (try? OperationHeader(b).carriesTransaction) ?? false } }
            for (lsn, record) in scan.logCandidates where operations[lsn].map({ !carries($0) && carries(record) }) ?? true {
                guard lsn > meta.horizon, lsn <= Counter.limit else { continue }
                let valid: Bool = withBytes(record) { (b) -> Bool in
                    if case .damaged = RecordChecksum.status(b, lsn: lsn, rules: rules) {
                        damaged.insert(lsn)
                        return false
                    }
                    guard let header = try? OperationHeader(b), let id = try? header.transactionID(at: lsn),
                          id <= meta.lastTxn || meta.lastTxn == 0,
                          catalog.tables[header.tableID(in: b)] != nil,
                          // Decoded on its own: its transaction's header, when elsewhere, is seen to below.
                          (try? LogEntry(lsn: lsn, record: b, catalog: catalog, rules: rules) { _ in
                              TransactionHeader(id: id, timestampMicros: 0, schemaVersion: 0)
                          }) != nil
                    else { return false }
                    return true
                }
                if valid { operations[lsn] = record }
            }

            // Per row, keep the newest unbroken chain of operations.
            var byTarget: [[UInt8]: [UInt64]] = [:]
            var prevOf: [UInt64: UInt64] = [:]
            for (lsn, record) in operations {
                try withBytes(record) { (b) throws(StrataError) in
                    let header = try OperationHeader(b)
                    byTarget[Array(b[header.target]), default: []].append(lsn)
                    prevOf[lsn] = header.prevLSN
                }
            }
            var kept: [(lsn: UInt64, record: [UInt8])] = []
            for (target, lsns) in byTarget {
                var lsn = lsns.max()!
                var chain: [UInt64] = []
                while true {
                    chain.append(lsn)
                    let prev = prevOf[lsn]!
                    if prev == 0 { break }
                    if prev <= meta.horizon || operations[prev] == nil || prev >= lsn {
                        // A predecessor at or before the horizon is in the base snapshot, not
                        // recovered: the row is rebuilt from the operations after it, which the
                        // user must learn, unless the oldest kept one is an insert (the row was
                        // gone before it, so it writes the whole row).
                        let beforeHorizon = prev <= meta.horizon && prev < lsn
                        let kind = try withBytes(operations[lsn]!) { (b) throws(StrataError) in try OperationHeader(b).kind }
                        if !beforeHorizon || kind != LogEntry.Kind.insert.rawValue {
                            let table = catalog.tables[target.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }]
                            let key = table.flatMap { t in try? withBytes(target) { (k) throws(StrataError) in try t.decodeKey(k) } }
                            report.rowsWithGaps.append(.init(
                                table: table?.schema.name ?? "?", key: key ?? RowKey([]), keptFrom: lsn, missing: prev, beforeHorizon: beforeHorizon))
                        }
                        break
                    }
                    lsn = prev
                }
                report.operationsBeforeGaps += lsns.count - chain.count
                for (i, l) in chain.enumerated() {
                    // The oldest kept operation starts the row afresh: its predecessor is not in the
                    // new log, and the history walk must not look for it.
                    let record = i == chain.count - 1 && prevOf[l]! != 0 ? try clearingPrevLSN(operations[l]!, lsn: l) : operations[l]!
                    kept.append((l, record))
                }
            }
            kept.sort { $0.lsn < $1.lsn }
            // The new store's last transaction id: the largest among the operations it keeps (0
            // for none), not the damaged store's, which may name a transaction the new log lost
            // (its first operation at or after the new log's end): a write refuses a `lastTxn`
            // not below the next LSN. A format-4 id is the LSN of an operation at or before the
            // one naming it; an older format's counter id never exceeds its operation's LSN (it
            // grew by one per transaction that logged an operation), so it stays below the next LSN.
            var lastTxn: UInt64 = 0
            for (lsn, record) in kept {
                lastTxn = max(lastTxn, try withBytes(record) { (b) throws(StrataError) in try OperationHeader(b).transactionID(at: lsn) })
            }
            report.operationsWithEstimatedTime = try Self.carryTransactionHeaders(&kept, recovered: operations)
            report.rowsWithGaps.sort { $0.keptFrom < $1.keptFrom }

            // What was lost: the LSNs after the horizon, up to the last recovered, not recovered —
            // the holes between consecutive recovered LSNs (a damaged key can make one huge, so
            // they are never enumerated one by one).
            var lost: [ClosedRange<UInt64>] = []
            var expected = meta.horizon + 1
            for lsn in operations.keys.sorted() {
                if lsn > expected { lost.append(expected...(lsn - 1)) }
                expected = lsn + 1
            }
            report.lostRanges = lost
            // Up to the last recovered LSN, as `lostRanges`: beyond it, other databases' 8-byte
            // keys (read as LSNs) would be taken for damaged operations.
            let lastFound = operations.keys.max() ?? 0
            report.damagedOperations = damaged.filter { $0 <= lastFound && operations[$0] == nil }.sorted()
            report.recoveredOperations = kept.count
            if let first = kept.first, let last = kept.last { report.recoveredRange = first.lsn...last.lsn }

            // The new store: the damaged one's identity and schema, then its operations, then views.
            // Built in a hidden folder inside `path` and moved in only when complete (as `replay`
            // does): a salvage that fails or is killed before the views are built must not leave
            // a store that opens with no rows and makes a second salvage into `path` refuse.
            let building = try Store.replayFolder(in: path)
            var completed = false
            defer { if !completed { try? FileManager.default.removeItem(atPath: building) } }
            do {
                do {
                    let store = try Store(path: building)
                    defer { store.close() }
                    try store.env.write { txn in
                        let databases = store.databases
                        try txn.setMeta(MetaKey.catalog, catalogBytes, in: databases)
                        try txn.setMeta(MetaKey.catalogVersion, meta.catalogVersion, in: databases)
                        if let id = meta.entries[MetaKey.clientID] { try txn.setMeta(MetaKey.clientID, id, in: databases) }
                        try txn.setMeta(MetaKey.lastTxn, lastTxn, in: databases)
                        for (key, value) in meta.entries where key.hasPrefix("p:") || key.hasPrefix(MetaKey.pinPrefix) || key.hasPrefix(MetaKey.libraryPrefix) {
                            if key.hasPrefix(MetaKey.pinPrefix), value.count != 8 { continue }
                            try txn.setMeta(key, value, in: databases)
                        }
                        for (lsn, record) in kept {
                            try lmdb { () throws(LMDBError) in
                                var k = lsn.bigEndian
                                try Swift.withUnsafeBytes(of: &k) { (kb) throws(LMDBError) in
                                    try withBytes(record) { (v) throws(LMDBError) in try txn.put(kb, v, in: databases.log, flags: .append) }
                                }
                            }
                        }
                        // The log may have gaps (lost records), which a fold of its tail refuses: the
                        // views are marked current here, and the rebuild below makes them so.
                        if let last = kept.last { try txn.setMeta(MetaKey.viewsLSN, last.lsn, in: databases) }
                        // Operations without a checksum, or with one that does not cover their LSN,
                        // are kept as they are: the new store requires one only after the last of them.
                        let unchecksummed = kept.last { $0.record.first.map { $0 < RecordFormat.checksummedFormat } ?? false }
                        try txn.setMeta(MetaKey.checksumsFrom, (unchecksummed?.lsn ?? 0) + 1, in: databases)
                        let uncovered = kept.last { $0.record.first.map { $0 < RecordFormat.lsnCoveredFormat } ?? false }
                        try txn.setMeta(MetaKey.lsnCoveredFrom, (uncovered?.lsn ?? 0) + 1, in: databases)
                    }
                }
                try beforeBuildingViews()
                // Reopened, so that the catalog and client id just written are the ones in use.
                let store = try Store(path: building)
                defer { store.close() }
                try store.rebuild()
                report.pendingRows = try store.read { try $0.pendingRows().count }
                try store.flush()
            } catch let error as StrataError {
                // Diagnosed here, while the half-built file it looks at is still there.
                throw Store.diagnosingDiskFull(error, writingIn: building)
            }
            try Store.moveReplayedStore(from: building, into: path)
            completed = true
            return report
        }
    }

    /// Makes the first kept operation of each transaction carry the transaction's header
    /// (``RecordFormat``): where the transaction's first operation is lost or left out, the next
    /// kept one is rewritten to carry the header, from the lost one when it was read, else with
    /// the time and schema version of the transaction before it (or, for the first, of the first
    /// one kept with its header). Returns how many operations took such an estimate.
    private static func carryTransactionHeaders(_ kept: inout [(lsn: UInt64, record: [UInt8])], recovered: [UInt64: [UInt8]]) throws(StrataError) -> Int {
        var headers: [(header: OperationHeader, id: UInt64)] = []
        var previous: TransactionHeader? = nil
        for (lsn, record) in kept {
            let h = try withBytes(record) { (b) throws(StrataError) in try OperationHeader(b) }
            headers.append((h, try h.transactionID(at: lsn)))
            if previous == nil { previous = try h.carriedTransaction(at: lsn) }
        }
        var carried = Set<UInt64>()
        var estimatedIDs = Set<UInt64>()
        var estimated = 0
        for i in kept.indices {
            let (lsn, record) = kept[i]
            let (header, id) = headers[i]
            if let own = try header.carriedTransaction(at: lsn) {
                carried.insert(id)
                previous = own
                continue
            }
            if carried.contains(id) {
                if estimatedIDs.contains(id) { estimated += 1 }
                continue
            }
            let transaction: TransactionHeader
            if let first = recovered[id], let t = try withBytes(first, { (b) throws(StrataError) in try OperationHeader(b).carriedTransaction(at: id) }) {
                transaction = t
            } else {
                transaction = TransactionHeader(id: id, timestampMicros: previous?.timestampMicros ?? 0, schemaVersion: previous?.schemaVersion ?? 0)
                estimatedIDs.insert(id)
                estimated += 1
            }
            kept[i].record = try withBytes(record) { (b) throws(StrataError) in try OperationRecord.carrying(transaction, b, lsn: lsn) }
            carried.insert(id)
            previous = transaction
        }
        return estimated
    }

    /// The operation `record`, stored at `lsn`, with its previous LSN set to 0, sealed again for
    /// `lsn` (a format-4 one as format 5, which has its layout).
    private static func clearingPrevLSN(_ record: [UInt8], lsn: UInt64) throws(StrataError) -> [UInt8] {
        try withBytes(record) { (b) throws(StrataError) -> [UInt8] in
            let header = try OperationHeader(b)
            var r = ByteReader(b, offset: header.target.upperBound)
            _ = try r.varint()
            var w = ByteWriter(capacity: record.count)
            w.append(UnsafeRawBufferPointer(rebasing: b[..<header.target.upperBound]))
            w.appendVarint(0)
            w.append(UnsafeRawBufferPointer(rebasing: b[r.offset...]))
            if header.format >= RecordFormat.compactFormat { w.bytes[0] = RecordFormat.operationFormat }
            if header.format >= RecordFormat.checksummedFormat { RecordChecksum.seal(&w, lsn: lsn) }
            return w.bytes
        }
    }
}

/// The pages of an LMDB data file, parsed without LMDB: only what `salvage` needs.
///
/// LMDB's layout (lmdb.h/mdb.c 0.9): pages of `psize` bytes; a 16-byte header (page number,
/// pad, flags, lower/upper free-space bounds, or the overflow page count); on a leaf or branch
/// page an array of 2-byte node offsets after the header; a node is data size (4 bytes in two
/// halves), flags, key size, key, then the data, or, with `F_BIGDATA`, the 8-byte number of the
/// overflow page holding it. A branch node keeps its child's page number where a leaf node keeps
/// the data size and flags (48 bits). Pages 0 and 1 are LMDB's two meta pages (see
/// ``readMeta(_:psize:pageCount:)``). LMDB 0.9 records no transaction id in a page header.
struct RawPages {
    struct Meta {
        var entries: [String: [UInt8]] = [:]
        var lastTxn: UInt64 = 0
        var catalogVersion: UInt64 = 0
        var horizon: UInt64 = 0
        var checksumsFrom: UInt64?
        var lsnCoveredFrom: UInt64?

        init(entries: [String: [UInt8]]) {
            self.entries = entries
            func counter(_ key: String) -> UInt64 {
                guard let v = entries[key], v.count == 8 else { return 0 }
                let n = RawPages.u64be(v)
                return n <= Counter.limit ? n : 0
            }
            lastTxn = counter(MetaKey.lastTxn)
            catalogVersion = counter(MetaKey.catalogVersion)
            horizon = counter(MetaKey.horizon)
            if entries[MetaKey.checksumsFrom] != nil { checksumsFrom = counter(MetaKey.checksumsFrom) }
            if entries[MetaKey.lsnCoveredFrom] != nil { lsnCoveredFrom = counter(MetaKey.lsnCoveredFrom) }
        }
    }

    let pageCount: Int
    var unreadable = 0
    /// `(LSN, record)` for each 8-byte-keyed entry of a leaf page, in file order.
    var logCandidates: [(UInt64, [UInt8])] = []
    /// Each leaf page holding a `catalog` entry, with its other entries: what salvage falls back
    /// on when ``metaTree`` is `nil`.
    var metaCandidates: [Meta] = []
    /// `meta` as LMDB's meta pages lead to it (``readMeta(_:psize:pageCount:)``), `nil` when
    /// that way finds no catalog.
    var metaTree: Meta?
    /// Whether ``metaTree`` is `meta` whole as of the last committed transaction: both LMDB
    /// meta pages parse and every page of the newer one's `meta` tree was read.
    var metaTreeComplete = false

    private static let headerSize = 16
    private static let leaf: UInt16 = 0x02, branch: UInt16 = 0x01, overflow: UInt16 = 0x04, metaPage: UInt16 = 0x08
    private static let bigData: UInt16 = 0x01, subData: UInt16 = 0x02, dupData: UInt16 = 0x04

    init(_ file: [UInt8]) {
        // The page size is in the meta page (the free database's md_pad); 4 KiB if unreadable.
        var psize = 4096
        if file.count >= 64 {
            let magic = Self.u32(file, 16)
            let stored = Int(Self.u32(file, 40))
            if magic == 0xBEEF_C0DE, stored >= 512, stored <= 65536, stored & (stored - 1) == 0 { psize = stored }
        }
        pageCount = file.count / psize
        var overflowPages = Set<Int>()
        for page in 2..<max(2, pageCount) {
            let base = page * psize
            let flags = Self.u16(file, base + 10)
            guard Self.u64(file, base) == UInt64(page) else {
                if !overflowPages.contains(page) { unreadable += 1 }
                continue
            }
            if flags & Self.overflow != 0 {
                let n = Int(Self.u32(file, base + 12))
                if n > 0, n < pageCount { for p in page..<min(pageCount, page + n) { overflowPages.insert(p) } }
                continue
            }
            guard flags & Self.leaf != 0, flags & (Self.branch | Self.metaPage) == 0 else { continue }
            guard let parsed = Self.parsePage(file, psize: psize, pageCount: pageCount, page: page) else {
                unreadable += 1
                continue
            }
            var metaEntries: [String: [UInt8]] = [:]
            var allTextKeys = true
            for node in parsed.nodes where node.flags & (Self.subData | Self.dupData) == 0 {
                guard let value = node.value else { continue }
                let key = node.key
                if key.count == 8 {
                    logCandidates.append((Self.u64be(key), value))
                }
                if let name = Self.metaName(key) {
                    metaEntries[name] = value
                } else {
                    allTextKeys = false
                }
            }
            if allTextKeys, metaEntries[MetaKey.catalog] != nil {
                metaCandidates.append(Meta(entries: metaEntries))
            }
        }
        if let read = Self.readMeta(file, psize: psize, pageCount: pageCount), read.entries[MetaKey.catalog] != nil {
            metaTree = Meta(entries: read.entries)
            metaTreeComplete = read.complete
        }
    }

    /// `key` as a `meta` key: text, ASCII names and property names, which may be any UTF-8 (a
    /// page of log or view keys holds binary ones). `nil` for anything else.
    private static func metaName(_ key: [UInt8]) -> String? {
        guard !key.isEmpty, let name = String(validating: key, as: UTF8.self),
              name.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F })
        else { return nil }
        return name
    }

    // MARK: Pages

    /// A node of a leaf or branch page.
    struct Node {
        var key: [UInt8]
        var flags: UInt16
        /// A leaf node's data, read from its overflow pages with `F_BIGDATA`; `nil` when it does
        /// not lie within the file, and for a branch node.
        var value: [UInt8]?
        /// A branch node's child page number.
        var child: UInt64
    }

    /// The nodes of the leaf or branch page `page`, in the page's (key) order, or `nil` when the
    /// page's header does not parse. `complete` is false when a node was left out because it
    /// does not lie within the page.
    private static func parsePage(_ file: [UInt8], psize: Int, pageCount: Int, page: Int) -> (isLeaf: Bool, nodes: [Node], complete: Bool)? {
        let base = page * psize
        guard base + psize <= file.count, u64(file, base) == UInt64(page) else { return nil }
        let flags = u16(file, base + 10)
        let isLeaf = flags & leaf != 0
        guard isLeaf != (flags & branch != 0), flags & (overflow | metaPage) == 0 else { return nil }
        let lower = Int(u16(file, base + 12))
        let upper = Int(u16(file, base + 14))
        guard lower >= headerSize, lower <= upper, upper <= psize, (lower - headerSize) % 2 == 0 else { return nil }
        var nodes: [Node] = []
        var complete = true
        for i in 0..<(lower - headerSize) / 2 {
            let offset = Int(u16(file, base + headerSize + 2 * i))
            guard offset >= upper, offset + 8 <= psize else { complete = false; continue }
            let node = base + offset
            let size = Int(u16(file, node)) | Int(u16(file, node + 2)) << 16
            let nodeFlags = u16(file, node + 4)
            let keySize = Int(u16(file, node + 6))
            guard node + 8 + keySize <= base + psize else { complete = false; continue }
            let key = Array(file[(node + 8)..<(node + 8 + keySize)])
            if !isLeaf {
                nodes.append(Node(key: key, flags: 0, value: nil, child: UInt64(size) | UInt64(nodeFlags) << 32))
                continue
            }
            var value: [UInt8]? = nil
            if nodeFlags & bigData != 0 {
                if node + 16 + keySize <= base + psize {
                    // The page number is damaged data like any other: range-checked before use.
                    let over = Int(clamping: u64(file, node + 8 + keySize))
                    if over > 1, over < pageCount, u64(file, over * psize) == UInt64(over),
                       u16(file, over * psize + 10) & overflow != 0 {
                        let start = over * psize + headerSize
                        if start + size <= file.count { value = Array(file[start..<(start + size)]) }
                    }
                }
            } else if node + 8 + keySize + size <= base + psize {
                value = Array(file[(node + 8 + keySize)..<(node + 8 + keySize + size)])
            }
            nodes.append(Node(key: key, flags: nodeFlags, value: value, child: 0))
        }
        return (isLeaf, nodes, complete)
    }

    // MARK: The meta database's B-tree

    /// Keys from `lower` (included; `nil`: from the first) to `upper` (excluded; `nil`: to the
    /// last), in LMDB's default order (bytes compared as unsigned, a prefix first).
    struct KeyRange {
        var lower: [UInt8]?
        var upper: [UInt8]?

        func contains(_ key: [UInt8]) -> Bool {
            (lower.map { !key.lexicographicallyPrecedes($0) } ?? true) && (upper.map { key.lexicographicallyPrecedes($0) } ?? true)
        }
    }

    /// What a walk down a B-tree read: its leaf entries, and the key ranges of the pages (or, for
    /// one key, the value) it could not read.
    struct TreeRead {
        var entries: [(key: [UInt8], value: [UInt8])] = []
        var holes: [KeyRange] = []
    }

    /// The entries of the B-tree whose root is `root`, each page read only if it parses, lies
    /// within the file, was not met before on the walk and is at most 32 levels down: a damaged
    /// page number must not send the walk into a cycle or outside the file.
    private static func walk(_ file: [UInt8], psize: Int, pageCount: Int, root: UInt64) -> TreeRead {
        var read = TreeRead()
        var visited = Set<UInt64>()
        func visit(_ page: UInt64, _ range: KeyRange, depth: Int) {
            guard depth < 32, page > 1, page < UInt64(pageCount), visited.insert(page).inserted,
                  let parsed = parsePage(file, psize: psize, pageCount: pageCount, page: Int(page))
            else {
                read.holes.append(range)
                return
            }
            let (isLeaf, nodes) = (parsed.isLeaf, parsed.nodes)
            // A branch's first key is not compared (LMDB's search starts at the second; the first
            // is usually empty): its child starts where the branch does.
            let keyed = isLeaf ? nodes[...] : nodes.dropFirst()
            // A node left out, keys out of order or out of the range the parent gave the page:
            // the page is damaged, and what it covers is a hole, though its readable entries
            // are taken (over the other tree's).
            let sound = parsed.complete && (isLeaf || !nodes.isEmpty)
                && keyed.allSatisfy { range.contains($0.key) }
                && zip(keyed, keyed.dropFirst()).allSatisfy { $0.key.lexicographicallyPrecedes($1.key) }
            if !sound { read.holes.append(range) }
            if isLeaf {
                for node in nodes where range.contains(node.key) {
                    if let value = node.value, node.flags & dupData == 0 {
                        read.entries.append((node.key, value))
                    } else {
                        read.holes.append(KeyRange(lower: node.key, upper: node.key + [0]))
                    }
                }
                return
            }
            guard sound else { return }
            // Child i holds the keys from key i up to key i + 1.
            for (i, node) in nodes.enumerated() {
                let child = KeyRange(lower: i == 0 ? range.lower : node.key, upper: i + 1 < nodes.count ? nodes[i + 1].key : range.upper)
                visit(node.child, child, depth: depth + 1)
            }
        }
        visit(root, KeyRange(), depth: 0)
        return read
    }

    /// `meta` read the way LMDB reads it: from the newer of the two meta pages (the higher
    /// transaction id), through the main database's record of `meta`, down `meta`'s B-tree.
    /// `nil` when neither meta page parses.
    ///
    /// LMDB copies on write: every transaction writes new copies of the pages it changes, and
    /// the pages of older versions stay in the file until reused, so a leaf page holding a
    /// property may be found many times over, with older values, and a removed property may
    /// still be on one. LMDB 0.9 records no transaction id in a page, so copies cannot be told
    /// apart by themselves; only the tree a meta page roots says which are current. Its entries
    /// are the last committed transaction's, with removed ones absent.
    ///
    /// Where a page of that tree (or a value's overflow page) is unreadable, the keys it covers
    /// (known from the branch page above it) are taken from the other meta page's tree: the
    /// transaction before, whose pages LMDB does not reuse until two transactions later, so
    /// that tree is intact but for damage. Keys neither tree reads are lost. `complete` is false
    /// then, and when a meta page does not parse (it may have been the newer one).
    static func readMeta(_ file: [UInt8], psize: Int, pageCount: Int) -> (entries: [String: [UInt8]], complete: Bool)? {
        // The meta page (mdb.c's MDB_meta, after the page header): magic at 16, version at 20,
        // then address and map size, the free and main databases' MDB_db (48 bytes each, from
        // 40: md_root is at 40 in one), the last page, the transaction id.
        var metas: [(txnid: UInt64, mainRoot: UInt64)] = []
        for page in 0..<min(2, pageCount) {
            let base = page * psize
            guard u64(file, base) == UInt64(page), u16(file, base + 10) & metaPage != 0,
                  u32(file, base + 16) == 0xBEEF_C0DE, u32(file, base + 20) == 1
            else { continue }
            metas.append((u64(file, base + 144), u64(file, base + 88 + 40)))
        }
        guard !metas.isEmpty else { return nil }
        metas.sort { $0.txnid > $1.txnid }
        let reads = metas.map { readMetaDatabase(file, psize: psize, pageCount: pageCount, mainRoot: $0.mainRoot) }
        let newest = reads[0]
        var entries: [String: [UInt8]] = [:]
        if reads.count > 1, !newest.holes.isEmpty {
            for (key, value) in reads[1].entries where newest.holes.contains(where: { $0.contains(key) }) {
                if let name = metaName(key) { entries[name] = value }
            }
        }
        for (key, value) in newest.entries {
            if let name = metaName(key) { entries[name] = value }
        }
        return (entries, metas.count == 2 && newest.holes.isEmpty)
    }

    /// The `meta` database of the main database rooted at `mainRoot`: the whole key range is a
    /// hole when its record in the main database cannot be read.
    private static func readMetaDatabase(_ file: [UInt8], psize: Int, pageCount: Int, mainRoot: UInt64) -> TreeRead {
        let name = Array(StoreDatabases.names.meta.utf8)
        let main = walk(file, psize: psize, pageCount: pageCount, root: mainRoot)
        // A named database's record: the key is its name, the value its MDB_db (md_root at 40).
        guard let record = main.entries.first(where: { $0.key == name })?.value, record.count == 48 else {
            return TreeRead(entries: [], holes: [KeyRange()])
        }
        let root = u64(record, 40)
        // P_INVALID: an empty database.
        if root == .max { return TreeRead() }
        return walk(file, psize: psize, pageCount: pageCount, root: root)
    }

    private static func u16(_ b: [UInt8], _ i: Int) -> UInt16 {
        i + 2 <= b.count ? UInt16(b[i]) | UInt16(b[i + 1]) << 8 : 0
    }
    private static func u32(_ b: [UInt8], _ i: Int) -> UInt32 {
        i + 4 <= b.count ? (0..<4).reduce(UInt32(0)) { $0 | UInt32(b[i + $1]) << (8 * $1) } : 0
    }
    private static func u64(_ b: [UInt8], _ i: Int) -> UInt64 {
        i + 8 <= b.count ? (0..<8).reduce(UInt64(0)) { $0 | UInt64(b[i + $1]) << (8 * $1) } : .max
    }
    fileprivate static func u64be(_ b: [UInt8]) -> UInt64 { b.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) } }
}

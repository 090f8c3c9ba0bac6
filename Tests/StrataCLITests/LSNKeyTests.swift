import Foundation
import LMDB
@testable import Strata
import Testing

/// Damage to a log record's key, its LSN, which LMDB keeps apart from the record: from log
/// format 5 the record's checksum covers the LSN it is stored under, so a key with a flipped
/// bit, or a record stored under another LSN, is named like a damaged record by every reader of
/// the log, and salvage skips it. (Before, a damaged key made salvage fail and a record whose
/// checksum still matched was folded in at the wrong place; issue 36.)
@Suite struct LSNKeyTests {
    let files = ChecksumTests()

    /// A store opened without the page check at open: the tests reach the readers of the log,
    /// which must stand on their own (an app may open with `checkAtOpen = .none`, and a damaged
    /// key that keeps the page's key order passes every page check).
    func open(_ path: String) throws -> Store {
        var options = StoreOptions()
        options.checkAtOpen = .none
        return try Store(path: path, options: options)
    }

    func fileBytes(_ path: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb")) }

    /// The raw records of the store's log, by LSN.
    func records(_ store: Store) throws -> [UInt64: [UInt8]] {
        try store.env.read { txn in
            try txn.withCursor(store.databases.log) { c in
                var out: [UInt64: [UInt8]] = [:]
                var e = try c.first()
                while let x = e {
                    out[try Counter.lsn(key: x.key)] = Array(x.value)
                    e = try c.next()
                }
                return out
            }
        }
    }

    func carriesTransaction(_ record: [UInt8]) throws -> Bool {
        try withBytes(record) { (b) throws(StrataError) in try OperationHeader(b).carriesTransaction }
    }

    /// The offsets in `path`'s data file of every copy of `record` (LMDB leaves older copies of
    /// pages behind, which salvage would find intact).
    func copies(of record: [UInt8], in path: String) throws -> [Int] {
        let file = try [UInt8](fileBytes(path))
        return (0...(file.count - record.count)).filter { file[$0..<($0 + record.count)].elementsEqual(record) }
    }

    /// A bit flip in the key of LSN 9 (the prepared store's edit of task 1) makes it LSN 1, out
    /// of the page's key order: the page check sees the order, and each reader of the log sees
    /// that the record's checksum does not cover the key it is under.
    @Test func aFlippedBitInAnLSNKeyIsNamedByEveryReader() throws {
        try files.withClosedStore { path in
            let (_, record) = try files.locate(path, lsn: 9)
            #expect(record[0] == RecordFormat.operationFormat)
            // A node's key (8 bytes, big-endian) lies just before its value: its last byte, 9,
            // becomes 1, in every copy of the record.
            for offset in try copies(of: record, in: path) { try files.flip(path, at: offset - 1, bit: 3) }
            let expected = "the operation at LSN 1 is damaged: its checksum does not cover LSN 1, the key it is stored under: it was sealed as LSN 9"

            // The page check: the keys of the log's leaf are out of order.
            let check = try Store.check(at: path)
            #expect(check.isDamaged && check.findings.contains { $0.database == "log" }, "\(check)")
            let cli = try runStrata(["check", path])
            #expect(cli.status == 3, "\(cli.status) \(cli.out) \(cli.err)")

            let store = try open(path)
            // verify names the record by the LSN it is under, and what is wrong.
            let report = try store.verify()
            #expect(!report.isConsistent && report.damagedOperations.map(\.lsn) == [1], "\(report)")
            #expect(report.description.contains("LSN 1: its checksum does not cover LSN 1"), "\(report)")

            // rebuild refuses, naming it, and leaves the store as it was.
            let before = try fileBytes(path)
            let rows = try store.read { try $0.rows("tasks", includingDeleted: true) }
            let rebuild = try #require(throws: StrataError.self) { try store.rebuild() }
            #expect(rebuild.code == .corruptRecord && rebuild.message.hasPrefix(expected), "\(rebuild)")
            #expect(try fileBytes(path) == before)
            #expect(try store.read { try $0.rows("tasks", includingDeleted: true) } == rows)

            // The log listing meets it at the key it is under; the history of task 1 looks for
            // LSN 9, which is gone.
            let listing = try #require(throws: StrataError.self) { try store.read { try $0.operations() } }
            #expect(listing.code == .corruptRecord && listing.message.hasPrefix(expected), "\(listing)")
            let history = try #require(throws: StrataError.self) { try store.read { try $0.history("tasks", key: 1) } }
            #expect(history.code == .corruptRecord && history.message.contains("LSN 9"), "\(history)")
            // Compaction folds from the log's start: it stops at the record, the store unchanged.
            let compact = try #require(throws: StrataError.self) { try store.compact(retaining: .operations(0)) }
            #expect(compact.code == .corruptRecord && compact.message.contains("does not cover LSN 1"), "\(compact)")
            #expect(try fileBytes(path) == before)
            store.close()

            let verify = try runStrata(["verify", path, "--no-check"])
            #expect(verify.status == 1 && verify.out.contains("LSN 1: its checksum does not cover LSN 1"), "\(verify.status) \(verify.out) \(verify.err)")
            let log = try runStrata(["log", path, "--no-check"])
            #expect(log.status != 0 && log.err.contains("does not cover LSN 1"), "\(log.status) \(log.err)")

            // salvage skips it: LSN 9 is lost, the rest is kept, and the new store verifies.
            let recovered = path + "-salvaged"
            defer { try? FileManager.default.removeItem(atPath: recovered) }
            let salvage = try Store.salvage(from: path, into: recovered)
            #expect(salvage.lostRanges == [9...9] && salvage.recoveredOperations == 12, "\(salvage)")
            let copy = try Store(path: recovered)
            defer { copy.close() }
            #expect(try copy.verify().isConsistent)
            #expect(try copy.read { try $0.operations().map(\.lsn) } == [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13])
            #expect(try copy.read { try $0.row("tasks", key: 1)?["title"] } == "t1")
        }
    }

    /// The last key of the log keeps the page's key order whatever it becomes: only the
    /// checksum sees it. In the log's tail (after the checkpointed views), the open's fold of
    /// the tail names it rather than a gap in the log.
    @Test func aFlippedBitInTheLastKeyIsNamedByTheFoldOfTheTail() throws {
        try withPreparedStore { path, store in
            try store.write { tx in try tx.update("tasks", key: 4, ["title": "tail"]) }  // LSN 14
            store.close()
            // As a process that stopped before its checkpoint leaves it: LSN 14 in the tail.
            do {
                var options = EnvironmentOptions()
                options.maxDatabases = 16
                let env = try Environment(path: path, options: options)
                let meta = try env.write { try $0.openDatabase("meta") }
                try env.write { txn in try txn.put(Array("viewsLSN".utf8), withUnsafeBytes(of: UInt64(13).bigEndian) { Array($0) }, in: meta) }
            }
            let (offset, _) = try files.locate(path, lsn: 14)
            // 14 becomes 14 + 2^40: still the last key, in order.
            try files.flip(path, at: offset - 6, bit: 0)
            #expect(try Store.check(at: path).isClean)
            let error = try #require(throws: StrataError.self) {
                let reopened = try Store(path: path)
                defer { reopened.close() }
                _ = try reopened.read { try $0.row("tasks", key: 4) }
            }
            let damagedKey = UInt64(14) + 1 << 40
            #expect(error.code == .corruptRecord, "\(error)")
            #expect(error.message.hasPrefix("the operation at LSN \(damagedKey) is damaged: its checksum does not cover LSN \(damagedKey), the key it is stored under: it was sealed as LSN 14"), "\(error)")
        }
    }

    /// A record stored under another LSN, whole and with a matching checksum of its content (a
    /// page assembled from the wrong copies, a tool that rewrote the log): every reader refuses
    /// it where it is, and salvage does not take it for the operation at that LSN.
    @Test func aRecordUnderAnotherLSNIsRefused() throws {
        try files.withClosedStore { path in
            let (original, five): ([LogEntry], [UInt8]) = try {
                let store = try Store(path: path)
                defer { store.close() }
                return (try store.read { try $0.operations() }, try #require(try records(store)[5]))
            }()
            do {
                var options = EnvironmentOptions()
                options.maxDatabases = 16
                let env = try Environment(path: path, options: options)
                let log = try env.write { try $0.openDatabase("log") }
                // LSN 5's record (task 1's acknowledgement) put in place of LSN 7's.
                try env.write { txn in try txn.put(withUnsafeBytes(of: UInt64(7).bigEndian) { Array($0) }, five, in: log) }
            }
            let store = try open(path)
            let report = try store.verify()
            #expect(report.damagedOperations.map(\.description) == ["LSN 7: its checksum does not cover LSN 7, the key it is stored under: it was sealed as LSN 5, so its key is damaged or it was moved"], "\(report)")
            let before = try fileBytes(path)
            let rebuild = try #require(throws: StrataError.self) { try store.rebuild() }
            #expect(rebuild.code == .corruptRecord && rebuild.message.contains("LSN 7"), "\(rebuild)")
            #expect(try fileBytes(path) == before)
            // LSN 7 acknowledged task 3: its history reads LSN 7.
            let history = try #require(throws: StrataError.self) { try store.read { try $0.history("tasks", key: 3) } }
            #expect(history.code == .corruptRecord && history.message.contains("sealed as LSN 5"), "\(history)")
            store.close()

            // Salvage never recovers the moved record as LSN 7; it may find LSN 7's own record
            // in an older copy of the page, which LMDB leaves in the file.
            let recovered = path + "-salvaged"
            defer { try? FileManager.default.removeItem(atPath: recovered) }
            let salvage = try Store.salvage(from: path, into: recovered)
            let copy = try Store(path: recovered)
            defer { copy.close() }
            #expect(try copy.verify().isConsistent)
            let ops = try copy.read { try $0.operations() }
            let byLSN = Dictionary(uniqueKeysWithValues: original.map { ($0.lsn, $0) })
            #expect(ops.allSatisfy { $0 == byLSN[$0.lsn] }, "\(salvage)")
            #expect(salvage.lostRanges == [] || salvage.lostRanges == [7...7], "\(salvage)")
        }
    }

    /// Compaction and salvage rewrite a record only under the LSN it had, and seal it for that
    /// LSN: their output verifies, and the rewritten record read under another key does not.
    @Test func compactionAndSalvageSealWhatTheyRewriteForItsLSN() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-lsnkey-\(UUID().uuidString)").path
        let (salvaged, compacted) = (path + "-salvaged", path + "-compacted")
        defer { for p in [path, salvaged, compacted] { try? FileManager.default.removeItem(atPath: p) } }
        do {
            let store = try Store(path: path)
            defer { store.close() }
            try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title")]))
            try store.write { tx in
                for i in 1...6 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)")]) }
                for i in 1...6 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
            }  // 1–12, one transaction
            try store.write { tx in try tx.update("tasks", key: 2, ["title": "u"]) }  // 13
        }
        // Salvage with LSN 1 (task 1's insert, which carries the transaction's header) damaged
        // in every copy: LSN 2 is rewritten to carry the header, and LSN 7 (task 1's
        // acknowledgement) to start the row's chain afresh.
        let (_, first) = try files.locate(path, lsn: 1)
        for offset in try copies(of: first, in: path) { try files.flip(path, at: offset + first.count - 1, bit: 0) }
        let report = try Store.salvage(from: path, into: salvaged)
        #expect(report.lostRanges == [1...1] && report.recoveredOperations == 12, "\(report)")
        do {
            let store = try Store(path: salvaged)
            defer { store.close() }
            #expect(try store.verify().isConsistent)
            let log = try records(store)
            let rules = try store.env.read { try $0.checksumRules(in: store.databases) }
            #expect(rules == .everyOperation)
            let (two, seven) = (try #require(log[2]), try #require(log[7]))
            #expect(try carriesTransaction(two) && !carriesTransaction(seven))
            for (lsn, record) in [(UInt64(2), two), (7, seven)] {
                #expect(record[0] == RecordFormat.operationFormat)
                #expect(record.withUnsafeBytes { RecordChecksum.status($0, lsn: lsn, rules: rules) } == .valid)
                #expect(record.withUnsafeBytes { RecordChecksum.status($0, lsn: lsn + 1, rules: rules) } != .valid)
            }
        }

        // Compaction whose horizon splits the transaction: LSN 6 is rewritten to carry the header.
        do {
            let store = try Store(path: compacted)
            defer { store.close() }
            try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title")]))
            try store.write { tx in
                for i in 1...6 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)")]) }
                for i in 1...6 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
            }
            try store.write { tx in try tx.update("tasks", key: 2, ["title": "u"]) }
            let report = try store.compact(retaining: .operations(8))
            #expect(report.horizon == 5)
            #expect(try store.verify().isConsistent)
            let six = try #require(try records(store)[6])
            #expect(try carriesTransaction(six))
            #expect(six.withUnsafeBytes { RecordChecksum.status($0, lsn: 6, rules: .everyOperation) } == .valid)
            #expect(six.withUnsafeBytes { RecordChecksum.status($0, lsn: 7, rules: .everyOperation) } != .valid)
            try store.rebuild()
            #expect(try store.verify().isConsistent)
        }
    }

    /// The checksum's LSN term: every single-bit change of a key is caught, and the LSN the
    /// record was sealed as is named.
    @Test func everyBitOfTheKeyIsCovered() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-lsnkey-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        do {
            let store = try Store(path: path)
            defer { store.close() }
            try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title")]))
            try store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a"]) }
            let record = try #require(try records(store)[1])
            var missed: [Int] = []
            for bit in 0..<64 {
                let lsn = UInt64(1) ^ (1 << UInt64(bit))
                let status = record.withUnsafeBytes { RecordChecksum.status($0, lsn: lsn, rules: .everyOperation) }
                if !(status == .damaged("its checksum does not cover LSN \(lsn), the key it is stored under: it was sealed as LSN 1, so its key is damaged or it was moved")) {
                    missed.append(bit)
                }
            }
            #expect(missed.isEmpty, "\(missed)")
        }
    }
}

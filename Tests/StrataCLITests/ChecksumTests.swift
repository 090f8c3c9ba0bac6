import Foundation
import LMDB
@testable import Strata
import StrataSync
import Testing

/// Damage inside log records, which LMDB cannot see: every operation carries a CRC-32C
/// (operation format 3), so verify names each damaged one by LSN, rebuild refuses it, salvage
/// skips it and the history reads refuse it.
@Suite struct ChecksumTests {
    /// The prepared store (see `withPreparedStore`: LSNs 1–13, 9 the edit of task 1, 12 the
    /// edit of task 3, 13 the server's change of it), checkpointed and closed; `body` gets the
    /// folder and may damage it.
    func withClosedStore(_ body: (String) throws -> Void) throws {
        try withPreparedStore { path, store in
            try store.checkpoint()
            store.close()
            try body(path)
        }
    }

    /// The record at `lsn` of the store at `path` and where it lies in `data.mdb`.
    func locate(_ path: String, lsn: UInt64) throws -> (offset: Int, record: [UInt8]) {
        let (page, pageBytes, record): (Int, Int, [UInt8]) = try {
            let env = try Environment(path: path)
            let log = try env.openDatabase("log", create: false)
            return try env.read { txn in
                let value = try #require(try txn.get(withUnsafeBytes(of: lsn.bigEndian) { Array($0) }, in: log))
                return (try #require(env.page(of: value.baseAddress!)), env.pageBytes, Array(value))
            }
        }()
        let file = try [UInt8](Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb")))
        let pageStart = page * pageBytes
        let matches = (pageStart...(pageStart + pageBytes - record.count)).filter { file[$0..<($0 + record.count)].elementsEqual(record) }
        try #require(matches.count == 1, "the record at LSN \(lsn) is found \(matches.count) times in its page")
        return (matches[0], record)
    }

    /// Flips bit `bit` of the byte at `offset` of `path`'s data file.
    func flip(_ path: String, at offset: Int, bit: Int) throws {
        let handle = try #require(FileHandle(forUpdatingAtPath: path + "/data.mdb"))
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(offset))
        var byte = try #require(try handle.read(upToCount: 1)).first!
        byte ^= 1 << UInt8(bit)
        try handle.seek(toOffset: UInt64(offset))
        try handle.write(contentsOf: [byte])
    }

    func fileBytes(_ path: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb")) }

    @Test func aFlippedBitInARecordsEntriesIsReportedRefusedAndSalvagedAround() throws {
        try withClosedStore { path in
            let (_, record) = try locate(path, lsn: 9)
            #expect(record[0] == RecordFormat.operationFormat)
            // The last byte: inside the new title of task 1. In every copy of the record in the
            // file (LMDB leaves older copies of pages behind, which salvage would find intact).
            let file = try [UInt8](fileBytes(path))
            let copies = (0...(file.count - record.count)).filter { file[$0..<($0 + record.count)].elementsEqual(record) }
            for offset in copies { try flip(path, at: offset + record.count - 1, bit: 0) }

            let store = try Store(path: path)
            let report = try store.verify()
            #expect(!report.isConsistent)
            #expect(report.damagedOperations.map(\.lsn) == [9])
            #expect(report.operationsWithoutChecksum == 0)
            #expect(report.description.contains("damaged: LSN 9: its checksum does not match"), "\(report)")

            // rebuild refuses, naming the LSN, and leaves the store as it was.
            let before = try fileBytes(path)
            let rows = try store.read { try $0.rows("tasks", includingDeleted: true) }
            let error = try #require(throws: StrataError.self) { try store.rebuild() }
            #expect(error.code == .corruptRecord && error.message.contains("LSN 9"), "\(error)")
            #expect(try fileBytes(path) == before)
            #expect(try store.read { try $0.rows("tasks", includingDeleted: true) } == rows)

            // The history reads refuse it too (a timestamp or kind read from damage is not shown).
            let history = try #require(throws: StrataError.self) { try store.read { try $0.history("tasks", key: 1) } }
            #expect(history.code == .corruptRecord && history.message.contains("LSN 9"))
            #expect(throws: StrataError.self) { try store.read { try $0.operations() } }
            #expect(try store.read { try $0.history("tasks", key: 4) }.count == 2)
            store.close()

            let cli = try runStrata(["verify", path])
            #expect(cli.status == 1 && cli.out.contains("LSN 9"), "\(cli.status) \(cli.out) \(cli.err)")
            let log = try runStrata(["log", path])
            #expect(log.status != 0 && log.err.contains("LSN 9"), "\(log.status) \(log.err)")

            // salvage skips it, reports it lost, and keeps the rest: pending edits stay pending.
            let recovered = path + "-salvaged"
            defer { try? FileManager.default.removeItem(atPath: recovered) }
            let salvage = try Store.salvage(from: path, into: recovered)
            #expect(salvage.damagedOperations == [9])
            #expect(salvage.lostRanges == [9...9])
            #expect(salvage.recoveredOperations == 12)
            let copy = try Store(path: recovered)
            defer { copy.close() }
            #expect(try copy.verify().isConsistent)
            let pending = try copy.read { try $0.pendingRows("tasks").map { "\($0.key) \($0.status)" } }
            #expect(pending == ["2 deleted", "3 updated", "5 inserted"])
            // Task 1 keeps what the operations before the damaged one made it: synced, unedited.
            #expect(try copy.read { try $0.row("tasks", key: 1) }.map { "\($0["title"]) \($0.isPending)" } == "\"t1\" false")
        }
    }

    /// Every single-bit flip in one record's header — format, checksum, kind, origin,
    /// transaction, timestamp, target, previous LSN, flags — is reported by verify at that LSN.
    /// (Before checksums, 13 of 300 random flips moved timestamps and 3 made `strata log` fail,
    /// while verify said "consistent".)
    @Test func everyBitOfARecordHeaderIsCovered() throws {
        try withClosedStore { path in
            let lsn: UInt64 = 12
            let (offset, record) = try locate(path, lsn: lsn)
            let headerBytes = try withBytes(record) { (b) throws(StrataError) in try OperationHeader(b).entriesStart }
            let pristine = try fileBytes(path)
            var missed: [String] = []
            for byte in 0..<headerBytes {
                for bit in 0..<8 {
                    try pristine.write(to: URL(fileURLWithPath: path + "/data.mdb"))
                    try flip(path, at: offset + byte, bit: bit)
                    let store = try Store(path: path)
                    defer { store.close() }
                    let report = try store.verify()
                    if report.damagedOperations.map(\.lsn) != [lsn] || report.isConsistent {
                        missed.append("byte \(byte) bit \(bit): \(report)")
                    }
                }
            }
            print("ChecksumTests: \(headerBytes * 8) single-bit flips in the header of LSN \(lsn), \(missed.count) missed")
            #expect(missed.isEmpty, "\(missed)")
        }
    }

    /// A damaged operation in the log's tail (after the checkpointed views): opening the store
    /// folds the tail, and refuses the damaged operation rather than showing a wrong view.
    @Test func aDamagedOperationInTheTailIsRefusedOnOpen() throws {
        try withPreparedStore { path, store in
            try store.write { tx in try tx.update("tasks", key: 4, ["title": "tail"]) }
            store.close()
            // As a process that stopped before its checkpoint leaves it: views through LSN 13
            // (closing checkpointed LSN 14 too; folding it again changes nothing), LSN 14 in the tail.
            do {
                var options = EnvironmentOptions()
                options.maxDatabases = 16
                let env = try Environment(path: path, options: options)
                let meta = try env.write { try $0.openDatabase("meta") }
                try env.write { txn in try txn.put(Array("viewsLSN".utf8), withUnsafeBytes(of: UInt64(13).bigEndian) { Array($0) }, in: meta) }
            }
            let (offset, record) = try locate(path, lsn: 14)
            try flip(path, at: offset + record.count - 2, bit: 3)
            let error = try #require(throws: StrataError.self) {
                let reopened = try Store(path: path)
                defer { reopened.close() }
                _ = try reopened.read { try $0.row("tasks", key: 4) }
            }
            #expect(error.code == .corruptRecord && error.message.contains("LSN 14"), "\(error)")
        }
    }

    /// Compaction folds operations into the base snapshot and deletes them: a damaged one stops
    /// it, named, and the store is left as it was.
    @Test func compactionRefusesADamagedOperation() throws {
        try withClosedStore { path in
            // LSN 4 inserted task 4, acknowledged at LSN 8: foldable (nothing pending before 9).
            let (offset, record) = try locate(path, lsn: 4)
            try flip(path, at: offset + record.count / 2, bit: 5)
            let before = try fileBytes(path)
            let store = try Store(path: path)
            defer { store.close() }
            let error = try #require(throws: StrataError.self) { try store.compact(retaining: .operations(0)) }
            #expect(error.code == .corruptRecord && error.message.contains("LSN 4"), "\(error)")
            #expect(try fileBytes(path) == before)
            #expect(try store.read { try $0.horizon } == 0)
        }
    }

    /// A replay reads every operation it copies as evidence: through a damaged one it fails,
    /// naming it, and leaves no store (and no half-built folder) at its destination; a replay that
    /// stops before the damage is whole.
    @Test func aReplayThroughADamagedOperationFailsAndLeavesNoStore() throws {
        try withClosedStore { path in
            let (offset, record) = try locate(path, lsn: 4)
            try flip(path, at: offset + record.count / 2, bit: 3)
            let store = try Store(path: path)
            defer { store.close() }
            let target = path + "-replay"
            defer { try? FileManager.default.removeItem(atPath: target) }
            let error = try #require(throws: StrataError.self) { try store.replay(into: target) }
            #expect(error.code == .corruptRecord && error.message.contains("LSN 4"), "\(error)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: target) == [], "nothing is left at the destination")
            let before = try store.replay(into: target, through: 3)
            defer { before.close() }
            #expect(try before.read { try $0.lastLSN } == 3)
            #expect(try before.verify().isConsistent)
        }
    }

    /// Salvage when the first operation of a transaction — the one that carries its header (log
    /// format 4) — is lost: the transaction's other operations are kept, the first of them
    /// rewritten to carry a header with the same transaction id and an estimated time.
    @Test func salvageKeepsATransactionWhoseFirstOperationIsLost() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-salvage-\(UUID().uuidString)").path
        let recovered = path + "-salvaged"
        defer { for p in [path, recovered] { try? FileManager.default.removeItem(atPath: p) } }
        do {
            let store = try Store(path: path)
            try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title")]))
            try store.write { tx in for i in 1...5 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)")]) } }  // 1–5
            try store.write { tx in for i in 2...4 { try tx.update("tasks", key: .init(.int(Int64(i))), ["title": "u"]) } }  // 6–8
            try store.write { tx in try tx.update("tasks", key: 5, ["title": "last"]) }  // 9
            try store.checkpoint()
            store.close()
        }
        let original: [LogEntry] = try {
            let store = try Store(path: path)
            defer { store.close() }
            return try store.read { try $0.operations() }
        }()
        // Damage LSNs 1 and 6, the first operations of their transactions, in every copy.
        for lsn: UInt64 in [1, 6] {
            let (_, record) = try locate(path, lsn: lsn)
            let file = try [UInt8](fileBytes(path))
            for offset in (0...(file.count - record.count)).filter({ file[$0..<($0 + record.count)].elementsEqual(record) }) {
                try flip(path, at: offset + record.count - 1, bit: 0)
            }
        }
        let report = try Store.salvage(from: path, into: recovered)
        #expect(report.damagedOperations == [1, 6] && report.lostRanges == [1...1, 6...6], "\(report)")
        #expect(report.recoveredOperations == 7)
        #expect(report.operationsWithEstimatedTime == 6, "\(report)")
        #expect(report.description.contains("6 operation(s) lost the first operation of their transaction"), "\(report)")

        let copy = try Store(path: recovered)
        defer { copy.close() }
        #expect(try copy.verify().isConsistent)
        let ops = try copy.read { try $0.operations() }
        #expect(ops.map(\.lsn) == [2, 3, 4, 5, 7, 8, 9])
        #expect(ops.map(\.transactionID) == [1, 1, 1, 1, 6, 6, 9])
        // Nothing recovered before them carries a time: they take the first one recovered whole.
        #expect(ops.allSatisfy { $0.timestamp == original[8].timestamp })
        // Everything but the header is as it was.
        let byLSN = Dictionary(uniqueKeysWithValues: original.map { ($0.lsn, $0) })
        for op in ops {
            let o = try #require(byLSN[op.lsn])
            #expect(op.kind == o.kind && op.key == o.key && op.changes == o.changes && op.schemaVersion == o.schemaVersion)
        }
        #expect(try copy.read { try $0.row("tasks", key: 3)?["title"] } == "u")
        #expect(try copy.read { try $0.row("tasks", key: 2)?["title"] } == "t2")
    }
}

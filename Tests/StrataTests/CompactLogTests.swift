import Foundation
import LMDB
@testable import Strata
import Testing

/// Log format 4 (``RecordFormat``): a transaction's header (id, time, schema version) is written
/// once, in its first logged operation; the others name it by their distance back.
@Suite struct CompactLogTests {
    /// The raw records of the log, by LSN (from LMDB: checkpoint first is not needed, the log is
    /// always LMDB's).
    static func records(_ store: Store) throws -> [UInt64: [UInt8]] {
        var out: [UInt64: [UInt8]] = [:]
        try store.env.read { txn in
            try txn.withCursor(store.databases.log) { c in
                var e = try c.first()
                while let x = e {
                    out[try Counter.lsn(key: x.key)] = Array(x.value)
                    e = try c.next()
                }
            }
        }
        return out
    }

    static func header(_ record: [UInt8]?) throws -> OperationHeader {
        let r = try #require(record)
        return try withBytes(r) { (b) throws(StrataError) in try OperationHeader(b) }
    }

    @Test func theFirstLoggedOperationCarriesTheTransactionsHeader() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in try tx.insert("tasks", ["id": 1, "title": "a"]) }
            try store.write { tx in
                // Neither an edit that changes nothing nor one that fails logs an operation, so
                // neither may take the header with it.
                try tx.update("tasks", key: 1, ["title": "a"])
                #expect(throws: StrataError.self) { try tx.insert("tasks", ["id": 1, "title": "again"]) }
                try tx.update("tasks", key: 1, ["title": "b"])
                try tx.insert("tasks", ["id": 2, "title": "c"])
                try tx.insert("tasks", ["id": 3, "title": "d"])
            }
            let ops = try store.read { try $0.operations() }
            #expect(ops.map(\.lsn) == [1, 2, 3, 4])
            #expect(ops.map(\.transactionID) == [1, 2, 2, 2])
            #expect(Set(ops.dropFirst().map(\.timestamp)).count == 1 && ops[1].timestamp >= ops[0].timestamp)

            let records = try Self.records(store)
            #expect(records.values.allSatisfy { $0[0] == RecordFormat.operationFormat })
            #expect(try [1, 2, 3, 4].map { try Self.header(records[$0]).carriesTransaction } == [true, true, false, false])
            // What the header costs: two operations alike but for it differ by at least the
            // timestamp (µs since 1970 takes 7 bytes as a varint).
            try store.write { tx in
                try tx.insert("tasks", ["id": 10, "title": "x"])
                try tx.insert("tasks", ["id": 11, "title": "x"])
            }
            let r = try Self.records(store)
            #expect(r[5]!.count - r[6]!.count >= 7, "the carrier \(r[5]!.count) bytes, the next \(r[6]!.count)")

            // History reads each operation's transaction from its first operation.
            #expect(try store.read { try $0.history("tasks", key: 3) }.map(\.transactionID) == [2])
            #expect(try store.read { try $0.history("tasks", key: 1) }.map(\.transactionID) == [1, 2])
        }
    }

    @Test func aSchemaChangeInsideATransactionIsRecordedPerOperation() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.createTable(.propertyBag("bag", key: [.string("k")]))
            let before = try store.read { try $0.catalog.version }
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "a"])
                // A new property-bag field changes the schema within the transaction.
                try tx.insert("bag", ["k": "x", "colour": "red"])
                try tx.insert("tasks", ["id": 2, "title": "b"])
            }
            let ops = try store.read { try $0.operations() }
            #expect(ops.map(\.schemaVersion) == [before, before + 1, before + 1])
            #expect(try store.read { try $0.catalog.version } == before + 1)
            let records = try Self.records(store)
            #expect(try !Self.header(records[2]).carriesTransaction && !Self.header(records[3]).carriesTransaction)
        }
    }

    @Test func compactionThatSplitsATransactionMovesItsHeader() throws {
        try withStore { store, path in
            try store.createTable(tasksSchema)
            try store.write { tx in
                for i in 1...6 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)")]) }
                for i in 1...6 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
            }
            try store.write { tx in
                try tx.update("tasks", key: 1, ["title": "u"])
                try tx.acknowledge("tasks", key: 1)
            }
            let before = try store.read { try $0.operations() }
            #expect(before.count == 14 && before.prefix(12).allSatisfy { $0.transactionID == 1 })

            // Horizon 5: the first transaction keeps 7 of its 12 operations.
            let report = try store.compact(retaining: .operations(9))
            #expect(report.horizon == 5 && report.foldedOperations == 5)
            #expect(try store.read { try $0.operations() } == Array(before.dropFirst(5)))
            var records = try Self.records(store)
            #expect(try Self.header(records[6]).carriesTransaction && !Self.header(records[7]).carriesTransaction)
            #expect(try store.verify().isConsistent)
            #expect(try store.read { try $0.history("tasks", key: 6) }.map(\.lsn) == [6, 12])

            // Again inside the same transaction: the header moves on.
            try store.compact(retaining: .operations(5))
            #expect(try store.read { try $0.operations() } == Array(before.dropFirst(9)))
            records = try Self.records(store)
            #expect(try Self.header(records[10]).carriesTransaction && !Self.header(records[11]).carriesTransaction)

            // A reopened store, a rebuild and a replay read the same log.
            store.close()
            let reopened = try Store(path: path)
            defer { reopened.close() }
            #expect(try reopened.read { try $0.operations() } == Array(before.dropFirst(9)))
            try reopened.rebuild()
            #expect(try reopened.verify().isConsistent)
            try withTemporaryFolder { copy in
                let replayed = try reopened.replay(into: copy + "/replayed")
                defer { replayed.close() }
                #expect(try replayed.read { try $0.operations() } == Array(before.dropFirst(9)))
                // Salvage finds the moved header (LMDB may also have left the record's older
                // copy, without it, in the file): nothing is estimated.
                let salvage = try Store.salvage(from: path, into: copy + "/salvaged")
                #expect(salvage.operationsWithEstimatedTime == 0 && salvage.recoveredOperations == 5, "\(salvage)")
                let salvaged = try Store(path: copy + "/salvaged")
                defer { salvaged.close() }
                #expect(try salvaged.read { try $0.operations() } == Array(before.dropFirst(9)))
            }
        }
    }

    /// `verify` names an operation whose transaction header no earlier operation carries (here
    /// the first operation of a transaction, removed behind the store's back).
    @Test func verifyNamesOperationsWhoseTransactionHeaderIsMissing() throws {
        try withTemporaryFolder { path in
            do {
                let store = try Store(path: path)
                defer { store.close() }
                try store.createTable(tasksSchema)
                try store.write { tx in for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
                try store.write { tx in try tx.insert("tasks", ["id": 4, "title": "t"]) }
                try store.checkpoint()
                #expect(try store.verify().isConsistent)
            }
            let env = try Environment(path: path, options: { var o = EnvironmentOptions(); o.maxDatabases = 16; return o }())
            let log = try env.write { try $0.openDatabase("log") }
            try env.write { _ = try $0.delete(withUnsafeBytes(of: UInt64(1).bigEndian) { Array($0) }, in: log) }
            let store = try Store(path: path)
            defer { store.close() }
            let report = try store.verify()
            #expect(!report.isConsistent)
            #expect(report.damagedOperations.map(\.lsn) == [2, 3], "\(report)")
            #expect(report.description.contains("belongs to transaction 1, but no operation of that transaction before it in the log carries"), "\(report)")
            let e = #expect(throws: StrataError.self) { try store.read { try $0.operations() } }
            #expect(e?.code == .corruptRecord && e?.message.contains("operation 2 belongs to transaction 1") == true, "\(String(describing: e))")
        }
    }

    /// A damaged format byte cannot make a record read in another layout or as sealed without
    /// its LSN: format 4's and 5's checksums cover their format byte, format 3's does not cover
    /// it but differs from theirs.
    @Test func aFormatByteTurnedIntoTheOtherLayoutIsDamage() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "a"])
                try tx.insert("tasks", ["id": 2, "title": "b"])
            }
            let records = try Self.records(store)
            for lsn: UInt64 in [1, 2] {
                var r = try #require(records[lsn])
                #expect(r.withUnsafeBytes { RecordChecksum.status($0, lsn: lsn, rules: .everyOperation) } == .valid)
                for older: UInt8 in [3, 4] {
                    r[0] = older
                    let status = r.withUnsafeBytes { RecordChecksum.status($0, lsn: lsn, rules: .everyOperation) }
                    #expect(status == .damaged("its checksum does not match its content"), "LSN \(lsn) as format \(older): \(status)")
                }
            }
            // A format-3 record (sealed as format 3 wrote it) read as format 4.
            var w = ByteWriter()
            w.append(records[1]!)
            w.bytes[0] = 3
            RecordChecksum.seal(&w, lsn: 1)
            // Before the store's `lsnCoveredFrom`, a format-3 record is valid without its LSN.
            let older = ChecksumRules(checksumsFrom: 1, lsnCoveredFrom: 2)
            #expect(w.withUnsafeBytes { RecordChecksum.status($0, lsn: 1, rules: older) } == .validWithoutLSN)
            w.bytes[0] = 4
            #expect(w.withUnsafeBytes { RecordChecksum.status($0, lsn: 1, rules: older) } == .damaged("its checksum does not match its content"))
            w.bytes[0] = 5
            #expect(w.withUnsafeBytes { RecordChecksum.status($0, lsn: 1, rules: older) } == .damaged("its checksum does not match its content and LSN 1: the record or its key is damaged"))
        }
    }
}

extension CompactLogTests {
    /// A horizon that splits a transaction after its first operation, whose later operations
    /// step the schema: every operation reads the schema version it had before compaction.
    @Test func compactionThatSplitsATransactionKeepsEachOperationsSchemaVersion() throws {
        try withStore { store, path in
            try store.createTable(tasksSchema)
            try store.createTable(.propertyBag("bag", key: [.string("k")]))
            let version = try store.read { try $0.catalog.version }
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "a"])
                // A new property-bag field changes the schema within the transaction.
                try tx.insert("bag", ["k": "x", "colour": "red"])
                try tx.insert("tasks", ["id": 2, "title": "b"])
            }
            try store.write { tx in
                try tx.acknowledge("tasks", key: 1)
                try tx.acknowledge("bag", key: .init(.string("x")))
                try tx.acknowledge("tasks", key: 2)
            }
            let before = try store.read { try $0.operations() }
            #expect(before.prefix(3).map(\.schemaVersion) == [version, version + 1, version + 1])
            let report = try store.compact(retaining: .after(1))
            #expect(report.horizon == 1)
            let after = try store.read { try $0.operations() }
            #expect(after.map(\.schemaVersion) == before.dropFirst().map(\.schemaVersion))
            #expect(after == Array(before.dropFirst()))
            #expect(try Self.header(Self.records(store)[2]).carriesTransaction)
            #expect(try store.verify().isConsistent)
            // Salvage reads the moved header the same way.
            try store.checkpoint()
            try withTemporaryFolder { copy in
                _ = try Store.salvage(from: path, into: copy)
                let salvaged = try Store(path: copy)
                defer { salvaged.close() }
                #expect(try salvaged.read { try $0.operations() }.map(\.schemaVersion) == after.map(\.schemaVersion))
            }
        }
    }

    /// A log with a gap right after the horizon (salvage leaves such gaps where records were
    /// lost): the first operation after the horizon is made to carry its transaction's header.
    @Test func compactionAcrossAGapInTheLogMovesTheHeaderToTheNextOperation() throws {
        try withTemporaryFolder { path in
            let before: [LogEntry] = try {
                let store = try Store(path: path)
                defer { store.close() }
                try store.createTable(tasksSchema)
                try store.write { tx in for i in 1...4 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
                try store.write { tx in for i in 1...4 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) } }
                try store.checkpoint()
                return try store.read { try $0.operations() }
            }()
            // LSN 2 (row 2's insert, in the middle of transaction 1) leaves the log.
            do {
                let env = try Environment(path: path, options: { var o = EnvironmentOptions(); o.maxDatabases = 16; return o }())
                let log = try env.write { try $0.openDatabase("log") }
                try env.write { _ = try $0.delete(withUnsafeBytes(of: UInt64(2).bigEndian) { Array($0) }, in: log) }
            }
            let store = try Store(path: path)
            defer { store.close() }
            #expect(try store.compact(retaining: .after(1)).horizon == 1)
            #expect(try Self.header(Self.records(store)[3]).carriesTransaction)
            let after = try store.read { try $0.operations() }
            #expect(after == before.filter { $0.lsn > 2 })
            #expect(after.first?.transactionID == 1)
        }
    }
}

import Foundation
import LMDB
@testable import Strata
import Testing

/// What a salvaged store can do afterwards, and what salvage leaves behind when it fails.
@Suite struct SalvageRecoveryTests {
    /// Zeroes the page of `path`'s log that holds `lsn` (the store must be closed).
    static func zeroLogPage(_ path: String, holding lsn: UInt64) throws {
        let page: Int = try {
            let env = try Environment(path: path, options: { var o = EnvironmentOptions(); o.maxDatabases = 16; return o }())
            let log = try env.openDatabase("log", create: false)
            return try env.read { txn in
                let value = try #require(try txn.get(withUnsafeBytes(of: lsn.bigEndian) { Array($0) }, in: log))
                return try #require(env.page(of: value.baseAddress!))
            }
        }()
        let handle = try #require(FileHandle(forWritingAtPath: path + "/data.mdb"))
        try handle.seek(toOffset: UInt64(page * 4096))
        try handle.write(contentsOf: Data(repeating: 0, count: 4096))
        try handle.close()
    }

    /// Writes, acknowledges and compacts in the salvaged store at `path`: what a sync client does
    /// next.
    static func writeAndSync(_ path: String, newKey: Int64) throws {
        let store = try Store(path: path)
        defer { store.close() }
        try store.write { tx in try tx.insert("tasks", ["id": .int(newKey), "title": "after salvage"]) }
        try store.write { tx in try tx.acknowledge("tasks", key: .init(.int(newKey))) }
        try store.compact()
        try store.write { tx in try tx.update("tasks", key: .init(.int(newKey)), ["title": "again"]) }
        #expect(try store.read { try $0.row("tasks", key: .init(.int(newKey)))?["title"] } == "again")
        #expect(try store.verify().isConsistent)
    }

    /// The damaged store's last transaction is lost whole: its id (the LSN of its first
    /// operation) is above every LSN recovered, and the salvaged store must still take writes.
    @Test func aStoreWhoseLastTransactionIsLostTakesWritesAfterSalvage() throws {
        try withTemporaryFolder { base in
            let (damaged, recovered) = (base + "/damaged", base + "/recovered")
            let last: UInt64 = try {
                let store = try Store(path: damaged)
                defer { store.close() }
                try store.createTable(tasksSchema)
                try store.write { tx in
                    for i in 1...40 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string(String(repeating: "x", count: 200))]) }
                }
                try store.write { tx in try tx.update("tasks", key: 40, ["title": "last"]) }
                try store.checkpoint()
                return try store.read { try $0.operations().last!.lsn }
            }()
            try Self.zeroLogPage(damaged, holding: last)
            let report = try Store.salvage(from: damaged, into: recovered)
            let kept = try #require(report.recoveredRange)
            #expect(kept.upperBound < last, "\(report)")
            try Self.writeAndSync(recovered, newKey: 1_000)
        }
    }

    /// A store property whose name is not ASCII: salvage used to take the meta page holding
    /// it for a page of binary keys, find no catalog anywhere, and fail outright.
    @Test func aStoreWithANonASCIIPropertyNameIsSalvaged() throws {
        try withTemporaryFolder { base in
            let (damaged, recovered) = (base + "/damaged", base + "/recovered")
            do {
                let store = try Store(path: damaged)
                defer { store.close() }
                try store.createTable(tasksSchema)
                try store.write { tx in
                    for i in 1...40 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string(String(repeating: "x", count: 200))]) }
                    try tx.setProperty("données", "été")
                }
                try store.checkpoint()
            }
            try Self.zeroLogPage(damaged, holding: 1)
            let report = try Store.salvage(from: damaged, into: recovered)
            #expect(report.recoveredOperations > 0, "\(report)")
            let store = try Store(path: recovered)
            defer { store.close() }
            #expect(try store.read { try $0.property("données") } == "été")
            #expect(try store.verify().isConsistent)
        }
    }

    /// A store of five acknowledged rows, compacted through LSN 10 to an empty log.
    static func makeStoreCompactedToAnEmptyLog(_ path: String) throws {
        let store = try Store(path: path)
        defer { store.close() }
        try store.createTable(tasksSchema)
        try store.write { tx in for i in 1...5 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
        try store.write { tx in for i in 1...5 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) } }
        let compaction = try store.compact()
        #expect(compaction.remainingOperations == 0 && compaction.horizon == 10)
        try store.checkpoint()
    }

    /// The compaction changed neither `lastTxn` nor the catalog version in `meta`, and the meta
    /// page it replaced is still in the file: salvage reads the one the compaction wrote, with
    /// its horizon, and so recovers none of the folded operations from stale log pages.
    @Test func salvageReadsTheMetaPageACompactionWrote() throws {
        try withTemporaryFolder { base in
            try Self.makeStoreCompactedToAnEmptyLog(base + "/damaged")
            let report = try Store.salvage(from: base + "/damaged", into: base + "/recovered")
            #expect(report.horizon == 10 && report.recoveredOperations == 0, "\(report)")
        }
    }

    /// A store compacted to an empty log: nothing is recovered, and the new store takes writes.
    @Test func aStoreCompactedToAnEmptyLogTakesWritesAfterSalvage() throws {
        try withTemporaryFolder { base in
            try Self.makeStoreCompactedToAnEmptyLog(base + "/damaged")
            _ = try Store.salvage(from: base + "/damaged", into: base + "/recovered")
            try Self.writeAndSync(base + "/recovered", newKey: 1_000)
        }
    }

    /// Salvage that fails after the log is written, before the views are built, leaves no store
    /// at the destination, and can be run again.
    @Test func aSalvageThatFailsBeforeItsViewsAreBuiltLeavesNoStore() throws {
        try withTemporaryFolder { base in
            let (damaged, recovered) = (base + "/damaged", base + "/recovered")
            do {
                let store = try Store(path: damaged)
                defer { store.close() }
                try store.createTable(tasksSchema)
                try store.write { tx in for i in 1...5 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
                try store.checkpoint()
            }
            var calls = 0
            let e = #expect(throws: StrataError.self) {
                try Store.salvage(from: damaged, into: recovered) { () throws(StrataError) in
                    calls += 1
                    throw StrataError(.io, "injected failure before the views are built")
                }
            }
            #expect(calls == 1 && e?.message.contains("injected failure") == true, "\(String(describing: e))")
            #expect(!FileManager.default.fileExists(atPath: recovered + "/data.mdb"))
            let left = (try? FileManager.default.contentsOfDirectory(atPath: recovered)) ?? []
            #expect(left.isEmpty, "left behind: \(left)")

            let report = try Store.salvage(from: damaged, into: recovered)
            #expect(report.recoveredOperations == 5 && report.pendingRows == 5, "\(report)")
            let store = try Store(path: recovered)
            defer { store.close() }
            #expect(try store.read { try $0.rows("tasks").count } == 5)
            #expect(try store.verify().isConsistent)
        }
    }

    /// A row whose kept history starts with an update whose predecessor was folded into the
    /// base snapshot (which salvage does not recover) is rebuilt from that update alone, and the
    /// report says so.
    @Test func aRowWhoseHistoryReachesTheHorizonIsReported() throws {
        try withTemporaryFolder { base in
            let (damaged, recovered) = (base + "/damaged", base + "/recovered")
            do {
                let store = try Store(path: damaged)
                defer { store.close() }
                try store.createTable(tasksSchema)
                try store.write { tx in for i in 1...3 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
                try store.write { tx in for i in 1...3 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) } }
                // Row 3 removed (LSN 7, 8), then inserted again (9, 10): that insert's predecessor
                // is at the horizon, but it writes the whole row, so nothing is missing.
                try store.write { tx in try tx.delete("tasks", key: 3) }
                try store.write { tx in try tx.acknowledge("tasks", key: 3) }
                try store.write { tx in try tx.insert("tasks", ["id": 3, "title": "again"]) }
                try store.write { tx in try tx.acknowledge("tasks", key: 3) }
                #expect(try store.compact(retaining: .after(8)).horizon == 8)
                #expect(try store.read { try $0.history("tasks", key: 3) }.map(\.lsn) == [9, 10])
                try store.write { tx in try tx.update("tasks", key: 2, ["priority": 5]) }
                // Inserted after the horizon: its whole history is in the log.
                try store.write { tx in try tx.insert("tasks", ["id": 4, "title": "new"]) }
                try store.checkpoint()
            }
            let report = try Store.salvage(from: damaged, into: recovered)
            #expect(report.rowsWithGaps.map(\.key) == [RowKey(.int(2))], "\(report)")
            let gap = try #require(report.rowsWithGaps.first)
            #expect(gap.beforeHorizon && gap.keptFrom == 11 && gap.missing == 5, "\(gap)")
            #expect(report.description.contains("tasks 2") && report.description.contains("compaction horizon"), "\(report)")
            let store = try Store(path: recovered)
            defer { store.close() }
            #expect(try store.read { try $0.row("tasks", key: 3)?["title"] } == "again")
        }
    }
}

import Foundation
import LMDB
@testable import Strata
import Testing

@Suite struct SalvageTests {
    /// A store of 1,500 rows: inserted in one transaction (so no older copy of a log page is
    /// left in the file), the first 1,000 acknowledged, every seventh row then edited (pending).
    func makeStore(_ path: String) throws {
        let store = try Store(path: path)
        try store.createTable(.fixed("notes", fields: [.int("id"), .string("text"), .int("n", default: 0)]))
        try store.write { tx in
            for i in 1...1_500 { try tx.insert("notes", ["id": .int(Int64(i)), "text": .string("note \(i)")]) }
        }
        try store.write { tx in
            for i in 1...1_000 { try tx.acknowledge("notes", key: .init(.int(Int64(i)))) }
        }
        try store.write { tx in
            for i in stride(from: 1, through: 1_500, by: 7) { try tx.update("notes", key: .init(.int(Int64(i))), ["n": .int(Int64(i))]) }
        }
    }

    /// Zeroes the page of `path`'s log that holds `lsn`; returns its page number.
    func zeroLogPage(_ path: String, holding lsn: UInt64) throws -> Int {
        let page: Int = try {
            let env = try Environment(path: path)
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
        return page
    }

    @Test func aStoreWithAZeroedLogPageIsSalvaged() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("strata-salvage-\(UUID().uuidString)").path
        let (intact, damaged, recovered, viaCLI) = (base + "-intact", base + "-damaged", base + "-recovered", base + "-cli")
        defer { for p in [intact, damaged, recovered, viaCLI] { try? FileManager.default.removeItem(atPath: p) } }
        try makeStore(intact)
        // The intact store's rows and each row's history, to compare with.
        let (rows, histories, clientID): ([Row], [RowKey: [UInt64]], String) = try {
            let store = try Store(path: intact)
            return try store.read { s in
                let rows = try s.rows("notes", includingDeleted: true)
                var h: [RowKey: [UInt64]] = [:]
                for r in rows { h[r.key] = try s.history("notes", key: r.key).map(\.lsn) }
                return (rows, h, store.clientID)
            }
        }()
        try FileManager.default.copyItem(atPath: intact, toPath: damaged)
        let page = try zeroLogPage(damaged, holding: 500)
        // The page check names the zeroed leaf.
        let check = try runStrata(["check", damaged])
        #expect(check.status == 3 && check.out.contains("in log page \(page)"), "\(check.status) \(check.out)")

        let report = try Store.salvage(from: damaged, into: recovered)
        print("SalvageTests: zeroed page \(page)\n\(report)")
        let lost = Set(report.lostRanges.flatMap { Array($0) })
        #expect(lost.contains(500))
        #expect(report.recoveredOperations + lost.count == 1_500 + 1_000 + 215)
        #expect(report.unreadablePages >= 1)
        #expect(!report.rowsWithGaps.isEmpty)

        let store = try Store(path: recovered)
        #expect(store.clientID == clientID)
        #expect(try store.verify().isConsistent)
        let salvaged = Dictionary(uniqueKeysWithValues: try store.read { try $0.rows("notes", includingDeleted: true) }.map { ($0.key, $0) })
        let gapKeys = Set(report.rowsWithGaps.map(\.key))
        var intactRows = 0
        for row in rows {
            let history = histories[row.key] ?? []
            if history.allSatisfy({ !lost.contains($0) }) {
                // A row none of whose operations was lost is exactly as it was, pending or not.
                intactRows += 1
                let copy = salvaged[row.key]
                #expect(copy?.values == row.values && copy?.status == row.status && copy?.changedFields == row.changedFields, "row \(row.key)")
                #expect(!gapKeys.contains(row.key))
            } else {
                #expect(gapKeys.contains(row.key), "row \(row.key) lost operations but is not reported")
            }
        }
        #expect(intactRows > 1_400)
        let pendingBefore = rows.filter { $0.status != .unchanged && (histories[$0.key] ?? []).allSatisfy { !lost.contains($0) } }.count
        let pendingAfter = try store.read { try $0.pendingRows("notes") }
        #expect(pendingAfter.count >= pendingBefore && pendingBefore > 500)

        // The command line: the same recovery, a report naming the lost range, exit 0.
        let r = try runStrata(["salvage", damaged, viaCLI])
        #expect(r.status == 0 && r.out.contains("lost LSNs") && r.out.contains("gap: notes"), "\(r.out) \(r.err)")
        #expect(try runStrata(["verify", viaCLI]).status == 0)
        // A second salvage into a folder that holds a store is refused, changing nothing.
        let again = try runStrata(["salvage", damaged, viaCLI])
        #expect(again.status == 2 && again.err.contains("already holds a store"))
    }
}

import Foundation
import Strata
import StrataSync
import StrataTesting
import StrataWorkload
import Testing

@Suite struct SoakTests {
    /// Months of use in a few seconds: edit, sync, compact, over and over, with a server that
    /// also edits. The log stays within the retention and the file stops growing, while
    /// everything stays consistent and nothing pending is lost.
    @Test func aLongEditSyncCompactCycleLevelsOff() async throws {
        let seed = testSeed("aLongEditSyncCompactCycleLevelsOff")
        var g = SplitMix64(seed: seed)
        try await withStoreAsync { store in
            let server = InMemorySyncServer()
            let sync = SyncClient(store: store, policy: .clientWins)
            let retention = 2_000
            var sizes: [Int] = []
            var logLengths: [Int] = []
            for round in 0..<60 {
                var edits: [(Int64, String)] = []
                for _ in 0..<400 { edits.append((Int64(g.below(300)), "r\(round) " + String(repeating: "x", count: 50 + g.below(100)))) }
                try await store.write { [edits] tx in
                    for (id, title) in edits { try tx.upsert("tasks", ["id": .int(id), "title": .string(title)]) }
                }
                // The server changes a few rows of its own.
                for _ in 0..<5 {
                    server.write("tasks", key: RowKey(.int(Int64(g.below(300)))), ["title": .string("server \(round)"), "priority": 1, "done": false, "notes": nil])
                }
                _ = try await sync.sync(with: server)
                #expect(try await store.read { try $0.pendingRows() }.isEmpty, "round \(round): all acknowledged")
                let report = try store.compact(retaining: .operations(retention))
                #expect(report.remainingOperations <= retention, "round \(round): \(report)")
                sizes.append(store.sizeInBytes)
                logLengths.append(report.remainingOperations)
            }
            print("soak: store size per round (KiB):", sizes.map { $0 / 1024 })
            // Levelled off. Without compaction the log alone would add about 100 KiB a round
            // (24,000 operations in all, over 5 MiB); with it, the file stays within twice its
            // size after round 10. (It still steps up now and then: LMDB needs runs of free
            // pages for large values such as the in-flight batch, and free space fragments.)
            #expect(sizes.last! < 2 * sizes[9], "the store kept growing: \(sizes.map { $0 / 1024 }) KiB")
            #expect(logLengths.allSatisfy { $0 <= retention })
            #expect(try store.verify().isConsistent)
            // Client and server agree on every row.
            let local = try await store.read { try $0.rows("tasks") }
            let remote = server.rows("tasks")
            #expect(local.count == remote.count)
            for row in local { #expect(remote[row.key]?["title"] == row["title"], "\(row.key)") }
        }
    }
}

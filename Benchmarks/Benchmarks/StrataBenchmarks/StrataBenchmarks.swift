import Benchmark
import Foundation
import Peers
import Strata
import StrataWorkload

// Regression benchmarks (package-benchmark). Throughput is reported, never asserted; allocation
// counts of the write path have thresholds in Thresholds/, so a regression shows up.
//
//   swift package --package-path Benchmarks benchmark
//   swift package --package-path Benchmarks benchmark --filter '.*Edits.*'

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal, .peakMemoryResident],
        warmupIterations: 1,
        maxDuration: .seconds(5),
        maxIterations: 5
    )

    // Small enough to repeat; the `compare` executable runs the full-size workload.
    let workload = ReferenceWorkload(seed: 42, preloadRows: 10_000, edits: 20_000)

    func edits(_ make: @escaping @Sendable (String) throws -> any Peer, name: String) {
        Benchmark("Edits B=1000 (20k) \(name)", configuration: .init(scalingFactor: .kilo)) { benchmark in
            let folder = FileManager.default.temporaryDirectory.appendingPathComponent("strata-bench-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: folder) }
            let peer = try make(folder)
            peer.prepare(workload)
            try peer.preload()
            try peer.markPreloadSynced()
            benchmark.startMeasurement()
            var i = 0
            while i < workload.edits.count {
                try peer.applyEdits(i..<min(i + 1000, workload.edits.count))
                i += 1000
            }
            benchmark.stopMeasurement()
        }
    }
    edits({ try StrataPeer(folder: $0) }, name: "Strata")
    edits({ try SQLitePeer(.trigger, folder: $0) }, name: "SQLite trigger")
    edits({ try SQLitePeer(.session, folder: $0) }, name: "SQLite session")

    // Allocations of the append path: 1,000 updates of one field in one transaction. The name
    // has no spaces: `thresholds update` writes the file name with spaces turned into `_`, but
    // `thresholds check` looks for it with the spaces, so a name with spaces is never checked.
    Benchmark("AppendPathAllocations-1000-updates", configuration: .init(metrics: [.mallocCountTotal, .wallClock], maxIterations: 20)) { benchmark in
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("strata-bench-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: folder) }
        var options = StoreOptions()
        options.durability = .noSync
        let store = try Store(path: folder, options: options)
        try store.createTable(ReferenceWorkload.schema)
        try store.write { tx in
            for i in 1...100 {
                try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t", "priority": 1, "done": 0, "notes": "n", "updated": 1.5])
            }
        }
        let updates: [(RowKey, FieldValues)] = (0..<1000).map { i in (RowKey(.int(Int64(1 + i % 100))), ["priority": .int(Int64(i))]) }
        benchmark.startMeasurement()
        try store.write { tx in for (k, f) in updates { try tx.update("tasks", key: k, f) } }
        benchmark.stopMeasurement()
    }
}

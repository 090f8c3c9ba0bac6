import ArgumentParser
import Foundation
import Strata
import StrataSync
import StrataWorkload

extension Durability: ExpressibleByArgument {}

/// `strata bench`: the reference workload against a fresh store, on this machine.
struct BenchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Run the reference workload (Benchmarks/WORKLOAD.md in the repository) against a fresh store.",
        discussion: """
            Preloads rows in one transaction (then acknowledges them, untimed), applies the edit \
            stream in transactions of --batch edits, coalesces the pending rows into the next \
            upload's changes, and rebuilds the tables from the log. Prints rates, times, size and \
            memory. The edit stream is generated before timing starts.

            Example:
              strata bench --edits 100000 --batch 1000
              strata bench --edits 2000 --batch 1 --json
            """
    )

    @Option(parsing: .unconditional, help: "Rows preloaded before the edits (at most \(BenchCommand.maxRows)).") var preload = 100_000
    @Option(parsing: .unconditional, help: "Edits applied after the preload (at most \(BenchCommand.maxRows)).") var edits = 1_000_000
    @Option(parsing: .unconditional, help: "Edits per transaction.") var batch = 1000
    @Option(help: "The workload's random seed.") var seed: UInt64 = 42
    @Option(help: "full, noMetaSync or noSync.") var durability: Durability = .full
    @Option(help: "The folder for the store (default: a new temporary folder, removed afterwards).") var path: String?
    @Flag(help: "Print the results as JSON.") var json = false

    /// The most rows or edits a run takes: the workload is generated in memory before timing.
    static let maxRows = 50_000_000
    /// Roughly what one generated edit or preloaded row takes in memory before the run, with the
    /// store's own use of it: the measure of whether a run fits this machine.
    static let bytesPerItem = 600

    func validate() throws {
        guard preload >= 0, edits >= 0 else { throw ValidationError("--preload and --edits cannot be negative") }
        guard batch >= 1 else { throw ValidationError("--batch must be at least 1") }
        guard preload <= Self.maxRows, edits <= Self.maxRows else {
            throw ValidationError("--preload and --edits take at most \(Self.maxRows) (the workload is generated in memory first)")
        }
        let needed = UInt64(preload + edits) * UInt64(Self.bytesPerItem)
        let memory = ProcessInfo.processInfo.physicalMemory
        guard needed <= memory / 2 else {
            throw ValidationError("--preload \(preload) and --edits \(edits) need about \(needed >> 20) MiB to generate, more than half of this machine's \(memory >> 20) MiB; run fewer")
        }
        if let path {
            var isFolder: ObjCBool = false
            if FileManager.default.fileExists(atPath: path, isDirectory: &isFolder) && !isFolder.boolValue {
                throw ValidationError("--path '\(path)' is a file; give a folder for the store")
            }
            if FileManager.default.fileExists(atPath: path + "/data.mdb") {
                throw ValidationError("'\(path)' already holds a store; the benchmark needs an empty folder")
            }
        }
    }

    struct Result: Codable {
        var machine: String
        var preload: Int
        var edits: Int
        var batch: Int
        var durability: String
        var preloadSeconds: Double
        var editSeconds: Double
        var editsPerSecond: Double
        var pendingPayloadSeconds: Double
        var pendingRows: Int
        var rebuildSeconds: Double
        var rebuildOperationsPerSecond: Double
        var logOperations: Int
        var sizeBytes: Int
        var peakResidentBytes: Int
        var anonymousResidentBytes: Int
    }

    func run() throws {
        try reportingErrors { try runBenchmark() }
    }

    private func runBenchmark() throws {
        let workload = ReferenceWorkload(seed: seed, preloadRows: preload, edits: edits)
        // Build every edit's arguments before timing, so the clock measures the store only.
        let preloadFields = workload.strataPreload()
        let prepared = workload.strataEdits()

        let folder = path ?? FileManager.default.temporaryDirectory.appendingPathComponent("strata-bench-\(UUID().uuidString)").path
        defer { if path == nil { try? FileManager.default.removeItem(atPath: folder) } }
        var options = StoreOptions()
        options.durability = durability
        options.initialMapSize = 1 << 30
        let store = try Store(path: folder, options: options)
        try store.createTable(ReferenceWorkload.schema)

        let preloadSeconds = try measure {
            try store.write { tx in for f in preloadFields { try tx.insert("tasks", f) } }
        }
        // The preloaded rows count as the server's, so that "pending" means "since the preload".
        try store.write { tx in for i in 0..<preload { try tx.acknowledge("tasks", key: RowKey(.int(Int64(i + 1)))) } }
        ProcessMemory.resetPeak()
        let bar = ProgressBar("edits")
        let editSeconds = try measure {
            var i = 0
            while i < prepared.count {
                bar.update(i, prepared.count)
                let end = min(i + batch, prepared.count)
                try store.write { tx in
                    for edit in prepared[i..<end] { try edit.apply(in: tx) }
                }
                i = end
            }
        }
        bar.update(prepared.count, prepared.count)
        let peak = ProcessMemory.peak
        let anon = ProcessMemory.anonymous
        var payload: [RowChange] = []
        let payloadSeconds = try measure { payload = try SyncClient(store: store).pendingChanges() }
        var folded = 0
        let rebuildSeconds = try measure { folded = try store.rebuild() }

        let result = Result(
            machine: "\(ProcessInfo.processInfo.activeProcessorCount) cores, \(ProcessInfo.processInfo.physicalMemory >> 30) GiB",
            preload: preload, edits: edits, batch: batch, durability: durability.rawValue,
            preloadSeconds: preloadSeconds, editSeconds: editSeconds,
            editsPerSecond: Double(edits) / editSeconds,
            pendingPayloadSeconds: payloadSeconds, pendingRows: payload.count,
            rebuildSeconds: rebuildSeconds, rebuildOperationsPerSecond: Double(folded) / rebuildSeconds,
            logOperations: folded, sizeBytes: store.sizeInBytes,
            peakResidentBytes: peak, anonymousResidentBytes: anon
        )
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try encoder.encode(result), as: UTF8.self))
        } else {
            print("""
                machine:   \(result.machine)
                preload:   \(preload) rows in \(format(preloadSeconds)) s
                edits:     \(edits) in transactions of \(batch) (\(durability.rawValue)): \(format(editSeconds)) s, \(Int(result.editsPerSecond)) edits/s
                payload:   \(payload.count) coalesced pending rows in \(format(payloadSeconds)) s
                rebuild:   \(folded) operations in \(format(rebuildSeconds)) s, \(Int(result.rebuildOperationsPerSecond)) ops/s
                size:      \(result.sizeBytes / 1_048_576) MiB
                memory:    peak resident during edits \(peak / 1_048_576) MiB (anonymous \(anon / 1_048_576) MiB)
                """)
        }
    }

    private func measure(_ body: () throws -> Void) rethrows -> Double {
        let start = ContinuousClock.now
        try body()
        let d = ContinuousClock.now - start
        return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
    }

    private func format(_ s: Double) -> String { String(format: "%.3f", s) }
}

import Foundation
import Peers
import Strata
import StrataWorkload

// Runs the reference workload (Benchmarks/WORKLOAD.md) against Strata and the SQLite peers in
// one process and prints every phase with Strata's ratio to each peer, as a Markdown table.
//
//   swift run -c release compare [--edits N] [--preload N] [--single N] [--batches 1000,100,1] [--probes N]
//                                [--reads N] [--concurrent N] [--systems Strata,trigger,session,plain] [--page-rows N] [--paging-only]

let arguments = Array(CommandLine.arguments.dropFirst())
func option(_ name: String, _ fallback: Int, in arguments: [String] = arguments) -> Int {
    guard let i = arguments.firstIndex(of: "--" + name), i + 1 < arguments.count, let v = Int(arguments[i + 1]) else { return fallback }
    return v
}
let editCount = option("edits", 1_000_000)
let preloadCount = option("preload", 100_000)
let singleCount = option("single", 10_000)
let timeTravelProbes = option("probes", 20)
let pointReadCount = option("reads", 100_000)
let concurrentTotal = option("concurrent", 4_000)
var timeTravelAnswers: [[Value]?] = []
let batches = (arguments.firstIndex(of: "--batches").map { arguments[$0 + 1] } ?? "1000,100,1").split(separator: ",").compactMap { Int($0) }

func seconds(_ body: () throws -> Void) rethrows -> Double {
    let start = ContinuousClock.now
    try body()
    let d = ContinuousClock.now - start
    return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
}

let workload = ReferenceWorkload(seed: 42, preloadRows: preloadCount, edits: editCount)
let c = workload.counts
print("Reference workload: seed 42, \(preloadCount) rows, \(editCount) edits (\(c.updates) updates, \(c.inserts) inserts, \(c.deletes) deletes)")
print("Machine: \(ProcessInfo.processInfo.activeProcessorCount) cores, \(ProcessInfo.processInfo.physicalMemory >> 30) GiB, \(ProcessInfo.processInfo.operatingSystemVersionString)")
print("Durability: Strata .full (fdatasync per commit); SQLite WAL + synchronous=FULL\n")

struct Row { var phase: String; var unit: String; var higherIsBetter: Bool; var values: [String: Double] }
var rows: [Row] = []
let allSystems = ["Strata", "SQLite trigger", "SQLite session", "SQLite plain"]
// `--systems Strata,trigger` runs a subset (for profiling one system); the table keeps every column.
let systems = (arguments.firstIndex(of: "--systems").map { arguments[$0 + 1] }).map { list in
    allSystems.filter { s in list.split(separator: ",").contains { s.hasSuffix($0) } }
} ?? allSystems

/// The raw-LMDB column: a peer for the edit rows only.
let rawLMDB = "raw LMDB"

/// Random point reads of preloaded rows, each in a read transaction of its own; reads per second.
func pointReads(_ peer: any Peer) throws -> Double {
    var g = SplitMix64(seed: 11)
    let ids = (0..<pointReadCount).map { _ in Int64(1 + g.next() % UInt64(preloadCount)) }
    var found = 0
    let t = try seconds { for id in ids where try peer.readRow(id) { found += 1 } }
    precondition(found > 0, "\(peer.name): no row found")
    return Double(ids.count) / t
}

func makePeer(_ name: String, _ folder: String) throws -> any Peer {
    switch name {
    case "Strata": try StrataPeer(folder: folder)
    case "SQLite trigger": try SQLitePeer(.trigger, folder: folder)
    case "SQLite session": try SQLitePeer(.session, folder: folder)
    default: try SQLitePeer(.plain, folder: folder)
    }
}

// `--paging-only` runs the paging rows alone (Strata's, with and without an index).
let pagingOnly = arguments.contains("--paging-only")
let pageRows = option("page-rows", 1_000_000)

for batch in pagingOnly ? [] : batches {
    let count = batch == 1 ? min(singleCount, editCount) : editCount
    var editRates: [String: Double] = [:]
    var preloadRates: [String: Double] = [:]
    var payload: [String: Double] = [:]
    var rebuild: [String: Double] = [:]
    var size: [String: Double] = [:]
    var memory: [String: Double] = [:]
    var timeTravel: [String: Double] = [:]
    var heap: [String: Double] = [:]
    var checkpoint: [String: Double] = [:]
    var withCheckpoint: [String: Double] = [:]
    var readsFull: [String: Double] = [:]
    var readsAfter: [String: Double] = [:]
    for system in systems {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("strata-compare-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let peer = try makePeer(system, folder)
        peer.prepare(workload)
        preloadRates[system] = Double(preloadCount) / (try seconds { try peer.preload() })
        try peer.markPreloadSynced()
        let base = ProcessMemory.resident
        let anonymousBase = ProcessMemory.anonymous
        var anonymousPeak = anonymousBase
        ProcessMemory.resetPeak()
        let t = try seconds {
            var i = 0
            var commits = 0
            while i < count {
                let end = min(i + batch, count)
                try peer.applyEdits(i..<end)
                i = end
                commits += 1
                // Sampled: reading /proc costs about as much as a small commit.
                if commits % 64 == 0 { anonymousPeak = max(anonymousPeak, ProcessMemory.anonymous) }
            }
        }
        editRates[system] = Double(count) / t
        // Point reads while what the edits left for later is still pending (Strata's overlay,
        // SQLite's WAL), then the final checkpoint, then the same reads again.
        if batch == batches.first { readsFull[system] = try pointReads(peer) }
        let tc = try seconds { try peer.checkpoint() }
        checkpoint[system] = tc
        withCheckpoint[system] = Double(count) / (t + tc)
        if batch == batches.first { readsAfter[system] = try pointReads(peer) }
        // The resident high-water mark belongs to the process: once Strata's phase has set it,
        // the peers that run after it cannot move it, so it is Strata's figure alone.
        if system == "Strata" { memory[system] = Double(max(0, ProcessMemory.peak - base)) / 1_048_576 }
        heap[system] = Double(max(0, max(anonymousPeak, ProcessMemory.anonymous) - anonymousBase)) / 1_048_576
        if batch == batches.first, system != "SQLite plain" {
            payload[system] = try seconds { _ = try peer.pendingPayload() }
            var ok = false
            rebuild[system] = try seconds { ok = try peer.rebuildAndCheck() }
            precondition(ok, "\(system): the table rebuilt from the log differs from the live one")
            size[system] = Double(peer.sizeOnDisk) / 1_048_576
            // Time travel: random rows as of random transaction boundaries; every system must
            // return the same values as Strata.
            var g = SplitMix64(seed: 7)
            let probes = (0..<timeTravelProbes).map { _ in (Int64(1 + g.next() % UInt64(preloadCount)), batch * Int(g.next() % UInt64(count / batch + 1))) }
            var answers: [[Value]?] = []
            let t = try seconds { for (id, n) in probes { answers.append(try peer.row(id, afterEdits: n, batch: batch) ?? nil) } }
            if system == "Strata" { timeTravelAnswers = answers } else if systems.contains("Strata") {
                precondition(answers == timeTravelAnswers, "\(system): time travel disagrees with Strata")
            }
            timeTravel[system] = t / Double(probes.count) * 1000
        }
        FileHandle.standardError.write("\(system) B=\(batch): \(Int(editRates[system]!)) edits/s\n".data(using: .utf8)!)
    }
    if batch == batches.first {
        rows.append(Row(phase: "preload (\(preloadCount) rows, 1 txn)", unit: "rows/s", higherIsBetter: true, values: preloadRates))
    }
    var raw = editRates
    if batch == 1 || batch == 1000 {
        // The engine's own limit: one ~100-byte record per edit, as many per commit.
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("strata-compare-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: folder) }
        // From the log Strata's edit phase starts from: the preload's inserts and their
        // acknowledgements, one record each.
        raw[rawLMDB] = try RawLMDB.appendRate(folder: folder, count: count, perCommit: batch, prefill: 2 * preloadCount)
    }
    rows.append(Row(phase: "edits, B = \(batch) (\(count) edits)", unit: "edits/s", higherIsBetter: true, values: raw))
    rows.append(Row(phase: "final checkpoint after the edit phase, B = \(batch)", unit: "s", higherIsBetter: false, values: checkpoint))
    rows.append(Row(phase: "edits, B = \(batch), final checkpoint included", unit: "edits/s", higherIsBetter: true, values: withCheckpoint))
    if batch == batches.first {
        rows.append(Row(phase: "point reads, before the final checkpoint", unit: "reads/s", higherIsBetter: true, values: readsFull))
        rows.append(Row(phase: "point reads, after the final checkpoint", unit: "reads/s", higherIsBetter: true, values: readsAfter))
    }
    rows.append(Row(phase: "edit phase peak memory (resident), B = \(batch)", unit: "MiB", higherIsBetter: false, values: memory))
    rows.append(Row(phase: "edit phase heap growth (anonymous), B = \(batch)", unit: "MiB", higherIsBetter: false, values: heap))
    if batch == batches.first {
        rows.append(Row(phase: "pending payload", unit: "s", higherIsBetter: false, values: payload))
        rows.append(Row(phase: "rebuild from the log + check", unit: "s", higherIsBetter: false, values: rebuild))
        rows.append(Row(phase: "size on disk", unit: "MiB", higherIsBetter: false, values: size))
        rows.append(Row(phase: "time travel: a row as of an earlier point", unit: "ms", higherIsBetter: false, values: timeTravel))
    }
}

// Concurrent writers: 8 threads of single durable edits. Strata shares commits (group commit);
// the plain SQLite table takes them one at a time behind its write lock.
if concurrentTotal > 0 {
    var rates: [String: Double] = [:]
    for system in ["Strata", "SQLite plain"] where systems.contains(system) {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("strata-compare-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: folder) }
        rates[system] = system == "Strata"
            ? try ConcurrentWriters.strata(folder: folder, threads: 8, total: concurrentTotal)
            : try ConcurrentWriters.sqlite(folder: folder, threads: 8, total: concurrentTotal)
    }
    rows.append(Row(phase: "concurrent writers: 8 threads of single durable edits (\(concurrentTotal) in all)", unit: "edits/s", higherIsBetter: true, values: rates))
}

// Merge: a server delta of every preloaded row against 10% of them pending, all of those
// conflicting (10% of the delta), server wins.
let mergeWork = MergeWorkload(rows: preloadCount, pending: preloadCount / 10, conflicting: preloadCount / 10)
var mergeTimes: [String: Double] = [:]
for system in systems where system != "SQLite plain" && !pagingOnly {
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent("strata-compare-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let peer = try makePeer(system, folder)
    peer.prepare(workload)
    try peer.preload()
    try peer.markPreloadSynced()
    try peer.editTitles(mergeWork.pending)
    if let strata = peer as? StrataPeer { strata.delta = strata.makeDelta(mergeWork) }
    var merged = false
    let t = try seconds { merged = try peer.merge(mergeWork) }
    if merged { mergeTimes[system] = t }
}
if !pagingOnly {
    rows.append(Row(phase: "merge: \(mergeWork.rows) server rows, \(mergeWork.pending) pending, \(mergeWork.conflicting) conflicting", unit: "s", higherIsBetter: false, values: mergeTimes))
}

// Paging: the tenth page (50 rows) of a query sorted by `updated` over `pageRows` rows, read
// after the nine before it, without an index on the sort field (every page sorts the whole
// result) and with one (a page is a key range of the index). Strata only.
if systems.contains("Strata") {
    let folder = FileManager.default.temporaryDirectory.appendingPathComponent("strata-compare-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: folder) }
    var options = StoreOptions()
    options.durability = .noSync
    let store = try Store(path: folder, options: options)
    try store.createTable(ReferenceWorkload.schema)
    var g = SplitMix64(seed: 11)
    var id = 0
    while id < pageRows {
        try store.write { tx in
            for _ in 0..<min(100_000, pageRows - id) {
                id += 1
                try tx.insert("tasks", ["id": .int(Int64(id)), "title": "t", "priority": .int(Int64(g.next() % 5)), "done": 0, "notes": "n", "updated": .double(Double(g.next() % 1_000_000) / 8)])
            }
        }
    }
    let query = Query("tasks", orderBy: [.ascending("updated")])
    func tenthPage() throws -> Double {
        var token: PageToken? = nil
        for _ in 0..<9 { token = try store.read { try $0.page(query, size: 50, after: token) }.next }
        var page: Page? = nil
        let t = try seconds { page = try store.read { try $0.page(query, size: 50, after: token) } }
        precondition(page?.rows.count == min(50, max(0, pageRows - 450)), "the tenth page is short")
        return t * 1000
    }
    let unindexed = try tenthPage()
    let plan = try store.read { try $0.explain(query) }
    try store.createIndex("tasks_by_updated", on: "tasks", fields: ["updated"])
    let indexed = try tenthPage()
    let indexedPlan = try store.read { try $0.explain(query) }
    FileHandle.standardError.write("paging: \(plan) → \(indexedPlan)\n".data(using: .utf8)!)
    rows.append(Row(phase: "tenth page of 50, sorted query on \(pageRows) rows, no index", unit: "ms", higherIsBetter: false, values: ["Strata": unindexed]))
    rows.append(Row(phase: "tenth page of 50, sorted query on \(pageRows) rows, index on the sort field", unit: "ms", higherIsBetter: false, values: ["Strata": indexed]))
}

func format(_ v: Double?) -> String {
    guard let v else { return "–" }
    return v >= 100 ? String(Int(v.rounded())) : String(format: "%.2f", v)
}
let columns = allSystems + [rawLMDB]
print("| phase | unit | " + columns.joined(separator: " | ") + " | Strata ÷ trigger | Strata ÷ session | Strata ÷ raw LMDB |")
print("|---|---|" + columns.map { _ in "---:" }.joined(separator: "|") + "|---:|---:|---:|")
for r in rows {
    // Ratios read as "times better": rates divide Strata by the peer, times and sizes the peer by Strata.
    func ratio(_ peer: String) -> String {
        guard r.unit != "MiB" || r.phase == "size on disk" else { return "–" }  // memory: absolute figures
        guard let s = r.values["Strata"], let p = r.values[peer], s > 0, p > 0 else { return "–" }
        return String(format: "%.2f×", r.higherIsBetter ? s / p : p / s)
    }
    print("| \(r.phase) | \(r.unit) | " + columns.map { format(r.values[$0]) }.joined(separator: " | ") + " | \(ratio("SQLite trigger")) | \(ratio("SQLite session")) | \(ratio(rawLMDB)) |")
}
if let c = rows.first(where: { $0.phase.hasPrefix("concurrent writers") }), let s = c.values["Strata"], let p = c.values["SQLite plain"] {
    print(String(format: "\nStrata ÷ SQLite plain, 8 concurrent writers of single durable edits: %.2f×", s / p))
}
if let full = rows.first(where: { $0.phase.hasPrefix("point reads, before") })?.values["Strata"],
   let after = rows.first(where: { $0.phase.hasPrefix("point reads, after") })?.values["Strata"] {
    print(String(format: "\nStrata point reads with the overlay full ÷ after the checkpoint: %.2f×", full / after))
}

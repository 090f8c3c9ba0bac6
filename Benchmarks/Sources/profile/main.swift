import Foundation
import Peers
import Strata
import StrataSync
import StrataWorkload

// One phase of Strata's side of `compare` at a time, on a store kept between runs, so that a
// profiler (perf, valgrind) sees that phase alone:
//
//   swift run -c release profile build  /tmp/store [--edits N] [--keep-overlay]   # preload + edits at B = 1000
//   swift run -c release profile payload|verify|rebuild|replay /tmp/store
//   swift run -c release profile reads /tmp/store [--edits 100000]
//   swift run -c release profile concurrent /tmp/folder [--edits 4000] [--threads 8]
//   swift run -c release profile merge /tmp/new-folder
//   swift run -c release profile single|single-nosync /tmp/store --edits 5000   # B = 1 edits on a store built with --edits 0
//   (single and concurrent take --durability noMetaSync: one sync per commit instead of two)
//   swift run -c release profile raw /tmp/new-folder --edits 5000 [--batch 1]   # compare's raw-LMDB peer alone
//   swift run -c release profile scale /tmp/folder [--lengths 100000,1000000,10000000] [--peers]
//       rebuild (verify) time and heap against log length, as CSV for plot-scale.py; with
//       --peers, also the SQLite trigger and session peers' replay (rebuildAndCheck) of the same
//       workload. STRATA_FOLD_WORKERS sets StoreOptions.foldWorkers.

let arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.count >= 2 else {
    print("usage: profile build|payload|verify|rebuild <folder> [--edits N]")
    exit(2)
}
let (phase, folder) = (arguments[0], arguments[1])
let edits = arguments.firstIndex(of: "--edits").flatMap { Int(arguments[$0 + 1]) } ?? 1_000_000
/// `--durability full|noMetaSync` for `single` and `concurrent` (default full): what one sync per
/// commit instead of two would give.
let durability: Durability = arguments.firstIndex(of: "--durability").map { arguments[$0 + 1] == "noMetaSync" ? .noMetaSync : .full } ?? .full

/// The reference workload's preload and `edits` edits at B = 1000, without fsync (the state on
/// disk is what counts here, not how fast it got there).
func build(_ folder: String, edits: Int) throws -> StrataPeer {
    let peer = try StrataPeer(folder: folder, durability: .noSync)
    try load(peer, edits: edits)
    // As in `compare`, whose rebuild follows the final checkpoint: verify then folds the log
    // once, not also a second time up to the checkpointed views.
    try peer.store.checkpoint()
    try peer.store.flush()
    return peer
}

/// Runs the preload and `edits` edits at B = 1000 on `peer`.
func load(_ peer: some Peer, edits: Int) throws {
    peer.prepare(ReferenceWorkload(seed: 42, preloadRows: 100_000, edits: edits))
    try peer.preload()
    try peer.markPreloadSynced()
    var i = 0
    while i < edits {
        try peer.applyEdits(i..<min(i + 1000, edits))
        i += 1000
    }
}

func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }

let start = ContinuousClock.now
switch phase {
case "build" where arguments.contains("--keep-overlay"):
    // The edits without the final checkpoint, and no close (which would checkpoint): the next
    // process to open the store folds the log tail into its overlay, as after a crash.
    let peer = try StrataPeer(folder: folder, durability: .noSync)
    try load(peer, edits: edits)
    try peer.store.flush()
    print(phase, ContinuousClock.now - start)
    exit(0)
case "build":
    _ = try build(folder, edits: edits)
case "scale":
    // The log holds the preload's 2 × 100,000 operations (inserts and acknowledgements) plus
    // about one per edit, so the edit counts are chosen to make the log about that long.
    let lengths = (arguments.firstIndex(of: "--lengths").map { arguments[$0 + 1] } ?? "100000,1000000,10000000").split(separator: ",").compactMap { Int($0) }
    let peers = arguments.contains("--peers")
    print("operations,rows,seconds,heap_mib,file_mib" + (peers ? ",trigger_seconds,session_seconds" : ""))
    for length in lengths {
        let path = folder + "/scale-\(length)"
        try? FileManager.default.removeItem(atPath: path)
        let peer = try build(path, edits: max(1000, length - 200_000))
        let store = peer.store
        let anonymousBase = ProcessMemory.anonymous
        var anonymousPeak = anonymousBase
        let t0 = ContinuousClock.now
        // The fold reports progress every 10,000 operations: sample the heap there.
        let report = try store.verify { _, _ in anonymousPeak = max(anonymousPeak, ProcessMemory.anonymous) }
        let d = ContinuousClock.now - t0
        precondition(report.isConsistent, "\(report)")
        let verifySeconds = seconds(d)
        let heap = Double(anonymousPeak - anonymousBase) / 1_048_576
        let file = Double(peer.sizeOnDisk) / 1_048_576
        var line = "\(report.operations),\(report.live["rows"]!.entries),\(verifySeconds),\(heap),\(file)"
        try? FileManager.default.removeItem(atPath: path)
        if peers {
            // The same edits on the SQLite peers (WAL; their build is not timed), then their
            // replay of the change log into a fresh table and the check against the live one.
            for kind in [SQLitePeer.Kind.trigger, .session] {
                let peerPath = folder + "/scale-\(length)-\(kind)"
                try? FileManager.default.removeItem(atPath: peerPath)
                try FileManager.default.createDirectory(atPath: peerPath, withIntermediateDirectories: true)
                let sqlite = try SQLitePeer(kind, folder: peerPath)
                try load(sqlite, edits: max(1000, length - 200_000))
                var ok = false
                let t = ContinuousClock.now
                ok = try sqlite.rebuildAndCheck()
                let d = ContinuousClock.now - t
                precondition(ok, "\(kind): the replayed table differs from the live one")
                line += ",\(seconds(d))"
                try? FileManager.default.removeItem(atPath: peerPath)
            }
        }
        print(line)
    }
case "merge":
    // compare's merge phase: 10% of the rows edited locally, then a delta of every row.
    let peer = try StrataPeer(folder: folder, durability: .noSync)
    let work = MergeWorkload(rows: 100_000, pending: 10_000, conflicting: 10_000)
    peer.prepare(ReferenceWorkload(seed: 42, preloadRows: 100_000, edits: 0))
    try peer.preload()
    try peer.markPreloadSynced()
    try peer.editTitles(work.pending)
    peer.delta = peer.makeDelta(work)
    let t0 = ContinuousClock.now
    _ = try peer.merge(work)
    print("merge alone", ContinuousClock.now - t0)
case "decode":
    // A client's decoding of pull pages: a page of 5,000 rows as strata-server writes them
    // (strata-sync-bench's `tasks` rows), decoded `--edits` times.
    var writer = DeltaPageWriter(tables: [DeltaPageWriter.Table(name: "tasks", keyFields: ["id"], fields: ["done", "notes", "priority", "title"])])
    for i in 1...5000 {
        try writer.upsert(table: 0, key: "[{\"int\":\(i)}]",
                          fields: "{\"done\":{\"bool\":\(i % 2 == 0)},\"notes\":{\"string\":\"a note on task \(i)\"},\"priority\":{\"int\":\(i % 5)},\"title\":{\"string\":\"task number \(i)\"}}",
                          version: Int64(i), timestamp: 1_700_000_000.5)
    }
    let page = Data(writer.finish(since: nil, anchor: "5000", mode: .snapshot))
    let t0 = ContinuousClock.now
    var rows = 0
    for _ in 0..<max(1, edits / 5000) {
        rows += try WireFormat.decode(ServerDelta.self, from: page).tables.reduce(0) { $0 + $1.upserts.count }
    }
    print("decoded \(rows) rows of \(page.count / 5000) bytes in", ContinuousClock.now - t0)
case "single", "single-nosync":
    // compare's B = 1 phase: one edit per transaction, durable ("single") or not.
    let peer = try StrataPeer(folder: folder, durability: phase == "single" ? durability : .noSync)
    peer.prepare(ReferenceWorkload(seed: 42, preloadRows: 100_000, edits: edits))
    let t0 = ContinuousClock.now
    for i in 0..<edits { try peer.applyEdits(i..<i + 1) }
    let d = ContinuousClock.now - t0
    print("single edits/s:", Double(edits) / (Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18))
case "raw":
    // compare's raw-LMDB column alone (prefilled as compare does), for strace or perf beside `single`.
    let batch = arguments.firstIndex(of: "--batch").flatMap { Int(arguments[$0 + 1]) } ?? 1
    let rate = try RawLMDB.appendRate(folder: folder, count: edits, perCommit: batch, prefill: 200_000)
    print("raw LMDB records/s:", rate)
case "payload":
    let peer = try StrataPeer(folder: folder)
    let t0 = ContinuousClock.now
    let bytes = try peer.pendingPayload()
    print("payload bytes:", bytes, "in", ContinuousClock.now - t0)
case "verify":
    print(try StrataPeer(folder: folder).store.verify())
case "reads":
    // compare's point reads on a store made by `build`: `--edits` random lookups (default
    // 100,000), each in a read transaction of its own.
    let peer = try StrataPeer(folder: folder)
    let count = arguments.firstIndex(of: "--edits").flatMap { Int(arguments[$0 + 1]) } ?? 100_000
    var g = SplitMix64(seed: 11)
    let ids = (0..<count).map { _ in Int64(1 + g.next() % 100_000) }
    var found = 0
    let t0 = ContinuousClock.now
    for id in ids where try peer.readRow(id) { found += 1 }
    let d = ContinuousClock.now - t0
    print(String(format: "%d reads (%d found): %.0f reads/s", count, found, Double(count) / seconds(d)))
case "concurrent":
    // compare's concurrent-writers phase alone, Strata then plain SQLite, `--edits` in all
    // (default 4,000), `--threads` writers (default 8), each in a fresh folder under `folder`.
    let total = arguments.firstIndex(of: "--edits").flatMap { Int(arguments[$0 + 1]) } ?? 4_000
    let threads = arguments.firstIndex(of: "--threads").flatMap { Int(arguments[$0 + 1]) } ?? 8
    try? FileManager.default.removeItem(atPath: folder)
    let strata = try ConcurrentWriters.strata(folder: folder + "/strata", threads: threads, total: total, durability: durability)
    let sqlite = try ConcurrentWriters.sqlite(folder: folder + "/sqlite", threads: threads, total: total)
    try? FileManager.default.removeItem(atPath: folder)
    print(String(format: "%d writers, %d edits: Strata %.0f/s, SQLite plain %.0f/s, ratio %.2f×", threads, total, strata, sqlite, strata / sqlite))
case "replay":
    // Replays the store at `folder` (made by `build`) into `folder`-replay; reports the time and
    // the heap's growth, sampled every 10,000 operations through the progress callback.
    let store = try StrataPeer(folder: folder).store
    let target = folder + "-replay"
    try? FileManager.default.removeItem(atPath: target)
    defer { try? FileManager.default.removeItem(atPath: target) }
    let base = ProcessMemory.anonymous
    var peak = base
    let t0 = ContinuousClock.now
    let replayed = try store.replay(into: target) { _, _ in peak = max(peak, ProcessMemory.anonymous) }
    let d = ContinuousClock.now - t0
    print("replayed \(try replayed.read { try $0.lastLSN }) operations in \(d); heap growth \(Double(peak - base) / 1_048_576) MiB")
    replayed.close()
case "rebuild":
    print("folded:", try StrataPeer(folder: folder).store.rebuild())
default:
    print("unknown phase \(phase)")
    exit(2)
}
print(phase, ContinuousClock.now - start)

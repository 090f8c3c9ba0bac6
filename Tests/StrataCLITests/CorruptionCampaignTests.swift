import Foundation
import Strata
import StrataSync
import Synchronization
import Testing

/// SplitMix64: small, fast, and the same sequence everywhere for a seed.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The corruption campaign: damaged copies of a fixture store (bit flips, random bytes over
/// pages, zeroed pages, truncation, appended garbage, a swapped lock file), each run through
/// every CLI command that opens a store, in child processes, and through the library's
/// open-and-read path with each check at open.
///
/// Every outcome is tallied; a crash in Strata's own code (a trap, or a fault whose innermost
/// frame outside libc is not liblmdb) fails the test with the seed and the trial to replay it:
/// `STRATA_SEED=<seed> STRATA_CAMPAIGN_TRIAL=<n> swift test --filter CorruptionCampaign`.
/// `STRATA_CAMPAIGN_TRIALS` sets the number of trials (CI runs the default).
@Suite struct CorruptionCampaignTests {
    /// Trials run by default: what fits in about two minutes of CI on two cores.
    static let defaultTrials = 250
    /// Trials run at once.
    static let workers = 6

    enum Mutation: CaseIterable {
        case bitFlips, randomPage, zeroedPage, truncation, appendedGarbage, swappedLockFile
    }

    struct Tally {
        var trials = 0
        var runs = 0
        /// Crashes in Strata's own code: must stay 0.
        var strataCrashes: [String] = []
        /// A command's page check (every command runs one before LMDB reads the store) found
        /// the damage and said so: exit 3.
        var damageFound = 0
        /// Commands that died inside liblmdb itself (not Strata's code): damage the page check
        /// does not see.
        var lmdbCrashes = 0
        /// A few of those, printed so the classification can be checked by eye.
        var lmdbCrashSamples: [String] = []
        /// A command reported the damage (or a missing store) as a clear error.
        var clearErrors = 0
        /// A command ran to the end (the damage missed what it read).
        var clean = 0
        /// Commands killed after the time limit (a damaged tree can loop).
        var hung = 0
        /// Faults in libc's vectorised memcpy that Swift's backtracer cannot unwind out of (no
        /// frame pointer), so the caller is unknown; printed in full, never silently excused.
        var unattributed = 0
        var unattributedSamples: [String] = []
        /// Which commands were killed, and on what damage.
        var hungSamples: [String] = []
        /// The library's open-and-read path (`Store(path:options:)`, then every table, the pending
        /// rows and the log, in `strata-crash-helper open-and-read`), by `checkAtOpen`: the runs
        /// that died of a signal, and those that refused the store with `corruptStore`.
        var libraryDeaths: [String: Int] = [:]
        var libraryRefusals: [String: Int] = [:]
        var libraryDeathSamples: [String] = []
        /// Runs after a death of the library's open-and-read that died again: the open after a
        /// crash finds the marker it left and runs the full check, so this must stay 0.
        var crashLoops = 0
        /// Operations `salvage` recovered, over all trials.
        var salvagedOperations = 0
        var salvages = 0
    }

    @Test func aCorruptionCampaignFindsNoCrashInStrata() throws {
        let environment = ProcessInfo.processInfo.environment
        // A fixed seed, so CI runs the same campaign every time; STRATA_SEED replays another.
        let seed = environment["STRATA_SEED"].flatMap(UInt64.init) ?? 19_2026
        let trials = environment["STRATA_CAMPAIGN_TRIALS"].flatMap(Int.init) ?? Self.defaultTrials
        let only = environment["STRATA_CAMPAIGN_TRIAL"].flatMap(Int.init)
        print("CorruptionCampaign: seed \(seed), \(trials) trials (replay with STRATA_SEED=\(seed) STRATA_CAMPAIGN_TRIAL=<n>)")

        let root = FileManager.default.temporaryDirectory.appendingPathComponent("strata-campaign-\(UUID().uuidString)").path
        // STRATA_CAMPAIGN_KEEP=1 keeps the damaged copies, to look at a replayed trial.
        let keep = environment["STRATA_CAMPAIGN_KEEP"] != nil
        defer { if !keep { try? FileManager.default.removeItem(atPath: root) } }
        if keep { print("CorruptionCampaign: keeping the damaged copies in \(root)") }
        let fixture = root + "/fixture"
        let otherLock = root + "/other"
        try Self.makeFixture(fixture)
        try Self.makeFixture(otherLock)
        // What `merge` and `import` read besides the damaged store: a delta and a briefcase.
        try WireFormat.encode(ServerDelta(anchor: "a2", tables: [
            TableDelta("tasks", upserts: (395...410).map { ServerRow(["id": .int(Int64($0)), "title": .string("server again \($0)")]) },
                       deletes: [.init(.int(7))]),
        ])).write(to: URL(fileURLWithPath: root + "/delta.json"))
        let exported = try runProcess(try strataExecutable(), ["export", fixture, root + "/fixture.briefcase", "--table", "tasks"], killAfter: 60)
        #expect(exported.status == 0, "exporting the fixture's briefcase: \(exported.err)")

        let tally = Locked(Tally())
        let indices = only.map { [$0] } ?? Array(0..<trials)
        let started = Date()
        // Children spend much of their time waiting (process start, fsync): more workers than
        // cores keep both cores busy.
        let next = Locked(0)
        let group = DispatchGroup()
        for _ in 0..<min(Self.workers, indices.count) {
            DispatchQueue.global().async(group: group) {
                while true {
                    let i: Int = next.withLock { n in defer { n += 1 }; return n }
                    guard i < indices.count else { return }
                    runTrial(indices[i])
                }
            }
        }
        group.wait()
        @Sendable func runTrial(_ trial: Int) {
            do {
                let t = try Self.run(trial: trial, seed: seed, fixture: fixture, otherLock: otherLock, root: root, keep: keep)
                tally.withLock { total in
                    total.trials += 1
                    total.runs += t.runs
                    total.strataCrashes += t.strataCrashes
                    total.damageFound += t.damageFound
                    total.lmdbCrashes += t.lmdbCrashes
                    if total.lmdbCrashSamples.count < 3 { total.lmdbCrashSamples += t.lmdbCrashSamples.prefix(3 - total.lmdbCrashSamples.count) }
                    total.clearErrors += t.clearErrors
                    total.clean += t.clean
                    total.hung += t.hung
                    total.unattributed += t.unattributed
                    total.unattributedSamples += t.unattributedSamples
                    if total.hungSamples.count < 5 { total.hungSamples += t.hungSamples.prefix(5 - total.hungSamples.count) }
                    total.libraryDeaths.merge(t.libraryDeaths, uniquingKeysWith: +)
                    total.libraryRefusals.merge(t.libraryRefusals, uniquingKeysWith: +)
                    total.crashLoops += t.crashLoops
                    if total.libraryDeathSamples.count < 5 { total.libraryDeathSamples += t.libraryDeathSamples.prefix(5 - total.libraryDeathSamples.count) }
                    total.salvagedOperations += t.salvagedOperations
                    total.salvages += t.salvages
                }
            } catch {
                tally.withLock { $0.strataCrashes.append("trial \(trial): the trial itself failed: \(error)") }
            }
        }
        let t = tally.withLock { $0 }
        print("""
            CorruptionCampaign tally (seed \(seed), \(t.trials) trials, \(t.runs) command runs, \(Int(Date().timeIntervalSince(started))) s):
              crashes in Strata's own code:  \(t.strataCrashes.count)
              damage found by the page check (exit 3): \(t.damageFound)
              crashes inside liblmdb:        \(t.lmdbCrashes)
              clear errors:                  \(t.clearErrors)
              ran clean:                     \(t.clean)
              killed after the time limit:   \(t.hung)
              faults in memcpy, caller not unwound: \(t.unattributed)
              salvaged records:              \(t.salvagedOperations) in \(t.salvages) salvages
              library open-and-read, by checkAtOpen: \(["none", "quick", "full"].map { "\($0): \(t.libraryDeaths[$0] ?? 0) died, \(t.libraryRefusals[$0] ?? 0) refused as corruptStore" }.joined(separator: "; "))
              the next launch after such a death died again: \(t.crashLoops)
            """)
        for sample in t.libraryDeathSamples { print("  library death: \(sample)") }
        for sample in t.lmdbCrashSamples { print("  liblmdb crash: \(sample)") }
        for sample in t.hungSamples { print("  killed: \(sample)") }
        for sample in t.unattributedSamples { print("  memcpy fault, caller unknown: \(sample)") }
        #expect(t.strataCrashes.isEmpty, "\(t.strataCrashes.count) crashes in Strata's own code (seed \(seed)):\n\(t.strataCrashes.prefix(20).joined(separator: "\n"))")
        #expect(t.trials == indices.count)
        // Every command runs the full page check before LMDB reads the file: none may die of a
        // signal, inside liblmdb or not, and none may hang.
        #expect(t.lmdbCrashes == 0, "\(t.lmdbCrashes) CLI runs died inside liblmdb (seed \(seed)):\n\(t.lmdbCrashSamples.joined(separator: "\n"))")
        #expect(t.unattributed == 0, "\(t.unattributed) CLI runs died in memcpy (seed \(seed)):\n\(t.unattributedSamples.prefix(5).joined(separator: "\n"))")
        #expect(t.hung == 0, "\(t.hung) CLI runs were killed after the time limit (seed \(seed)):\n\(t.hungSamples.joined(separator: "\n"))")
        // The full check leaves LMDB nothing to die on.
        #expect(t.crashLoops == 0, "\(t.crashLoops) crash loops: an open after a death died again (seed \(seed))")
        #expect(t.libraryDeaths["full", default: 0] == 0, "the library opened with the full check died \(t.libraryDeaths["full", default: 0]) times (seed \(seed)):\n\(t.libraryDeathSamples.joined(separator: "\n"))")
    }

    /// Builds the fixture: a few hundred rows over several transactions, acknowledged, edited,
    /// merged with a server delta and compacted, so every database has pages.
    static func makeFixture(_ path: String) throws {
        let store = try Store(path: path)
        try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title"), .int("priority", default: 0)]))
        try store.createIndex("by_priority", on: "tasks", fields: ["priority"])
        for batch in 0..<4 {
            try store.write { tx in
                for i in 1...100 {
                    let id = Int64(batch * 100 + i)
                    try tx.insert("tasks", ["id": .int(id), "title": .string("task \(id) " + String(repeating: "x", count: Int(id % 40))), "priority": .int(id % 5)])
                }
            }
        }
        try store.write { tx in for row in try tx.snapshot.pendingRows("tasks").prefix(300) { try tx.acknowledge("tasks", key: row.key) } }
        try store.write { tx in
            for i in stride(from: 1, through: 400, by: 3) { try tx.update("tasks", key: .init(.int(Int64(i))), ["priority": .int(9)]) }
            for i in stride(from: 2, through: 400, by: 11) { try tx.delete("tasks", key: .init(.int(Int64(i)))) }
        }
        try SyncClient(store: store, policy: .deferred).merge(ServerDelta(anchor: "a1", tables: [
            TableDelta("tasks", upserts: (301...320).map { ServerRow(["id": .int(Int64($0)), "title": .string("server \($0)")]) }),
        ]))
        _ = try store.compact(retaining: .operations(200))
    }

    /// One trial: a damaged copy, every command on it.
    static func run(trial: Int, seed: UInt64, fixture: String, otherLock: String, root: String, keep: Bool = false) throws -> Tally {
        var rng = SplitMix64(seed: seed ^ (UInt64(trial) &* 0x9E37_79B9_7F4A_7C15))
        let dir = root + "/trial-\(trial)"
        defer { if !keep { try? FileManager.default.removeItem(atPath: dir) } }
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for name in ["data.mdb", "lock.mdb"] {
            try FileManager.default.copyItem(atPath: fixture + "/" + name, toPath: dir + "/" + name)
        }
        let mutation = Mutation.allCases.randomElement(using: &rng)!
        let what = try damage(dir, mutation, otherLock: otherLock, using: &rng)
        var tally = Tally()
        // Every command that opens a store. Those that only read run on the damaged copy itself;
        // those that write (or make a store or file of their own) each get a fresh copy of the
        // damaged one, so that what one writes is never what the next one reads.
        let readers: [[String]] = [
            ["check", dir], ["info", dir], ["log", dir], ["show", dir, "tasks"], ["history", dir, "tasks", "5"],
            ["pending", dir, "--held-back"], ["conflicts", dir], ["verify", dir],
        ]
        let writers: [[String]] = [
            ["salvage", "{}", "{}-salvaged", "--json"], ["export", "{}", "{}.briefcase"], ["copy", "{}", "{}-copy"],
            ["copy", "{}", "{}-copy", "--compact"], ["replay", "{}", "{}-replay"], ["compact", "{}"],
            ["compact", "{}", "--keep-operations", "0", "--reclaim"], ["rebuild", "{}"], ["resolve", "{}", "tasks", "301", "--server"],
            ["merge", "{}", root + "/delta.json"], ["import", "{}", root + "/fixture.briefcase"],
            // No server listens on port 9: the sync gets as far as opening the store and pulling.
            ["sync", "{}", "--server", "http://127.0.0.1:9", "--token", "t", "--timeout", "2"],
        ]
        var commands = readers
        for (i, arguments) in writers.enumerated() {
            let copy = dir + "-w\(i)"
            try? FileManager.default.removeItem(atPath: copy)
            try FileManager.default.copyItem(atPath: dir, toPath: copy)
            commands.append(arguments.map { $0.replacingOccurrences(of: "{}", with: copy) })
        }
        defer {
            if !keep {
                let parent = URL(fileURLWithPath: dir).deletingLastPathComponent().path
                let name = URL(fileURLWithPath: dir).lastPathComponent
                for entry in (try? FileManager.default.contentsOfDirectory(atPath: parent)) ?? [] where entry.hasPrefix(name + "-w") {
                    try? FileManager.default.removeItem(atPath: parent + "/" + entry)
                }
            }
        }
        for arguments in commands {
            tally.runs += 1
            var r = try runChild(arguments, backtrace: false)
            if r.timedOut {
                tally.hung += 1
                tally.hungSamples.append("trial \(trial) (\(what)): `strata \(arguments[0])`")
                continue
            }
            if r.signal != nil {
                // Again with Swift's backtracer, to see whose code crashed (slow, so only now).
                // What the first run made (a salvaged store, a copy, a briefcase) would change the second.
                if ["salvage", "export", "copy", "replay"].contains(arguments[0]) { try? FileManager.default.removeItem(atPath: arguments[2]) }
                let again = try runChild(arguments, backtrace: true)
                if again.signal != nil { r = again }
            }
            if let signal = r.signal {
                if unattributed(r.err) {
                    tally.unattributed += 1
                    tally.unattributedSamples.append("trial \(trial) (\(what)): `strata \(arguments[0])` signal \(signal): \(crashSummary(r.err))")
                } else if crashedInLMDB(r.err) {
                    tally.lmdbCrashes += 1
                    tally.lmdbCrashSamples.append("trial \(trial) (\(what)): `strata \(arguments[0])` signal \(signal): \(crashSummary(r.err))")
                } else {
                    tally.strataCrashes.append("trial \(trial) (\(what)): `strata \(arguments[0])` died of signal \(signal): \(crashSummary(r.err))")
                }
                continue
            }
            switch r.status {
            case 0:
                tally.clean += 1
                if arguments[0] == "salvage" {
                    tally.salvages += 1
                    if let report = try? JSONSerialization.jsonObject(with: Data(r.out.utf8)) as? [String: Any] {
                        tally.salvagedOperations += report["recoveredOperations"] as? Int ?? 0
                    }
                }
            case 3:
                tally.damageFound += 1
            case 1, 2:
                tally.clearErrors += 1
            default:
                tally.strataCrashes.append("trial \(trial) (\(what)): `strata \(arguments[0])` exited with \(r.status): \(r.err.prefix(200))")
            }
        }
        // The library, with each check at open. The marker a run that died leaves behind would
        // make the next run's open check fully: each run starts without it.
        let helper = try strataExecutable().deletingLastPathComponent().appendingPathComponent("strata-crash-helper")
        for check in ["none", "quick", "full"] {
            try? FileManager.default.removeItem(atPath: dir + "/strata-open.marker")
            let r = try runProcess(helper, ["open-and-read", dir, check], environment: ["SWIFT_BACKTRACE": "enable=no"], killAfter: 60)
            if r.signal != nil || r.killed {
                tally.libraryDeaths[check, default: 0] += 1
                if check != "none" { tally.libraryDeathSamples.append("trial \(trial) (\(what)): checkAtOpen .\(check): \(r.killed ? "killed after the time limit" : "signal \(r.signal!)")") }
                // The app's next launch, with the marker the death left: the full check runs.
                if check != "none" {
                    let again = try runProcess(helper, ["open-and-read", dir, check], environment: ["SWIFT_BACKTRACE": "enable=no"], killAfter: 60)
                    if again.signal != nil || again.killed { tally.crashLoops += 1 }
                }
            } else if r.out.hasPrefix("E corruptStore") {
                tally.libraryRefusals[check, default: 0] += 1
            }
        }
        return tally
    }

    /// Applies `mutation` to the store in `dir`; returns a description for failure messages.
    static func damage(_ dir: String, _ mutation: Mutation, otherLock: String, using rng: inout SplitMix64) throws -> String {
        let file = dir + "/data.mdb"
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
        let pages = bytes.count / 4096
        var what: String
        switch mutation {
        case .bitFlips:
            let n = Int.random(in: 1...8, using: &rng)
            var at: [Int] = []
            for _ in 0..<n {
                let i = Int.random(in: 0..<bytes.count, using: &rng)
                bytes[i] ^= 1 << UInt8.random(in: 0...7, using: &rng)
                at.append(i)
            }
            what = "bits flipped at \(at)"
        case .randomPage:
            let first = Int.random(in: 0..<pages, using: &rng)
            let count = min(Int.random(in: 1...3, using: &rng), pages - first)
            for i in (first * 4096)..<((first + count) * 4096) { bytes[i] = UInt8.random(in: 0...255, using: &rng) }
            what = "random bytes over pages \(first)..<\(first + count)"
        case .zeroedPage:
            let page = Int.random(in: 0..<pages, using: &rng)
            for i in (page * 4096)..<((page + 1) * 4096) { bytes[i] = 0 }
            what = "page \(page) zeroed"
        case .truncation:
            let length = Int.random(in: 0..<bytes.count, using: &rng)
            bytes.removeLast(bytes.count - length)
            what = "truncated to \(length) bytes"
        case .appendedGarbage:
            let n = Int.random(in: 1...20_000, using: &rng)
            bytes += (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) }
            what = "\(n) garbage bytes appended"
        case .swappedLockFile:
            if Bool.random(using: &rng) {
                try FileManager.default.removeItem(atPath: dir + "/lock.mdb")
                try FileManager.default.copyItem(atPath: otherLock + "/lock.mdb", toPath: dir + "/lock.mdb")
                what = "lock file of another store"
            } else {
                let n = Int.random(in: 0...9_000, using: &rng)
                try Data((0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) }).write(to: URL(fileURLWithPath: dir + "/lock.mdb"))
                what = "lock file of \(n) random bytes"
            }
        }
        try Data(bytes).write(to: URL(fileURLWithPath: file))
        return what
    }

    /// Runs `strata` with a time limit; the backtracer is off unless asked for.
    static func runChild(_ arguments: [String], backtrace: Bool) throws -> (signal: Int32?, status: Int32, out: String, err: String, timedOut: Bool) {
        let backtracer = backtrace ? "enable=yes,interactive=no,color=no,preset=full,threads=crashed,registers=none,images=none,unwind=precise" : "enable=no"
        let r = try runProcess(try strataExecutable(), arguments, environment: ["SWIFT_BACKTRACE": backtracer], killAfter: 60)
        return (r.signal, r.status, r.out, r.err, r.killed)
    }

    /// Whether the crashed thread's innermost frame outside the C library is in liblmdb (an
    /// LMDB assertion aborts through libc, a bad page faults in mdb_* or in a libc memcpy).
    static func crashedInLMDB(_ stderr: String) -> Bool {
        if stderr.contains("mdb.c:") && stderr.contains("Assertion") { return true }
        let lines = stderr.split(separator: "\n")
        guard let start = lines.firstIndex(where: { $0.contains("crashed:") }) else { return false }
        for line in lines[(start + 1)...].prefix(12) where line.contains(" in ") {
            if line.contains("libc.so") || line.contains("ld-linux") || line.contains("libpthread") { continue }
            return line.contains("liblmdb")
        }
        return false
    }

    /// Whether the crashed thread faulted in libc's memcpy and the backtracer could not name
    /// its caller (the next frame is a bare, unresolved address).
    static func unattributed(_ stderr: String) -> Bool {
        let lines = stderr.split(separator: "\n")
        guard let start = lines.firstIndex(where: { $0.contains("crashed:") }) else { return false }
        let frames = lines[(start + 1)...].filter { $0.trimmingCharacters(in: .whitespaces).first?.isNumber == true }.prefix(2)
        guard frames.count == 2, frames.first!.contains("memcpy") || frames.first!.contains("memmove") else { return false }
        return !frames.last!.contains(" in ")
    }

    static func crashSummary(_ stderr: String) -> String {
        let lines = stderr.split(separator: "\n")
        let start = lines.firstIndex { $0.contains("crashed:") } ?? 0
        return lines.filter { $0.contains("Fatal error") || $0.contains("runtime failure") }.prefix(1).joined()
            + " | " + lines[start...].prefix(6).joined(separator: " | ")
    }
}

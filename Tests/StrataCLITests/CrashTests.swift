import Foundation
@testable import Strata
import StrataLibc
import StrataWorkload
import Synchronization
import Testing

/// A writer process killed with SIGKILL at random moments, again and again: after every kill the
/// store opens, `verify()` passes, every transaction the writer reported committed is there, and
/// no transaction is half there. (A killed *process* loses nothing in any durability mode: the
/// data is in the kernel's page cache. What power loss can lose is documented per mode.)
@Suite struct CrashTests {
    static func helper() throws -> URL {
        try strataExecutable().deletingLastPathComponent().appendingPathComponent("strata-crash-helper")
    }

    @Test(arguments: ["full", "noMetaSync", "noSync"])
    func killedWritersLeaveEveryCommittedTransactionAndNoHalfOne(mode: String) throws {
        let seed = ProcessInfo.processInfo.environment["STRATA_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
        print("killedWriters(\(mode)): seed \(seed) (replay with STRATA_SEED=\(seed))")
        var g = SplitMix64(seed: seed)
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-crash-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        var lastCommitted = 0
        for round in 0..<6 {
            // Checkpoints after every commit, every few commits, or never: kills land inside
            // checkpoints, and reopens fold tails of every length.
            let budget = ["0", "65536", String(Int.max)][round % 3]
            let writer = try KilledWriter([path, mode, String(g.next())], environment: ["STRATA_OVERLAY_BUDGET": budget])
            // Waits for a first commit (a slow start, under a sanitizer or a loaded machine, must
            // not end a round empty), then kills it mid-write, a random moment later.
            writer.wait { $0.contains("C ") }
            let output = writer.kill(after: 20_000 + g.next() % 250_000)
            #expect(writer.process.terminationReason == .uncaughtSignal, "round \(round): the writer stopped by itself")
            let lines = output.split(separator: "\n")
            let reported = lines.compactMap { $0.hasPrefix("C ") ? Int($0.dropFirst(2)) : nil }.last ?? lastCommitted
            #expect(reported > lastCommitted, "round \(round): the writer committed nothing")

            let store = try Store(path: path)
            let report = try store.verify()
            #expect(report.isConsistent, "round \(round): \(report)")
            let counter = Int(try store.read { try $0.row("crash", key: 0)?["txn"].intValue ?? -1 })
            // Everything reported is there (the writer may have committed one more before printing).
            #expect(counter >= reported && counter <= reported + 1, "round \(round): counter \(counter), reported \(reported)")
            let rows = try store.read { try $0.rows("crash", includingDeleted: true) }
            var parts: [Int: Int] = [:]
            for row in rows where row.key != 0 { parts[Int(row["txn"].intValue!), default: 0] += 1 }
            for m in 1...max(1, counter) where counter > 0 {
                #expect(parts[m] == 5, "round \(round): transaction \(m) has \(parts[m] ?? 0) of its 5 rows")
            }
            #expect(parts.keys.allSatisfy { $0 <= counter }, "round \(round): a transaction after the counter is (half) there")
            lastCommitted = counter
        }
    }

    /// Four threads write at once, so their closures commit in groups (one LMDB transaction, one
    /// fsync each), and the process is killed mid-stream: every closure a thread saw commit is
    /// there whole, no closure is half there, and no closure that threw (and rolled back inside
    /// its group) left a trace.
    @Test func aWriterKilledDuringGroupCommitsLosesNoCommittedClosureAndKeepsNoRolledBackOne() throws {
        let seed = ProcessInfo.processInfo.environment["STRATA_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
        print("killedGroupWriter: seed \(seed) (replay with STRATA_SEED=\(seed))")
        var g = SplitMix64(seed: seed)
        let threads = 4
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-group-crash-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        var last = [Int](repeating: 0, count: threads)
        for round in 0..<4 {
            let writer = try KilledWriter(["group-writer", path, String(g.next()), String(threads)])
            // Waits until every thread has committed (so groups form), then a random moment more.
            func reported(_ output: String) -> [Int] {
                var r = last
                for line in output.split(separator: "\n") {
                    let f = line.split(separator: " ")
                    if f.count == 3, f[0] == "C", let t = Int(f[1]), let i = Int(f[2]), t < threads { r[t] = max(r[t], i) }
                }
                return r
            }
            writer.wait { !zip(reported($0), last).contains(where: { $0 <= $1 }) }
            let output = writer.kill(after: 20_000 + g.next() % 200_000)
            #expect(writer.process.terminationReason == .uncaughtSignal, "round \(round): the writer stopped by itself: \(output.suffix(300))")
            let seen = reported(output)

            let store = try Store(path: path)
            let report = try store.verify()
            #expect(report.isConsistent, "round \(round): \(report)")
            let rows = try store.read { try $0.rows("group") }
            var counters = [Int](repeating: -1, count: threads)
            var parts: [[Int]: Int] = [:]
            for row in rows {
                let t = Int(row["thread"].intValue!), i = Int(row["iteration"].intValue!)
                if row.key == RowKey(.int(Int64(t))) { counters[t] = i; continue }
                #expect(row["payload"].stringValue != "doomed", "round \(round): a rolled-back closure of thread \(t) (iteration \(i)) is in the store")
                parts[[t, i], default: 0] += 1
            }
            for t in 0..<threads {
                // Everything a thread saw commit is there; it may have committed one more
                // before it could print.
                #expect(counters[t] >= seen[t] && counters[t] <= seen[t] + 1, "round \(round): thread \(t) counter \(counters[t]), reported \(seen[t])")
                for i in stride(from: 1, through: counters[t], by: 1) {
                    #expect(parts[[t, i]] == 5, "round \(round): thread \(t) iteration \(i) has \(parts[[t, i]] ?? 0) of its 5 rows")
                }
                #expect(!parts.keys.contains { $0[0] == t && $0[1] > counters[t] }, "round \(round): thread \(t) has rows past its counter")
            }
            last = counters
            store.close()
        }
    }
}

/// A `strata-crash-helper` writer whose output is collected as it comes, so that a test can wait
/// for what it printed and then SIGKILL it.
final class KilledWriter {
    let process = Process()
    private let out = Pipe()
    private let output = Locked(Data())

    init(_ arguments: [String], environment: [String: String] = [:]) throws {
        process.executableURL = try CrashTests.helper()
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        process.standardOutput = out
        out.fileHandleForReading.readabilityHandler = { [output] h in
            let chunk = h.availableData
            output.withLock { $0.append(chunk) }
        }
        try process.run()
    }

    /// What it printed so far.
    var text: String { String(decoding: output.withLock { $0 }, as: UTF8.self) }

    /// Waits (two minutes at most, or until it exits) until what it printed satisfies `done`.
    func wait(until done: (String) -> Bool) {
        let deadline = ContinuousClock.now + .seconds(120)
        while ContinuousClock.now < deadline, process.isRunning, !done(text) { usleep(5_000) }
    }

    /// Kills it `microseconds` from now and returns everything it printed.
    func kill(after microseconds: UInt64) -> String {
        usleep(UInt32(microseconds))
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        out.fileHandleForReading.readabilityHandler = nil
        let rest = out.fileHandleForReading.readDataToEndOfFile()
        output.withLock { $0.append(rest) }
        return text
    }
}

@Suite struct TwoProcessTests {
    /// One process writes, this one reads the same store meanwhile: every snapshot holds exactly
    /// the transactions up to its counter, each complete — no torn read, no deadlock.
    @Test func aReaderInAnotherProcessSeesOnlyWholeTransactions() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-2proc-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let writer = Process()
        writer.executableURL = try CrashTests.helper()
        writer.arguments = [path, "noSync", "7"]
        // The writer never checkpoints: every snapshot here folds the log's tail itself.
        // A short pause per commit keeps the table small enough that every snapshot's checks stay
        // quick while the rest of the suite loads the machine.
        writer.environment = ProcessInfo.processInfo.environment.merging(["STRATA_OVERLAY_BUDGET": String(Int.max), "STRATA_HELPER_PAUSE_US": "2000"]) { $1 }
        let out = Pipe()
        writer.standardOutput = out
        // Drains the writer's output as it comes (a full pipe would stop it) and notes its first
        // commit, which also created the table: a slow start (a sanitizer, a loaded machine) must
        // not find the store still empty.
        let started = Locked(false)
        out.fileHandleForReading.readabilityHandler = { h in
            if String(decoding: h.availableData, as: UTF8.self).contains("C ") { started.withLock { $0 = true } }
        }
        try writer.run()
        defer {
            kill(writer.processIdentifier, SIGKILL)
            writer.waitUntilExit()
            out.fileHandleForReading.readabilityHandler = nil
        }
        let startDeadline = ContinuousClock.now + .seconds(120)
        while ContinuousClock.now < startDeadline, writer.isRunning, !started.withLock({ $0 }) { usleep(5_000) }
        try #require(started.withLock { $0 }, "the writer process did not commit within 120 s")
        var options = StoreOptions()
        options.createIfMissing = false
        let store = try Store(path: path, options: options)
        var snapshots = 0
        var last = 0
        let deadline = ContinuousClock.now + .milliseconds(800)
        while ContinuousClock.now < deadline {
            let (counter, tagged) = try store.read { snap -> (Int, [Int: Int]) in
                let counter = Int(try snap.row("crash", key: 0)?["txn"].intValue ?? 0)
                var tagged: [Int: Int] = [:]
                let rows = try snap.rows("crash", includingDeleted: true)
                for row in rows where row.key != 0 { tagged[Int(row["txn"].intValue!), default: 0] += 1 }
                // The same snapshot through the pending view and a paged query agrees with it
                // (every third snapshot: a sorted page costs a sort of the whole table here).
                guard snapshots % 3 == 0 else { return (counter, tagged) }
                let pending = try snap.pendingRows("crash").map(\.key)
                #expect(pending == rows.filter { $0.status != .unchanged }.map(\.key), "the pending view disagrees with the rows")
                var paged: [RowKey] = []
                var token: PageToken? = nil
                repeat {
                    let page = try snap.page(Query("crash", orderBy: [.descending("txn"), .ascending("id")]), size: 2000, after: token)
                    paged += page.rows.map(\.key)
                    token = page.next
                } while token != nil
                let txnOf = Dictionary(uniqueKeysWithValues: rows.map { ($0.key, $0["txn"].intValue!) })
                let visible = rows.filter { $0.status != .deleted }.map(\.key)
                #expect(Set(paged) == Set(visible) && paged.count == visible.count, "a paged query disagrees with the rows")
                #expect(zip(paged, paged.dropFirst()).allSatisfy { txnOf[$0]! >= txnOf[$1]! }, "a paged query is out of order")
                return (counter, tagged)
            }
            #expect(tagged.keys.allSatisfy { $0 <= counter } && (1...max(counter, 1)).allSatisfy { counter == 0 || tagged[$0] == 5 }, "a torn snapshot at counter \(counter)")
            #expect(counter >= last, "the counter went backwards")
            last = counter
            snapshots += 1
        }
        #expect(snapshots > 5 && last > 0)
    }
}

extension TwoProcessTests {
    /// A write that fails in this process must leave nothing that a later snapshot could take
    /// for another process's commit. LMDB gives an aborted write's transaction id to the next
    /// commit; the overlay this process published used to be stamped with the id the failed
    /// write would have had, so a snapshot of the other process's commit (which took that id)
    /// was handed the old overlay unchecked, and the other process's row was missing.
    @Test func aFailedWriteDoesNotHideTheNextCommitOfAnotherProcess() throws {
        struct Refused: Error {}
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-2proc-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let store = try Store(path: path)
        try store.createTable(.fixed("t", fields: [.int("id"), .string("v")]))
        try store.write { try $0.insert("t", ["id": 1, "v": "here"]) }
        let before = try store.read { try $0.lastLSN }
        #expect(throws: Refused.self) {
            try store.write { tx in
                try tx.insert("t", ["id": 3, "v": "rolled back"])
                throw Refused()
            }
        }
        let other = try ResourceLimitTests.runHelper(["insert-and-exit", path, "2"])
        try #require(other.status == 0 && other.lines == ["OK"], "the other process failed: \(other.lines)")
        let (keys, lastLSN, pending) = try store.read { snap in
            (try snap.rows("t").map(\.key), try snap.lastLSN, try snap.pendingRows("t").map(\.key))
        }
        #expect(keys == [1, 2], "rows seen after the other process's commit")
        #expect(pending == [1, 2])
        #expect(lastLSN == before + 1)
        #expect(try store.verify().isConsistent)
    }

    /// The same for a write that succeeds but changes nothing: LMDB commits nothing for it, and
    /// gives its transaction id to the next commit. The overlay version it published used to be
    /// stamped with that id, so the next write here took it as current, unchecked, missed the
    /// other process's row, and a later checkpoint wrote views without it (the log kept it:
    /// `verify` named the difference). Seen in `SharedOpenProcessTests`, where the crash
    /// helper's writes that change nothing met this process's writes.
    @Test func aWriteThatChangesNothingDoesNotHideTheNextCommitOfAnotherProcess() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-2proc-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let store = try Store(path: path)
        try store.createTable(.fixed("t", fields: [.int("id"), .string("v")]))
        try store.write { try $0.insert("t", ["id": 1, "v": "here"]) }
        try store.write { _ in }
        let other = try ResourceLimitTests.runHelper(["insert-and-exit", path, "2"])
        try #require(other.status == 0 && other.lines == ["OK"], "the other process failed: \(other.lines)")
        try store.write { try $0.update("t", key: 1, ["v": "changed"]) }
        #expect(try store.read { try $0.rows("t").map(\.key) } == [1, 2])
        try store.checkpoint()
        let report = try store.verify()
        #expect(report.isConsistent, "\(report)")
    }

    /// A table another process creates is there for this process's next snapshot and write,
    /// though this process had found its cached catalog current for its last snapshot (a read
    /// and a write of the same snapshot take that catalog without reading `meta`).
    @Test func aTableAnotherProcessCreatesIsSeenByTheNextReadAndWrite() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-2proc-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let store = try Store(path: path)
        try store.createTable(.fixed("t", fields: [.int("id"), .string("v")]))
        try store.write { try $0.insert("t", ["id": 1, "v": "here"]) }
        #expect(try store.read { try $0.tables.map(\.name) } == ["t"])
        #expect(try store.read { try $0.count("t") } == 1)
        let other = try ResourceLimitTests.runHelper(["create-table-and-exit", path, "u"])
        try #require(other.status == 0 && other.lines == ["OK"], "the other process failed: \(other.lines)")
        #expect(try store.read { try $0.tables.map(\.name).sorted() } == ["t", "u"])
        #expect(try store.read { try $0.row("u", key: 1)?["v"] } == "from another process")
        try store.write { try $0.insert("u", ["id": 2, "v": "here too"]) }
        #expect(try store.read { try $0.rows("u").map(\.key) } == [1, 2])
        let report = try store.verify()
        #expect(report.isConsistent, "\(report)")
    }

    /// A process that only reads keeps no more overlay than the writing process has not
    /// checkpointed: once the other process checkpoints, the entries this one folded from the
    /// log's tail are in the views, and its next snapshot drops them instead of carrying them
    /// (and everything folded after them) for as long as it stays open.
    @Test func aReadingProcessDropsTheOverlayAnotherProcessCheckpointed() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-2proc-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let creator = try Store(path: path)
        try creator.createTable(.fixed("t", fields: [.int("id"), .string("v")]))
        creator.close()
        // A write left in the log's tail, by a process that did not checkpoint.
        let first = try ResourceLimitTests.runHelper(["insert-and-exit", path, "1"])
        try #require(first.status == 0 && first.lines == ["OK"], "the other process failed: \(first.lines)")
        var options = StoreOptions()
        options.createIfMissing = false
        let reader = try Store(path: path, options: options)
        #expect(try reader.read { try $0.count("t") } == 1)
        let folded = reader.overlay.current
        #expect(folded.bytes > 0, "the reader folded the tail into its overlay")
        // The other process checkpoints what this one has already folded.
        let other = try ResourceLimitTests.runHelper(["checkpoint", path])
        try #require(other.status == 0 && other.lines == ["OK"], "the other process failed: \(other.lines)")
        #expect(try reader.read { try $0.count("t") } == 1)
        let after = reader.overlay.current
        #expect(after.base > folded.base, "the overlay starts at the other process's checkpoint")
        #expect(after.bytes == 0 && after.isEmpty, "the reader still holds \(after.bytes) bytes the views have")
        #expect(try reader.verify().isConsistent)
    }
}

@Suite struct ResourceLimitTests {
    /// Runs the crash helper to completion and returns its output lines.
    static func runHelper(_ arguments: [String]) throws -> (status: Int32, lines: [String]) {
        let process = Process()
        process.executableURL = try CrashTests.helper()
        process.arguments = arguments
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init))
    }

    /// A full disk, simulated with a file size limit (RLIMIT_FSIZE) on the writer: the write that
    /// does not fit fails with `diskFull`, the process goes on (no crash), and the store holds
    /// every transaction committed before it and nothing of the failed one.
    @Test(arguments: ["full", "noSync"])
    func aFullDiskFailsTheWriteAndLeavesTheStoreIntact(mode: String) throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-full-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let (status, lines) = try Self.runHelper([path, mode, "11", String(3 << 20)])
        #expect(status == 0, "the writer crashed: \(lines.suffix(3))")
        let committed = lines.compactMap { $0.hasPrefix("C ") ? Int($0.dropFirst(2)) : nil }.last ?? 0
        #expect(committed > 10, "the writer committed too little before the disk filled")
        let failure = try #require(lines.first { $0.hasPrefix("E ") }, "no write failed: \(lines.suffix(3))")
        #expect(failure.hasPrefix("E diskFull the disk is full"), "\(failure)")

        let store = try Store(path: path)
        #expect(try store.verify().isConsistent)
        let counter = Int(try store.read { try $0.row("crash", key: 0)?["txn"].intValue ?? -1 })
        #expect(counter == committed)
        let rows = try store.read { try $0.rows("crash", includingDeleted: true) }
        var parts: [Int: Int] = [:]
        for row in rows where row.key != 0 { parts[Int(row["txn"].intValue!), default: 0] += 1 }
        #expect((1...counter).allSatisfy { parts[$0] == 5 } && parts.keys.allSatisfy { $0 <= counter })
        // With room again, the store takes writes.
        try store.write { try $0.update("crash", key: 0, ["payload": "after"]) }
        #expect(try store.verify().isConsistent)
    }
}

@Suite struct ReaderSlotTests {
    /// Processes killed while reading leave their reader slots taken (each slot names its
    /// process). While another process keeps the store open, LMDB does not notice: the slots stay
    /// taken and pin old pages. The next `Store` opened clears exactly those slots.
    @Test func slotsOfKilledReadersAreClearedOnOpen() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-readers-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let keeper = try Store(path: path)
        try keeper.createTable(.fixed("t", fields: [.int("id")]))
        // All readers at once: each opener clears the slots of dead processes it finds.
        var processes: [Process] = []
        for _ in 0..<3 {
            let process = Process()
            process.executableURL = try CrashTests.helper()
            process.arguments = ["read-and-wait", path, "126"]
            let out = Pipe()
            process.standardOutput = out
            try process.run()
            // Killed only once its read transaction holds a slot.
            let line = String(decoding: out.fileHandleForReading.availableData, as: UTF8.self)
            #expect(line.hasPrefix("R"), "the reader did not start: \(line)")
            processes.append(process)
        }
        for p in processes {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
        let (status, lines) = try ResourceLimitTests.runHelper(["check-readers", path, "126"])
        #expect(status == 0 && lines == ["S 3", "OK"], "got \(lines)")
        // Cleared for good: the next opener finds none.
        let (_, again) = try ResourceLimitTests.runHelper(["check-readers", path, "126"])
        #expect(again == ["S 0", "OK"], "got \(again)")
        _ = keeper
    }
}

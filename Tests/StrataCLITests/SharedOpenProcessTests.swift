import Foundation
import Strata
import StrataLibc
import StrataWorkload
import Synchronization
import Testing

@Suite struct SharedOpenProcessTests {
    /// The issue's second reproduction: this process keeps a `Store` open and writes, and keeps
    /// opening and closing a second `Store` on the same path, while writer processes come and go.
    /// Before the registry, closing the second environment dropped this process's LMDB file
    /// locks, so the next writer process to start believed it was alone, reset the lock file
    /// (reader table, writer mutex) under this process's feet, and committed transactions
    /// vanished while `verify` still said "consistent". Every transaction either side reported
    /// must be there, whole.
    @Test func aSecondStoreOpenedAndClosedBesideWriterProcessesLosesNothing() throws {
        let seed = ProcessInfo.processInfo.environment["STRATA_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
        print("aSecondStoreOpenedAndClosedBesideWriterProcessesLosesNothing: seed \(seed) (replay with STRATA_SEED=\(seed))")
        var g = SplitMix64(seed: seed)
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-2open-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        var options = StoreOptions()
        options.durability = .noMetaSync
        let keeper = try Store(path: path, options: options)
        try keeper.createTable(.fixed("side", fields: [.int("id"), .string("by")]))
        var sideRows = 0
        var reported = 0
        // This process also writes without pause on another thread, through the Store it keeps,
        // so that a writer process starting up finds it in the middle of a write.
        let background = Locked<(stop: Bool, rows: Int, failure: String?)>((false, 0, nil))
        let backgroundDone = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            var n = 0
            while !background.withLock({ $0.stop }) {
                do {
                    try keeper.write { try $0.insert("side", ["id": .int(Int64(1_000_000 + n)), "by": "background"]) }
                    n += 1
                } catch {
                    background.withLock { $0.failure = "\(error)" }
                    break
                }
            }
            background.withLock { $0.rows = n }
            backgroundDone.signal()
        }
        for round in 0..<6 {
            // A new writer process each round: one that opens the store while this process's
            // locks are gone would take itself for the only user.
            let writer = Process()
            writer.executableURL = try CrashTests.helper()
            writer.arguments = [path, "noMetaSync", String(g.next())]
            let out = Pipe()
            writer.standardOutput = out
            try writer.run()
            let first = String(decoding: out.fileHandleForReading.availableData, as: UTF8.self)
            #expect(first.hasPrefix("C "), "round \(round): the writer did not start: \(first)")
            let deadline = ContinuousClock.now + .milliseconds(200 + Int(g.next() % 300))
            while ContinuousClock.now < deadline {
                let second = try Store(path: path, options: options)
                _ = try second.read { try $0.row("crash", key: 0) }
                try second.write { try $0.insert("side", ["id": .int(Int64(sideRows)), "by": "second"]) }
                sideRows += 1
                if g.next() % 2 == 0 { second.close() }
                // Reads and writes through the Store kept open all along.
                try keeper.read { snap in
                    let counter = Int(try snap.row("crash", key: 0)?["txn"].intValue ?? 0)
                    #expect(counter >= reported, "round \(round): the writer's counter went back from \(reported) to \(counter)")
                }
                try keeper.write { try $0.insert("side", ["id": .int(Int64(sideRows)), "by": "keeper"]) }
                sideRows += 1
            }
            kill(writer.processIdentifier, SIGKILL)
            writer.waitUntilExit()
            let lines = (first + String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)).split(separator: "\n")
            reported = max(reported, lines.compactMap { $0.hasPrefix("C ") ? Int($0.dropFirst(2)) : nil }.max() ?? 0)
        }
        background.withLock { $0.stop = true }
        backgroundDone.wait()
        let (_, backgroundRows, failure) = background.withLock { $0 }
        #expect(failure == nil, "the background writer failed: \(failure ?? "")")
        sideRows += backgroundRows
        keeper.close()

        let store = try Store(path: path)
        #expect(try store.verify().isConsistent)
        let counter = Int(try store.read { try $0.row("crash", key: 0)?["txn"].intValue ?? -1 })
        #expect(counter >= reported && counter <= reported + 1, "counter \(counter), reported \(reported)")
        let rows = try store.read { try $0.rows("crash", includingDeleted: true) }
        var parts: [Int: Int] = [:]
        for row in rows where row.key != 0 { parts[Int(row["txn"].intValue!), default: 0] += 1 }
        #expect((1...max(counter, 1)).allSatisfy { counter == 0 || parts[$0] == 5 }, "a committed transaction of the writers is missing rows")
        #expect(try store.read { try $0.count("side") } == sideRows, "this process's own commits are missing")
    }
}

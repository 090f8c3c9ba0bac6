import Foundation
import Strata
import StrataWorkload
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct SharedOpenProcessTests {
    /// The second reproduction: another process writes while this one keeps a `Store`
    /// open and opens and closes a second `Store` on the same path, again and again. Before the
    /// registry, closing the second one dropped the first one's LMDB locks and a committed
    /// transaction could silently vanish (and `verify` still said "consistent"). Every
    /// transaction the writer reported must be there, whole.
    @Test func aSecondStoreOpenedAndClosedBesideAWriterProcessLosesNothing() throws {
        let seed = ProcessInfo.processInfo.environment["STRATA_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
        print("aSecondStoreOpenedAndClosedBesideAWriterProcessLosesNothing: seed \(seed) (replay with STRATA_SEED=\(seed))")
        var g = SplitMix64(seed: seed)
        for round in 0..<6 {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-2open-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: path) }
            let writer = Process()
            writer.executableURL = try CrashTests.helper()
            writer.arguments = [path, "noMetaSync", String(g.next())]
            let out = Pipe()
            writer.standardOutput = out
            try writer.run()
            // The helper creates the store; wait for its first commit.
            let first = String(decoding: out.fileHandleForReading.availableData, as: UTF8.self)
            #expect(first.hasPrefix("C "), "round \(round): the writer did not start: \(first)")
            var options = StoreOptions()
            options.createIfMissing = false
            let keeper = try Store(path: path, options: options)
            let deadline = ContinuousClock.now + .milliseconds(300 + Int(g.below(400)))
            var opens = 0
            while ContinuousClock.now < deadline {
                let second = try Store(path: path, options: options)
                _ = try second.read { try $0.row("crash", key: 0) }
                if g.below(2) == 0 { second.close() }
                opens += 1
                _ = try keeper.read { try $0.row("crash", key: 0) }
            }
            kill(writer.processIdentifier, SIGKILL)
            writer.waitUntilExit()
            let lines = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n")
            let reported = (first + "\n" + lines.joined(separator: "\n")).split(separator: "\n")
                .compactMap { $0.hasPrefix("C ") ? Int($0.dropFirst(2)) : nil }.max() ?? 0
            keeper.close()

            let store = try Store(path: path)
            #expect(try store.verify().isConsistent, "round \(round)")
            let counter = Int(try store.read { try $0.row("crash", key: 0)?["txn"].intValue ?? -1 })
            #expect(counter >= reported && counter <= reported + 1, "round \(round) (\(opens) opens): counter \(counter), reported \(reported)")
            let rows = try store.read { try $0.rows("crash", includingDeleted: true) }
            var parts: [Int: Int] = [:]
            for row in rows where row.key != 0 { parts[Int(row["txn"].intValue!), default: 0] += 1 }
            #expect((1...max(counter, 1)).allSatisfy { counter == 0 || parts[$0] == 5 }, "round \(round): a committed transaction is missing rows")
            store.close()
        }
    }
}

import Foundation
@testable import Strata
import StrataWorkload
import Testing

/// `replay(into:through:)` builds its store in steps in a hidden folder and moves it into place
/// only when it is whole.
@Suite struct ReplayTests {
    /// A replay written in transactions of a few dozen bytes (a tiny fold memory limit) holds
    /// exactly what one written in a single step holds: every database, byte for byte.
    @Test func aReplayInManyStepsIsTheReplayInOne() throws {
        let seed = testSeed("aReplayInManyStepsIsTheReplayInOne")
        var rng = SplitMix64(seed: seed)
        try withTemporaryFolder { source in
            let (horizon, last) = try ParallelFoldTests.randomStore(at: source, &rng)
            let through = horizon + 1 + rng.next() % (last - horizon)
            for through in [through, last] {
                let inOne = try ParallelFoldTests.fold(source, through: through, workers: 1, limit: StoreOptions().foldMemoryLimit)
                let inSteps = try ParallelFoldTests.fold(source, through: through, workers: 1, limit: 2_000)
                #expect(inOne.replayed["log"]!.count / 2 == Int(through - horizon), "the log through \(through), after the horizon \(horizon)")
                for (name, entries) in inOne.replayed {
                    #expect(ParallelFoldTests.firstDifference(inSteps.replayed[name]!, entries) == nil, "replay through \(through), database \(name)")
                }
            }
        }
    }

    /// What a killed replay left behind (a `.replay-<pid>-…` folder of a process that is gone)
    /// is removed by the next replay into the same folder; the new replay is whole.
    @Test func aKilledReplaysLeftoversAreRemovedByTheNext() throws {
        try withStore { store, path in
            try store.createTable(tasksSchema)
            try store.write { tx in for i in 0..<50 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
            let target = path + "-replay"
            defer { try? FileManager.default.removeItem(atPath: target) }
            // Above Linux's largest process id (2^22), so no process has it.
            let leftover = target + "/.replay-4194305-0A1B"
            try FileManager.default.createDirectory(atPath: leftover, withIntermediateDirectories: true)
            try Data([1, 2, 3]).write(to: URL(fileURLWithPath: leftover + "/data.mdb"))
            let replayed = try store.replay(into: target)
            defer { replayed.close() }
            #expect(!FileManager.default.fileExists(atPath: leftover))
            #expect(try replayed.read { try $0.count("tasks") } == 50)
            #expect(try replayed.verify().isConsistent)
            #expect(try FileManager.default.contentsOfDirectory(atPath: target).filter { $0.hasPrefix(".replay-") } == [])
        }
    }
}

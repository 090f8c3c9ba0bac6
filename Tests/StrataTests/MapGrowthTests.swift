import Foundation
import Strata
import Testing

/// A write closure runs again only when the map fills up during it. The store grows the map
/// ahead of writes (room for twice the largest write seen), and a write that ran out of room asks
/// for more on each rerun, so a write far larger than the map reruns a few times, not once per
/// doubling, and writes of a size seen before do not rerun.
@Suite struct MapGrowthTests {
    @Test func aWriteFarLargerThanTheMapRerunsAFewTimesAndLaterOnesNever() throws {
        var options = StoreOptions()
        options.initialMapSize = 256 << 10
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            let text = String(repeating: "x", count: 2_000)
            var runs = 0
            func write(_ w: Int) throws {
                try store.write { tx in
                    runs += 1  // the side effect the rule on `write` warns about
                    for i in 0..<2_000 {
                        try tx.insert("tasks", ["id": .int(Int64(w * 10_000 + i)), "title": .string(text), "notes": .string(text)])
                    }
                }
            }
            // About 8 MB of rows, log and views into a 256 KiB map: doubling alone would rerun
            // the closure about six times.
            try write(0)
            #expect(runs - 1 <= 3, "\(runs - 1) reruns for one write")
            #expect(store.writeReruns == runs - 1)
            let afterFirst = runs
            for w in 1...5 { try write(w) }
            #expect(runs - afterFirst == 5, "writes of a size seen before reran \(runs - afterFirst - 5) times")
            #expect(try store.read { try $0.count(Query("tasks")) } == 6 * 2_000)
            #expect(try store.verify().isConsistent)
        }
    }
}

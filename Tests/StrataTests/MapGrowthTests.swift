import Foundation
import Strata
import Testing

/// A write closure runs again only when the map fills up during it; the store grows the map
/// ahead of writes, so that happens at most once for a run of writes of one size.
@Suite struct MapGrowthTests {
    @Test func largeWritesOnASmallMapRunTheirClosureOnceAfterTheFirst() throws {
        var options = StoreOptions()
        options.initialMapSize = 1 << 20
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            let text = String(repeating: "x", count: 2_000)
            var runs = 0
            let writes = 30
            for w in 0..<writes {
                try store.write { tx in
                    runs += 1  // the side effect the rule warns about
                    for i in 0..<400 {
                        try tx.insert("tasks", ["id": .int(Int64(w * 1000 + i)), "title": .string(text), "notes": .string(text)])
                    }
                }
            }
            // Each write needs more than the whole initial map: the first one reruns (perhaps
            // twice, as it finds how much it needs); the later ones find the room made for them.
            #expect(runs - writes <= 2, "\(runs - writes) reruns for \(writes) writes")
            #expect(store.writeReruns == runs - writes)
            #expect(try store.read { try $0.count(Query("tasks")) } == writes * 400)
            #expect(try store.verify().isConsistent)
        }
    }
}

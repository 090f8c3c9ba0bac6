import Foundation
import Strata
import StrataWorkload
import Testing

/// No false alarms (issue 36): undamaged stores of varied shapes — sizes, property bags, indexes,
/// values large enough for LMDB's overflow pages, rows deleted and revived, stores grown and
/// compacted, space reclaimed — check clean, quick and full. `STRATA_CLEAN_STORES` sets how many
/// (1,000 by hand; CI runs fewer); the seed is printed.
@Suite struct CleanStoresCheckCleanTests {
    @Test func undamagedStoresOfVariedShapesCheckClean() throws {
        let count = ProcessInfo.processInfo.environment["STRATA_CLEAN_STORES"].flatMap(Int.init) ?? 24
        var random = SplitMix64(seed: testSeed("undamagedStoresOfVariedShapesCheckClean"))
        for trial in 0..<count {
            try withTemporaryFolder { path in
                var options = StoreOptions()
                options.durability = .noSync
                options.overlayBudget = [1 << 16, 1 << 20, 64 << 20][Int(random.next() % 3)]
                let store = try Store(path: path, options: options)
                try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title"), .bytes("blob", nullable: true)]))
                try store.createTable(.propertyBag("bag", key: [.string("name")]))
                if random.next() % 2 == 0 { try store.createIndex("by_title", on: "tasks", fields: ["title"]) }
                let rows = Int(random.next() % 1500)
                try store.write { tx in
                    for i in 0..<rows {
                        // Now and then a value past a page: LMDB puts it on overflow pages.
                        let blob: Value = random.next() % 25 == 0 ? .bytes([UInt8](repeating: UInt8(i & 0xFF), count: 4000 + Int(random.next() % 20000))) : .null
                        try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(random.next() % 97)"), "blob": blob])
                        if random.next() % 4 == 0 { try tx.insert("bag", ["name": .string("n\(i)"), "p\(random.next() % 9)": .int(Int64(i))]) }
                    }
                }
                if rows > 0 {
                    try store.write { tx in
                        for _ in 0..<Int(random.next() % 300) {
                            let key = RowKey(.int(Int64(random.next() % UInt64(rows))))
                            if random.next() % 2 == 0 { try? tx.delete("tasks", key: key) } else { try? tx.acknowledge("tasks", key: key) }
                        }
                    }
                }
                if random.next() % 3 == 0 { _ = try store.compact(retaining: Retention(operations: Int(random.next() % 200))) }
                try store.checkpoint()
                store.close()
                if random.next() % 4 == 0 { _ = try Store.reclaimSpace(at: path) }
                for scope in [StoreCheckOptions.Scope.quick, .full] {
                    var check = StoreCheckOptions()
                    check.scope = scope
                    let report = try Store.check(at: path, options: check)
                    #expect(report.isClean, "trial \(trial), \(scope): \(report)")
                }
            }
        }
    }
}

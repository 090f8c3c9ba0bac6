import Foundation
import Strata
import StrataWorkload

/// A fresh folder under the system temporary directory, removed by `body`'s end.
func withTemporaryFolder<R>(_ body: (String) throws -> R) throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-test-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try body(path)
}

/// A fresh store in its own temporary folder, removed afterwards.
func withStore<R>(_ options: StoreOptions = StoreOptions(), _ body: (Store, String) throws -> R) throws -> R {
    try withTemporaryFolder { path in
        var options = options
        // Tests do not need fsync; durability has its own tests.
        if options.durability == .full { options.durability = .noSync }
        return try body(try Store(path: path, options: options), path)
    }
}


/// The seed of a randomized test: `STRATA_SEED` when set (to replay a failure), else random.
/// Printed so that any failure can be replayed.
func testSeed(_ name: String) -> UInt64 {
    let seed = ProcessInfo.processInfo.environment["STRATA_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
    print("\(name): seed \(seed) (replay with STRATA_SEED=\(seed))")
    return seed
}

let tasksSchema = TableSchema.fixed("tasks", primaryKey: ["id"], fields: [
    .int("id"), .string("title"), .int("priority", default: 0), .bool("done", default: false),
    .string("notes", nullable: true), .double("updated", nullable: true),
])

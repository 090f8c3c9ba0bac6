import Foundation
import Strata

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

/// splitmix64: small, fast, and the same generator the reference workload specifies.
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

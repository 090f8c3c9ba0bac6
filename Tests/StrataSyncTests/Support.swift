import Foundation
import Strata
import StrataSync
import StrataWorkload

func withTemporaryFolder<R>(_ body: (String) throws -> R) throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-sync-test-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try body(path)
}

/// A fresh store with the `tasks` table, in its own temporary folder.
func withStore<R>(_ body: (Store) throws -> R) throws -> R {
    try withTemporaryFolder { path in
        var options = StoreOptions()
        options.durability = .noSync
        options.checkInvariants = true
        let store = try Store(path: path, options: options)
        try store.createTable(tasks)
        return try body(store)
    }
}

let tasks = TableSchema.fixed("tasks", primaryKey: ["id"], fields: [
    .int("id"), .string("title"), .int("priority", default: 0), .bool("done", default: false), .string("notes", nullable: true),
])

extension SplitMix64 {
    /// A draw below `n`, as an `Int`.
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}

func testSeed(_ name: String) -> UInt64 {
    let seed = ProcessInfo.processInfo.environment["STRATA_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
    print("\(name): seed \(seed) (replay with STRATA_SEED=\(seed))")
    return seed
}

/// Everything observable: rows with their state, the anchor, the log length.
func observable(_ store: Store) throws -> [String] {
    try store.read { snap in
        try snap.rows("tasks", includingDeleted: true).map(\.description)
            + ["anchor \(String(describing: try snap.property(SyncClient.anchorProperty)))", "lsn \(try snap.lastLSN)"]
    }
}

func withStoreAsync<R>(_ body: (Store) async throws -> R) async throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-sync-test-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    var options = StoreOptions()
    options.durability = .noSync
    let store = try Store(path: path, options: options)
    try store.createTable(tasks)
    return try await body(store)
}

import Foundation
import Strata

/// Runs `body` with a new store in a fresh folder under the system's temporary directory, then
/// closes the store and removes the folder, whether `body` returns or throws.
///
/// For tests: each gets a store of its own, and nothing is left behind.
///
/// ```swift
/// @Test func aTaskCanBeAdded() throws {
///     try withTemporaryStore(tables: [.fixed("tasks", fields: [.int("id"), .string("title")])]) { store, _ in
///         try store.write { try $0.insert("tasks", ["id": 1, "title": "Buy milk"]) }
///         #expect(try store.read { try $0.count("tasks") } == 1)
///     }
/// }
/// ```
///
/// - Parameters:
///   - options: the store's options. `nil` (the default) means `Durability.noSync` and
///     everything else as `StoreOptions()`: a test does not need its commits on disk (the
///     folder is removed anyway), and skipping the sync makes it faster.
///   - tables: tables to create before `body` runs.
///   - body: the test, given the open store and its folder.
/// - Throws: what opening the store, creating the tables or `body` throws.
public func withTemporaryStore<R>(
    options: StoreOptions? = nil, tables: [TableSchema] = [], _ body: (Store, String) throws -> R
) throws -> R {
    let (store, folder) = try openTemporaryStore(options: options, tables: tables)
    defer { closeAndRemove(store, folder) }
    return try body(store, folder)
}

/// The `async` form of ``withTemporaryStore(options:tables:_:)-7me2v``: runs `body` with a new store
/// in a fresh temporary folder, then closes the store and removes the folder.
///
/// - Parameters:
///   - options: the store's options; `nil` means `Durability.noSync`, the rest as `StoreOptions()`.
///   - tables: tables to create before `body` runs.
///   - isolation: the caller's actor, where `body` runs (so a `@MainActor` test may use main-actor
///     types, such as a `LiveQuery`, in `body`); the default is the caller's own.
///   - body: the test, given the open store and its folder.
/// - Throws: what opening the store, creating the tables or `body` throws.
public func withTemporaryStore<R>(
    options: StoreOptions? = nil, tables: [TableSchema] = [], isolation: isolated (any Actor)? = #isolation,
    _ body: (Store, String) async throws -> R
) async throws -> R {
    let (store, folder) = try openTemporaryStore(options: options, tables: tables)
    defer { closeAndRemove(store, folder) }
    return try await body(store, folder)
}

private func openTemporaryStore(options: StoreOptions?, tables: [TableSchema]) throws -> (Store, String) {
    let folder = FileManager.default.temporaryDirectory
        .appendingPathComponent("strata-testing-\(UUID().uuidString)").path
    var resolved = options ?? StoreOptions()
    if options == nil { resolved.durability = .noSync }
    do {
        let store = try Store(path: folder, options: resolved)
        do {
            for table in tables { try store.createTable(table) }
        } catch {
            closeAndRemove(store, folder)
            throw error
        }
        return (store, folder)
    } catch {
        try? FileManager.default.removeItem(atPath: folder)
        throw error
    }
}

private func closeAndRemove(_ store: Store, _ folder: String) {
    store.close()
    try? FileManager.default.removeItem(atPath: folder)
}

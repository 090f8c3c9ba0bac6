import Foundation
import LMDB
import Strata
import StrataLibc
import Synchronization
import Testing

/// Runs `strata` with extra environment variables; kills it after `limit` seconds (a guard
/// against a hang, not a speed check) and reports whether it had to.
func runStrata(_ arguments: [String], environment: [String: String], killAfter limit: Double = 120) throws -> (status: Int32, out: String, err: String, killed: Bool) {
    let r = try runProcess(try strataExecutable(), arguments, environment: environment, killAfter: limit)
    return (r.status, r.out, r.err, r.killed)
}

/// Holds a write transaction of `store` on another thread until the returned closure is called.
func holdingTheWriteLock(of store: Store, _ body: () throws -> Void) throws {
    let started = DispatchSemaphore(value: 0)
    let release = DispatchSemaphore(value: 0)
    let finished = DispatchSemaphore(value: 0)
    Thread.detachNewThread {
        _ = try? store.write { _ in
            started.signal()
            release.wait()
        }
        finished.signal()
    }
    started.wait()
    defer {
        release.signal()
        finished.wait()
    }
    try body()
}

@Suite struct BusyStoreTests {
    /// An app in this process holds the store's write lock (a long write) while the read-only
    /// commands run in another process: each completes, since opening a current store takes no
    /// write transaction.
    @Test func readOnlyCommandsDoNotWaitForAWriter() throws {
        try withPreparedStore { path, store in
            try holdingTheWriteLock(of: store) {
                for command in [["info", path], ["show", path, "tasks"], ["log", path], ["history", path, "tasks", "1"],
                                ["pending", path], ["conflicts", path], ["verify", path], ["show", path, "tasks", "--as-of", "3"]] {
                    let r = try runStrata(command, environment: [:], killAfter: 30)
                    #expect(!r.killed, "\(command[0]) waited for the writer")
                    #expect(r.status == 0, "\(command[0]): \(r.err)")
                }
            }
        }
    }

    /// Where opening must write (a store that needs initializing or migrating) and another
    /// process writes, the command gives up after the timeout with "busy writing" (exit 2).
    @Test func openingThatMustWriteGivesUpWithBusy() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-busy-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        // A store of the previous format: opening it migrates it, in a write transaction. (A
        // bare LMDB environment, which this test used before, is not a store: it is refused
        // without waiting.)
        do {
            let store = try Store(path: path)
            store.close()
        }
        let env = try Environment(path: path)
        let meta = try env.openDatabase("meta", create: false)
        try env.write { try $0.put(Array("format".utf8), withUnsafeBytes(of: (Store.formatVersion - 1).bigEndian) { Array($0) }, in: meta) }
        let started = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            _ = try? env.write { _ in
                started.signal()
                release.wait()
            }
            finished.signal()
        }
        started.wait()
        let r = try runStrata(["info", path], environment: ["STRATA_BUSY_TIMEOUT": "0.5"])
        release.signal()
        finished.wait()
        #expect(!r.killed, "info waited with no limit")
        #expect(r.status == 2)
        #expect(r.err.contains("is busy writing"), "\(r.err)")
    }
}

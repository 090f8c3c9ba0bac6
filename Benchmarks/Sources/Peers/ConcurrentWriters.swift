import CSQLite
import Foundation
import Strata
import StrataWorkload

/// Several threads, each committing single durable edits (one update per transaction) to one
/// table of `rows` rows, `total` edits in all. Strata shares commits between its writers (group
/// commit); the SQLite peer is a plain table in WAL mode with `synchronous=FULL`, one connection
/// per thread, waiting on the write lock with a busy timeout. Each returns edits per second.
public enum ConcurrentWriters {
    public static func strata(folder: String, threads: Int, total: Int, rows: Int = 1_000, durability: Durability = .full) throws -> Double {
        var options = StoreOptions()
        options.durability = durability
        let store = try Store(path: folder, options: options)
        defer { store.close() }
        try store.createTable(.fixed("t", fields: [.int("id"), .int("v")]))
        try store.write { tx in for i in 0..<rows { try tx.insert("t", ["id": .int(Int64(i)), "v": 0]) } }
        return try run(threads: threads, total: total) { thread in
            var g = SplitMix64(seed: UInt64(thread + 1))
            return { n in
                try store.write { tx in try tx.update("t", key: RowKey(.int(Int64(g.next() % UInt64(rows)))), ["v": .int(Int64(n))]) }
            }
        }
    }

    public static func sqlite(folder: String, threads: Int, total: Int, rows: Int = 1_000) throws -> Double {
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let path = folder + "/t.db"
        let setup = try SQLiteDatabase(path: path)
        try setup.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")
        try setup.exec("BEGIN")
        for i in 0..<rows { try setup.exec("INSERT INTO t VALUES (\(i), 0)") }
        try setup.exec("COMMIT")
        return try run(threads: threads, total: total) { thread in
            // One connection per thread, opened on that thread's first call.
            var db: SQLiteDatabase?
            var update: OpaquePointer?
            var g = SplitMix64(seed: UInt64(thread + 1))
            return { n in
                if db == nil {
                    db = try SQLiteDatabase(path: path)
                    try db!.exec("PRAGMA synchronous=FULL; PRAGMA busy_timeout=60000")
                    update = try db!.prepare("UPDATE t SET v = ?1 WHERE id = ?2")
                }
                sqlite3_bind_int64(update, 1, Int64(n))
                sqlite3_bind_int64(update, 2, Int64(g.next() % UInt64(rows)))
                try db!.step(update!)
            }
        }
    }

    /// Runs `threads` threads, each making its share of `total` calls of the edit its factory
    /// returns; edits per second over the whole run.
    private static func run(threads: Int, total: Int, _ make: @escaping @Sendable (Int) -> (Int) throws -> Void) throws -> Double {
        let failure = NSLock()
        nonisolated(unsafe) var firstError: (any Error)?
        let group = DispatchGroup()
        let start = ContinuousClock.now
        for t in 0..<threads {
            group.enter()
            Thread {
                defer { group.leave() }
                let edit = make(t)
                do {
                    for n in stride(from: t, to: total, by: threads) { try edit(n) }
                } catch {
                    failure.lock()
                    if firstError == nil { firstError = error }
                    failure.unlock()
                }
            }.start()
        }
        group.wait()
        let d = ContinuousClock.now - start
        if let firstError { throw firstError }
        return Double(total) / (Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18)
    }
}

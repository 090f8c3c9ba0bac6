import Foundation
@testable import LMDB
@testable import Strata
import StrataWorkload
import Testing

/// Compaction, retention, reclaiming space, and opening stores of an older format.
@Suite struct CompactionTests {
    /// Everything a user can read about the current tables: rows with their state, pending rows,
    /// indexes and views.
    static func tables(_ store: Store) throws -> [String] {
        try store.read { snap in
            var out: [String] = []
            for t in try snap.tables {
                out += try snap.rows(t.name, includingDeleted: true).map(\.description)
                out += try snap.pendingRows(t.name).map { "pending \($0.key) \($0.status)" }
            }
            out += try snap.rows(Query("tasks", orderBy: [.ascending("title")])).map { "by title \($0.key)" }
            out += try snap.rows(view: "open_tasks").map { "view \($0.key)" }
            return out
        }
    }

    /// `tasks` with an index on titles and a view of the open tasks.
    static func createTasks(_ store: Store) throws {
        try store.write { tx in
            try tx.createTable(tasksSchema)
            try tx.createIndex("tasks_by_title", on: "tasks", fields: ["title"])
            try tx.createView("open_tasks", Query("tasks", where: .equals("done", false), orderBy: [.ascending("priority")]))
        }
    }

    /// Random edits on 30 keys, some acknowledged; `tasks` has an index and a named view.
    static func randomHistory(_ store: Store, _ rng: inout SplitMix64, transactions: Int) throws {
        if try store.tables.isEmpty { try createTasks(store) }
        for _ in 0..<transactions {
            try store.write { tx in
                for _ in 0..<(1 + Int(rng.next() % 5)) {
                    let key = RowKey(.int(Int64(rng.next() % 30)))
                    let exists = try tx.snapshot.row("tasks", key: key, includingDeleted: true) != nil
                    let live = try tx.snapshot.row("tasks", key: key) != nil
                    switch rng.next() % 6 {
                    case 0 where !exists:
                        try tx.insert("tasks", ["id": key.values[0], "title": .string("t\(rng.next() % 50)"), "priority": .int(Int64(rng.next() % 5))])
                    case 0 where live, 1 where live, 2 where live:
                        try tx.update("tasks", key: key, ["title": .string("t\(rng.next() % 50)"), "done": .bool(rng.next() % 2 == 0)])
                    case 3 where live:
                        try tx.delete("tasks", key: key)
                    default:
                        // Most changes get acknowledged, so that compaction has something to fold.
                        for row in try tx.snapshot.pendingRows("tasks") where rng.next() % 3 != 0 {
                            try tx.acknowledge("tasks", key: row.key)
                        }
                    }
                }
            }
        }
    }

    @Test func compactionChangesNoTableAndKeepsHistoryAndTimeTravelAfterTheHorizon() throws {
        let seed = testSeed("compactionChangesNoTable")
        var rng = SplitMix64(seed: seed)
        var options = StoreOptions()
        options.checkInvariants = true
        try withStore(options) { store, path in
            for round in 0..<6 {
                try Self.randomHistory(store, &rng, transactions: 60)
                let last = try store.read { try $0.lastLSN }
                let tablesBefore = try Self.tables(store)
                let keys = (0..<30).map { RowKey(.int(Int64($0))) }
                let historyBefore = try store.read { snap in try keys.map { try snap.history("tasks", key: $0) } }
                let horizon = try store.read { try $0.horizon }
                let probes = (0..<20).map { _ in max(1, horizon + rng.next() % (last - horizon + 1)) }
                let pastBefore = try store.read { snap in
                    try probes.map { lsn in try keys.map { try snap.row("tasks", key: $0, asOf: lsn, includingDeleted: true) } }
                }
                let oldestPending = try store.read { snap in try snap.pendingRows("tasks").compactMap { try snap.history("tasks", key: $0.key).last?.lsn } }

                let keep = Int(rng.next() % 150)
                let report = try store.compact(retaining: .operations(keep))

                // The horizon respects the retention and never passes a pending row's edits. It
                // never moves back either: a round that keeps more than an earlier one folded
                // leaves it where it was.
                #expect(report.horizon >= horizon)
                #expect(report.horizon <= max(horizon, last - UInt64(min(keep, Int(last)))), "horizon before: \(horizon)")
                #expect(oldestPending.allSatisfy { $0 > report.horizon }, "round \(round)")
                #expect(try store.read { try $0.operations().count } == report.remainingOperations)
                #expect(try store.read { try $0.operations().first?.lsn ?? report.horizon + 1 } > report.horizon)
                // Nothing a reader sees of the current tables changed.
                #expect(try Self.tables(store) == tablesBefore, "round \(round), \(report)")
                // History after the horizon is unchanged; before it, gone.
                let historyAfter = try store.read { snap in try keys.map { try snap.history("tasks", key: $0) } }
                for (before, after) in zip(historyBefore, historyAfter) {
                    #expect(after == before.filter { $0.lsn > report.horizon })
                }
                // Time travel to any LSN from the horizon on gives what it gave before.
                try store.read { snap throws in
                    for (lsn, rows) in zip(probes, pastBefore) {
                        if lsn >= report.horizon {
                            #expect(try keys.map { try snap.row("tasks", key: $0, asOf: lsn, includingDeleted: true) } == rows, "asOf \(lsn)")
                        } else {
                            let e = #expect(throws: StrataError.self) { try snap.row("tasks", key: keys[0], asOf: lsn) }
                            #expect(e?.code == .compacted)
                        }
                    }
                }
                // Rebuild and verify start from the base.
                #expect(try store.verify().isConsistent)
                try store.rebuild()
                #expect(try Self.tables(store) == tablesBefore)
                // A replay through an LSN after the horizon has that LSN's rows; before it, refused.
                let through = report.horizon + (last - report.horizon) / 2
                try withTemporaryFolder { scratch in
                    let replayed = try store.replay(into: scratch, through: through)
                    let rows = try replayed.read { snap in try keys.map { try snap.row("tasks", key: $0, includingDeleted: true) } }
                    #expect(rows == (try store.read { snap in try keys.map { try snap.row("tasks", key: $0, asOf: through, includingDeleted: true) } }))
                    #expect(try replayed.verify().isConsistent)
                }
                if report.horizon > 1 {
                    try withTemporaryFolder { scratch in
                        let e = #expect(throws: StrataError.self) { try store.replay(into: scratch, through: report.horizon - 1) }
                        #expect(e?.code == .compacted)
                    }
                }
            }
            // Everything survives close and reopen.
            let before = try Self.tables(store)
            let horizon = try store.read { try $0.horizon }
            let reopened = try Store(path: path)
            #expect(try Self.tables(reopened) == before)
            #expect(try reopened.read { try $0.horizon } == horizon)
            #expect(try reopened.verify().isConsistent)
        }
    }

    @Test func retentionByCountAgeAndLSN() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            for i in 0..<100 {
                try store.write { tx in
                    try tx.upsert("tasks", ["id": .int(Int64(i % 10)), "title": .string("v\(i)")])
                    try tx.acknowledge("tasks", key: RowKey(.int(Int64(i % 10))))
                }
            }
            let last = try store.read { try $0.lastLSN }
            // Everything is younger than an hour: nothing goes.
            #expect(try store.compact(retaining: .age(3_600)).foldedOperations == 0)
            // An LSN bound, then a count: each keeps what it names.
            var report = try store.compact(retaining: .after(50))
            #expect(report.horizon == 50 && report.foldedOperations == 50 && report.heldBy == nil)
            report = try store.compact(retaining: .operations(30))
            #expect(report.horizon == last - 30 && report.remainingOperations == 30)
            // Several limits: the most generous wins.
            report = try store.compact(retaining: Retention(operations: 5, after: last - 20))
            #expect(report.horizon == last - 20)
            // Age zero folds everything foldable, and the log can become empty.
            report = try store.compact(retaining: .age(0))
            #expect(report.horizon == last && report.remainingOperations == 0 && report.baseRows == 10)
            // LSNs go on from the horizon, and the new operation's history starts after it.
            try store.write { try $0.update("tasks", key: 3, ["title": "after"]) }
            #expect(try store.read { try $0.lastLSN } == last + 1)
            #expect(try store.read { try $0.history("tasks", key: 3).map(\.lsn) } == [last + 1])
            #expect(try store.verify().isConsistent)
            // Bad retention values are refused, and change nothing.
            let e = #expect(throws: StrataError.self) { try store.compact(retaining: .operations(-1)) }
            #expect(e?.code == .invalidOperation)
            #expect(throws: StrataError.self) { try store.compact(retaining: .age(.nan)) }
            #expect(try store.read { try $0.horizon } == last)
        }
    }

    @Test func pendingRowsAndPinsHoldTheHorizonBack() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                for i in 0..<5 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "a"]) }
                for i in 0..<5 { try tx.acknowledge("tasks", key: RowKey(.int(Int64(i)))) }
            }
            try store.write { try $0.update("tasks", key: 2, ["title": "pending"]) }
            let pendingLSN = try store.read { try $0.lastLSN }
            for i in [0, 1, 3] { try store.write { try $0.update("tasks", key: RowKey(.int(Int64(i))), ["title": "b"]); try $0.acknowledge("tasks", key: RowKey(.int(Int64(i)))) } }
            var report = try store.compact()
            #expect(report.horizon == pendingLSN - 1 && report.heldBy == .pendingEdits)
            #expect(try store.read { try $0.history("tasks", key: 2).map(\.lsn) } == [pendingLSN])

            try store.write { try $0.acknowledge("tasks", key: 2) }
            try store.write { try $0.pinLog("audit", after: pendingLSN + 2) }
            #expect(try store.read { try $0.logPins } == ["audit": pendingLSN + 2])
            report = try store.compact()
            #expect(report.horizon == pendingLSN + 2 && report.heldBy == .pin("audit"))
            try store.write { try $0.unpinLog("audit") }
            report = try store.compact()
            #expect(report.horizon == (try store.read { try $0.lastLSN }) && report.heldBy == nil)
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func reclaimingSpaceShrinksTheFileAndNeedsTheStoreClosed() throws {
        try withTemporaryFolder { path in
            var options = StoreOptions()
            options.durability = .noSync
            do {
                let store = try Store(path: path, options: options)
                try Self.createTasks(store)
                for i in 0..<200 {
                    try store.write { tx in
                        for j in 0..<50 { try tx.upsert("tasks", ["id": .int(Int64(j)), "title": .string(String(repeating: "x", count: 200) + "\(i)")]) }
                        for j in 0..<50 { try tx.acknowledge("tasks", key: RowKey(.int(Int64(j)))) }
                    }
                }
                try store.compact(retaining: .operations(10))
                try store.flush()
                // Open here: refused, and nothing is touched.
                let e = #expect(throws: StrataError.self) { try Store.reclaimSpace(at: path) }
                #expect(e?.code == .busy)
            }
            let before = try Self.tables(try Store(path: path))
            // A leftover from a reclaim that crashed before its rename is ignored and removed.
            try FileManager.default.createDirectory(atPath: path + "/reclaim.tmp", withIntermediateDirectories: true)
            _ = FileManager.default.createFile(atPath: path + "/reclaim.tmp/data.mdb", contents: Data("junk".utf8))
            let (old, new) = try Store.reclaimSpace(at: path)
            #expect(new < old / 4, "\(old) → \(new)")
            #expect(!FileManager.default.fileExists(atPath: path + "/reclaim.tmp"))
            let store = try Store(path: path)
            #expect(try Self.tables(store) == before)
            #expect(try store.verify().isConsistent)
            try store.write { try $0.update("tasks", key: 1, ["title": "after reclaim"]) }
            #expect(try store.read { try $0.row("tasks", key: 1)?["title"] } == "after reclaim")
            let missing = #expect(throws: StrataError.self) { try Store.reclaimSpace(at: path + "/nothing") }
            #expect(missing?.code == .io)
        }
    }

    /// A store closed on this thread while another thread starts child processes: each child
    /// holds a copy of the closed store's lock descriptor until it runs its program. Before
    /// `reclaimSpace` waited a moment for such a lock, about a third of these calls failed with
    /// `busy` for a store nobody had open (98 of 300 in one run).
    @Test func reclaimingRightAfterACloseIsNotRefusedWhileChildProcessesStart() throws {
        try withTemporaryFolder { path in
            do { try Self.createTasks(try Store(path: path)) }
            let stop = Locked(false)
            let stopped = DispatchSemaphore(value: 0)
            let spawner = Thread {
                while !stop.withLock({ $0 }) {
                    let p = Process()
                    p.executableURL = URL(fileURLWithPath: "/bin/sh")
                    p.arguments = ["-c", "exit 0"]
                    try? p.run()
                    p.waitUntilExit()
                }
                stopped.signal()
            }
            spawner.start()
            defer {
                stop.withLock { $0 = true }
                stopped.wait()
            }
            var refused = 0
            for _ in 0..<100 {
                do { _ = try Store(path: path) }
                do { try Store.reclaimSpace(at: path) } catch let e as StrataError where e.code == .busy { refused += 1 }
            }
            #expect(refused == 0, "reclaimSpace refused \(refused) of 100 times right after the store was closed")
        }
    }

    // MARK: Format versions

    /// Copies the format-1 store kept in `Fixtures/` (written by Strata's first format) to a
    /// scratch folder; opening it migrates it in place.
    static func withFormat1Store<R>(_ body: (String) throws -> R) throws -> R {
        let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/format1-store/data.mdb")
        return try withTemporaryFolder { path in
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: fixture.path, toPath: path + "/data.mdb")
            return try body(path)
        }
    }

    @Test func aFormat1StoreIsMigratedWithEverythingInIt() throws {
        try Self.withFormat1Store { path in
            let format = { () throws -> UInt64? in
                let env = try Environment(path: path, options: { var o = EnvironmentOptions(); o.maxDatabases = 16; return o }())
                let meta = try env.write { try $0.openDatabase("meta") }
                return try env.read { txn in try txn.get(Array("format".utf8), in: meta).map { var r = ByteReader($0); return try r.bigEndian64() } }
            }
            #expect(try format() == 1)
            let store = try Store(path: path)
            #expect(try format() == Store.formatVersion)
            // What the fixture was written with (see its commit): the demo, then a pending insert,
            // update and delete and an index on titles.
            try store.read { snap throws in
                #expect(try snap.lastLSN == 24)
                #expect(try snap.rows("tasks", includingDeleted: true).map(\.key) == [1, 2, 4, 40])
                #expect(try snap.pendingRows("tasks").map { "\($0.key) \($0.status)" } == ["1 updated", "2 deleted", "40 inserted"])
                #expect(try snap.row("tasks", key: 1)?["title"] == "Edited, not yet uploaded")
                #expect(try snap.row("tasks", key: 1)?.original("title") == "Buy milk")
                #expect(try snap.history("tasks", key: 1).count == 7)
                #expect(try snap.row("tasks", key: 1, asOf: 11)?["title"] == "Buy oat milk")
                #expect(try snap.rows(Query("tasks", where: .equals("title", "Pay rent"))).map(\.key) == [4])
                #expect(try snap.explain(Query("tasks", where: .equals("title", "Pay rent"))).contains("tasks_by_title"))
                #expect(try snap.horizon == 0)
            }
            #expect(try store.verify().isConsistent)
            // The migrated store does what format 2 adds.
            try store.write { try $0.acknowledge("tasks", key: 1) }
            let report = try store.compact()
            #expect(report.heldBy == .pendingEdits && report.foldedOperations > 0)
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func aStoreOfAnUnknownOlderFormatIsRefusedUntouched() throws {
        try withTemporaryFolder { path in
            do {
                let store = try Store(path: path)
                try store.createTable(tasksSchema)
                try store.env.write { try $0.setMeta(MetaKey.format, 0, in: store.databases) }
            }
            let e = #expect(throws: StrataError.self) { try Store(path: path) }
            #expect(e?.code == .formatVersion)
            #expect(e?.message.contains("format 0") == true)
            // Still refused: the failed attempt wrote nothing.
            #expect(throws: StrataError.self) { try Store(path: path) }
        }
    }
}

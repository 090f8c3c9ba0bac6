import Foundation
import Strata
import Testing

/// The README's API tour, verbatim apart from the folder: if this stops compiling or passing,
/// the README is wrong.
@Suite struct ReadmeTests {
    @Test func apiTour() throws {
        try withTemporaryFolder { folder in
            // --- sample tour begins ---
            let store = try Store(path: folder)

            try store.createTable(.fixed("tasks", primaryKey: ["id"], fields: [
                .int("id"), .string("title"), .bool("done", default: false), .string("notes", nullable: true),
            ]))

            // One write = one atomic LMDB transaction: the log is durable when it returns; views are written behind.
            try store.write { tx in
                try tx.insert("tasks", ["id": 7, "title": "Buy milk"])
                try tx.insert("tasks", ["id": 8, "title": "Call mum"])
            }

            // Sync code marks rows the server accepted; their values become the originals.
            try store.write { tx in
                for row in try tx.snapshot.pendingRows("tasks") { try tx.acknowledge("tasks", key: row.key) }
            }

            try store.write { tx in
                try tx.update("tasks", key: 7, ["title": "Buy oat milk", "done": true])
                try tx.delete("tasks", key: 8)
            }

            let task = try store.read { try $0.row("tasks", key: 7) }!
            print(task["title"], task.original("title"))  // "Buy oat milk" "Buy milk"
            print(task.status, task.changedFields)        // updated ["title", "done"]

            try store.write { try $0.revert("tasks", key: 7, field: "title") }

            let pending = try store.read { try $0.pendingRows() }   // task 7 (updated), task 8 (deleted)
            let history = try store.read { try $0.history("tasks", key: 7) }
            for op in history { print(op.lsn, op.kind, op.changes.map(\.field)) }

            try store.rebuild()                           // drop the views, fold the log again
            let report = try store.verify()               // views == fold of the log, byte for byte
            print(report)                                 // consistent: 7 operations, …
            // --- sample tour ends ---

            #expect(task["title"] == "Buy oat milk" && task.original("title") == "Buy milk")
            #expect(task.status == .updated && task.changedFields == ["title", "done"])
            #expect(pending.map(\.key) == [7, 8] && pending.map(\.status) == [.updated, .deleted])
            #expect(history.map(\.kind) == [.insert, .acknowledge, .update, .revertField])
            #expect(report.isConsistent && report.operations == 7)
            #expect(try store.read { try $0.row("tasks", key: 7) }!["title"] == "Buy milk")
        }
    }
}

extension ReadmeTests {
    /// The compaction sample of docs/compaction-and-formats.md, verbatim apart from the setup.
    @Test func compactionExample() throws {
        try withTemporaryFolder { folder in
            do {
                let store = try Store(path: folder)
                try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title")]))
                try store.write { tx in
                    for i in 0..<6_000 {
                        try tx.upsert("tasks", ["id": .int(Int64(i % 10)), "title": .string("v\(i)")])
                        try tx.acknowledge("tasks", key: RowKey(.int(Int64(i % 10))))
                    }
                }
                // --- sample compaction begins ---
                // Fold everything but the last 10,000 operations (also: Retention(age:), .after(lsn), combined).
                let report = try store.compact(retaining: .operations(10_000))
                print(report)   // folded 2000 operations; horizon 0 → 2000; 10000 operations left in the log, …

                let horizon = try store.read { try $0.horizon }                 // 2000: the log starts after it
                let recent = try store.read { try $0.history("tasks", key: 7) }  // the operations after the horizon
                // Time travel before the horizon throws StrataError with code .compacted.
                // --- sample compaction pauses ---
                #expect(report.foldedOperations == 2_000 && report.remainingOperations == 10_000)
                #expect(horizon == 2_000 && recent.allSatisfy { $0.lsn > 2_000 } && !recent.isEmpty)
                let e = #expect(throws: StrataError.self) { try store.read { try $0.row("tasks", key: 7, asOf: 5) } }
                #expect(e?.code == .compacted)
            }
            let before = try FileManager.default.attributesOfItem(atPath: folder + "/data.mdb")[.size] as! Int
            // --- sample compaction resumes ---
            // Later, with every Store on the store's folder (`folder`, its path) closed, give the space back:
            try Store.reclaimSpace(at: folder)
            // --- sample compaction ends ---
            let after = try FileManager.default.attributesOfItem(atPath: folder + "/data.mdb")[.size] as! Int
            #expect(after < before)
        }
    }
}

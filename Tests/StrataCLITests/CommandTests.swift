import Foundation
import Strata
import StrataSync
import Testing

/// A store prepared for the command tests: two synced tasks, one edited, one inserted, one
/// deleted, and one deferred conflict.
func withPreparedStore(_ body: (String, Store) throws -> Void) throws {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-cli-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    do {
        let store = try Store(path: path)
        try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title"), .int("priority", default: 0)]))
        try store.write { tx in
            for i in 1...4 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)"), "priority": .int(Int64(i % 2))]) }
            for i in 1...4 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
            try tx.update("tasks", key: 1, ["title": "edited"])
            try tx.insert("tasks", ["id": 5, "title": "new"])
            try tx.delete("tasks", key: 2)
            try tx.update("tasks", key: 3, ["title": "mine"])
        }
        try SyncClient(store: store, policy: .deferred).merge(ServerDelta(anchor: "a1", tables: [
            TableDelta("tasks", upserts: [ServerRow(["id": 3, "title": "theirs", "priority": 1])]),
        ]))
        try body(path, store)
    }
}



func json(_ text: String) throws -> Any {
    try JSONSerialization.jsonObject(with: Data(text.utf8))
}

@Suite struct CommandTests {
    @Test func infoCountsEverything() throws {
        try withPreparedStore { path, _ in
            let r = try runStrata(["info", path, "--json"])
            #expect(r.status == 0, "\(r.err)")
            let info = try #require(try json(r.out) as? [String: Any])
            #expect(info["pendingRows"] as? Int == 4 && info["conflicts"] as? Int == 1 && info["anchor"] as? String == "a1")
            #expect(info["logLength"] as? Int == 13)
            let table = try #require((info["tables"] as? [[String: Any]])?.first)
            #expect(table["name"] as? String == "tasks" && table["rows"] as? Int == 4 && table["pending"] as? Int == 4)
        }
    }

    @Test func showFiltersSortsLimitsAndTravelsInTime() throws {
        try withPreparedStore { path, store in
            let r = try runStrata(["show", path, "tasks", "--where", "priority=1", "--sort", "title", "--json"])
            #expect(r.status == 0, "\(r.err)")
            let rows = try #require(try json(r.out) as? [[String: Any]])
            #expect(rows.compactMap { ($0["values"] as? [String: Any])?["title"] as? [String: String] } == [["string": "edited"], ["string": "mine"]])
            #expect(rows.first?["status"] as? String == "updated")
            #expect((rows.first?["originals"] as? [String: Any])?["title"] as? [String: String] == ["string": "t1"])
            let limited = try runStrata(["show", path, "tasks", "--limit", "2", "--json"])
            #expect((try json(limited.out) as? [Any])?.count == 2)
            // As of LSN 4: the first four inserts only, all pending.
            let past = try runStrata(["show", path, "tasks", "--as-of", "4", "--json"])
            let pastRows = try #require(try json(past.out) as? [[String: Any]])
            #expect(pastRows.count == 4 && pastRows.allSatisfy { $0["status"] as? String == "inserted" })
            let deleted = try runStrata(["show", path, "tasks", "--include-deleted"])
            #expect(deleted.out.contains("tasks 2 [deleted]"))
        }
    }

    /// `--where` matches as a query's `.equals` does (``Value/order(_:_:)``, which `--sort`
    /// uses too): two ints are compared exactly, not through `Double`, where 2^53 and 2^53 + 1
    /// are one number.
    @Test func showWhereComparesAsQueriesDo() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-cli-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let big: Int64 = 1 << 53
        do {
            let store = try Store(path: path)
            defer { store.close() }
            try store.createTable(.fixed("counts", fields: [.int("id"), .int("n"), .double("d")]))
            try store.write { tx in
                try tx.insert("counts", ["id": 1, "n": .int(big), "d": 1.5])
                try tx.insert("counts", ["id": 2, "n": .int(big + 1), "d": -0.0])
                try tx.insert("counts", ["id": 3, "n": 1, "d": 0.0])
            }
            #expect(try store.read { try $0.rows(Query("counts", where: .equals("n", .int(big + 1)))) }.map(\.key) == [RowKey(.int(2))])
        }
        func ids(_ filter: String) throws -> [Int] {
            let r = try runStrata(["show", path, "counts", "--where", filter, "--json"])
            #expect(r.status == 0, "\(r.err)")
            let rows = try #require(try json(r.out) as? [[String: Any]])
            return rows.compactMap { (($0["values"] as? [String: Any])?["id"] as? [String: Int])?["int"] }
        }
        #expect(try ids("n=\(big + 1)") == [2])
        #expect(try ids("n=\(big)") == [1])
        // An int and a double of the same value are equal, as are 0.0 and -0.0.
        #expect(try ids("n=1.0") == [3])
        #expect(try ids("d=0.0") == [2, 3])
    }

    @Test func logAndHistory() throws {
        try withPreparedStore { path, _ in
            let log = try #require(try json(try runStrata(["log", path, "--table", "tasks", "--key", "1", "--json"]).out) as? [[String: Any]])
            #expect(log.map { $0["kind"] as? String } == ["insert", "acknowledge", "update"])
            let window = try #require(try json(try runStrata(["log", path, "--from", "5", "--to", "8", "--json"]).out) as? [[String: Any]])
            #expect(window.compactMap { $0["lsn"] as? Int } == [5, 6, 7, 8])
            let history = try #require(try json(try runStrata(["history", path, "tasks", "3", "--json"]).out) as? [String: Any])
            #expect((history["operations"] as? [Any])?.count == 4)
            #expect((history["blame"] as? [String: Int])?["title"] == 13)
        }
    }

    /// `pending` names the rows it holds back and why (with the command that settles a
    /// conflict), and `resolve` settles one: the row then goes up with the next upload.
    @Test func pendingNamesWhatItHoldsBackAndResolveSettlesIt() throws {
        try withPreparedStore { path, store in
            try SyncClient(store: store).markSent(try #require(try SyncClient(store: store).nextBatch(maxRows: 1)))
            let text = try runStrata(["pending", path])
            #expect(text.status == 0, "\(text.err)")
            #expect(text.out.contains("held back (no upload carries them until they are settled):"), "\(text.out)")
            #expect(text.out.contains(#"tasks 3: in conflict: title (local "mine", server "theirs"); settle it with `strata resolve \#(path) tasks 3 --local`"#), "\(text.out)")
            #expect(text.out.contains("in flight: batch ") && text.out.contains("1 rows, sent, its answer lost"), "\(text.out)")
            let held = try #require(try json(try runStrata(["pending", path, "--held-back", "--json"]).out) as? [[String: Any]])
            #expect(held.count == 1 && held[0]["reason"] as? String == "conflict" && held[0]["table"] as? String == "tasks")
            let bad = try runStrata(["resolve", path, "tasks", "3"])
            #expect(bad.status == 64, "a side is needed: \(bad.err)")
            let notConflicted = try runStrata(["resolve", path, "tasks", "1", "--local"])
            #expect(notConflicted.status == 2 && notConflicted.err.contains("holds no conflict"), "\(notConflicted.err)")
            let r = try runStrata(["resolve", path, "tasks", "3", "--local"])
            #expect(r.status == 0 && r.out.contains("resolved tasks 3 (local)") && r.out.contains("mine"), "\(r.out) \(r.err)")
            #expect(try SyncClient(store: store).conflicts().isEmpty)
            #expect(try SyncClient(store: store).pendingChanges().contains { $0.key == 3 && $0.values["title"] == "mine" })
            #expect(try runStrata(["pending", path, "--held-back"]).out.contains("(nothing held back)"))
        }
    }

    @Test func pendingAndConflicts() throws {
        try withPreparedStore { path, _ in
            let pending = try #require(try json(try runStrata(["pending", path, "--json"]).out) as? [[String: Any]])
            // The conflicted row 3 is held back; inserts and updates first, then deletes.
            #expect(pending.map { $0["kind"] as? String } == ["update", "insert", "delete"])
            let conflicts = try #require(try json(try runStrata(["conflicts", path, "--json"]).out) as? [[String: Any]])
            #expect(conflicts.count == 1 && conflicts[0]["fields"] as? [String] == ["title"])
            #expect((conflicts[0]["server"] as? [String: Any])?["title"] as? [String: String] == ["string": "theirs"])
        }
    }

    @Test func mergeDryRunChangesNothingAndMergeDoes() throws {
        try withPreparedStore { path, store in
            let file = path + "-delta.json"
            defer { try? FileManager.default.removeItem(atPath: file) }
            let delta = ServerDelta(since: "a1", anchor: "a2", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 4, "title": "server4"])])])
            try WireFormat.encode(delta).write(to: URL(fileURLWithPath: file))
            let dry = try runStrata(["merge", path, file, "--dry-run", "--json"])
            #expect(dry.status == 0, "\(dry.err)")
            #expect((try json(dry.out) as? [String: Any])?["rowsApplied"] as? Int == 1)
            #expect((try json(try runStrata(["info", path, "--json"]).out) as? [String: Any])?["anchor"] as? String == "a1")
            let real = try runStrata(["merge", path, file])
            #expect(real.status == 0 && real.out.contains("1 rows applied"))
            let row = try json(try runStrata(["show", path, "tasks", "--where", "id=4", "--json"]).out) as? [[String: Any]]
            #expect((row?.first?["values"] as? [String: Any])?["title"] as? [String: String] == ["string": "server4"])
        }
    }

    /// `history` and `log` show a server operation's merge audit: the delta, the conflict and
    /// its resolution, and each field's base, local and server values with the outcome.
    @Test func historyAndLogShowTheMergeAudit() throws {
        try withPreparedStore { path, _ in
            let history = try runStrata(["history", path, "tasks", "3"])
            #expect(history.status == 0, "\(history.err)")
            #expect(history.out.contains("merged from delta a1, conflict (fields) resolved deferred by policy deferred"), "\(history.out)")
            #expect(history.out.contains(#"title: base "t3", local "mine", server "theirs" → conflictDeferred"#), "\(history.out)")
            let log = try runStrata(["log", path, "--table", "tasks", "--key", "3", "--json"])
            let entries = try #require(try json(log.out) as? [[String: Any]], "\(log.err)")
            let audits = entries.compactMap { $0["audit"] as? [String: Any] }
            #expect(audits.count == 1 && entries.filter { $0["origin"] as? String == "local" }.allSatisfy { $0["audit"] == nil })
            let title = (audits.first?["decisions"] as? [[String: Any]])?.first { $0["field"] as? String == "title" }
            #expect(title?["outcome"] as? String == "conflictDeferred" && (title?["server"] as? [String: String]) == ["string": "theirs"], "\(log.out)")
            #expect(audits.first?["anchor"] as? String == "a1" && audits.first?["policy"] as? String == "deferred")
        }
    }

    @Test func maintenanceCommands() throws {
        try withPreparedStore { path, _ in
            #expect(try runStrata(["verify", path]).status == 0)
            #expect(try runStrata(["rebuild", path]).out.contains("rebuilt from 13 operations"))
            let replay = path + "-replay"
            let copy = path + "-copy"
            defer { for p in [replay, copy] { try? FileManager.default.removeItem(atPath: p) } }
            let r = try runStrata(["replay", path, replay, "--through", "8"])
            #expect(r.status == 0 && r.out.contains("replayed 8 operations"), "\(r.err)")
            // `--until`, the option's first name, still works.
            let alias = path + "-replay-until"
            defer { try? FileManager.default.removeItem(atPath: alias) }
            let u = try runStrata(["replay", path, alias, "--until", "7"])
            #expect(u.status == 0 && u.out.contains("replayed 7 operations"), "\(u.err)")
            let replayed = try #require(try json(try runStrata(["show", replay, "tasks", "--json"]).out) as? [[String: Any]])
            #expect(replayed.count == 4 && replayed.allSatisfy { $0["status"] as? String == "unchanged" })
            #expect(try runStrata(["copy", path, copy, "--compact"]).status == 0)
            #expect(try runStrata(["verify", copy, "--json"]).out.contains("\"consistent\" : true"))
        }
    }

    @Test func compactFoldsWhatIsAcknowledgedAndReclaimNeedsTheStoreClosed() throws {
        try withPreparedStore { path, _ in
            // Operations 1–8 (inserts and their acknowledgements) fold; 9 on are pending.
            let r = try runStrata(["compact", path, "--json"])
            let report = try #require(try json(r.out) as? [String: Any], "\(r.err)")
            #expect(report["horizon"] as? Int == 8 && report["foldedOperations"] as? Int == 8 && report["heldBy"] as? String == "pending")
            #expect(try runStrata(["info", path]).out.contains("compacted through LSN 8"))
            #expect(try runStrata(["verify", path]).status == 0)
            let past = try runStrata(["show", path, "tasks", "--as-of", "5"])
            #expect(past.status == 2 && past.err.contains("compacted through LSN 8"), "\(past.err)")
            // This test holds the store open, so the file cannot be swapped.
            let busy = try runStrata(["compact", path, "--reclaim"])
            #expect(busy.status == 2 && busy.err.contains("is open"), "\(busy.err)")
            #expect(try runStrata(["compact", path, "--keep-operations", "-1"]).status == 64)
        }
    }

    @Test func badInputIsOneLineAndANonZeroStatus() throws {
        try withPreparedStore { path, store in
            let notAStore = path + "-nothing"
            let delta = path + "-bad.json"
            defer { try? FileManager.default.removeItem(atPath: delta) }
            try Data(#"{"anchor":"x","tables":[{"table":"tasks","upserts":[{"fields":{"id":{"int":1}},"colour":1}]}]}"#.utf8).write(to: URL(fileURLWithPath: delta))
            let before = try json(try runStrata(["info", path, "--json"]).out) as? [String: Any]
            let cases: [([String], Int32, String)] = [
                (["info", notAStore], 2, "no Strata store"),
                (["show", path, "nosuch"], 2, "no table named 'nosuch'"),
                (["history", path, "tasks", "77"], 2, "no row with key 77"),
                (["show", path, "tasks", "--as-of", "999"], 2, "past the end of the log"),
                (["show", path, "tasks", "--as-of", "0"], 64, "--as-of"),
                (["log", path, "--from", "9", "--to", "3"], 64, "--from 9 is after --to 3"),
                (["merge", path, delta], 2, "upserts[0].colour"),
                (["merge", path, notAStore + ".json"], 2, "cannot read the delta file"),
            ]
            for (arguments, status, message) in cases {
                let r = try runStrata(arguments)
                #expect(r.status == status, "\(arguments): status \(r.status), \(r.err)")
                #expect(r.err.contains(message), "\(arguments): \(r.err)")
                #expect(!r.err.contains("Fatal error") && !r.err.contains("Stack dump"), "\(arguments) crashed")
                if status == 2 { #expect(r.err.split(separator: "\n").count == 1, "\(arguments): not one line: \(r.err)") }
            }
            #expect(!FileManager.default.fileExists(atPath: notAStore), "a command created a store where there was none")
            let after = try json(try runStrata(["info", path, "--json"]).out) as? [String: Any]
            #expect(after?["logLength"] as? Int == before?["logLength"] as? Int)
        }
    }

    @Test func aStoreOfANewerFormatIsRefused() throws {
        try withPreparedStore { path, store in
            let newer = path + "-newer"
            defer { try? FileManager.default.removeItem(atPath: newer) }
            try FileManager.default.createDirectory(atPath: newer, withIntermediateDirectories: true)
            try store.copy(to: newer, compact: false)
            // Raise the copy's format version with a tiny writer of our own.
            try raiseFormatVersion(newer)
            let r = try runStrata(["info", newer])
            #expect(r.status == 2 && r.err.contains("newer than this Strata reads"), "\(r.err)")
            // Salvage too: it would misread a newer format's records (issue 36: it exited 0).
            let salvaged = newer + "-salvaged"
            defer { try? FileManager.default.removeItem(atPath: salvaged) }
            let s = try runStrata(["salvage", newer, salvaged])
            #expect(s.status != 0 && s.err.contains("newer than this Strata reads"), "\(s.status) \(s.err)")
            #expect(!FileManager.default.fileExists(atPath: salvaged + "/data.mdb"))
        }
    }

    @Test func exportAndImportABriefcase() throws {
        try withPreparedStore { path, _ in
            let file = path + ".briefcase"
            let fresh = path + "-imported"
            defer { for p in [file, fresh] { try? FileManager.default.removeItem(atPath: p) } }
            let e = try runStrata(["export", path, file, "--data-version", "7", "--json"])
            let exported = try json(e.out) as? [String: Any]
            #expect(e.status == 0 && exported?["rowCount"] as? Int == 5, "\(e.err)")
            let refused = try runStrata(["import", fresh, file])
            #expect(refused.status == 2 && refused.err.contains("no Strata store"))
            let wrong = try runStrata(["import", fresh, file, "--create", "--expect-data-version", "8"])
            #expect(wrong.status == 2 && wrong.err.contains("data version '7'"), "\(wrong.err)")
            let ok = try runStrata(["import", fresh, file, "--create", "--expect-data-version", "7"])
            #expect(ok.status == 0 && ok.out.contains("imported 5 rows"), "\(ok.err)")
            let a = try runStrata(["show", path, "tasks", "--include-deleted"]).out
            let b = try runStrata(["show", fresh, "tasks", "--include-deleted"]).out
            #expect(a == b && a.contains("conflicted"))
        }
    }

    @Test func everyCommandHasHelpWithAnExample() throws {
        for command in ["demo", "info", "show", "log", "history", "pending", "conflicts", "resolve", "merge", "rebuild", "verify", "replay", "export", "import", "copy", "bench"] {
            let r = try runStrata([command, "--help"])
            #expect(r.status == 0 && r.out.contains("strata \(command)"), "\(command) --help")
        }
    }

    /// `strata bench --help` names the workload document by its place in the repository, and
    /// that document is there with the check counts `WorkloadTests` holds the generator to.
    @Test func benchHelpPointsAtTheWorkloadDocumentInTheRepository() throws {
        let help = try runStrata(["bench", "--help"])
        #expect(help.status == 0 && help.out.contains("Benchmarks/WORKLOAD.md"), "\(help.out)")
        #expect(!help.out.contains("shared/"))
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let document = try String(contentsOf: root.appendingPathComponent("Benchmarks/WORKLOAD.md"), encoding: .utf8)
        for count in ["700,509 updates", "199,461 inserts", "100,030 deletes", "199,431 live rows"] {
            #expect(document.contains(count), "Benchmarks/WORKLOAD.md lacks '\(count)'")
        }
    }
}

import Foundation
import Strata
import StrataLibc
import StrataSync
import Testing

/// Runs `strata` through `/bin/sh -c` with `prefix` before it (a `ulimit`, a `trap`).
func runStrataInShell(_ prefix: String, _ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
    let quoted = ([try strataExecutable().path] + arguments).map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }
    let r = try runProcess(URL(fileURLWithPath: "/bin/sh"), ["-c", prefix + "; exec " + quoted.joined(separator: " ")])
    return (r.status, r.out, r.err)
}

func temporaryPath(_ name: String) -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("strata-cli-\(name)-\(UUID().uuidString)").path
}

@Suite struct StreamedOutputTests {
    /// `log`, `history`, `pending` and `show` print one item at a time; what they print is what
    /// the library returns, in the same order, as valid JSON and as text.
    @Test func streamedListingsHoldExactlyWhatTheLibraryReturns() throws {
        try withPreparedStore { path, store in
            // Enough rows and operations that a listing spans many writes of the output.
            try store.write { tx in
                for i in 100..<400 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("row \(i)"), "priority": .int(Int64(i % 7))]) }
                for i in 0..<50 { try tx.update("tasks", key: 1, ["title": .string("edit \(i)")]) }
            }
            let operations = try store.read { try $0.operations() }
            let log = try #require(try json(try runStrata(["log", path, "--json"]).out) as? [[String: Any]])
            #expect(log.compactMap { $0["lsn"] as? Int } == operations.map { Int($0.lsn) })
            // One line per operation; a merge's audit follows its operation on indented lines.
            #expect(try runStrata(["log", path]).out.split(separator: "\n").filter { !$0.hasPrefix(" ") }.count == operations.count)

            let history = try store.read { try $0.history("tasks", key: 1) }
            let h = try #require(try json(try runStrata(["history", path, "tasks", "1", "--json"]).out) as? [String: Any])
            #expect((h["operations"] as? [[String: Any]])?.compactMap { $0["lsn"] as? Int } == history.map { Int($0.lsn) })
            #expect((h["blame"] as? [String: Int])?["title"] == Int(history.last!.lsn))

            let pending = try SyncClient(store: store).pendingChanges()
            let p = try #require(try json(try runStrata(["pending", path, "--json"]).out) as? [[String: Any]])
            #expect(p.count == pending.count)
            var streamed: [RowChange] = []
            try SyncClient(store: store).forEachPendingChange { streamed.append($0) }
            #expect(streamed == pending, "forEachPendingChange differs from pendingChanges")

            // Sorted with a limit: the first rows of a stable sort by priority, then key.
            let rows = try store.read { try $0.rows("tasks") }
            let expected = rows.enumerated().sorted { a, b in
                let (x, y) = (a.element["priority"].intValue!, b.element["priority"].intValue!)
                return x != y ? x < y : a.offset < b.offset
            }.prefix(25).map { $0.element["id"].intValue! }
            let s = try #require(try json(try runStrata(["show", path, "tasks", "--sort", "priority", "--limit", "25", "--json"]).out) as? [[String: Any]])
            #expect(s.compactMap { (($0["values"] as? [String: Any])?["id"] as? [String: Int])?["int"] }.map(Int64.init) == expected)
            let empty = try runStrata(["show", path, "tasks", "--where", "title=nobody", "--json"])
            #expect((try json(empty.out) as? [Any])?.isEmpty == true, "\(empty.out)")
        }
    }

    /// `show --sort` lists rows in the library's order (`Value.order`, as `rows(_:)` sorts):
    /// strings by UTF-8 bytes — "e" + U+0301 before "f" before "é", which Swift's `<` holds
    /// equal to each other and after "f" — and values of different types ranked, not equal.
    @Test func showSortsInTheLibrarysOrder() throws {
        try withPreparedStore { path, store in
            try store.createTable(.propertyBag("bag", key: [.int("id")]))
            let values: [Value] = [
                "é", "f", "e\u{301}", .bytes([2]), .bytes([1]), .int(5), .null, .bool(true), .double(-1.5), "a",
                .timestamp(Date(timeIntervalSince1970: 1)), .bytes([1, 0]), .int(-3),
            ]
            try store.write { tx in
                for (i, v) in values.enumerated() { try tx.insert("bag", ["id": .int(Int64(i)), "v": v]) }
            }
            let expected = try store.read { try $0.rows(Query("bag", orderBy: [.ascending("v")])) }.map { $0["id"].intValue! }
            // The order the test relies on: not key order, and the precomposed "é" after "f".
            #expect(expected != Array(0..<Int64(values.count)))
            #expect(expected.firstIndex(of: 2)! < expected.firstIndex(of: 1)! && expected.firstIndex(of: 1)! < expected.firstIndex(of: 0)!)
            for limit in [[], ["--limit", "4"]] {
                let r = try runStrata(["show", path, "bag", "--sort", "v", "--json"] + limit)
                let s = try #require(try json(r.out) as? [[String: Any]], "\(r.err)")
                let ids = s.compactMap { (($0["values"] as? [String: Any])?["id"] as? [String: Int])?["int"] }.map(Int64.init)
                #expect(ids == (limit.isEmpty ? expected : Array(expected.prefix(4))), "\(limit)")
            }
        }
    }

    /// Text output cuts long values and says their size; JSON keeps them whole.
    @Test func longValuesAreElidedInTextWithTheirSize() throws {
        try withPreparedStore { path, store in
            let long = String(repeating: "x", count: 1_000_000)
            try store.write { try $0.update("tasks", key: 4, ["title": .string(long)]) }
            let text = try runStrata(["show", path, "tasks", "--where", "id=4"])
            #expect(text.status == 0 && text.out.contains("(1000000 bytes)"), "\(text.err)")
            #expect(text.out.utf8.count < 2_000)
            let log = try runStrata(["log", path, "--table", "tasks", "--key", "4"])
            #expect(log.out.contains("(1000000 bytes)") && log.out.utf8.count < 5_000)
            let json = try runStrata(["show", path, "tasks", "--where", "id=4", "--json"])
            #expect(json.out.contains(long))
        }
    }
}

@Suite struct CommandRobustnessTests {
    /// `--where` and `--sort` name fields the table has; a malformed `--where` is a usage error,
    /// not a crash.
    @Test func unknownOrMalformedFieldsAreErrors() throws {
        try withPreparedStore { path, _ in
            for (arguments, status, message) in [
                (["show", path, "tasks", "--where", "="], Int32(64), "--where takes field=value"),
                (["show", path, "tasks", "--where", "=3"], 64, "--where takes field=value"),
                (["show", path, "tasks", "--where", "titel=x"], 2, "no field 'titel' (--where)"),
                (["show", path, "tasks", "--sort", "prio"], 2, "no field 'prio' (--sort)"),
                (["show", path, "tasks", "--limit", "-5"], 64, "--limit cannot be negative"),
            ] {
                let r = try runStrata(arguments)
                #expect(r.status == status && r.err.contains(message), "\(arguments): \(r.status) \(r.err)")
                #expect(!r.err.contains("Fatal error"))
            }
            // An empty value is a value: `title=` matches an empty title.
            #expect(try runStrata(["show", path, "tasks", "--where", "title="]).out.contains("(no rows)"))
        }
    }

    /// `compact --reclaim` on a store open elsewhere refuses before compacting anything.
    @Test func reclaimOnAnOpenStoreChangesNothing() throws {
        try withPreparedStore { path, store in
            let before = try store.read { (try $0.lastLSN, try $0.horizon) }
            let r = try runStrata(["compact", path, "--reclaim"])
            #expect(r.status == 2 && r.err.contains("is open"), "\(r.err)")
            let after = try store.read { (try $0.lastLSN, try $0.horizon) }
            #expect(after == before, "the compaction ran although the reclaim was refused")
        }
    }

    /// A briefcase is never written inside a store's folder (it would replace `data.mdb`).
    @Test func exportRefusesAPathInsideAStore() throws {
        try withPreparedStore { path, store in
            let link = path + "-link"
            try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: path)
            defer { try? FileManager.default.removeItem(atPath: link) }
            try FileManager.default.createDirectory(atPath: path + "/sub", withIntermediateDirectories: true)
            for file in [path + "/data.mdb", path + "/x.briefcase", link + "/data.mdb", path + "/sub/../data.mdb", path + "/sub/x.briefcase"] {
                let r = try runStrata(["export", path, file])
                #expect(r.status == 2 && r.err.contains("inside the store folder"), "\(file): \(r.err)")
            }
            #expect(!FileManager.default.fileExists(atPath: path + "/x.briefcase"))
            #expect(try store.verify().isConsistent)
            #expect(try runStrata(["info", path]).status == 0)
        }
    }

    /// Exit statuses: errors are 2 with one readable line, bad arguments 64.
    @Test func exitStatusesAndMessages() throws {
        try withPreparedStore { path, _ in
            let file = temporaryPath("file")
            _ = FileManager.default.createFile(atPath: file, contents: Data("x".utf8))
            defer { try? FileManager.default.removeItem(atPath: file) }
            let copy = try runStrata(["copy", path, file + "/sub"])
            #expect(copy.status == 2 && !copy.err.contains("Error Domain") && copy.err.split(separator: "\n").count == 1, "\(copy.err)")
            for command in ["demo", "bench"] {
                let r = try runStrata([command, "--path", file])
                #expect(r.status == 64 && r.err.contains("is a file"), "\(command): \(r.status) \(r.err)")
            }
            #expect(try runStrata(["compact", path, "--keep-days", "-2"]).status == 64)
        }
    }

    /// A briefcase with a value that does not decode, or of format 0, is refused as malformed,
    /// saying nothing was imported; a failed `import --create` leaves no store behind.
    @Test func badBriefcasesSayNothingWasImported() throws {
        try withPreparedStore { path, store in
            let good = temporaryPath("good") + ".briefcase"
            let fresh = temporaryPath("fresh")
            defer { for p in [good, fresh] { try? FileManager.default.removeItem(atPath: p) } }
            try store.write { try $0.update("tasks", key: 4, ["title": "ZZZZ-marker"]) }
            try store.exportBriefcase(to: good)
            let bytes = Array(try Data(contentsOf: URL(fileURLWithPath: good)))
            func withChecksum(_ body: [UInt8]) -> [UInt8] {
                // FNV-1a over the length (8 bytes, little-endian) and the bytes, as the
                // briefcase format computes it.
                var h: UInt64 = 0xcbf2_9ce4_8422_2325
                let length = withUnsafeBytes(of: UInt64(body.count).littleEndian) { Array($0) }
                for b in length + body { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
                return body + withUnsafeBytes(of: h.littleEndian) { Array($0) }
            }
            var zero = Array(bytes.dropLast(8))
            zero[8] = 0
            // The marker string's value: its type tag (before its one-byte length) turned into
            // one no Strata writes.
            var badValue = Array(bytes.dropLast(8))
            let marker = Array("ZZZZ-marker".utf8)
            let at = try #require((0...(badValue.count - marker.count)).last { Array(badValue[$0..<($0 + marker.count)]) == marker })
            badValue[at - 2] = 0xEE
            for (name, content, message) in [("zero", withChecksum(zero), "format 0"), ("value", withChecksum(badValue), "does not decode")] {
                let file = temporaryPath(name)
                defer { try? FileManager.default.removeItem(atPath: file) }
                try Data(content).write(to: URL(fileURLWithPath: file))
                let r = try runStrata(["import", fresh, file, "--create"])
                #expect(r.status == 2 && r.err.contains(message) && r.err.contains("nothing was imported") && !r.err.contains("newer"), "\(name): \(r.err)")
                #expect(!FileManager.default.fileExists(atPath: fresh), "\(name): a failed import --create left a store")
            }
        }
    }

    /// `replay` that hits the file size limit reports a full disk and leaves no store behind.
    @Test func replayIntoAFullDiskSaysSoAndCleansUp() throws {
        let source = temporaryPath("big")
        let target = temporaryPath("replayed")
        defer { for p in [source, target] { try? FileManager.default.removeItem(atPath: p) } }
        let store = try Store(path: source)
        try store.createTable(.fixed("t", fields: [.int("id"), .string("text")]))
        try store.write { tx in
            for i in 0..<2_000 { try tx.insert("t", ["id": .int(Int64(i)), "text": .string(String(repeating: "y", count: 2_000))]) }
        }
        store.close()
        // 1 MiB in 512-byte blocks (POSIX sh); SIGXFSZ ignored so the write fails instead.
        let r = try runStrataInShell("trap '' XFSZ; ulimit -f 2048", ["replay", source, target])
        #expect(r.status == 2 && r.err.contains("disk is full"), "\(r.status) \(r.err)")
        #expect(!FileManager.default.fileExists(atPath: target), "the failed replay left its store")
    }

    /// Scratch stores of dead processes are swept when a command starts; a killed reclaim's
    /// `reclaim.tmp` goes when the store is next opened.
    @Test func leftoversAreSwept() throws {
        try withPreparedStore { path, store in
            let dead = Process()
            dead.executableURL = URL(fileURLWithPath: "/bin/true")
            try dead.run()
            dead.waitUntilExit()
            let tmp = FileManager.default.temporaryDirectory
            let stale = tmp.appendingPathComponent("\(Store.scratchPrefix)\(dead.processIdentifier)-verify-\(UUID().uuidString)").path
            let live = tmp.appendingPathComponent("\(Store.scratchPrefix)\(getpid())-verify-\(UUID().uuidString)").path
            defer { for p in [stale, live] { try? FileManager.default.removeItem(atPath: p) } }
            for p in [stale, live] { try FileManager.default.createDirectory(atPath: p, withIntermediateDirectories: true) }
            #expect(try runStrata(["info", path]).status == 0)
            #expect(!FileManager.default.fileExists(atPath: stale), "a dead process's scratch store was kept")
            #expect(FileManager.default.fileExists(atPath: live), "a live process's scratch store was swept")

            store.close()
            try FileManager.default.createDirectory(atPath: path + "/reclaim.tmp", withIntermediateDirectories: true)
            #expect(try runStrata(["info", path]).status == 0)
            #expect(!FileManager.default.fileExists(atPath: path + "/reclaim.tmp"))
        }
    }

    /// `bench` refuses sizes this machine cannot generate, instead of dying of memory.
    @Test func benchValidatesItsSizes() throws {
        for arguments in [["--edits", "10000000000"], ["--preload", "999999999999"], ["--edits", "-3"]] {
            let r = try runStrata(["bench"] + arguments)
            #expect(r.status == 64, "\(arguments): \(r.status) \(r.err)")
        }
    }
}

@Suite struct ReadOnlyStoreTests {
    /// A store whose files this process cannot write is inspected read-only; a command that
    /// would write says the store is read-only and changes nothing.
    @Test func aStoreWithReadOnlyFilesCanBeInspected() throws {
        try withPreparedStore { path, store in
            store.close()
            let run: ([String]) throws -> (status: Int32, out: String, err: String)
            if getuid() == 0 {
                // Root writes anything: run the command as nobody, for whom the files (0644,
                // owned by root) are read-only.
                run = { try runAs(65534, $0) }
            } else {
                for file in ["data.mdb", "lock.mdb", "strata.lock"] { chmod(path + "/" + file, 0o444) }
                chmod(path, 0o555)
                run = { try runStrata($0) }
            }
            defer { chmod(path, 0o755) }
            for arguments in [["info", path], ["show", path, "tasks"], ["log", path], ["pending", path], ["verify", path]] {
                let r = try run(arguments)
                #expect(r.status == 0, "\(arguments[0]): \(r.status) \(r.err)")
            }
            let write = try run(["compact", path])
            #expect(write.status == 2 && write.err.contains("read-only"), "\(write.status) \(write.err)")
            #expect(try Store(path: path).verify().isConsistent)
        }
    }
}

/// Runs `strata` as user `uid` (and group `uid`) through `setpriv`.
func runAs(_ uid: Int, _ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
    let r = try runProcess(URL(fileURLWithPath: "/usr/bin/setpriv"), ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", try strataExecutable().path] + arguments)
    return (r.status, r.out, r.err)
}

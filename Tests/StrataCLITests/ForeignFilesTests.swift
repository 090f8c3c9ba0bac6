import Foundation
import LMDB
import Strata
import Testing

/// Folders whose `data.mdb` is not a Strata store: every CLI command and `Store(path:)` must
/// refuse them with a clear error and leave every file as it was, byte for byte. Before this,
/// `strata info` turned each of them into a new empty store.
@Suite struct ForeignFilesTests {
    enum Kind: String, CaseIterable, CustomStringConvertible {
        case emptyDataFile, notLMDB, foreignLMDB, mdbLoadDatabase, foreignFreshEnvironment, rootInvalid, rootPastTheEnd
        var description: String { rawValue }
        /// A Strata store whose meta pages name an impossible root: the page check that runs
        /// before LMDB reads a store calls it damaged (`corruptStore`, exit 3), not foreign.
        var isDamagedStore: Bool { self == .rootInvalid || self == .rootPastTheEnd }
    }

    /// Makes a folder of `kind` at `path`; `store` is a real store to damage for the root cases.
    static func make(_ kind: Kind, at path: String, from store: String) throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        let data = URL(fileURLWithPath: path + "/data.mdb")
        switch kind {
        case .emptyDataFile:
            try Data().write(to: data)
        case .notLMDB:
            try Data(String(repeating: "these are someone's notes, not a database\n", count: 400).utf8).write(to: data)
        case .foreignLMDB:
            // Another program's database, written with this package's own LMDB wrapper: a named
            // database of its own and a plain key in the main database.
            let env = try Environment(path: path)
            let contacts = try env.openDatabase("contacts")
            let main = try env.openDatabase(nil)
            try env.write { txn in
                for i in 0..<50 { try txn.put(Array("person-\(i)".utf8), Array("phone \(i)".utf8), in: contacts) }
                try txn.put(Array("version".utf8), [7], in: main)
            }
            env.close()
        case .mdbLoadDatabase:
            // The same made by LMDB's own tool (lmdb-utils), as a user's other program would.
            let load = Process()
            load.executableURL = URL(fileURLWithPath: "/usr/bin/mdb_load")
            load.arguments = [path]
            let input = Pipe()
            load.standardInput = input
            try load.run()
            let dump = "VERSION=3\nformat=print\ntype=btree\nmapsize=1048576\nHEADER=END\n hello\n world\n key2\n value2\nDATA=END\n"
            input.fileHandleForWriting.write(Data(dump.utf8))
            try input.fileHandleForWriting.close()
            load.waitUntilExit()
            #expect(load.terminationStatus == 0, "mdb_load failed")
        case .foreignFreshEnvironment:
            // An environment another program opened and never wrote to (no strata.lock beside it).
            let env = try Environment(path: path)
            env.close()
        case .rootInvalid, .rootPastTheEnd:
            // A Strata store whose header names no main tree, or a page past the end of the file.
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: store + "/data.mdb")))
            let pageSize = Int(bytes[40]) | Int(bytes[41]) << 8 | Int(bytes[42]) << 16 | Int(bytes[43]) << 24
            let root: UInt64 = kind == .rootInvalid ? .max : 999_999
            // MDB_meta after the 16-byte page header: magic, version, address, map size, then
            // the free and main databases' records (48 bytes each, the root last).
            for page in 0..<2 {
                withUnsafeBytes(of: root.littleEndian) { bytes.replaceSubrange(page * pageSize + 128..<page * pageSize + 136, with: $0) }
            }
            try Data(bytes).write(to: data)
        }
    }

    /// A folder path under the temporary directory (not created), removed afterwards.
    static func withFolder(_ body: (String) throws -> Void) throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-foreign-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        try body(path)
    }

    /// Every file of `folder` by name with its bytes. `lock.mdb` counts by presence only: it is
    /// LMDB's reader table, rewritten by every LMDB reader of the file (another program's own
    /// tools too), and holds no data.
    static func snapshot(_ folder: String) throws -> [String: Data] {
        var files: [String: Data] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: folder) {
            files[name] = name == "lock.mdb" ? Data("present".utf8) : try contents(of: folder + "/" + name)
        }
        return files
    }

    /// A file's bytes, read with `read(2)`: Foundation's `Data(contentsOf:)` leaks its buffer on
    /// some of these files (LeakSanitizer, Swift 6.3.1), which would fail the ASan run.
    static func contents(of path: String) throws -> Data {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw CocoaError(.fileReadNoSuchFile, userInfo: [NSFilePathErrorKey: path]) }
        defer { close(fd) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw CocoaError(.fileReadUnknown, userInfo: [NSFilePathErrorKey: path]) }
            if n == 0 { return data }
            data.append(buffer, count: n)
        }
    }

    /// The files that differ between two snapshots.
    static func difference(_ a: [String: Data], _ b: [String: Data]) -> [String] {
        Set(a.keys).union(b.keys).sorted().filter { a[$0] != b[$0] }
    }

    /// A small real store to damage, and the files commands need (a delta, a briefcase, tables).
    static func withFixtures(_ body: (_ store: String, _ scratch: String) throws -> Void) throws {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("strata-foreign-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
        let store = scratch + "/real"
        do {
            let s = try Store(path: store)
            try s.createTable(.fixed("tasks", fields: [.int("id"), .string("title")]))
            try s.write { tx in for i in 1...20 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t\(i)"]) } }
            try s.copy(to: scratch, compact: false)  // a clean data.mdb without the lock files
        }
        try FileManager.default.removeItem(atPath: store)
        try FileManager.default.createDirectory(atPath: store, withIntermediateDirectories: true)
        try FileManager.default.moveItem(atPath: scratch + "/data.mdb", toPath: store + "/data.mdb")
        let briefcase = scratch + "/x.briefcase"
        #expect(try runStrata(["export", store, briefcase]).status == 0)
        try Data(#"{"anchor":"a1","tables":[]}"#.utf8).write(to: URL(fileURLWithPath: scratch + "/delta.json"))
        try Data(#"{"tables":[{"name":"t","primaryKey":["id"],"fields":[{"name":"id","type":"int"}]}]}"#.utf8)
            .write(to: URL(fileURLWithPath: scratch + "/tables.json"))
        try body(store, scratch)
    }

    @Test(arguments: Kind.allCases)
    func everyCommandRefusesAndLeavesTheFolderUntouched(_ kind: Kind) throws {
        if kind == .mdbLoadDatabase && !FileManager.default.isExecutableFile(atPath: "/usr/bin/mdb_load") {
            print("ForeignFilesTests: mdb_load is not installed (lmdb-utils); \(kind) not tested")
            return
        }
        try Self.withFixtures { store, scratch in
            let dir = scratch + "/\(kind)"
            try Self.make(kind, at: dir, from: store)
            let before = try Self.snapshot(dir)
            let out = scratch + "/out-\(kind)"
            // Every command that reads a store, and every one that may create one.
            let commands: [[String]] = [
                ["info", dir], ["info", dir, "--json"], ["show", dir, "tasks"], ["log", dir], ["history", dir, "tasks", "1"],
                ["pending", dir], ["conflicts", dir], ["merge", dir, scratch + "/delta.json"], ["compact", dir],
                ["compact", dir, "--reclaim"], ["rebuild", dir], ["verify", dir], ["check", dir], ["salvage", dir, out + "-salvage"],
                ["replay", dir, out + "-replay"], ["export", dir, out + ".briefcase"], ["import", dir, scratch + "/x.briefcase"],
                ["import", dir, scratch + "/x.briefcase", "--create"], ["copy", dir, out + "-copy"],
                ["sync", dir, "--server", "http://127.0.0.1:9", "--token", "t"], ["demo", "--path", dir],
                ["create", dir, "--tables", scratch + "/tables.json"],
            ]
            // `check` walks the pages of whatever LMDB file it is given, and `salvage` reads
            // them directly: they may report damage rather than "not a store".
            let walkers: Set<String> = ["check", "salvage", "verify"]
            for arguments in commands {
                let r = try runStrataWatchingSignals(arguments)
                let label = "\(kind): strata \(arguments.joined(separator: " "))"
                #expect(r.signal == nil, "\(label) died of signal \(r.signal ?? 0): \(r.err.prefix(300))")
                if ["demo", "create"].contains(arguments[0]) {
                    // They create a store only in a folder that holds nothing.
                    #expect(r.status != 0, "\(label) succeeded")
                } else if kind.isDamagedStore {
                    // The page check before the open finds the damage: exit 3, and salvage.
                    if ["check", "verify"].contains(arguments[0]) {
                        #expect(r.status == 3, "\(label): status \(r.status), \(r.err.prefix(300))")
                    } else if arguments[0] != "salvage" {
                        #expect(r.status == 3 && r.err.contains("damaged") && r.err.contains("salvage"), "\(label): status \(r.status), \(r.err.prefix(300))")
                    }
                } else if !walkers.contains(arguments[0]) {
                    #expect(r.status == 2 && r.err.contains("does not hold a Strata store"), "\(label): status \(r.status), \(r.err.prefix(300))")
                }
                if kind == .emptyDataFile && !["demo", "create"].contains(arguments[0]) {
                    // An empty file is no LMDB file at all: no command, `check` included, reads it as one.
                    #expect(r.status == 2 && r.err.contains("does not hold a Strata store"), "\(label): status \(r.status), \(r.err.prefix(300))")
                }
                let after = try Self.snapshot(dir)
                #expect(after == before, "\(label) changed the folder: \(Self.difference(before, after))")
            }

            // The library: `Store(path:)`, creating or not, refuses with `notAStore`.
            for create in [true, false] {
                var options = StoreOptions()
                options.createIfMissing = create
                let e = #expect(throws: StrataError.self) { try Store(path: dir, options: options) }
                if kind.isDamagedStore {
                    #expect(e?.code == .corruptStore && e?.message.contains("nothing was written") == true, "\(kind), create \(create): \(String(describing: e))")
                } else {
                    #expect(e?.code == .notAStore && e?.message.contains("Nothing was written") == true, "\(kind), create \(create): \(String(describing: e))")
                }
                let after = try Self.snapshot(dir)
                #expect(after == before, "\(kind): Store(path:) with createIfMissing \(create) changed the folder: \(Self.difference(before, after))")
            }
        }
    }

    /// An app's `Store(path:)` still creates a store where there is none: a missing folder, or
    /// an existing folder without `data.mdb`. Inspection opens do not.
    @Test func aStoreIsCreatedOnlyWhereNoDataFileExists() throws {
        try Self.withFolder { path in
            var existing = StoreOptions()
            existing.createIfMissing = false
            let e = #expect(throws: StrataError.self) { try Store(path: path + "/new", options: existing) }
            #expect(e?.code == .io)
            #expect(!FileManager.default.fileExists(atPath: path + "/new"))
            #expect(try runStrata(["info", path + "/new"]).status == 2)
            #expect(!FileManager.default.fileExists(atPath: path + "/new"))

            let first = try Store(path: path + "/new").clientID
            try FileManager.default.createDirectory(atPath: path + "/folder", withIntermediateDirectories: true)
            try Data("notes".utf8).write(to: URL(fileURLWithPath: path + "/folder/readme.txt"))
            let second = try Store(path: path + "/folder")
            try second.createTable(.fixed("t", fields: [.int("id")]))
            #expect(second.clientID != first)
            second.close()
            let again = try Store(path: path + "/folder", options: existing)
            let tables = try again.tables.map(\.name)
            #expect(again.clientID == second.clientID && tables == ["t"])
        }
    }

    /// A Strata process stopped between LMDB creating `data.mdb` and committing the new store
    /// leaves a never-committed environment beside `strata.lock`: `Store(path:)` finishes
    /// creating it, an inspection refuses it and writes nothing.
    @Test func aStoreLeftHalfCreatedByStrataIsCreatedByTheNextCreatingOpen() throws {
        try Self.withFolder { path in
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            #expect(FileManager.default.createFile(atPath: path + "/strata.lock", contents: nil))
            try Environment(path: path).close()
            let before = try Self.snapshot(path)
            let r = try runStrata(["info", path])
            #expect(r.status == 2 && r.err.contains("empty LMDB environment"), "\(r.err)")
            var existing = StoreOptions()
            existing.createIfMissing = false
            let e = #expect(throws: StrataError.self) { try Store(path: path, options: existing) }
            #expect(e?.code == .notAStore)
            try #expect(Self.snapshot(path) == before)
            let store = try Store(path: path)
            try store.createTable(.fixed("t", fields: [.int("id")]))
            store.close()
            #expect(try runStrata(["info", path]).status == 0)
        }
    }

    /// Many processes open a folder at once while it is being created, some creating and some
    /// only inspecting: every creator gets the one store that was created (none mistakes an
    /// environment another is still initializing for a foreign file, none initializes it
    /// twice), and an inspector gets that store or "no store (yet)", never a second one.
    @Test func processesOpeningAStoreWhileItIsCreatedAgreeOnOneStore() throws {
        let helper = try strataExecutable().deletingLastPathComponent().appendingPathComponent("strata-crash-helper")
        try Self.withFolder { root in
            for round in 0..<12 {
                let path = root + "/store-\(round)"
                var processes: [(Process, Pipe, Pipe, Bool)] = []
                for i in 0..<8 {
                    let create = i % 2 == 0
                    let p = Process()
                    p.executableURL = helper
                    p.arguments = ["open", path, create ? "create" : "existing"]
                    let input = Pipe(), output = Pipe()
                    p.standardInput = input
                    p.standardOutput = output
                    try p.run()
                    processes.append((p, input, output, create))
                }
                // All of them start opening at (nearly) the same moment.
                for (_, input, _, _) in processes { input.fileHandleForWriting.write(Data("go\n".utf8)) }
                var ids: Set<String> = []
                for (p, _, output, create) in processes {
                    let line = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                    p.waitUntilExit()
                    if line.hasPrefix("ID ") {
                        ids.insert(line)
                    } else {
                        #expect(!create, "round \(round): a creating open failed: \(line)")
                        // Not there yet, or an environment still being initialized.
                        #expect(line.hasPrefix("E io no Strata store") || line.contains("empty LMDB environment"), "round \(round): \(line)")
                    }
                }
                #expect(ids.count == 1, "round \(round): \(ids)")
                var existing = StoreOptions()
                existing.createIfMissing = false
                let store = try Store(path: path, options: existing)
                #expect(ids == ["ID \(store.clientID)\n"])
                store.close()
            }
        }
    }
}

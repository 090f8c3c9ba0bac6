import Foundation
@testable import Strata
import StrataWorkload
import Testing

@Suite struct BriefcaseTests {
    /// A source store with synced, updated, inserted, deleted rows in a fixed table and a bag.
    func source(_ path: String) throws -> Store {
        let store = try Store(path: path)
        try store.createTable(tasksSchema)
        try store.createTable(.propertyBag("settings", key: [.string("name")]))
        try store.write { tx in
            for i in 1...5 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)"), "notes": i % 2 == 0 ? "n" : nil]) }
            for i in 1...4 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
            try tx.update("tasks", key: 1, ["title": "edited", "done": true])
            try tx.delete("tasks", key: 2)
            try tx.insert("settings", ["name": "theme", "value": "dark", "size": 3])
        }
        return store
    }

    func contents(_ store: Store) throws -> [Row] {
        try store.read { snap in try snap.tables.flatMap { try snap.rows($0.name, includingDeleted: true) } }
    }

    @Test func exportThenImportGivesIdenticalTablesPendingStateIncluded() throws {
        try withTemporaryFolder { dir in
            let a = try source(dir + "/a")
            let file = dir + "/snapshot.briefcase"
            let info = try a.exportBriefcase(to: file, dataVersion: "v7", properties: ["user": "ann"])
            #expect(info.rowCount == 6)
            #expect(try Store.briefcaseInfo(at: file).properties == ["user": "ann"])
            let b = try Store(path: dir + "/b")
            try b.importBriefcase(from: file, expectingDataVersion: "v7")
            #expect(try contents(b).map(\.description) == (try contents(a)).map(\.description))
            #expect(try b.read { try $0.pendingRows().map(\.key) } == (try a.read { try $0.pendingRows().map(\.key) }))
            #expect(try b.read { try $0.history("tasks", key: 1) }.last?.kind == .imported)
            #expect(try b.verify().isConsistent)
            // Importing again into a store that changed meanwhile restores the briefcase's rows.
            try b.write { tx in
                try tx.insert("tasks", ["id": 99, "title": "extra"])
                try tx.update("tasks", key: 3, ["title": "changed"])
            }
            try b.importBriefcase(from: file)
            #expect(try contents(b).map(\.description) == (try contents(a)).map(\.description))
        }
    }

    @Test func aWrongDataVersionIsReportedAndNothingIsImported() throws {
        try withTemporaryFolder { dir in
            let file = dir + "/old.briefcase"
            try source(dir + "/a").exportBriefcase(to: file, dataVersion: "v6")
            let b = try Store(path: dir + "/b")
            let e = #expect(throws: StrataError.self) { try b.importBriefcase(from: file, expectingDataVersion: "v7") }
            #expect(e?.code == .dataVersionMismatch && e?.message.contains("'v6'") == true)
            #expect(try b.tables.isEmpty)
        }
    }

    @Test func aDamagedOrTruncatedBriefcaseImportsNothing() throws {
        let seed = testSeed("aDamagedBriefcase")
        var g = SplitMix64(seed: seed)
        try withTemporaryFolder { dir in
            let file = dir + "/good.briefcase"
            try source(dir + "/a").exportBriefcase(to: file)
            let good = try Data(contentsOf: URL(fileURLWithPath: file))
            let b = try Store(path: dir + "/b")
            try b.createTable(tasksSchema)
            try b.write { try $0.insert("tasks", ["id": 42, "title": "mine"]) }
            let before = try contents(b)
            for i in 0..<60 {
                var bad = good
                if i % 2 == 0 {
                    bad = bad.prefix(Int(g.next() % UInt64(good.count)))
                } else {
                    let at = Int(g.next() % UInt64(good.count))
                    bad[at] ^= UInt8(1 + g.next() % 255)
                }
                let path = dir + "/bad.briefcase"
                try bad.write(to: URL(fileURLWithPath: path))
                let e = #expect(throws: StrataError.self, "case \(i)") { try b.importBriefcase(from: path) }
                #expect(e?.code == .malformedInput, "case \(i): \(e.map(String.init(describing:)) ?? "-")")
                #expect(try contents(b) == before, "case \(i) changed the store")
            }
        }
    }

    static let usersSchema = TableSchema.fixed("users", primaryKey: ["id"], fields: [.int("id"), .string("email"), .string("name", nullable: true)])

    /// A store with `users` (a unique index on `email`) holding `rows` (id → email), synced.
    func users(_ path: String, _ rows: [Int64: String]) throws -> Store {
        let store = try Store(path: path)
        try store.createTable(Self.usersSchema)
        try store.createIndex("byEmail", on: "users", fields: ["email"], unique: true)
        try store.write { tx in
            for (id, email) in rows.sorted(by: { $0.key < $1.key }) {
                try tx.insert("users", ["id": .int(id), "email": .string(email)])
                try tx.acknowledge("users", key: .init(.int(id)))
            }
        }
        return store
    }

    func emails(_ store: Store) throws -> [Int64: String] {
        try store.read { snap in
            var out: [Int64: String] = [:]
            for row in try snap.rows("users", includingDeleted: true) {
                guard case .int(let id) = row.key.values[0], case .string(let email) = row["email"] else { continue }
                out[id] = email
            }
            return out
        }
    }

    /// The briefcase's rows replace the table's in one transaction: a unique value that moves
    /// from a row the briefcase lacks to one it holds, or two rows that swap their values, is no
    /// clash — uniqueness holds once the import is whole. Each used to fail with `duplicateKey`.
    @Test(arguments: [
        // (the importing store's rows, the briefcase's rows)
        ([2: "a"], [1: "a"]),
        ([1: "a", 2: "b"], [1: "b", 2: "a"]),
        ([1: "a", 2: "b", 3: "c"], [1: "b", 2: "c", 3: "a", 4: "d"]),
    ] as [([Int64: String], [Int64: String])])
    func uniqueValuesMayMoveBetweenRows(store before: [Int64: String], briefcase rows: [Int64: String]) throws {
        try withTemporaryFolder { dir in
            let file = dir + "/users.briefcase"
            try users(dir + "/a", rows).exportBriefcase(to: file)
            let b = try users(dir + "/b", before)
            try b.importBriefcase(from: file)
            #expect(try emails(b) == rows)
            for (id, email) in rows {
                #expect(try b.read { try $0.rows(Query("users", where: .equals("email", .string(email)))) }.map(\.key) == [RowKey(.int(id))])
            }
            #expect(try b.verify().isConsistent)
        }
    }

    /// Rows the briefcase holds that repeat a unique value of the importing store's index are
    /// still refused, with the index and both rows named, and nothing is imported.
    @Test func aBriefcaseRepeatingAUniqueValueImportsNothing() throws {
        try withTemporaryFolder { dir in
            let file = dir + "/users.briefcase"
            let a = try Store(path: dir + "/a")
            try a.createTable(Self.usersSchema)
            try a.write { tx in
                try tx.insert("users", ["id": 1, "email": "same"])
                try tx.insert("users", ["id": 2, "email": "same"])
            }
            try a.exportBriefcase(to: file)
            let b = try users(dir + "/b", [3: "other"])
            let e = #expect(throws: StrataError.self) { try b.importBriefcase(from: file) }
            #expect(e?.code == .duplicateKey && e?.message.contains("byEmail") == true && e?.message.contains("nothing was imported") == true, "\(String(describing: e))")
            #expect(try emails(b) == [3: "other"])
            #expect(try b.verify().isConsistent)
        }
    }

    /// A key as the file gives it (an int for a double key field) names the row the store
    /// holds under the converted key: it is kept, not removed as a row the briefcase lacks.
    @Test func aKeyConvertedOnImportIsKept() throws {
        try withTemporaryFolder { dir in
            let schema = TableSchema.fixed("points", primaryKey: ["x"], fields: [.double("x"), .string("label")])
            let info = BriefcaseInfo(dataVersion: nil, properties: [:], tables: [schema], fieldNames: ["points": ["x", "label"]], rowCount: 2, createdAt: Date(), sourceClientID: "test", storeProperties: nil)
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            let file = dir + "/points.briefcase"
            let bytes = try BriefcaseFormat.encode(info, [
                .init(table: 0, key: RowKey(.int(5)), state: RowState(fields: ["label": .clean("five")])),
                .init(table: 0, key: RowKey(.double(6.5)), state: RowState(fields: ["label": .clean("six and a half")])),
            ])
            try Data(bytes).write(to: URL(fileURLWithPath: file))
            let b = try Store(path: dir + "/b")
            try b.importBriefcase(from: file)
            let rows = try b.read { try $0.rows("points") }
            #expect(rows.map(\.key) == [RowKey(.double(5)), RowKey(.double(6.5))])
            #expect(rows.map { $0["label"] } == ["five", "six and a half"])
            // Again, over the rows now there: nothing changes.
            try b.importBriefcase(from: file)
            #expect(try b.read { try $0.rows("points") } == rows)
        }
    }

    /// A one-row briefcase of `tasks` (rows 1…) with each row's flags byte and field marks as
    /// given, checksummed as Strata does: the checksum is no secret, so the decoder, not the
    /// checksum, must meet bytes no Strata writes.
    static func handMade(_ rows: [(flags: UInt8, marks: [String: UInt8])]) throws -> [UInt8] {
        let info = BriefcaseInfo(dataVersion: nil, properties: [:], tables: [tasksSchema], fieldNames: ["tasks": tasksSchema.fields.map(\.name)], rowCount: rows.count, createdAt: Date(), sourceClientID: "test", storeProperties: nil)
        var w = ByteWriter()
        w.append(Array(try BriefcaseFormat.encode(info, []).dropLast(8)))
        for (i, row) in rows.enumerated() {
            w.appendVarint(0)
            w.appendVarint(1)
            w.appendValue(.int(Int64(i + 1)))
            w.append(row.flags)
            let fields: [(String, Value)] = [("done", false), ("priority", 1), ("title", "t")]
            w.appendVarint(UInt64(fields.count))
            for (name, value) in fields {
                w.appendValue(.string(name))
                w.appendValue(value)
                w.appendValue(value)
                w.append(row.marks[name] ?? 0)
            }
        }
        var d = Digest()
        w.withUnsafeBytes { d.add($0) }
        w.appendLittleEndian(d.value)
        return w.bytes
    }

    /// The states a briefcase row may have are those Strata stores: flags 1 (inserted),
    /// 2 (deleted) and 4 (conflicted), never inserted and deleted together, and field conflict
    /// marks only in a conflicted row. Others used to be imported — flags 3 made a hidden row
    /// that the next changeset uploaded as an insert — and are now refused, naming the row,
    /// with nothing imported.
    @Test(arguments: [
        (3, [:], "both inserted and deleted"),
        (7, ["title": 1], "both inserted and deleted"),
        (8, [:], "unknown flags"),
        (0x81, [:], "unknown flags"),
        (0, ["title": 1], "not in conflict"),
        (1, ["done": 1], "not in conflict"),
    ] as [(UInt8, [String: UInt8], String)])
    func rowStatesStrataNeverWritesAreRefused(flags: UInt8, marks: [String: UInt8], why: String) throws {
        try withTemporaryFolder { dir in
            let b = try Store(path: dir + "/b")
            try b.createTable(tasksSchema)
            try b.write { try $0.insert("tasks", ["id": 42, "title": "mine"]) }
            let before = try contents(b)
            let file = dir + "/bad.briefcase"
            // A sound row first: the refusal is of the file, not of the rows before the bad one.
            try Data(try Self.handMade([(0, [:]), (flags, marks)])).write(to: URL(fileURLWithPath: file))
            let e = #expect(throws: StrataError.self) { try b.importBriefcase(from: file) }
            #expect(e?.code == .malformedInput && e?.message.contains(why) == true && e?.message.contains("row 2") == true, "\(String(describing: e))")
            #expect(try contents(b) == before)
            #expect(try b.read { try $0.pendingChangeset("tasks").changes() }.map(\.key) == [RowKey(.int(42))])
        }
    }

    /// Every state Strata writes still imports, conflict marks in a conflicted row included.
    @Test func rowStatesStrataWritesImport() throws {
        try withTemporaryFolder { dir in
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            let file = dir + "/good.briefcase"
            try Data(try Self.handMade([(0, [:]), (1, [:]), (2, [:]), (4, ["title": 1]), (5, ["done": 1]), (6, [:])])).write(to: URL(fileURLWithPath: file))
            let b = try Store(path: dir + "/b")
            try b.importBriefcase(from: file)
            let rows = try b.read { try $0.rows("tasks", includingDeleted: true) }
            #expect(rows.map(\.status) == [.unchanged, .inserted, .deleted, .unchanged, .inserted, .deleted])
            #expect(rows.map(\.isConflicted) == [false, false, false, true, true, true])
            #expect(rows.prefix(5).map(\.conflictingFields) == [[], [], [], ["title"], ["done"]])
            #expect(try b.verify().isConsistent)
        }
    }

    /// Strata writes each row once; a briefcase naming a row twice (as given, or once converted,
    /// like 5 and 5.0 for a double key field) is refused instead of the last copy winning.
    @Test(arguments: [[RowKey(.double(5)), RowKey(.double(5))], [RowKey(.int(5)), RowKey(.double(5))]])
    func aRowGivenTwiceIsRefused(keys: [RowKey]) throws {
        try withTemporaryFolder { dir in
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            let schema = TableSchema.fixed("points", primaryKey: ["x"], fields: [.double("x"), .string("label")])
            let info = BriefcaseInfo(dataVersion: nil, properties: [:], tables: [schema], fieldNames: ["points": ["x", "label"]], rowCount: keys.count, createdAt: Date(), sourceClientID: "test", storeProperties: nil)
            let file = dir + "/twice.briefcase"
            let bytes = try BriefcaseFormat.encode(info, keys.enumerated().map { i, key in
                .init(table: 0, key: key, state: RowState(fields: ["label": .clean(.string("copy \(i)"))]))
            })
            try Data(bytes).write(to: URL(fileURLWithPath: file))
            let b = try Store(path: dir + "/b")
            let e = #expect(throws: StrataError.self) { try b.importBriefcase(from: file) }
            #expect(e?.code == .malformedInput && e?.message.contains("twice") == true, "\(String(describing: e))")
            #expect(try b.tables.isEmpty)
        }
    }
}

/// A briefcase is written beside its path and renamed over it; over a device, a FIFO or a
/// symbolic link that would replace the thing itself (issue 36: `strata export store /dev/stdout`
/// made `/dev/stdout` a regular file). Those are refused and left as they were; a regular file is
/// replaced and a new path created.
@Suite struct BriefcaseTargetTests {
    @Test func onlyARegularFileOrANewPathIsWritten() throws {
        try withStore { store, folder in
            try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title")]))
            try store.write { try $0.insert("tasks", ["id": 1, "title": "t"]) }
            let dir = folder + "-targets"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let fifo = dir + "/fifo", link = dir + "/link", linked = dir + "/linked", regular = dir + "/regular"
            #expect(mkfifo(fifo, 0o644) == 0)
            try Data("linked".utf8).write(to: URL(fileURLWithPath: linked))
            try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: linked)
            try Data("old".utf8).write(to: URL(fileURLWithPath: regular))
            for (target, kind) in [(fifo, "a FIFO"), (link, "a symbolic link"), ("/dev/null", "a device"), (dir, "a folder")] {
                let e = #expect(throws: StrataError.self, "\(target)") { try store.exportBriefcase(to: target) }
                #expect(e?.code == .invalidOperation && e?.message.contains(kind) == true, "\(String(describing: e))")
            }
            var st = stat()
            #expect(lstat(fifo, &st) == 0 && st.st_mode & S_IFMT == S_IFIFO)
            #expect(lstat(link, &st) == 0 && st.st_mode & S_IFMT == S_IFLNK)
            #expect(lstat("/dev/null", &st) == 0 && st.st_mode & S_IFMT == S_IFCHR)
            #expect(try String(contentsOfFile: linked, encoding: .utf8) == "linked")
            #expect(try store.exportBriefcase(to: regular).rowCount == 1)
            #expect(try store.exportBriefcase(to: dir + "/new").rowCount == 1)
        }
    }
}

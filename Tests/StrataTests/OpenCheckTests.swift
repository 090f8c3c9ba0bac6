import Foundation
import LMDB
import Strata
import Testing

/// The page check before LMDB reads a store (`StoreOptions.checkAtOpen`, `Store.check(at:)`) and
/// the crash-loop guard (`strata-open.marker`): a damaged store is `corruptStore`, never a crash.
@Suite struct OpenCheckTests {
    /// Damage that crashes LMDB at the first write or read (issue 36): the newer meta page's
    /// free-list root set to 0 (`Assertion 'root > 1'`), a leaf's `mp_upper` past its page (SIGSEGV).
    enum Damage: String, CaseIterable, CustomStringConvertible {
        case freeListRootZero, leafUpperBound
        var description: String { rawValue }
    }

    static let markerName = "strata-open.marker"

    /// A closed store in `path`: a table of `rows` rows, each acknowledged and some edited.
    static func makeStore(_ path: String, rows: Int = 40) throws {
        var options = StoreOptions()
        options.durability = .noSync
        let store = try Store(path: path, options: options)
        try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title")]))
        try store.write { tx in
            for i in 1...rows { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("task \(i) " + String(repeating: "x", count: i % 90))]) }
        }
        try store.write { tx in for i in stride(from: 1, through: rows, by: 2) { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) } }
        try store.flush()
        store.close()
    }

    static func bytes(_ path: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb"))) }
    static func write(_ bytes: [UInt8], _ path: String) throws { try Data(bytes).write(to: URL(fileURLWithPath: path + "/data.mdb")) }
    static func set16(_ b: inout [UInt8], _ i: Int, _ v: Int) { b[i] = UInt8(v & 0xFF); b[i + 1] = UInt8(v >> 8 & 0xFF) }
    static func u16(_ b: [UInt8], _ i: Int) -> Int { Int(b[i]) | Int(b[i + 1]) << 8 }

    /// Applies `damage` to the closed store in `path`.
    static func damage(_ path: String, _ damage: Damage) throws {
        var b = try bytes(path)
        let report = try PageValidator.validate(path: path)
        let used = try #require(report.usedMeta)
        switch damage {
        case .freeListRootZero:
            // MDB_meta after the 16-byte page header: magic, version, address, map size, then the
            // free list's record (48 bytes, its root last).
            for k in 0..<8 { b[used * 4096 + 80 + k] = 0 }
        case .leafUpperBound:
            let leaf = try #require(report.databases.first { $0.name == "meta" }?.root)
            set16(&b, Int(leaf) * 4096 + 14, 5000)
        }
        try write(b, path)
    }

    /// The number of a leaf of `database` that neither its first nor its last leaf is on, nor any
    /// page on the way to them: what a quick check does not read.
    static func middleLeaf(_ path: String, _ database: String) throws -> Int {
        let b = try bytes(path)
        let report = try PageValidator.validate(path: path)
        var page = Int(try #require(report.databases.first { $0.name == database }?.root))
        var depth = 0
        // A branch page (flag 0x01): go down its middle child.
        while u16(b, page * 4096 + 10) & 0x01 != 0 {
            let count = (u16(b, page * 4096 + 12) - 16) / 2
            try #require(count >= 3)
            let node = page * 4096 + u16(b, page * 4096 + 16 + 2 * (count / 2))
            page = u16(b, node) | u16(b, node + 2) << 16 | u16(b, node + 4) << 32
            depth += 1
        }
        try #require(depth >= 1)
        return page
    }

    @Test(arguments: OpenCheck.allCases)
    func aCleanStoreOpensWithEachCheck(_ check: OpenCheck) throws {
        try withTemporaryFolder { path in
            try Self.makeStore(path)
            var options = StoreOptions()
            options.checkAtOpen = check
            let store = try Store(path: path, options: options)
            #expect(try store.read { try $0.count("tasks") } == 40)
            #expect(store.options.checkAtOpen == check)
            store.close()
            #expect(try Store.check(at: path).isClean)
            #expect(try Store.check(at: path, options: .quick).isClean)
        }
    }

    /// A newer meta page whose last page number is 2^60 (issue 36): the check refuses it, and
    /// without the check the open still ends in an error or a working store, never a trap (the
    /// used size it implies saturates instead of overflowing).
    @Test(arguments: [OpenCheck.none, .quick])
    func aLastPageOf2To60IsNeverATrap(_ check: OpenCheck) throws {
        try withTemporaryFolder { path in
            try Self.makeStore(path)
            var b = try Self.bytes(path)
            let used = try #require(try PageValidator.validate(path: path).usedMeta)
            // MDB_meta after the 16-byte page header: magic, version, address, map size, the two
            // database records (48 bytes each), then the last page number.
            let lastPage = UInt64(1) << 60
            for k in 0..<8 { b[used * 4096 + 136 + k] = UInt8(lastPage >> (8 * UInt64(k)) & 0xFF) }
            try Self.write(b, path)
            var options = StoreOptions()
            options.checkAtOpen = check
            do {
                let store = try Store(path: path, options: options)
                _ = try? store.read { try $0.count("tasks") }
                store.close()
                #expect(check == .none, "the quick check let a last page of 2^60 through")
            } catch {
                if check == .quick { #expect((error as? StrataError)?.code == .corruptStore, "\(error)") }
            }
        }
    }

    @Test(arguments: Damage.allCases, [OpenCheck.quick, .full])
    func aDamagedStoreIsCorruptStoreAndNeverReachesLMDB(_ damage: Damage, _ check: OpenCheck) throws {
        try withTemporaryFolder { path in
            try Self.makeStore(path)
            try Self.damage(path, damage)
            let before = try FileManager.default.contentsOfDirectory(atPath: path).sorted()
            var options = StoreOptions()
            options.checkAtOpen = check
            let e = #expect(throws: StrataError.self) { try Store(path: path, options: options) }
            #expect(e?.code == .corruptStore, "\(String(describing: e))")
            #expect(e?.message.contains("salvage") == true && e?.message.contains(path) == true, "\(String(describing: e))")
            // Nothing was created: not the marker, not LMDB's lock file.
            #expect(try FileManager.default.contentsOfDirectory(atPath: path).sorted() == before)

            let report = try Store.check(at: path)
            #expect(report.isDamaged && !report.isClean && report.error?.code == .corruptStore, "\(report)")
            #expect(!report.findings.isEmpty)
            #expect(try Store.check(at: path, options: .quick).isDamaged)
            // What the message points to: salvage recovers the log.
            let salvaged = path + "-salvaged"
            defer { try? FileManager.default.removeItem(atPath: salvaged) }
            let recovered = try Store.salvage(from: path, into: salvaged)
            #expect(recovered.recoveredOperations > 0)
            let store = try Store(path: salvaged, options: options)
            #expect(try store.read { try $0.count("tasks") } > 0)
            store.close()
        }
    }

    @Test func theMarkerIsWrittenAtOpenAndRemovedAtACleanClose() throws {
        try withTemporaryFolder { path in
            let marker = path + "/" + Self.markerName
            let store = try Store(path: path)
            #expect(FileManager.default.fileExists(atPath: marker))
            // A second Store of this process shares the open: the marker stays until the last closes.
            let second = try Store(path: path)
            store.close()
            #expect(FileManager.default.fileExists(atPath: marker))
            second.close()
            #expect(!FileManager.default.fileExists(atPath: marker))
        }
    }

    /// Damage off the quick check's path is not seen by a quick open; after an unclean close
    /// (the marker left, as a crash or a kill leaves it) the next open runs the full check.
    @Test func aMarkerLeftByAnUncleanCloseMakesTheNextOpenRunTheFullCheck() throws {
        try withTemporaryFolder { path in
            try Self.makeStore(path, rows: 3000)
            var b = try Self.bytes(path)
            let leaf = try Self.middleLeaf(path, "log")
            Self.set16(&b, leaf * 4096 + 14, 5000)
            try Self.write(b, path)
            #expect(try Store.check(at: path, options: .quick).isClean)
            #expect(try Store.check(at: path).isDamaged)

            var quick = StoreOptions()
            quick.checkAtOpen = .quick
            try Store(path: path, options: quick).close()  // reads no page of the log's middle
            let marker = path + "/" + Self.markerName
            #expect(!FileManager.default.fileExists(atPath: marker))

            #expect(FileManager.default.createFile(atPath: marker, contents: Data()))
            let e = #expect(throws: StrataError.self) { try Store(path: path, options: quick) }
            #expect(e?.code == .corruptStore && e?.message.contains("in log page \(leaf)") == true, "\(String(describing: e))")
            // The marker stays: every open runs the full check until the store is salvaged.
            #expect(FileManager.default.fileExists(atPath: marker))
            #expect(throws: StrataError.self) { try Store(path: path, options: quick) }

            // `.none` checks nothing, marker or not.
            var none = StoreOptions()
            none.checkAtOpen = .none
            try Store(path: path, options: none).close()
        }
    }

    @Test func aNewStoreAndAMissingOneAreNotChecked() throws {
        try withTemporaryFolder { path in
            var full = StoreOptions()
            full.checkAtOpen = .full
            let store = try Store(path: path + "/new", options: full)
            try store.createTable(.fixed("t", fields: [.int("id")]))
            store.close()
            #expect(try Store.check(at: path + "/new").isClean)
            let e = #expect(throws: StrataError.self) { try Store.check(at: path + "/missing") }
            #expect(e?.code == .io)
        }
    }

    /// A check while another writer commits: findings are damage only when the file was quiet.
    @Test func aCheckDuringWritesReportsNoDamage() throws {
        try withStore { store, path in
            try store.createTable(.fixed("t", fields: [.int("id"), .string("s")]))
            let stop = StopFlag()
            let writer = Thread {
                var i: Int64 = 0
                while !stop.isSet {
                    try? store.write { tx in
                        for _ in 0..<50 {
                            i += 1
                            try tx.insert("t", ["id": .int(i), "s": .string(String(repeating: "s", count: Int(i % 300)))])
                        }
                    }
                }
            }
            writer.start()
            defer { stop.set() }
            for _ in 0..<30 {
                let report = try Store.check(at: path)
                #expect(!report.isDamaged, "\(report)")
            }
            stop.set()
            while !writer.isFinished { usleep(1000) }
        }
    }
}

/// A flag one thread sets and another polls.
private final class StopFlag: @unchecked Sendable {
    // @unchecked: `flag` is only touched with `lock` held.
    private let lock = NSLock()
    private var flag = false
    func set() { lock.withLock { flag = true } }
    var isSet: Bool { lock.withLock { flag } }
}

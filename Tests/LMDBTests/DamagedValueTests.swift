import Foundation
import LMDB
import Testing

/// Values that a damaged file makes reach past its end are refused, not read (a SIGBUS before).
@Suite struct DamagedValueTests {
    /// A store whose one large value's overflow pages are the last pages of the file; `body`
    /// gets its folder and database name.
    private func withBigValue(_ body: (String, [UInt8]) throws -> Void) throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("lmdb-damaged-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let big = (0..<40_000).map { UInt8(truncatingIfNeeded: $0) }
        do {
            let env = try Environment(path: path)
            let db = try env.openDatabase("items")
            try env.write { txn in try txn.put([1], [7], in: db) }
            // A transaction of its own, so its overflow pages come after every other page.
            try env.write { txn in try txn.put([2], big, in: db) }
        }
        try body(path, big)
    }

    @Test func aValueCutOffByATruncatedFileIsAnErrorNamingTheDatabase() throws {
        try withBigValue { path, big in
            let file = path + "/data.mdb"
            let size = try #require(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int)
            // 40,000 bytes span ten pages; drop the last two of them.
            #expect(truncate(file, off_t(size - 2 * 4096)) == 0)
            let env = try Environment(path: path)
            let db = try env.openDatabase("items", create: false)
            try env.read { txn in
                #expect(try txn.get([1], in: db).map(Array.init) == [7])
                do {
                    _ = try txn.get([2], in: db)
                    Issue.record("a value reaching past the end of the file was lent")
                } catch let error as LMDBError {
                    #expect(error.resultCode == .valueOutsideFile)
                    #expect(error.database == "items")
                    #expect(error.description.contains("outside the data file"))
                }
                // A cursor step onto the same entry is refused the same way.
                try txn.withCursor(db) { (c: inout Cursor) throws in
                    #expect(try c.first()?.value.count == 1)
                    var cursor = c
                    #expect(throws: LMDBError.self) { try cursor.next() }
                }
            }
            _ = big
        }
    }

    @Test func intactValuesPassTheCheckBeforeAndAfterTheMapMoves() throws {
        try withBigValue { path, big in
            var options = EnvironmentOptions()
            options.mapSize = 1 << 20
            options.syncMode = .noSync
            let env = try Environment(path: path, options: options)
            let db = try env.openDatabase("items", create: false)
            #expect(try env.read { try $0.get([2], in: db).map(Array.init) } == big)
            // Growing the map remaps the file; values read afterwards must still be admitted,
            // in read transactions and in the write transaction (its dirty pages are on the heap).
            for i in 0..<200 as Range<UInt64> {
                try env.write { txn in
                    try txn.put(withUnsafeBytes(of: (i + 10).bigEndian) { Array($0) }, big, in: db)
                    #expect(try txn.get(withUnsafeBytes(of: (i + 10).bigEndian) { Array($0) }, in: db).map(Array.init) == big)
                }
            }
            #expect(env.mapSize > 1 << 20)
            try env.read { txn in
                #expect(try txn.get([2], in: db).map(Array.init) == big)
                var n = 0
                try txn.withCursor(db) { (c: inout Cursor) throws in
                    var e = try c.first()
                    while e != nil { n += 1; e = try c.next() }
                }
                #expect(n == 202)
            }
        }
    }
}

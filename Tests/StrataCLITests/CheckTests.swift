import Foundation
import LMDB
import Strata
import Testing

/// Overwrites, in a copy of `store`, the page holding the first entry of `database` with
/// `byte`; returns the copy's folder and the page number.
func damagedCopy(of store: Store, database: String, fill byte: UInt8) throws -> (path: String, page: Int) {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("strata-damaged-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    try store.copy(to: dir, compact: false)
    let page: Int = try {
        let env = try Environment(path: dir)
        let db = try env.openDatabase(database, create: false)
        return try env.read { txn in
            try txn.withCursor(db) { c in
                let first = try #require(try c.first())
                return try #require(env.page(of: first.key.baseAddress!))
            }
        }
    }()
    let handle = try #require(FileHandle(forWritingAtPath: dir + "/data.mdb"))
    try handle.seek(toOffset: UInt64(page * 4096))
    try handle.write(contentsOf: Data(repeating: byte, count: 4096))
    try handle.close()
    return (dir, page)
}

@Suite struct CheckTests {
    @Test func aCleanStoreChecksClean() throws {
        try withPreparedStore { path, _ in
            let r = try runStrata(["check", path, "--json"])
            #expect(r.status == 0, "\(r.err)")
            let report = try #require(try json(r.out) as? [String: Any])
            let dbs = try #require(report["databases"] as? [[String: Any]])
            #expect(Set(dbs.compactMap { $0["name"] as? String }).isSuperset(of: ["log", "rows", "pending", "meta"]))
            #expect(dbs.allSatisfy { $0["status"] as? String == "ok" })
        }
    }

    @Test func aPageThatCrashesLMDBIsContainedAndNamed() throws {
        try withPreparedStore { _, store in
            // A leaf page full of 0xFF makes LMDB read far past the file: SIGBUS inside liblmdb.
            let (dir, page) = try damagedCopy(of: store, database: "rows", fill: 0xFF)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let r = try runStrata(["check", dir, "--json"])
            #expect(r.status == 3, "\(r.out) \(r.err)")
            let dbs = try #require((try json(r.out) as? [String: Any])?["databases"] as? [[String: Any]])
            let rows = try #require(dbs.first { $0["name"] as? String == "rows" })
            #expect(rows["status"] as? String == "crashed")
            #expect((rows["message"] as? String)?.contains("crashed inside LMDB") == true)
            // The walk went on after the crash: the log and meta were still read.
            #expect(dbs.first { $0["name"] as? String == "log" }?["status"] as? String == "ok")
            #expect(dbs.first { $0["name"] as? String == "meta" }?["status"] as? String == "ok")
            let text = try runStrata(["check", dir])
            #expect(text.status == 3 && text.out.contains("database rows") && text.out.contains("strata salvage"), "\(text.out)")
            // verify runs the same walk first, and does not crash either.
            let v = try runStrata(["verify", dir])
            #expect(v.status == 3 && v.out.contains("database rows"), "page \(page): \(v.out) \(v.err)")
        }
    }

    @Test func aZeroedPageIsReportedByDatabase() throws {
        try withPreparedStore { _, store in
            let (dir, _) = try damagedCopy(of: store, database: "log", fill: 0)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let r = try runStrata(["check", dir])
            #expect(r.status == 1 && r.out.contains("database log") && r.out.contains("MDB_CORRUPTED"), "\(r.out) \(r.err)")
            #expect(try runStrata(["verify", dir]).status == 1)
            #expect(try runStrata(["check", dir + "-nothing"]).status == 2)
        }
    }
}

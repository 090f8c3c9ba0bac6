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
            #expect(report["clean"] as? Bool == true && report["scope"] as? String == "full")
            let dbs = try #require(report["databases"] as? [[String: Any]])
            #expect(Set(dbs.compactMap { $0["name"] as? String }).isSuperset(of: ["log", "rows", "pending", "meta"]))
            #expect(dbs.allSatisfy { $0["status"] as? String == "ok" })
            let quick = try runStrata(["check", path, "--quick"])
            #expect(quick.status == 0 && quick.out.contains("quick check") && quick.out.contains("clean"), "\(quick.out)")
        }
    }

    /// A leaf page full of 0xFF made LMDB read far past the file (SIGBUS inside liblmdb); the
    /// check, in this process and without LMDB, names the page and exits 3.
    @Test func aPageThatCrashesLMDBIsNamedWithoutAChildProcess() throws {
        try withPreparedStore { _, store in
            let (dir, page) = try damagedCopy(of: store, database: "rows", fill: 0xFF)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let r = try runStrata(["check", dir, "--json"])
            #expect(r.status == 3, "\(r.out) \(r.err)")
            let report = try #require(try json(r.out) as? [String: Any])
            #expect(report["damaged"] as? Bool == true)
            let findings = try #require(report["findings"] as? [[String: Any]])
            #expect(findings.contains { $0["database"] as? String == "rows" && $0["page"] as? Int == page }, "\(findings)")
            let dbs = try #require(report["databases"] as? [[String: Any]])
            #expect(dbs.first { $0["name"] as? String == "log" }?["status"] as? String == "ok")
            let text = try runStrata(["check", dir])
            #expect(text.status == 3 && text.out.contains("in rows page \(page)") && text.out.contains("strata salvage"), "\(text.out)")
            // verify runs the same check first.
            let v = try runStrata(["verify", dir])
            #expect(v.status == 3 && v.out.contains("in rows page \(page)"), "\(v.out) \(v.err)")
        }
    }

    @Test func aZeroedPageIsReportedByDatabase() throws {
        try withPreparedStore { _, store in
            let (dir, page) = try damagedCopy(of: store, database: "log", fill: 0)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let r = try runStrata(["check", dir])
            #expect(r.status == 3 && r.out.contains("in log page \(page)"), "\(r.out) \(r.err)")
            #expect(try runStrata(["verify", dir]).status == 3)
            #expect(try runStrata(["check", dir + "-nothing"]).status == 2)
        }
    }

    /// `--timeout 0` once reported a healthy store as crash damage; now it is refused, and a
    /// check that runs out of time says so with exit 2, not 3.
    @Test func aTimeoutOfZeroIsRefused() throws {
        try withPreparedStore { path, _ in
            let r = try runStrata(["check", path, "--timeout", "0"])
            #expect(r.status == 64 && r.err.contains("--timeout"), "\(r.status) \(r.err)")
            #expect(try runStrata(["check", path, "--timeout", "0.001"]).status != 3)
        }
    }
}

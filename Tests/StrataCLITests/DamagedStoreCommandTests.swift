import Foundation
import LMDB
import Strata
import Testing

/// Every command that opens a store checks all its pages first: on the damage that crashed them
/// inside LMDB (issue 36), each exits 3 with the damage and the salvage command; `--no-check`
/// skips the check.
@Suite struct DamagedStoreCommandTests {
    /// A copy of the prepared store whose newer meta page says the free list's root is page 0:
    /// `check` and `verify` called it clean, and then `compact` and `rebuild` died of LMDB's
    /// `Assertion 'root > 1'`.
    static func freeListRootZeroed(_ store: Store) throws -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("strata-damaged-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try store.copy(to: dir, compact: false)
        let used = try #require(try PageValidator.validate(path: dir).usedMeta)
        let handle = try #require(FileHandle(forWritingAtPath: dir + "/data.mdb"))
        // MDB_meta after the 16-byte page header: magic, version, address, map size, then the
        // free list's record (48 bytes, its root last).
        try handle.seek(toOffset: UInt64(used * 4096 + 80))
        try handle.write(contentsOf: Data(count: 8))
        try handle.close()
        return dir
    }

    @Test func everyCommandThatOpensADamagedStoreExitsThreeWithTheSalvageCommand() throws {
        try withPreparedStore { path, store in
            let dir = try Self.freeListRootZeroed(store)
            let out = dir + "-out"
            defer { for p in [dir, out + "-copy", out + "-replay", out + ".briefcase"] { try? FileManager.default.removeItem(atPath: p) } }
            let delta = dir + "-delta.json"
            defer { try? FileManager.default.removeItem(atPath: delta) }
            try Data(#"{"anchor":"a2","tables":[]}"#.utf8).write(to: URL(fileURLWithPath: delta))
            let commands: [[String]] = [
                ["info", dir], ["show", dir, "tasks"], ["log", dir], ["history", dir, "tasks", "1"], ["pending", dir],
                ["conflicts", dir], ["export", dir, out + ".briefcase"], ["copy", dir, out + "-copy"], ["compact", dir],
                ["rebuild", dir], ["replay", dir, out + "-replay"], ["merge", dir, delta], ["verify", dir], ["check", dir],
            ]
            for arguments in commands {
                let r = try runProcess(try strataExecutable(), arguments)
                let said = r.err + r.out
                #expect(r.signal == nil, "strata \(arguments[0]) died of signal \(r.signal ?? 0)")
                #expect(r.status == 3, "strata \(arguments[0]): status \(r.status), \(said.prefix(300))")
                #expect(said.contains("damaged") && said.contains("free list's root is page 0") && said.contains("strata salvage '\(dir)'"),
                        "strata \(arguments[0]): \(said.prefix(400))")
            }
            #expect(!FileManager.default.fileExists(atPath: out + "-copy/data.mdb") && !FileManager.default.fileExists(atPath: out + ".briefcase"))
            // The command the message gives recovers the store.
            let salvaged = try runStrata(["salvage", dir, out + "-replay"])
            #expect(salvaged.status == 0, "\(salvaged.err)")
            #expect(try runStrata(["info", out + "-replay"]).status == 0)
            _ = path
        }
    }

    /// `--no-check` opens the damaged store without the check: a read that never touches the
    /// free list works, as it did before the check existed.
    @Test func noCheckSkipsTheCheck() throws {
        try withPreparedStore { _, store in
            let dir = try Self.freeListRootZeroed(store)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let r = try runStrataWatchingSignals(["show", dir, "tasks", "--no-check"])
            #expect(r.signal == nil && r.status == 0, "\(r.status) \(r.err.prefix(300))")
            #expect(try runStrata(["show", dir, "tasks"]).status == 3)
        }
    }
}

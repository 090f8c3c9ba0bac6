import Foundation
import Strata
import Testing

/// `strata create` and `strata sync` without a server: creation from a tables file, and the
/// errors a user sees.
@Suite struct SyncCommandTests {
    static let tablesFile = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Server/Examples/tables.json").path

    @Test func createMakesAStoreWithTheServersTablesAndPrintsItsClientID() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-create-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let r = try runStrata(["create", path, "--tables", Self.tablesFile])
        #expect(r.status == 0, "\(r.err)")
        let info = try runStrata(["info", path, "--json"])
        #expect(info.out.contains(r.out.trimmingCharacters(in: .whitespacesAndNewlines)))
        for table in ["tasks", "comments", "settings"] { #expect(info.out.contains("\"\(table)\"")) }
        // Never over an existing store.
        let again = try runStrata(["create", path, "--tables", Self.tablesFile])
        #expect(again.status == 2 && again.err.contains("already exists"))
    }

    /// The tables file's associations go with the store: a new comment uploads after its new
    /// task (alphabetically it would go first, and the server would set it aside as an orphan).
    /// `pending` lists the upload in the order `sync` sends it, from the same stored associations.
    @Test func createKeepsTheAssociationsSoUploadsGoParentsFirst() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-create-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        #expect(try runStrata(["create", path, "--tables", Self.tablesFile]).status == 0)
        do {
            let store = try Store(path: path)
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "new task"])
                try tx.insert("comments", ["id": -1, "task": 1, "text": "on the new task"])
            }
        }
        let pending = try runStrata(["pending", path, "--json"])
        #expect(pending.status == 0, "\(pending.err)")
        let tables = try #require(try JSONSerialization.jsonObject(with: Data(pending.out.utf8)) as? [[String: Any]]).map { $0["table"] as? String }
        #expect(tables == ["tasks", "comments"])
    }

    /// A create that fails leaves no folder behind, neither the store's nor a hidden one, and
    /// can be run again once the tables file is fixed.
    @Test func aFailedCreateLeavesNothingBehind() throws {
        let parent = FileManager.default.temporaryDirectory.appendingPathComponent("strata-create-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: parent, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: parent) }
        let path = parent.appendingPathComponent("phone").path
        // The second table's key names a field it does not have: the tables file is refused,
        // with what is wrong in it.
        let bad = parent.appendingPathComponent("bad.json").path
        try Data("""
            {"tables": [{"name": "tasks", "primaryKey": ["id"], "fields": [{"name": "id", "type": "int"}]},
                        {"name": "notes", "primaryKey": ["nope"], "fields": [{"name": "id", "type": "int"}]}]}
            """.utf8).write(to: URL(fileURLWithPath: bad))
        let failed = try runStrata(["create", path, "--tables", bad])
        #expect(failed.status == 2, "\(failed.out) \(failed.err)")
        #expect(failed.err.contains("table 'notes': key field 'nope' is not among its fields"), "\(failed.err)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: parent.path) == ["bad.json"])
        let again = try runStrata(["create", path, "--tables", Self.tablesFile])
        #expect(again.status == 0, "\(again.err)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: parent.path).sorted() == ["bad.json", "phone"])
    }

    @Test func syncRefusesBadArguments() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-sync-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        #expect(try runStrata(["create", path, "--tables", Self.tablesFile]).status == 0)
        let badURL = try runStrata(["sync", path, "--server", "not a url", "--token", "t"])
        #expect(badURL.status == 64 && badURL.err.contains("--server"))
        // (An unreachable server is tested in Server/, against the real transport: these tests
        // also run under the sanitizers, which would report Foundation's networking internals.)
        let badTimeout = try runStrata(["sync", path, "--server", "http://127.0.0.1:9", "--token", "t", "--timeout", "0"])
        #expect(badTimeout.status == 64 && badTimeout.err.contains("--timeout"))
    }
}

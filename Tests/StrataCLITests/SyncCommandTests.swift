import Foundation
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

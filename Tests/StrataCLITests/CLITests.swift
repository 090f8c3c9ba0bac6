import Foundation
import Strata
import Testing

/// The `strata` executable next to the test bundle in the build folder.
func strataExecutable() throws -> URL {
    var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    // On macOS the test binary sits inside an .xctest bundle.
    while dir.pathExtension == "xctest" || dir.lastPathComponent == "MacOS" || dir.lastPathComponent == "Contents" {
        dir.deleteLastPathComponent()
    }
    let url = dir.appendingPathComponent("strata")
    guard FileManager.default.isExecutableFile(atPath: url.path) else {
        throw CocoaError(.fileNoSuchFile, userInfo: [NSFilePathErrorKey: url.path])
    }
    return url
}

/// Runs `strata` with `arguments`; returns exit status, standard output and standard error.
func runStrata(_ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
    let r = try runProcess(try strataExecutable(), arguments)
    return (r.status, r.out, r.err)
}

@Suite struct CLITests {
    @Test func demoRunsToCompletionAndTellsTheStory() throws {
        let r = try runStrata(["demo"])
        #expect(r.status == 0, "\(r.err)")
        for expected in [
            "Buy oat milk", "original \"Buy milk\"", "still changed: done", "[deleted]",
            "conflict: tasks 2 field notes → deferred", "unresolved: tasks 2",
            "will upload notes \"due Monday\" replacing the server's \"due Tuesday\"",
            "update tasks 2: notes = \"due Monday\"; notes was \"due Tuesday\"", "delete tasks 3",
            "acknowledged 2 rows; pending now: 0",
            "History of task 1", "revert field", "server change [server] (delta v2)",
            "as of LSN 14, just before the server's delta", "tasks 3 [deleted]",
            "consistent:", "views equal the log's fold", "Done.",
        ] {
            #expect(r.out.contains(expected), "demo output lacks \(expected)")
        }
    }

    @Test func demoKeepsItsStoreWhenAsked() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-cli-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let r = try runStrata(["demo", "--path", path, "--keep"])
        #expect(r.status == 0)
        #expect(FileManager.default.fileExists(atPath: path + "/data.mdb"))
        // A second run refuses the non-empty folder with a one-line error and a non-zero status.
        let again = try runStrata(["demo", "--path", path])
        #expect(again.status != 0)
        #expect(again.err.contains("already holds a store"))
    }

    @Test func versionAndHelp() throws {
        #expect(try runStrata(["--version"]).out.trimmingCharacters(in: .whitespacesAndNewlines) == Store.libraryVersion)
        let help = try runStrata(["demo", "--help"])
        #expect(help.status == 0 && help.out.contains("strata demo --path"))
    }
}

/// CHANGELOG.md, the library's version constant and `strata --version` name the same release.
@Suite struct VersionTests {
    /// The CHANGELOG's newest release: its version (the first `## ` heading) and the store format
    /// its entry names.
    private func latestRelease() throws -> (version: String, storeFormat: String) {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOf: root.appendingPathComponent("CHANGELOG.md"), encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let heading = try #require(lines.firstIndex { $0.hasPrefix("## ") }, "CHANGELOG.md has no release heading")
        // "## 0.1.0 (unreleased)" → "0.1.0"
        let version = String(lines[heading].dropFirst(3).prefix { $0 != " " })
        let entry = lines[(heading + 1)...].prefix { !$0.hasPrefix("## ") }
        let format = try #require(entry.first { $0.hasPrefix("- Store format: ") }, "the entry for \(version) names no store format")
        return (version, String(format.dropFirst("- Store format: ".count).prefix { $0.isNumber }))
    }

    @Test func changelogStoreAndCommandAgreeOnTheVersion() throws {
        let latest = try latestRelease()
        #expect(latest.version == Store.libraryVersion)
        #expect(latest.storeFormat == String(Store.formatVersion))
        let printed = try runStrata(["--version"])
        #expect(printed.status == 0)
        #expect(printed.out.trimmingCharacters(in: .whitespacesAndNewlines) == latest.version)
    }
}

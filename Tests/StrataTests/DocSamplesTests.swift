import Foundation
import Testing

/// Every Swift sample published in the README and `docs/` says, line for line, what a test
/// compiles and runs between its `// --- sample <name> begins ---` and `ends` markers.
///
/// A sample that moves to another page moves its row here; a sample edited without its test (or
/// a test without its sample) fails with the first line that differs.
@Suite struct DocSamplesTests {
    /// Where a sample is published (the first Swift block after `heading` in `page`), and the
    /// test region that runs it.
    struct Sample: CustomStringConvertible {
        let page: String
        let heading: String
        let test: String
        let region: String
        var description: String { "\(page) (\(heading)) ↔ \(test) (\(region))" }
    }

    static let samples: [Sample] = [
        Sample(page: "README.md", heading: "## A tour", test: "Tests/StrataTests/ReadmeTests.swift", region: "tour"),
        Sample(page: "docs/getting-started.md", heading: "**The same in an app**", test: "Tests/StrataTests/ReadmeSwiftValuesTests.swift", region: "swift values"),
        Sample(page: "docs/reading.md", heading: "## The sample", test: "Tests/StrataTests/ReadmeReadingTests.swift", region: "reading"),
        Sample(page: "docs/compaction-and-formats.md", heading: "# Keeping the log bounded", test: "Tests/StrataTests/ReadmeTests.swift", region: "compaction"),
        Sample(page: "docs/live-queries.md", heading: "# Live queries", test: "Tests/StrataSyncTests/ReadmeLiveSchemaTests.swift", region: "live"),
        Sample(page: "docs/schema.md", heading: "# Schema and migrations", test: "Tests/StrataSyncTests/ReadmeLiveSchemaTests.swift", region: "schema"),
        Sample(page: "docs/sync.md", heading: "## Merging server deltas", test: "Tests/StrataSyncTests/ReadmeSyncTests.swift", region: "sync"),
        Sample(page: "docs/sync.md", heading: "## Uploading pending edits", test: "Tests/StrataSyncTests/ReadmeSyncTests.swift", region: "upload"),
        Sample(page: "docs/sync.md", heading: "### Client reset", test: "Tests/StrataSyncTests/ReadmeSyncTests.swift", region: "reset"),
    ]

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The lines of a file, trimmed; blank lines are left out, since a test's region cannot keep
    /// the blank line a page has where the region pauses.
    private func lines(_ path: String) throws -> [String] {
        try String(contentsOf: Self.root.appendingPathComponent(path), encoding: .utf8)
            .split(separator: "\n", omittingEmptySubsequences: false)
            .map { $0.trimmingCharacters(in: .whitespaces) }
    }

    /// The sample's code as published, without its `import` lines (a test file has them at its top).
    private func published(_ sample: Sample) throws -> [String] {
        let text = try lines(sample.page)
        let heading = try #require(text.firstIndex { $0.hasPrefix(sample.heading) }, "\(sample.page) has no \(sample.heading)")
        let fence = try #require(text[heading...].firstIndex(of: "```swift"), "no Swift block after \(sample.heading)")
        let end = try #require(text[(fence + 1)...].firstIndex(of: "```"), "the Swift block after \(sample.heading) does not end")
        return text[(fence + 1)..<end].filter { !$0.isEmpty && !$0.hasPrefix("import ") }
    }

    /// The region's lines, without those between its `pauses` and `resumes` markers (the test's
    /// own checks).
    private func region(_ sample: Sample) throws -> [String] {
        let text = try lines(sample.test)
        let from = try #require(text.firstIndex(of: "// --- sample \(sample.region) begins ---"), "\(sample.test) has no region \(sample.region)")
        let to = try #require(text.firstIndex(of: "// --- sample \(sample.region) ends ---"), "region \(sample.region) does not end")
        var kept: [String] = [], paused = false
        for line in text[(from + 1)..<to] {
            if line == "// --- sample \(sample.region) pauses ---" { paused = true } else if line == "// --- sample \(sample.region) resumes ---" { paused = false } else if !paused && !line.isEmpty { kept.append(line) }
        }
        return kept
    }

    @Test(arguments: samples) func sampleMatchesItsTest(_ sample: Sample) throws {
        var page = try published(sample)
        // The tour's test opens the store itself, with a temporary folder as the path.
        if sample.region == "tour", !page.isEmpty {
            page[0] = page[0].replacingOccurrences(of: "Store(path: \"/path/to/store\")   // a folder; created if missing", with: "Store(path: folder)")
        }
        let test = try region(sample)
        let i = page.indices.first { $0 >= test.count || page[$0] != test[$0] } ?? (page.count < test.count ? page.count : nil)
        #expect(i == nil, "\(sample): line \((i ?? 0) + 1) differs: page \(i.map { $0 < page.count ? page[$0] : "(ended)" } ?? "") | test \(i.map { $0 < test.count ? test[$0] : "(ended)" } ?? "")")
    }
}

import ArgumentParser
import Foundation
import Strata

/// The store a command works on.
struct StoreArgument: ParsableArguments {
    @Argument(help: "The store's folder.")
    var store: String

    /// Opens an existing store; never creates one.
    func open() throws -> Store {
        var options = StoreOptions()
        options.createIfMissing = false
        return try Store(path: store, options: options)
    }
}

/// `--json` for every read command.
struct OutputOptions: ParsableArguments {
    @Flag(help: "Print JSON instead of text, for scripts.")
    var json = false
}

/// Exit statuses scripts can rely on.
enum Exit {
    /// A ``StrataError``: bad input, a missing store, an unknown table or key, a malformed file.
    static let error: Int32 = 2
    /// `verify` found differences between the views and the log.
    static let inconsistent: Int32 = 1
    /// `check` or `verify`: reading the store crashed LMDB, in a child process that contained it.
    static let crashContained: Int32 = 3
}

/// Runs a command body; a ``StrataError`` becomes one line on standard error and exit status 2.
func reportingErrors(_ body: () throws -> Void) throws {
    do {
        try body()
    } catch let e as StrataError {
        FileHandle.standardError.write(Data("strata: \(e.message)\n".utf8))
        throw ExitCode(Exit.error)
    }
}

func printJSON(_ value: some Encodable) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

/// A row as JSON: values tagged with their type, originals of changed fields only.
struct RowJSON: Encodable {
    var table: String
    var key: [Value]
    var status: String
    var conflicted: Bool
    var lastLSN: UInt64
    var values: [String: Value]
    var originals: [String: Value]

    init(_ row: Row) {
        table = row.table
        key = row.key.values
        status = row.status.rawValue
        conflicted = row.isConflicted
        lastLSN = row.lastLSN
        values = row.values
        originals = Dictionary(uniqueKeysWithValues: row.changedFields.map { ($0, row.original($0)) })
    }
}

/// A log entry as JSON.
struct EntryJSON: Encodable {
    var lsn: UInt64
    var transaction: UInt64
    var timestamp: Double
    var origin: String
    var kind: String
    var table: String
    var key: [Value]
    var changes: [String: [String: Value]]

    init(_ e: LogEntry) {
        lsn = e.lsn
        transaction = e.transactionID
        timestamp = e.timestamp.timeIntervalSince1970
        origin = e.origin == .local ? "local" : "server"
        kind = "\(e.kind)"
        table = e.table
        key = e.key.values
        changes = Dictionary(uniqueKeysWithValues: e.changes.map { ($0.field, ["current": $0.current, "original": $0.original]) })
    }
}

/// Parses a key given on the command line: integers, `true`/`false`, or text; comma-separated
/// for a composite key.
func parseKey(_ text: String) -> RowKey {
    RowKey(text.split(separator: ",", omittingEmptySubsequences: false).map { parseValue(String($0)) })
}

/// Parses a value given on the command line: `null`, `true`/`false`, an integer, a decimal, or text.
func parseValue(_ text: String) -> Value {
    if text == "null" { return .null }
    if text == "true" { return .bool(true) }
    if text == "false" { return .bool(false) }
    if let i = Int64(text) { return .int(i) }
    if let d = Double(text), text.contains(".") { return .double(d) }
    return .string(text)
}

/// A one-line text rendering of a log entry.
func describe(_ e: LogEntry) -> String {
    let fields = e.changes.map { c in "\(c.field) = \(c.current)\(c.isChanged ? " (server: \(c.original))" : "")" }
    let when = e.timestamp.formatted(.iso8601)
    return "\(e.lsn)  \(when)  \(e.origin == .local ? "local " : "server")  \(e.kind)  \(e.table) \(e.key)\(fields.isEmpty ? "" : ": " + fields.joined(separator: ", "))"
}

/// A progress bar on standard error, drawn only when standard error is a terminal (so scripts
/// and logs never see it), at most ten times a second.
final class ProgressBar {
    private let label: String
    private let enabled = isatty(2) == 1
    private var lastDraw = ContinuousClock.now - .seconds(1)

    init(_ label: String) { self.label = label }

    func update(_ done: Int, _ total: Int) {
        guard enabled, total > 0, ContinuousClock.now - lastDraw > .milliseconds(100) || done >= total else { return }
        lastDraw = ContinuousClock.now
        let width = 30
        let filled = min(width, done * width / total)
        let bar = String(repeating: "█", count: filled) + String(repeating: "·", count: width - filled)
        FileHandle.standardError.write(Data("\r\(label) \(bar) \(done)/\(total)".utf8))
        if done >= total { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

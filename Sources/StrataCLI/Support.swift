import ArgumentParser
import Foundation
import Strata
import StrataSync
import Synchronization

/// The store a command works on.
struct StoreArgument: ParsableArguments {
    @Argument(help: "The store's folder.")
    var store: String

    @Flag(name: .customLong("no-check"), help: "Skip the check of every page of the store's file that runs before it is opened (a damaged file may then crash LMDB).")
    var noCheck = false

    /// The options every command opens its store with: never created, and every page checked
    /// before LMDB reads the file (``OpenCheck/full``; the CLI is a debugging tool, and the check
    /// costs about half a millisecond per MB), unless `--no-check`. A damaged store is then
    /// ``StrataError/Code/corruptStore``: exit 3 with the damage and the salvage command.
    var options: StoreOptions {
        var options = StoreOptions()
        options.createIfMissing = false
        options.checkAtOpen = noCheck ? .none : .full
        return options
    }

    /// Opens an existing store; never creates one. `check` replaces the page check `--no-check`
    /// chose (`verify` checks the pages itself first).
    ///
    /// An existing store of the current format opens with read transactions only, so this does
    /// not wait for an app that is writing. A store that must be written to open (one of an older
    /// format, migrated on open) waits for the writer at most ``busyTimeout`` and then fails with
    /// "the store is busy writing", rather than hang with no limit.
    func open(check: OpenCheck? = nil) throws -> Store {
        var options = self.options
        if let check { options.checkAtOpen = check }
        return try openWaitingAtMost(StoreArgument.busyTimeout) { [store, options] in try Store(path: store, options: options) }
    }

    /// How long opening waits for another writer: `STRATA_BUSY_TIMEOUT` seconds, default 10.
    static var busyTimeout: Double {
        ProcessInfo.processInfo.environment["STRATA_BUSY_TIMEOUT"].flatMap(Double.init).map { max(0, $0) } ?? 10
    }

    /// Runs `open` on another thread and waits for it at most `seconds`. When it takes longer
    /// (it waits for LMDB's writer lock, which has no timeout), the command gives up with `busy`;
    /// the waiting thread is left behind, and the process exits with the error.
    private func openWaitingAtMost(_ seconds: Double, _ open: @escaping @Sendable () throws -> Store) throws -> Store {
        let result = Locked<Result<Store, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let r = Result { try open() }
            result.withLock { $0 = r }
            done.signal()
        }
        guard done.wait(timeout: .now() + seconds) == .success, let r = result.withLock({ $0 }) else {
            throw StrataError(.busy, "the store at '\(store)' is busy writing: another process holds its write lock, and opening it needs a write (it is of an older format); waited \(seconds.formatted()) s, try again later")
        }
        return try r.get()
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
    /// The store's file is damaged (``StrataError/Code/corruptStore``): found by the page check
    /// that runs before any command opens a store (or by `check`), before LMDB read a page.
    static let damaged: Int32 = 3
}

/// Runs a command body; an error becomes one line on standard error and exit status 2 (3 for a
/// damaged store, ``StrataError/Code/corruptStore``): a ``StrataError`` by its message, a file
/// system error by its description (never a raw `NSError` dump, and never status 1, which means
/// "verify found differences").
func reportingErrors(_ body: () throws -> Void) throws {
    // Scratch stores left behind by a crashed or killed strata (or app) go first.
    Store.sweepScratchStores()
    do {
        try body()
    } catch let e as StrataError {
        FileHandle.standardError.write(Data("strata: \(e.message)\n".utf8))
        // The message names the damage and the salvage command.
        throw ExitCode(e.code == .corruptStore ? Exit.damaged : Exit.error)
    } catch let e as ExitCode {
        throw e
    } catch let e as ValidationError {
        throw e
    } catch {
        FileHandle.standardError.write(Data("strata: \(error.localizedDescription)\n".utf8))
        throw ExitCode(Exit.error)
    }
}

/// Refuses an output path inside a store's folder (at any depth, through symlinks or `..`): a
/// file written there could replace the store's own files (`export <store> <store>/data.mdb`).
func refuseInsideAStore(_ output: String, what: String) throws(StrataError) {
    var folder = URL(fileURLWithPath: output).standardizedFileURL.deletingLastPathComponent()
    while true {
        let resolved = folder.resolvingSymlinksInPath().path
        if FileManager.default.fileExists(atPath: resolved + "/data.mdb") {
            throw StrataError(.invalidOperation, "the \(what) '\(output)' is inside the store folder '\(resolved)'; write it outside any store (nothing was written)")
        }
        if folder.path == "/" || folder.path.isEmpty { return }
        folder = folder.deletingLastPathComponent()
    }
}

/// Removes what a failed command created in `folder`: the store's files, and the folder itself
/// when the command created it. Used when `import --create` or `replay` fails, so that running
/// it again does not find an empty store in the way.
func removeCreatedStore(_ folder: String, folderExisted: Bool) {
    for name in ["data.mdb", "lock.mdb", "strata.lock"] {
        try? FileManager.default.removeItem(atPath: folder + "/" + name)
    }
    if !folderExisted { try? FileManager.default.removeItem(atPath: folder) }
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
    /// A server operation's merge audit; absent for other operations.
    var audit: AuditJSON?

    struct AuditJSON: Encodable {
        var anchor: String
        var serverVersion: String?
        var conflict: String?
        var resolution: String?
        var policy: String?
        var decisions: [Decision]

        struct Decision: Encodable {
            var field: String
            var base: Value?
            var local: Value
            var server: Value
            var outcome: String
        }

        init(_ a: MergeAudit) {
            anchor = a.anchor
            serverVersion = a.serverVersion
            conflict = a.conflict.map { "\($0)" }
            resolution = a.resolution?.rawValue
            policy = a.policy?.rawValue
            decisions = a.decisions.map { Decision(field: $0.field, base: $0.base, local: $0.local, server: $0.server, outcome: "\($0.outcome)") }
        }
    }

    init(_ e: LogEntry) {
        lsn = e.lsn
        transaction = e.transactionID
        timestamp = e.timestamp.timeIntervalSince1970
        origin = e.origin == .local ? "local" : "server"
        kind = "\(e.kind)"
        table = e.table
        key = e.key.values
        changes = Dictionary(uniqueKeysWithValues: e.changes.map { ($0.field, ["current": $0.current, "original": $0.original]) })
        audit = e.origin == .server ? MergeAudit(e).map(AuditJSON.init) : nil
    }
}

/// Parses a key given on the command line: integers, `true`/`false`, or text; comma-separated
/// for a composite key.
func parseKey(_ text: String) -> RowKey {
    RowKey(text.split(separator: ",", omittingEmptySubsequences: false).map { parseValue(String($0)) })
}

/// A key as the command line takes it (`parseKey`): its values, commas between them.
func keyArgument(_ key: RowKey) -> String {
    key.values.map { v in
        switch v {
        case .string(let s): s
        case .int(let i): String(i)
        case .double(let d): String(d)
        case .bool(let b): String(b)
        case .null: "null"
        default: v.description
        }
    }.joined(separator: ",")
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

/// Prints a JSON array one element at a time, so that a listing of any length is never held in
/// memory: `[`, then each element on its own line (compact, keys sorted), then `]`.
struct JSONArrayPrinter {
    private let encoder: JSONEncoder = {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        return e
    }()
    private var count = 0

    init() { print("[", terminator: "") }

    mutating func add(_ value: some Encodable) throws {
        print(count == 0 ? "\n" : ",\n", terminator: "")
        print(String(decoding: try encoder.encode(value), as: UTF8.self), terminator: "")
        count += 1
    }

    /// Closes the array.
    func finish() { print(count == 0 ? "]" : "\n]") }
}

/// Text output shows at most this many characters of a string (or bytes of a blob).
let textValueLimit = 200

/// A value for text output: long strings and blobs are cut, with their full size, so that a
/// 100 MB value prints one line instead of hundreds of megabytes (JSON output keeps it whole).
func displayValue(_ value: Value) -> String {
    switch value {
    case .string(let s) where s.utf8.count > textValueLimit:
        return "\"\(s.prefix(textValueLimit))…\" (\(s.utf8.count) bytes)"
    case .bytes(let b) where b.count > textValueLimit / 2:
        return "0x" + b.prefix(textValueLimit / 4).map { String(format: "%02x", $0) }.joined() + "… (\(b.count) bytes)"
    default:
        return "\(value)"
    }
}

/// A one-line text rendering of a row, in `Row.description`'s form with long values cut.
func describe(_ row: Row) -> String {
    let fields = row.fieldNames.map { f in
        let current = row[f], original = row.original(f)
        return current == original || row.status == .inserted
            ? "\(f): \(displayValue(current))"
            : "\(f): \(displayValue(original)) → \(displayValue(current))"
    }
    return "\(row.table) \(row.key) [\(row.status.rawValue)\(row.isConflicted ? ", conflicted" : "")] {\(fields.joined(separator: ", "))}"
}

/// A text rendering of a log entry: one line, and under a server operation its merge audit
/// (what the server sent, what was local, and what was chosen, field by field).
func describe(_ e: LogEntry) -> String {
    let fields = e.changes.map { c in "\(c.field) = \(displayValue(c.current))\(c.isChanged ? " (server: \(displayValue(c.original)))" : "")" }
    let when = e.timestamp.formatted(.iso8601)
    let line = "\(e.lsn)  \(when)  \(e.origin == .local ? "local " : "server")  \(e.kind)  \(e.table) \(e.key)\(fields.isEmpty ? "" : ": " + fields.joined(separator: ", "))"
    guard e.origin == .server, let audit = MergeAudit(e) else { return line }
    var head = "    merged from delta \(audit.anchor)"
    if let v = audit.serverVersion { head += ", server version \(v)" }
    if let c = audit.conflict {
        head += ", conflict (\(c))"
        if let r = audit.resolution { head += " resolved \(r.rawValue)" }
        if let p = audit.policy { head += " by policy \(p.rawValue)" }
    }
    let decisions = audit.decisions.map { d in
        "      \(d.field): base \(d.base.map(displayValue) ?? "none"), local \(displayValue(d.local)), server \(displayValue(d.server)) → \(d.outcome)"
    }
    return ([line, head] + decisions).joined(separator: "\n")
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

import ArgumentParser
import Foundation
import Strata
import StrataSync

struct InfoCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "info",
        abstract: "Show a store's tables, counts, log length, pending rows, conflicts, anchor and size.",
        discussion: "Example:\n  strata info ~/Library/todo-store --json"
    )
    @OptionGroup var target: StoreArgument
    @OptionGroup var output: OutputOptions

    struct Info: Encodable {
        struct Table: Encodable { var name: String; var mode: String; var primaryKey: [String]; var fields: [String]; var rows: Int; var pending: Int }
        var path: String
        var clientID: String
        var formatVersion: UInt64
        var logLength: UInt64
        /// Operations up to this LSN were folded into the base snapshot by compaction.
        var horizon: UInt64
        var tables: [Table]
        var pendingRows: Int
        var conflicts: Int
        var anchor: String?
        var sizeBytes: Int
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            let info = try store.read { snap in
                let pending = try snap.pendingRows()
                return Info(
                    path: store.path, clientID: store.clientID, formatVersion: Store.formatVersion, logLength: try snap.lastLSN, horizon: try snap.horizon,
                    tables: try snap.tables.map { t in
                        Info.Table(
                            name: t.name, mode: t.mode.rawValue, primaryKey: t.primaryKey,
                            fields: try snap.fieldNames(t.name), rows: try snap.count(t.name),
                            pending: pending.filter { $0.table == t.name }.count
                        )
                    },
                    pendingRows: pending.count, conflicts: pending.filter(\.isConflicted).count,
                    anchor: try snap.property(SyncClient.anchorProperty)?.stringValue, sizeBytes: store.sizeInBytes
                )
            }
            if output.json { return try printJSON(info) }
            print("store      \(info.path)")
            print("client     \(info.clientID)")
            print("log        \(info.logLength) operations" + (info.horizon > 0 ? " (compacted through LSN \(info.horizon))" : ""))
            print("pending    \(info.pendingRows) rows (\(info.conflicts) conflicted)")
            print("anchor     \(info.anchor ?? "none")")
            print("size       \(info.sizeBytes / 1024) KiB")
            for t in info.tables {
                print("table      \(t.name) (\(t.mode), key \(t.primaryKey.joined(separator: ", "))): \(t.rows) rows, \(t.pending) pending; fields \(t.fields.joined(separator: ", "))")
            }
        }
    }
}

struct ShowCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "show",
        abstract: "List a table's rows, with their original values and pending state.",
        discussion: """
            Examples:
              strata show store tasks --where done=false --sort priority --limit 10
              strata show store tasks --as-of 1200 --json
            """
    )
    @OptionGroup var target: StoreArgument
    @Argument(help: "The table.") var table: String
    @Option(name: .customLong("where"), help: "Only rows whose field equals the value (field=value); repeatable.") var filters: [String] = []
    @Option(help: "Sort by this field (ascending); rows are otherwise in key order.") var sort: String?
    @Option(help: "Show at most this many rows.") var limit: Int?
    @Option(name: .customLong("as-of"), help: "Show the table as it was right after this LSN.") var asOf: UInt64?
    @Flag(help: "Include rows deleted locally and not yet uploaded.") var includeDeleted = false
    @OptionGroup var output: OutputOptions

    func validate() throws {
        if let limit, limit < 0 { throw ValidationError("--limit cannot be negative") }
        for f in filters where !f.contains("=") { throw ValidationError("--where takes field=value, not '\(f)'") }
        if asOf == 0 { throw ValidationError("--as-of takes an LSN from 1") }
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            var rows: [Row]
            if let asOf {
                let last = try store.read { try $0.lastLSN }
                guard asOf <= last else { throw StrataError(.invalidOperation, "LSN \(asOf) is past the end of the log (\(last))") }
                let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("strata-asof-\(UUID().uuidString)").path
                defer { try? FileManager.default.removeItem(atPath: scratch) }
                let past = try store.replay(into: scratch, through: asOf)
                rows = try past.read { try $0.rows(table, includingDeleted: includeDeleted) }
            } else {
                rows = try store.read { try $0.rows(table, includingDeleted: includeDeleted) }
            }
            for f in filters {
                let parts = f.split(separator: "=", maxSplits: 1).map(String.init)
                let wanted = parseValue(parts.count > 1 ? parts[1] : "")
                rows = rows.filter { $0[parts[0]] == wanted || ($0[parts[0]].doubleValue != nil && $0[parts[0]].doubleValue == wanted.doubleValue) }
            }
            if let sort {
                rows.sort { a, b in Self.precedes(a[sort], b[sort]) }
            }
            if let limit { rows = Array(rows.prefix(limit)) }
            if output.json { return try printJSON(rows.map(RowJSON.init)) }
            for row in rows { print(row) }
            if rows.isEmpty { print("(no rows)") }
        }
    }

    static func precedes(_ a: Value, _ b: Value) -> Bool {
        switch (a, b) {
        case (.null, .null): false
        case (.null, _): true
        case (_, .null): false
        case (.string(let x), .string(let y)): x < y
        case (.bool(let x), .bool(let y)): !x && y
        case (.timestamp(let x), .timestamp(let y)): x < y
        default: (a.doubleValue ?? 0) < (b.doubleValue ?? 0)
        }
    }
}

struct LogCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "log",
        abstract: "List operations of the log, oldest first.",
        discussion: "Example:\n  strata log store --table tasks --from 100 --to 200\n  strata log store --table tasks --key 7 --json"
    )
    @OptionGroup var target: StoreArgument
    @Option(help: "Only operations on this table.") var table: String?
    @Option(help: "Only operations on this row (needs --table; commas separate a composite key).") var key: String?
    @Option(help: "From this LSN.") var from: UInt64 = 1
    @Option(help: "Up to this LSN.") var to: UInt64 = .max
    @Option(help: "Only operations at or after this time (ISO 8601).") var since: String?
    @Option(help: "Only operations at or before this time (ISO 8601).") var until: String?
    @OptionGroup var output: OutputOptions

    func validate() throws {
        if key != nil && table == nil { throw ValidationError("--key needs --table") }
        if from > to { throw ValidationError("--from \(from) is after --to \(to)") }
        for t in [since, until].compactMap({ $0 }) where (try? Date(t, strategy: .iso8601)) == nil {
            throw ValidationError("'\(t)' is not an ISO 8601 time (like 2026-11-21T06:00:00Z)")
        }
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            let start = try since.map { try Date($0, strategy: .iso8601) }
            let end = try until.map { try Date($0, strategy: .iso8601) }
            var entries: [LogEntry] = []
            try store.read { snap in
                if let table { _ = try snap.schema(table) }
                let rowKey = key.map(parseKey)
                try snap.forEachOperation(from: from, through: to) { e in
                    if let table, e.table != table { return true }
                    if let rowKey, e.key != rowKey { return true }
                    if let start, e.timestamp < start { return true }
                    if let end, e.timestamp > end { return false }
                    entries.append(e)
                    return true
                }
            }
            if output.json { return try printJSON(entries.map(EntryJSON.init)) }
            for e in entries { print(describe(e)) }
        }
    }
}

struct HistoryCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history",
        abstract: "Show every operation on one row, and which operation last set each field.",
        discussion: "Example:\n  strata history store tasks 7\n  strata history store pairs 3,abc --json"
    )
    @OptionGroup var target: StoreArgument
    @Argument(help: "The table.") var table: String
    @Argument(help: "The row's key (commas separate a composite key).") var key: String
    @OptionGroup var output: OutputOptions

    struct History: Encodable {
        var operations: [EntryJSON]
        var blame: [String: UInt64]
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            let rowKey = parseKey(key)
            let (history, blame) = try store.read { snap in (try snap.history(table, key: rowKey), try snap.blame(table, key: rowKey)) }
            guard !history.isEmpty else { throw StrataError(.rowNotFound, "table '\(table)' has no row with key \(rowKey), now or ever") }
            if output.json {
                return try printJSON(History(operations: history.map(EntryJSON.init), blame: blame.mapValues(\.lsn)))
            }
            for e in history { print(describe(e)) }
            print("\nblame:")
            for (field, e) in blame.sorted(by: { $0.key < $1.key }) {
                print("  \(field): LSN \(e.lsn) (\(e.kind), \(e.origin == .local ? "local" : "server"), \(e.timestamp.formatted(.iso8601)))")
            }
        }
    }
}

struct PendingCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pending",
        abstract: "Show what the next upload would carry: each pending row's coalesced change, in upload order.",
        discussion: "Example:\n  strata pending store --json"
    )
    @OptionGroup var target: StoreArgument
    @OptionGroup var output: OutputOptions

    func run() throws {
        try reportingErrors {
            let changes = try SyncClient(store: try target.open()).pendingChanges()
            if output.json { return try printJSON(changes) }
            for c in changes {
                let values = c.values.sorted { $0.key < $1.key }.map { "\($0.key) = \($0.value)" }
                let originals = c.originals.sorted { $0.key < $1.key }.map { "\($0.key) was \($0.value)" }
                print("\(c.kind) \(c.table) \(c.key): \((values + originals).joined(separator: ", "))")
            }
            if changes.isEmpty { print("(nothing to upload)") }
        }
    }
}

struct ConflictsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "conflicts",
        abstract: "List rows holding a conflict the app has not resolved.",
        discussion: "Example:\n  strata conflicts store --json"
    )
    @OptionGroup var target: StoreArgument
    @OptionGroup var output: OutputOptions

    struct ConflictJSON: Encodable {
        var table: String
        var key: [Value]
        var fields: [String]
        var local: [String: Value]
        var server: [String: Value]
        var deletedLocally: Bool
        var deletedOnServer: Bool
    }

    func run() throws {
        try reportingErrors {
            let conflicts = try SyncClient(store: try target.open()).conflicts()
            if output.json {
                return try printJSON(conflicts.map { ConflictJSON(table: $0.table, key: $0.key.values, fields: $0.fields, local: $0.local, server: $0.server, deletedLocally: $0.isDeletedLocally, deletedOnServer: $0.isDeletedOnServer) })
            }
            for c in conflicts {
                let fields = c.fields.map { "\($0): local \(c.local[$0] ?? .null), server \(c.server[$0] ?? .null)" }
                let note = c.isDeletedLocally ? " (deleted here, changed on the server)" : c.isDeletedOnServer ? " (changed here, deleted on the server)" : ""
                print("\(c.table) \(c.key)\(note): \(fields.joined(separator: "; "))")
            }
            if conflicts.isEmpty { print("(no conflicts)") }
        }
    }
}

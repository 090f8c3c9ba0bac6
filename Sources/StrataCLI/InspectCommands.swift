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
    @Option(name: .customLong("where"), help: "Only rows whose field equals the value (field=value), as a query's equals compares; repeatable.") var filters: [String] = []
    @Option(help: "Sort by this field (ascending); rows are otherwise in key order.") var sort: String?
    // `.unconditional`: "-5" is read as this option's value (and refused by validate()), not as
    // an unknown flag ("Missing value for '--limit'").
    @Option(parsing: .unconditional, help: "Show at most this many rows.") var limit: Int?
    @Option(name: .customLong("as-of"), help: "Show the table as it was right after this LSN.") var asOf: UInt64?
    @Flag(help: "Include rows deleted locally and not yet uploaded.") var includeDeleted = false
    @OptionGroup var output: OutputOptions

    func validate() throws {
        if let limit, limit < 0 { throw ValidationError("--limit cannot be negative") }
        for f in filters {
            guard let eq = f.firstIndex(of: "="), eq != f.startIndex else {
                throw ValidationError("--where takes field=value, not '\(f)'")
            }
        }
        if sort?.isEmpty == true { throw ValidationError("--sort needs a field name") }
        if asOf == 0 { throw ValidationError("--as-of takes an LSN from 1") }
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            if let asOf {
                let last = try store.read { try $0.lastLSN }
                guard asOf <= last else { throw StrataError(.invalidOperation, "LSN \(asOf) is past the end of the log (\(last))") }
                let scratch = Store.newScratchFolder("asof")
                defer { try? FileManager.default.removeItem(atPath: scratch) }
                let past = try store.replay(into: scratch, through: asOf)
                defer { past.close() }
                try list(past)
            } else {
                try list(store)
            }
        }
    }

    /// Prints the rows of `store`'s table that pass the filters, one at a time: in key order
    /// (stopping at the limit), or sorted, keeping at most `limit` rows (all of them without a
    /// limit: sorting needs them).
    private func list(_ store: Store) throws {
        try store.read { snap in
            let known = Set(try snap.fieldNames(table))
            let conditions = try filters.map { f -> (String, Value) in
                let parts = f.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
                guard known.contains(parts[0]) else {
                    throw StrataError(.fieldNotFound, "table '\(table)' has no field '\(parts[0])' (--where); its fields: \(known.sorted().joined(separator: ", "))")
                }
                return (parts[0], parseValue(parts[1]))
            }
            if let sort, !known.contains(sort) {
                throw StrataError(.fieldNotFound, "table '\(table)' has no field '\(sort)' (--sort); its fields: \(known.sorted().joined(separator: ", "))")
            }
            // A query's `.equals` (`Value.order`, as `--sort`): ints and doubles compared by
            // value, two ints exactly (not through Double, where 2^53 and 2^53 + 1 are one).
            let filter = Condition.and(conditions.map { Condition.equals($0.0, $0.1) })
            func passes(_ row: Row) -> Bool { filter.matches(row) }
            var json = output.json ? JSONArrayPrinter() : nil
            var printed = 0
            func emit(_ row: Row) throws {
                if json != nil { try json!.add(RowJSON(row)) } else { print(describe(row)) }
                printed += 1
            }
            if let sort {
                // Stable: rows of equal sort values stay in key order.
                var kept: [(Int, Row)] = []
                var seen = 0
                try snap.forEachRow(table, includingDeleted: includeDeleted) { row in
                    guard passes(row) else { return true }
                    let value = row[sort]
                    var low = 0, high = kept.count
                    while low < high {
                        let mid = (low + high) / 2
                        // The library's order (`Value.order`, the one queries sort by): strings by
                        // UTF-8 bytes, every type ranked, so `show --sort` lists what `rows(_:)` does.
                        if Value.order(value, kept[mid].1[sort]) < 0 { high = mid } else { low = mid + 1 }
                    }
                    if let limit, low >= limit { return true }
                    kept.insert((seen, row), at: low)
                    seen += 1
                    if let limit, kept.count > limit { kept.removeLast() }
                    return true
                }
                for (_, row) in kept { try emit(row) }
            } else if limit != 0 {
                try snap.forEachRow(table, includingDeleted: includeDeleted) { row in
                    guard passes(row) else { return true }
                    try emit(row)
                    return limit.map { printed < $0 } ?? true
                }
            }
            if let json { json.finish() } else if printed == 0 { print("(no rows)") }
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
    @Option(parsing: .unconditional, help: "From this LSN.") var from: UInt64 = 1
    @Option(parsing: .unconditional, help: "Up to this LSN.") var to: UInt64 = .max
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
            // Printed as they are read: memory stays flat however long the log.
            var json = output.json ? JSONArrayPrinter() : nil
            try store.read { snap in
                if let table { _ = try snap.schema(table) }
                let rowKey = key.map(parseKey)
                try snap.forEachOperation(from: from, through: to) { e in
                    if let table, e.table != table { return true }
                    if let rowKey, e.key != rowKey { return true }
                    if let start, e.timestamp < start { return true }
                    if let end, e.timestamp > end { return false }
                    if json != nil { try json!.add(EntryJSON(e)) } else { print(describe(e)) }
                    return true
                }
            }
            json?.finish()
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

    /// The operation that last set a field.
    struct Blame: Encodable {
        var lsn: UInt64
        var kind: String
        var origin: String
        var timestamp: Date
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            let rowKey = parseKey(key)
            // Operations are printed as they are read, oldest first; the blame (one entry per
            // field) is folded meanwhile and printed last.
            var blame: [String: Blame] = [:]
            var count = 0
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            try store.read { snap in
                _ = try snap.schema(table)
                try snap.forEachInHistory(table, key: rowKey) { e in
                    if count == 0 && output.json { print("{\"operations\": [", terminator: "") }
                    if output.json {
                        print(count == 0 ? "\n" : ",\n", terminator: "")
                        print(String(decoding: try encoder.encode(EntryJSON(e)), as: UTF8.self), terminator: "")
                    } else {
                        print(describe(e))
                    }
                    count += 1
                    let who = Blame(lsn: e.lsn, kind: "\(e.kind)", origin: e.origin == .local ? "local" : "server", timestamp: e.timestamp)
                    for c in e.changes { blame[c.field] = who }
                    return true
                }
            }
            guard count > 0 else { throw StrataError(.rowNotFound, "table '\(table)' has no row with key \(rowKey), now or ever") }
            if output.json {
                print("\n], \"blame\": " + String(decoding: try encoder.encode(blame.mapValues(\.lsn)), as: UTF8.self) + "}")
                return
            }
            print("\nblame:")
            for (field, e) in blame.sorted(by: { $0.key < $1.key }) {
                print("  \(field): LSN \(e.lsn) (\(e.kind), \(e.origin), \(e.timestamp.formatted(.iso8601)))")
            }
        }
    }
}

struct PendingCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pending",
        abstract: "Show what the next upload would carry: each pending row's coalesced change, in upload order; then the rows held back, and why.",
        discussion: """
            A pending row is held back while it holds a conflict (settle it with `strata resolve`) or after the server set it aside (the app retries or discards it). A batch in flight goes up again first at the next sync.
            Example:
              strata pending store
              strata pending store --json
              strata pending store --held-back --json
            """
    )
    @OptionGroup var target: StoreArgument
    @Flag(name: .customLong("held-back"), help: "List only the pending rows held back from uploads, and why.")
    var heldBack = false
    @OptionGroup var output: OutputOptions

    /// A pending row that no upload carries until it is settled.
    struct HeldBack: Encodable {
        var table: String
        var key: [Value]
        /// `conflict` or `setAside`.
        var reason: String
        /// Why, in words, and what settles it.
        var detail: String
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            // Ordered as `strata sync` uploads: by the associations stored with the store.
            let sync = SyncClient(store: store)
            if heldBack {
                let rows = try held(sync)
                if output.json { return try printJSON(rows) }
                for r in rows { print("\(r.table) \(RowKey(r.key)): \(r.detail)") }
                if rows.isEmpty { print("(nothing held back)") }
                return
            }
            // Printed as they are read: memory stays flat however many rows are pending.
            var json = output.json ? JSONArrayPrinter() : nil
            var count = 0
            try sync.forEachPendingChange { c in
                count += 1
                if json != nil { return try json!.add(c) }
                let values = c.values.sorted { $0.key < $1.key }.map { "\($0.key) = \(displayValue($0.value))" }
                let originals = c.originals.sorted { $0.key < $1.key }.map { "\($0.key) was \(displayValue($0.value))" }
                print("\(c.kind) \(c.table) \(c.key): \((values + originals).joined(separator: ", "))")
            }
            if let json { return json.finish() }
            if count == 0 { print("(nothing to upload)") }
            let rows = try held(sync)
            if !rows.isEmpty {
                print("held back (no upload carries them until they are settled):")
                for r in rows { print("  \(r.table) \(RowKey(r.key)): \(r.detail)") }
            }
            if let (batch, state) = try sync.inFlightBatch() {
                print("in flight: batch \(batch.id), \(batch.changes.count) rows, \(state == .sent ? "sent, its answer lost" : "not sent yet"); the next sync sends it first")
            }
        }
    }

    /// The pending rows held back: conflicted, then set aside by the server.
    private func held(_ sync: SyncClient) throws -> [HeldBack] {
        let conflicts = try sync.conflicts().map { c in
            let fields = c.fields.map { "\($0) (local \(displayValue(c.local[$0] ?? .null)), server \(displayValue(c.server[$0] ?? .null)))" }
            let what = c.isDeletedLocally ? "deleted here, changed on the server" : c.isDeletedOnServer ? "changed here, deleted on the server" : "in conflict"
            return HeldBack(table: c.table, key: c.key.values, reason: "conflict", detail: """
                \(what): \(fields.joined(separator: ", ")); settle it with `strata resolve \(target.store) \(c.table) \(keyArgument(c.key)) --local` (or --server)
                """)
        }
        let setAside = try sync.rejectedRows().map { r in
            HeldBack(table: r.table, key: r.key.values, reason: "setAside", detail: """
                set aside by the server (\(r.kind) in batch \(r.batchID)): \(r.reason); the app retries it (retryRejected) or discards it (discardRejected)
                """)
        }
        return conflicts + setAside
    }
}

struct ResolveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "resolve",
        abstract: "Settle a row's conflict: keep the local values of its conflicting fields, or take the server's.",
        discussion: """
            As `SyncClient.resolve(_:key:with:)`: only the fields in conflict are decided; other local edits stay pending. With --local the row's values go up at the next sync.
            Example:
              strata resolve store tasks 7 --local
              strata resolve store pairs 3,abc --server
            """
    )
    @OptionGroup var target: StoreArgument
    @Argument(help: "The table.") var table: String
    @Argument(help: "The row's key (commas separate a composite key).") var key: String
    @Flag(help: "Which side wins the conflicting fields.") var side: Side

    enum Side: String, EnumerableFlag {
        case local, server
        static func help(for value: Side) -> ArgumentHelp? {
            value == .local ? "Keep the local values; they go up at the next sync." : "Take the server's values (for a row the server deleted: remove it)."
        }
    }

    func run() throws {
        try reportingErrors {
            let store = try target.open()
            let rowKey = parseKey(key)
            try SyncClient(store: store).resolve(table, key: rowKey, with: side == .local ? .local : .server)
            let row = try store.read { try $0.row(table, key: rowKey, includingDeleted: true) }
            print("resolved \(table) \(rowKey) (\(side.rawValue)): " + (row.map(describe) ?? "the row is gone"))
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

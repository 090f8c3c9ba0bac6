import ArgumentParser
import Foundation
import Strata
import StrataSync

/// `strata sync`: one round of sync with a Strata sync server over HTTP.
struct SyncCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Sync a store with a Strata sync server: pull and merge, then push the pending rows.",
        discussion: """
            Progress goes to standard error; the merge and acknowledgement report to standard output.
            Example:
              strata sync ./phone --server http://127.0.0.1:8080 --token "$TOKEN"
            """
    )
    @OptionGroup var target: StoreArgument
    @Option(help: "The server's base URL (http://host:port).") var server: String
    @Option(help: "The bearer token for this store's client id (strata-server token create).") var token: String
    @Option(help: "Seconds a request may take.") var timeout: Double = 30
    @Option(help: "server-wins, client-wins, last-writer-wins or deferred.") var policy: String = "server-wins"
    @OptionGroup var output: OutputOptions

    func validate() throws {
        guard let url = URL(string: server), url.scheme == "http" || url.scheme == "https", url.host != nil else {
            throw ValidationError("--server must be an http:// or https:// URL, not '\(server)'")
        }
        if ConflictPolicy(argument: policy) == nil {
            throw ValidationError("--policy must be server-wins, client-wins, last-writer-wins or deferred")
        }
        guard timeout > 0 else { throw ValidationError("--timeout must be positive") }
    }

    struct Report: Encodable {
        var rowsApplied, fieldsFromServer, fieldsKeptLocal, fieldsSettled: Int
        var conflicts: [String]
        var batches, acknowledged, rejected, conflictsOnPush, retries: Int
        var pending: Int
        var anchor: String?
    }

    func run() async throws {
        do {
            let store = try target.open()
            let sync = SyncClient(store: store, policy: ConflictPolicy(argument: policy)!)
            let transport = HTTPSyncTransport(server: URL(string: server)!, token: token, timeout: timeout)
            let quiet = output.json
            let report = try await sync.sync(with: transport, maxAttempts: 3) { p in
                guard !quiet else { return }
                let rows = p.total.isEmpty ? "" : " " + p.total.keys.sorted().map { "\($0) \(p.processed[$0] ?? 0)/\(p.total[$0]!)" }.joined(separator: ", ")
                FileHandle.standardError.write(Data("\(p.phase.rawValue): \(p.status.rawValue)\(rows)\n".utf8))
            }
            let pending = try await store.read { try $0.pendingRows().count }
            let acknowledged = report.acks.reduce(0) { $0 + $1.acknowledged }
            let pushConflicts = report.acks.reduce(0) { $0 + $1.conflicts }
            let refused = report.acks.reduce(0) { $0 + $1.setAside + $1.dropped + $1.rolledBack }
            let m = report.merge
            let conflicts = m.conflicts.map { "\($0.table) \($0.key) \($0.fields.joined(separator: ",")) → \($0.resolution)" }
            if output.json {
                return try printJSON(Report(
                    rowsApplied: m.rowsApplied, fieldsFromServer: m.fieldsFromServer, fieldsKeptLocal: m.fieldsKeptLocal,
                    fieldsSettled: m.fieldsSettled, conflicts: conflicts, batches: report.batches, acknowledged: acknowledged,
                    rejected: refused, conflictsOnPush: pushConflicts, retries: report.retries, pending: pending,
                    anchor: try sync.anchor()))
            }
            print("merge: \(m)")
            for c in conflicts { print("conflict: \(c)") }
            print("push: \(report.batches) batches, \(acknowledged) rows acknowledged, \(pushConflicts) in conflict, \(refused) refused; \(report.retries) retries")
            print("pending now: \(pending); anchor \(try sync.anchor() ?? "none")")
        } catch let e as StrataError {
            FileHandle.standardError.write(Data("strata: \(e.message)\n".utf8))
            throw ExitCode(Exit.error)
        } catch let e as ResetRequired {
            FileHandle.standardError.write(Data("strata: \(e)\n".utf8))
            throw ExitCode(Exit.error)
        }
    }
}

/// `strata create`: a new store with the tables of a server's tables file.
struct CreateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Create a store with the tables of a strata-server tables file (JSON), and print its client id.",
        discussion: "Example:\n  strata create ./phone --tables Server/Examples/tables.json"
    )
    @Argument(help: "The new store's folder.") var store: String
    @Option(help: "The tables file (the one strata-server runs with).") var tables: String

    /// The part of the server's tables file that a store needs.
    struct TablesFile: Decodable {
        struct Field: Decodable {
            var name: String
            var type: ValueType
            var nullable: Bool?
            var `default`: Value?
        }
        struct Table: Decodable {
            var name: String
            var mode: TableSchema.Mode?
            var primaryKey: [String]
            var fields: [Field]
        }
        var tables: [Table]
    }

    func run() throws {
        try reportingErrors {
            guard let data = FileManager.default.contents(atPath: tables) else { throw StrataError(.io, "cannot read the tables file '\(tables)'") }
            let file: TablesFile
            do { file = try JSONDecoder().decode(TablesFile.self, from: data) } catch {
                throw StrataError(.malformedInput, "the tables file '\(tables)' is not valid: \(error)")
            }
            guard !FileManager.default.fileExists(atPath: store) else { throw StrataError(.invalidOperation, "'\(store)' already exists") }
            let s = try Store(path: store)
            for t in file.tables {
                let fields = t.fields.map { FieldDefinition($0.name, $0.type, nullable: $0.nullable ?? false, default: $0.default) }
                try s.createTable(t.mode == .propertyBag
                    ? .propertyBag(t.name, key: fields.filter { t.primaryKey.contains($0.name) })
                    : .fixed(t.name, primaryKey: t.primaryKey, fields: fields))
            }
            print(s.clientID)
        }
    }
}

import ArgumentParser
import Foundation
import Synchronization
import Strata
import StrataSync

/// `strata sync`: one round of sync with a Strata sync server over HTTP.
struct SyncCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Sync a store with a Strata sync server: pull and merge, then push the pending rows.",
        discussion: """
            Progress goes to standard error; the merge and acknowledgement report to standard output.
            Uploads go parents first by the associations of the tables file that `strata create` read (stored with the store); --tables reads them from a tables file instead (for a store created otherwise).
            Example:
              strata sync ./phone --server http://127.0.0.1:8080 --token "$TOKEN"
            """
    )
    @OptionGroup var target: StoreArgument
    @Option(help: "The server's base URL (http://host:port).") var server: String
    @Option(help: "The bearer token for this store's client id (strata-server token create).") var token: String
    @Option(help: "Seconds a request may take.") var timeout: Double = 30
    @Option(help: "server-wins, client-wins, last-writer-wins or deferred.") var policy: String = "server-wins"
    @Option(help: "A tables file whose associations to use instead of the ones `strata create` stored.") var tables: String?
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
        /// Server rows this store cannot hold, set aside: "table key: reason".
        var refusedServerRows: [String]
        var batches, acknowledged, rejected, conflictsOnPush, retries: Int
        var pending: Int
        var anchor: String?
    }

    func run() async throws {
        do {
            let store = try target.open()
            let associations = try tables.map { try CreateCommand.TablesFile.read($0).associations ?? [] } ?? StoredAssociations.read(store)
            let sync = SyncClient(store: store, policy: ConflictPolicy(argument: policy)!, associations: associations)
            let transport = HTTPSyncTransport(server: URL(string: server)!, token: token, timeout: timeout)
            let quiet = output.json
            let mergeRate = RateLine()
            let report = try await sync.sync(with: transport, maxAttempts: 3) { p in
                guard !quiet else { return }
                // A long pull merges page after page: one line every half second, not one a page.
                if p.phase == .merge, p.status == .inProgress {
                    if let line = mergeRate.line(rows: p.processed.values.reduce(0, +)) { FileHandle.standardError.write(Data(line.utf8)) }
                    return
                }
                let rows = p.total.isEmpty ? "" : " " + p.total.keys.sorted().map { "\($0) \(p.processed[$0] ?? 0)/\(p.total[$0]!)" }.joined(separator: ", ")
                FileHandle.standardError.write(Data("\(p.phase.rawValue): \(p.status.rawValue)\(rows)\n".utf8))
            }
            let pending = try await store.read { try $0.pendingRows().count }
            let acknowledged = report.acks.reduce(0) { $0 + $1.acknowledged }
            let pushConflicts = report.acks.reduce(0) { $0 + $1.conflicts }
            let refused = report.acks.reduce(0) { $0 + $1.setAside + $1.dropped + $1.rolledBack }
            let m = report.merge
            let conflicts = m.conflicts.map { "\($0.table) \($0.key) \($0.fields.joined(separator: ",")) → \($0.resolution)" }
            let refusedRows = m.refusedRows.map { "\($0.table) \($0.key): \($0.reason)" }
            if output.json {
                return try printJSON(Report(
                    rowsApplied: m.rowsApplied, fieldsFromServer: m.fieldsFromServer, fieldsKeptLocal: m.fieldsKeptLocal,
                    fieldsSettled: m.fieldsSettled, conflicts: conflicts, refusedServerRows: refusedRows, batches: report.batches, acknowledged: acknowledged,
                    rejected: refused, conflictsOnPush: pushConflicts, retries: report.retries, pending: pending,
                    anchor: try sync.anchor()))
            }
            print("merge: \(m)")
            for c in conflicts { print("conflict: \(c)") }
            for r in refusedRows { print("server row set aside (this store cannot hold it): \(r)") }
            print("push: \(report.batches) batches, \(acknowledged) rows acknowledged, \(pushConflicts) in conflict, \(refused) refused; \(report.retries) retries")
            // A pending row still here after the upload is held back (or the upload stopped):
            // `strata pending` names each one and why.
            let held = try sync.conflicts().count + sync.rejectedRows().count
            let note = held == 0 ? "" : " (\(held) held back: `strata pending \(target.store)` says why)"
            print("pending now: \(pending)\(note); anchor \(try sync.anchor() ?? "none")")
        } catch let e as StrataError {
            FileHandle.standardError.write(Data("strata: \(e.message)\n".utf8))
            throw ExitCode(e.code == .corruptStore ? Exit.damaged : Exit.error)
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
        discussion: """
            The file's associations are stored with the store: `strata sync` and `strata pending` order uploads by them, parents first. The store is built in a hidden folder beside the new one and renamed at the end, so a failed create leaves nothing behind.
            Example:
              strata create ./phone --tables Server/Examples/tables.json
            """
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
        var associations: [Association]?

        /// The tables file at `path`, its associations checked against its tables.
        static func read(_ path: String) throws -> TablesFile {
            guard let data = FileManager.default.contents(atPath: path) else { throw StrataError(.io, "cannot read the tables file '\(path)'") }
            let file: TablesFile
            do { file = try JSONDecoder().decode(TablesFile.self, from: data) } catch {
                throw StrataError(.malformedInput, "the tables file '\(path)' is not valid: \(error)")
            }
            for a in file.associations ?? [] {
                guard let child = file.tables.first(where: { $0.name == a.child }), child.fields.contains(where: { $0.name == a.field }),
                      file.tables.contains(where: { $0.name == a.parent }) else {
                    throw StrataError(.malformedInput, "the tables file '\(path)' is not valid: association \(a.child).\(a.field) → \(a.parent) names a table or field it does not define")
                }
            }
            return file
        }
    }

    func run() throws {
        try reportingErrors {
            let file = try TablesFile.read(tables)
            guard !FileManager.default.fileExists(atPath: store) else { throw StrataError(.invalidOperation, "'\(store)' already exists") }
            // Built under a hidden name beside the new store and renamed when complete: a create
            // that fails (or is killed) never leaves a half-made store under the name asked for.
            let target = URL(fileURLWithPath: store).standardizedFileURL
            let parent = target.deletingLastPathComponent()
            let scratch = parent.appendingPathComponent(".\(target.lastPathComponent).creating-\(UUID().uuidString)").path
            do {
                try FileManager.default.createDirectory(at: parent, withIntermediateDirectories: true)
            } catch {
                throw StrataError(.io, "cannot create the folder '\(parent.path)': \(error.localizedDescription)")
            }
            let clientID: String
            do {
                let s = try Store(path: scratch)
                defer { s.close() }
                for t in file.tables {
                    let fields = t.fields.map { FieldDefinition($0.name, $0.type, nullable: $0.nullable ?? false, default: $0.default) }
                    try s.createTable(t.mode == .propertyBag
                        ? .propertyBag(t.name, key: fields.filter { t.primaryKey.contains($0.name) })
                        : .fixed(t.name, primaryKey: t.primaryKey, fields: fields))
                }
                let associations = file.associations ?? []
                try s.write { tx in try tx.setStrataProperty(StoredAssociations.property, StoredAssociations.value(associations)) }
                clientID = s.clientID
            } catch {
                try? FileManager.default.removeItem(atPath: scratch)
                throw error
            }
            do {
                // rename(2) without replacing: a folder made meanwhile under that name is kept.
                try FileManager.default.moveItem(atPath: scratch, toPath: target.path)
            } catch {
                try? FileManager.default.removeItem(atPath: scratch)
                throw StrataError(.io, "cannot move the new store to '\(store)': \(error.localizedDescription)")
            }
            print(clientID)
        }
    }
}

/// The associations of the tables file a store was created from (`strata create`), kept as a
/// store property so that `strata sync` and `strata pending` order uploads as the server expects.
enum StoredAssociations {
    static let property = "strata.cli.associations"

    static func value(_ associations: [Association]) throws -> Value {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return .string(String(decoding: try encoder.encode(associations), as: UTF8.self))
    }

    /// The stored associations; none for a store that `strata create` did not make.
    static func read(_ store: Store) throws -> [Association] {
        guard let stored = try store.read({ try $0.property(property) }) else { return [] }
        guard let text = stored.stringValue, let list = try? JSONDecoder().decode([Association].self, from: Data(text.utf8)) else {
            throw StrataError(.corruptRecord, "the store's associations (property \(property)) are not readable: \(stored)")
        }
        return list
    }
}

/// The progress line of a long merge: rows so far and rows a second, at most every half second.
final class RateLine: Sendable {
    private struct State {
        var start = ContinuousClock.now
        var last: ContinuousClock.Instant?
    }
    private let state = Mutex(State())

    /// The line to print for `rows` merged so far, or `nil` when one was printed less than half a
    /// second ago.
    func line(rows: Int) -> String? {
        state.withLock { s in
            let now = ContinuousClock.now
            if let last = s.last, now - last < .milliseconds(500) { return nil }
            s.last = now
            let seconds = max((now - s.start) / .seconds(1), 0.001)
            return "merge: \(rows) rows, \(Int(Double(rows) / seconds)) rows/s\n"
        }
    }
}

import Foundation
import Strata
import Synchronization

/// A small in-process sync server, for tests, examples and the demo: it keeps tables of rows,
/// serves deltas since an anchor, and applies batches with optimistic concurrency (an update or
/// delete must name the values the server holds; an insert needs a free key). It answers a batch
/// id it has seen before with the same acknowledgement, so a retried upload is never applied twice.
public final class InMemorySyncServer: SyncTransport {
    struct State {
        var rows: [String: [RowKey: [String: Value]]] = [:]
        var fieldNames: [String: Set<String>] = [:]
        var log: [(version: Int, table: String, key: RowKey)] = []
        var version = 0
        var acks: [String: BatchAck] = [:]
        var applied: [String] = []
    }
    private let state = Mutex(State())
    /// The key fields of each table, by table name (`["id"]` when not listed).
    public let keyFields: [String: [String]]
    /// Lets a test refuse changes or assign keys and values: return a result to use instead of
    /// the server's own.
    public let decide: (@Sendable (RowChange) -> RowResult?)?

    public init(keyFields: [String: [String]] = [:], decide: (@Sendable (RowChange) -> RowResult?)? = nil) {
        self.keyFields = keyFields
        self.decide = decide
    }

    /// The server's rows of `table` (key fields left out).
    public func rows(_ table: String) -> [RowKey: [String: Value]] { state.withLock { $0.rows[table] ?? [:] } }

    /// Ids of the batches applied, in order (a repeat is not applied again, so not listed again).
    public var appliedBatches: [String] { state.withLock { $0.applied } }

    /// Changes the server's data directly, as another client or a back office would.
    public func write(_ table: String, key: RowKey, _ fields: [String: Value]?) {
        state.withLock { s in
            if let fields {
                s.rows[table, default: [:]][key] = fields.filter { !$0.value.isNull }
                s.fieldNames[table, default: []].formUnion(fields.keys)
            } else {
                s.rows[table]?[key] = nil
            }
            s.version += 1
            s.log.append((s.version, table, key))
        }
    }

    public func pull(since anchor: String?) async throws -> ServerDelta {
        state.withLock { s in
            let since = anchor.flatMap(Int.init) ?? 0
            var latest: [String: [RowKey]] = [:]
            var seen = Set<String>()
            for change in s.log.reversed() where change.version > since && seen.insert("\(change.table)\u{0}\(change.key)").inserted {
                latest[change.table, default: []].append(change.key)
            }
            var tables: [TableDelta] = []
            for (table, keys) in latest.sorted(by: { $0.key < $1.key }) {
                var delta = TableDelta(table)
                for key in keys.reversed() {
                    if let row = s.rows[table]?[key] {
                        // A complete row: fields without a value are listed as null.
                        var full: [String: Value] = [:]
                        for f in s.fieldNames[table] ?? [] { full[f] = row[f] ?? .null }
                        for (i, k) in (keyFields[table] ?? ["id"]).enumerated() { full[k] = key.values[i] }
                        delta.upserts.append(ServerRow(full, version: "\(s.version)"))
                    } else {
                        delta.deletes.append(key)
                    }
                }
                tables.append(delta)
            }
            return ServerDelta(since: anchor, anchor: "\(s.version)", tables: tables)
        }
    }

    public func push(_ batch: Batch) async throws -> BatchAck {
        state.withLock { s in
            if let ack = s.acks[batch.id] { return ack }
            var results: [RowResult] = []
            for change in batch.changes {
                if let custom = decide?(change) {
                    if custom.status == .ok { _ = apply(change, &s, as: custom.newKey, serverValues: custom.serverValues ?? [:]) }
                    results.append(custom)
                } else {
                    results.append(apply(change, &s))
                }
            }
            let ack = BatchAck(batchID: batch.id, results: results)
            s.acks[batch.id] = ack
            s.applied.append(batch.id)
            return ack
        }
    }

    private func apply(_ c: RowChange, _ s: inout State, as newKey: RowKey? = nil, serverValues: [String: Value] = [:]) -> RowResult {
        let key = newKey ?? c.key
        let keyNames = Set(keyFields[c.table] ?? ["id"])
        var rows = s.rows[c.table] ?? [:]
        switch c.kind {
        case .insert:
            guard rows[key] == nil else { return RowResult(table: c.table, key: c.key, status: .conflict) }
            rows[key] = c.values.filter { !$0.value.isNull && !keyNames.contains($0.key) }
        case .update:
            guard var row = rows[key] else { return RowResult(table: c.table, key: c.key, status: .conflict) }
            for (f, o) in c.originals where (row[f] ?? .null) != o { return RowResult(table: c.table, key: c.key, status: .conflict) }
            for (f, v) in c.values {
                if v.isNull { row.removeValue(forKey: f) } else { row[f] = v }
            }
            rows[key] = row
        case .delete:
            if let row = rows[key] {
                for (f, o) in c.originals where (row[f] ?? .null) != o { return RowResult(table: c.table, key: c.key, status: .conflict) }
                rows[key] = nil
            }
        }
        if c.kind != .delete, !serverValues.isEmpty { rows[key]?.merge(serverValues) { $1 } }
        s.rows[c.table] = rows
        s.fieldNames[c.table, default: []].formUnion(c.values.keys.filter { !keyNames.contains($0) })
        s.fieldNames[c.table, default: []].formUnion(serverValues.keys)
        s.version += 1
        s.log.append((s.version, c.table, key))
        return .ok(c.table, c.key, newKey: newKey)
    }
}

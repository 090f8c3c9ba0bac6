import Foundation
import Strata

/// The batching rules: which change each pending row uploads, in which order, and in which
/// batch. This file is the only place they are decided.
///
/// **Coalescing.** A pending row already holds the net effect of every local edit since the server
/// last confirmed it: its originals are the first originals and its currents the last currents,
/// an insert followed by a delete left no row, an edit back to the original left a clean field.
/// So each pending row uploads exactly one change:
///
/// | row | change |
/// |---|---|
/// | inserted (and maybe updated) | insert with the final values |
/// | updated | update of the changed fields only: new values and their originals |
/// | deleted (maybe after updates) | delete carrying the server's values as originals |
/// | inserted then deleted | nothing (no row remains) |
///
/// Conflicted rows and rows set aside are held back.
///
/// **Order.** Tables are ordered by the declared associations, parents first. Inserts and
/// updates go in that order; deletes follow in the reverse order, children before parents. Rows of
/// one table go in key order. A cycle among associations is an error. Batches are cut from this one
/// sequence, so the order also holds across batch boundaries.
///
/// **Size.** A batch holds at most `maxRows` changes and `maxBytes` of encoded changes; a single
/// change larger than `maxBytes` goes alone in its batch.
enum BatchingRules {
    /// The change a pending row uploads, or `nil` when it uploads nothing.
    static func change(for row: Row) -> RowChange? {
        let key = Set(row.keyFieldNames)
        switch row.status {
        case .unchanged:
            return nil
        case .inserted:
            var values: [String: Value] = [:]
            for f in row.fieldNames where !row[f].isNull { values[f] = row[f] }
            return RowChange(table: row.table, key: row.key, kind: .insert, values: values)
        case .updated:
            var values: [String: Value] = [:]
            var originals: [String: Value] = [:]
            for f in row.changedFields where !key.contains(f) {
                values[f] = row[f]
                originals[f] = row.original(f)
            }
            return RowChange(table: row.table, key: row.key, kind: .update, values: values, originals: originals)
        case .deleted:
            var originals: [String: Value] = [:]
            for f in row.fieldNames where !key.contains(f) && !row.original(f).isNull { originals[f] = row.original(f) }
            return RowChange(table: row.table, key: row.key, kind: .delete, originals: originals)
        }
    }

    /// Table names with parents before children.
    ///
    /// - Throws: `StrataError` `invalidSchema` naming the cycle when associations form one.
    static func tableOrder(_ tables: [String], _ associations: [Association]) throws -> [String] {
        var parents: [String: Set<String>] = [:]
        for a in associations where a.child != a.parent { parents[a.child, default: []].insert(a.parent) }
        var order: [String] = []
        var state: [String: Int] = [:]  // 1 visiting, 2 done
        func visit(_ t: String, _ path: [String]) throws {
            if state[t] == 2 { return }
            if state[t] == 1 {
                let cycle = path.drop { $0 != t } + [t]
                throw StrataError(.invalidSchema, "the associations form a cycle: \(cycle.joined(separator: " → "))")
            }
            state[t] = 1
            for p in (parents[t] ?? []).sorted() { try visit(p, path + [t]) }
            state[t] = 2
            order.append(t)
        }
        for t in tables.sorted() { try visit(t, []) }
        return order.filter { tables.contains($0) }
    }

    /// Orders changes: inserts and updates parents first, then deletes children first.
    /// `changes` come in key order per table; grouping keeps that order.
    static func order(_ changes: [RowChange], tableOrder: [String]) -> [RowChange] {
        group(changes.filter { $0.kind != .delete }, tableOrder) + group(changes.filter { $0.kind == .delete }, tableOrder.reversed())
    }

    private static func group(_ changes: [RowChange], _ tables: [String]) -> [RowChange] {
        var byTable: [String: [RowChange]] = [:]
        for c in changes { byTable[c.table, default: []].append(c) }
        return tables.flatMap { byTable[$0] ?? [] }
    }

    /// The encoded size of a change, as the wire format will send it.
    static func size(_ change: RowChange) -> Int {
        (try? WireFormat.encoder.encode(change).count) ?? 0
    }

    /// Cuts the first batch from the ordered changes.
    static func firstBatch(_ ordered: [RowChange], maxRows: Int, maxBytes: Int) -> [RowChange] {
        var batch: [RowChange] = []
        var bytes = 0
        for c in ordered {
            let s = size(c)
            if !batch.isEmpty && (batch.count >= maxRows || bytes + s > maxBytes) { break }
            batch.append(c)
            bytes += s
        }
        return batch
    }
}

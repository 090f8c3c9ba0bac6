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
/// **Size.** A batch holds at most `maxRows` changes, and its payload as the wire format encodes
/// it (envelope included) is at most `maxBytes`; a single change too large for that goes alone
/// in its batch.
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

    /// Refuses batch limits that leave no room for a row: a batch always holds at least one.
    static func checkLimits(maxRows: Int, maxBytes: Int, _ names: (rows: String, bytes: String)) throws(StrataError) {
        guard maxRows > 0, maxBytes > 0 else {
            throw StrataError(.invalidOperation, "a batch needs room for at least one row: \(names.rows) is \(maxRows) and \(names.bytes) is \(maxBytes); both must be 1 or more")
        }
    }

    /// Cuts the first batch from the ordered changes: as many as fit in `maxRows` changes and
    /// `maxBytes` of payload — the whole `Batch` as `WireFormat` encodes it, its envelope and
    /// separators included — and at least one. Each change is measured once, by `WireSize`,
    /// without encoding it.
    static func firstBatch(_ ordered: [RowChange], clientID: String, number: UInt64, maxRows: Int, maxBytes: Int) -> [RowChange] {
        var batch: [RowChange] = []
        var bytes = WireSize.batchEnvelope(id: "\(clientID)-\(number)", clientID: clientID, number: number)
        for c in ordered {
            let s = WireSize.change(c) + (batch.isEmpty ? 0 : 1)  // the comma before it
            if !batch.isEmpty && (batch.count >= maxRows || bytes + s > maxBytes) { break }
            batch.append(c)
            bytes += s
        }
        return batch
    }
}

/// The length in bytes of a payload as `WireFormat.encoder` writes it, computed from the values
/// without encoding them: sorted keys do not change a length, and the encoder's escaping and
/// number formatting are followed exactly (`BatchSizeTests` checks every case against the
/// encoder). Batching uses it to cut batches in one pass.
enum WireSize {
    /// `{"changes":[…],"clientID":"…","id":"…","number":N}` without the changes.
    static func batchEnvelope(id: String, clientID: String, number: UInt64) -> Int {
        object(4) + string("changes") + 2 + string("clientID") + string(clientID) + string("id") + string(id)
            + string("number") + decimalDigits(number)
    }

    /// `{"key":[…],"kind":"…","originals":{…},"table":"…","values":{…}}`.
    static func change(_ c: RowChange) -> Int {
        var n = object(5) + string("key") + array(c.key.values.count) + string("kind") + string(c.kind.rawValue)
            + string("originals") + string("table") + string(c.table) + string("values")
        for v in c.key.values { n += value(v) }
        for fields in [c.values, c.originals] {
            n += object(fields.count)
            for (name, v) in fields { n += string(name) + value(v) }
        }
        return n
    }

    /// `{"int":3}`, `{"string":"x"}`, … or `null`.
    static func value(_ v: Value) -> Int {
        let wrapper = object(1) + 2  // braces, colon, and the quotes of the type name
        switch v {
        case .null: return 4
        case .bool(let b): return wrapper + 4 + (b ? 4 : 5)
        case .int(let i): return wrapper + 3 + (i < 0 ? 1 + decimalDigits(i.magnitude) : decimalDigits(UInt64(i)))
        case .double(let d): return wrapper + 6 + double(d)
        case .string(let s): return wrapper + 6 + string(s)
        case .bytes(let b): return wrapper + 5 + string(Data(b).base64EncodedString())  // base64 may hold "/", escaped
        case .timestamp(let t): return wrapper + 9 + double(t.timeIntervalSince1970)
        }
    }

    /// Braces, and a colon per member and the commas between them (keys and values not counted).
    private static func object(_ members: Int) -> Int { 2 + members + max(0, members - 1) }

    /// Brackets and the commas between the elements.
    private static func array(_ elements: Int) -> Int { 2 + max(0, elements - 1) }

    /// A JSON string with its quotes: `"` `\` and `/` escaped with a backslash, `\b \f \n \r \t`
    /// likewise, other control characters as `\u00XX`, everything else as UTF-8.
    static func string(_ s: String) -> Int {
        var n = 2
        for byte in s.utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), 0x08, 0x0C, 0x0A, 0x0D, 0x09: n += 2
            case 0..<0x20: n += 6
            default: n += 1
            }
        }
        return n
    }

    /// The encoder writes a double as its shortest round-trip form, without a trailing `.0`.
    private static func double(_ d: Double) -> Int {
        let s = d.description
        return s.hasSuffix(".0") ? s.utf8.count - 2 : s.utf8.count
    }

    private static func decimalDigits(_ v: UInt64) -> Int {
        var n = 1
        var v = v
        while v >= 10 { v /= 10; n += 1 }
        return n
    }
}

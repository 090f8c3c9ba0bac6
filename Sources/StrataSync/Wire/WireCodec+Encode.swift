import Foundation
import Strata

// The codec's writing half: each type written with its keys in `JSONEncoder`'s `.sortedKeys`
// order (the UTF-8 bytes of the keys, compared in order), optional fields left out when `nil`,
// as the synthesized and hand-written `encode(to:)` of the `Codable` path do.
extension WireCodec {
    /// Encodes `value` if the codec handles its type; `nil` for any other type, and for a value
    /// holding a NaN or infinite double (which the `Codable` path refuses with its own error).
    package static func encode<T>(_ value: T) -> Data? {
        var w = JSONWriter()
        do {
            switch value {
            case let v as ServerDelta: try serverDelta(v, &w)
            case let v as Batch: try batch(v, &w)
            case let v as BatchAck: try batchAck(v, &w)
            case let v as [RowChange]: try array(v, &w, rowChange)
            case let v as [String: Value]: try fields(v, &w)
            case let v as [Value]: try array(v, &w, Self.value)
            case let v as RowKey: try array(v.values, &w, Self.value)
            case let v as Value: try Self.value(v, &w)
            default: return nil
            }
        } catch {
            return nil
        }
        return Data(w.bytes)
    }

    static func array<E>(_ elements: [E], _ w: inout JSONWriter, _ element: (E, inout JSONWriter) throws(JSONWriter.NonFinite) -> Void) throws(JSONWriter.NonFinite) {
        w.byte(UInt8(ascii: "["))
        for (i, e) in elements.enumerated() {
            if i > 0 { w.byte(UInt8(ascii: ",")) }
            try element(e, &w)
        }
        w.byte(UInt8(ascii: "]"))
    }

    static func value(_ v: Value, _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        switch v {
        case .null: w.raw("null"); return
        case .bool(let b): w.raw(b ? #"{"bool":true"# : #"{"bool":false"#)
        case .int(let i): w.raw(#"{"int":"#); w.int(i)
        case .double(let d): w.raw(#"{"double":"#); try w.double(d)
        case .string(let s): w.raw(#"{"string":"#); w.string(s)
        case .bytes(let b): w.raw(#"{"bytes":"#); w.base64(b)
        case .timestamp(let t): w.raw(#"{"timestamp":"#); try w.double(t.timeIntervalSince1970)
        }
        w.byte(UInt8(ascii: "}"))
    }

    /// Whether `a` sorts before `b` as `JSONEncoder`'s `.sortedKeys` sorts them: by UTF-8 bytes.
    static func precedes(_ a: String, _ b: String) -> Bool {
        var a = a, b = b
        return a.withUTF8 { pa in
            b.withUTF8 { pb in
                let n = min(pa.count, pb.count)
                for i in 0..<n where pa[i] != pb[i] { return pa[i] < pb[i] }
                return pa.count < pb.count
            }
        }
    }

    static func fields(_ f: [String: Value], _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        w.byte(UInt8(ascii: "{"))
        if f.count == 1, let (k, v) = f.first {
            w.string(k)
            w.byte(UInt8(ascii: ":"))
            try value(v, &w)
        } else {
            for (i, (k, v)) in f.sorted(by: { precedes($0.key, $1.key) }).enumerated() {
                if i > 0 { w.byte(UInt8(ascii: ",")) }
                w.string(k)
                w.byte(UInt8(ascii: ":"))
                try value(v, &w)
            }
        }
        w.byte(UInt8(ascii: "}"))
    }

    static func serverDelta(_ d: ServerDelta, _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        w.raw(#"{"anchor":"#); w.string(d.anchor)
        w.raw(#","mode":"#); w.string(d.mode.rawValue)
        if let since = d.since { w.raw(#","since":"#); w.string(since) }
        w.raw(#","tables":"#); try array(d.tables, &w, tableDelta)
        w.byte(UInt8(ascii: "}"))
    }

    static func tableDelta(_ t: TableDelta, _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        w.raw(#"{"deletes":"#); try array(t.deletes, &w) { (k, w) throws(JSONWriter.NonFinite) in try array(k.values, &w, value) }
        w.raw(#","table":"#); w.string(t.table)
        w.raw(#","upserts":"#); try array(t.upserts, &w, serverRow)
        w.byte(UInt8(ascii: "}"))
    }

    static func serverRow(_ row: ServerRow, _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        w.raw(#"{"fields":"#); try fields(row.fields, &w)
        if let t = row.timestamp { w.raw(#","timestamp":"#); try w.double(t.timeIntervalSince1970) }
        if let v = row.version { w.raw(#","version":"#); w.string(v) }
        w.byte(UInt8(ascii: "}"))
    }

    static func batch(_ b: Batch, _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        w.raw(#"{"changes":"#); try array(b.changes, &w, rowChange)
        w.raw(#","clientID":"#); w.string(b.clientID)
        w.raw(#","id":"#); w.string(b.id)
        w.raw(#","number":"#); w.uint(b.number)
        w.byte(UInt8(ascii: "}"))
    }

    static func rowChange(_ c: RowChange, _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        w.raw(#"{"key":"#); try array(c.key.values, &w, value)
        w.raw(#","kind":"#); w.string(c.kind.rawValue)
        w.raw(#","originals":"#); try fields(c.originals, &w)
        w.raw(#","table":"#); w.string(c.table)
        w.raw(#","values":"#); try fields(c.values, &w)
        w.byte(UInt8(ascii: "}"))
    }

    static func batchAck(_ a: BatchAck, _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        w.raw(#"{"batchID":"#); w.string(a.batchID)
        w.raw(#","results":"#); try array(a.results, &w, rowResult)
        w.byte(UInt8(ascii: "}"))
    }

    static func rowResult(_ r: RowResult, _ w: inout JSONWriter) throws(JSONWriter.NonFinite) {
        w.byte(UInt8(ascii: "{"))
        if let e = r.error {
            w.raw(#""error":{"action":"#); w.string(e.action.rawValue)
            w.raw(#","reason":"#); w.string(e.reason)
            w.raw("},")
        }
        w.raw(#""key":"#); try array(r.key.values, &w, value)
        if let k = r.newKey { w.raw(#","newKey":"#); try array(k.values, &w, value) }
        if let s = r.serverValues { w.raw(#","serverValues":"#); try fields(s, &w) }
        w.raw(#","status":"#); w.string(r.status.rawValue)
        w.raw(#","table":"#); w.string(r.table)
        w.byte(UInt8(ascii: "}"))
    }
}

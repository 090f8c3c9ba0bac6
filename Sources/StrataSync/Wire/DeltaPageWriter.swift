import Foundation
import Strata

/// Writes a pull page — a ``ServerDelta`` in the wire format — from rows a server keeps as wire
/// JSON, without decoding their values: each row's key values and stored fields are copied as
/// they are, checked for syntax only. `strata-server` assembles its pages with it.
///
/// ```swift
/// var page = DeltaPageWriter(tables: [.init(name: "tasks", keyFields: ["id"], fields: ["title", "done"])])
/// try page.upsert(table: 0, key: #"[{"int":7}]"#, fields: #"{"title":{"string":"Buy milk"}}"#, version: 42, timestamp: 1.7e9)
/// let body = page.finish(since: "41", anchor: "42", mode: .incremental)
/// ```
///
/// A row is complete in the page: its key fields come first, from its key, and a declared field
/// its stored fields leave out is listed as `null` (a field left out of an upsert means
/// "unchanged" to a client).
public struct DeltaPageWriter: Sendable {
    /// A table's shape, as the page needs it.
    public struct Table: Sendable {
        /// The table's name.
        public var name: String
        /// Its key fields, in key order.
        public var keyFields: [String]
        /// Its declared fields other than the key (empty for a property bag): listed as `null`
        /// when a row's stored fields leave them out.
        public var fields: [String]

        /// A table of the page.
        public init(name: String, keyFields: [String], fields: [String]) {
            self.name = name
            self.keyFields = keyFields
            self.fields = fields
        }
    }

    private let tables: [Table]
    /// Per table, its names as bytes, made once: a page compares and writes them for every row.
    private let shapes: [Shape]
    /// Per table, the upserts and the deletes written so far, each a comma-separated list.
    private var upserts: [JSONWriter]
    private var deletes: [JSONWriter]

    private struct Shape: Sendable {
        /// The key fields' names (UTF-8), and each as the member's start it is written as:
        /// `"name":`, after a comma from the second on.
        var keyNames: [[UInt8]]
        var keyMembers: [[UInt8]]
        /// The declared fields' names (UTF-8), and each as the member a row that leaves it out
        /// gets: `,"name":null`.
        var fieldNames: [[UInt8]]
        var nullMembers: [[UInt8]]

        init(_ t: Table) {
            func utf8(_ s: String) -> [UInt8] { Array(s.utf8) }
            func quoted(_ s: String) -> [UInt8] { var w = JSONWriter(capacity: s.utf8.count + 2); w.string(s); return w.bytes }
            keyNames = t.keyFields.map(utf8)
            keyMembers = t.keyFields.enumerated().map { i, name in (i > 0 ? [UInt8(ascii: ",")] : []) + quoted(name) + [UInt8(ascii: ":")] }
            fieldNames = t.fields.map(utf8)
            nullMembers = t.fields.map { [UInt8(ascii: ",")] + quoted($0) + Array(":null".utf8) }
        }
    }

    /// A page of rows of `tables`, in the order the page lists them.
    public init(tables: [Table]) {
        self.tables = tables
        shapes = tables.map(Shape.init)
        upserts = tables.map { _ in JSONWriter(capacity: 0) }
        deletes = tables.map { _ in JSONWriter(capacity: 0) }
    }

    /// Adds an upsert of a row of `tables[table]`: `key` is the JSON array of its key values,
    /// `fields` the JSON object of its other fields, both as the wire format writes them.
    ///
    /// - Throws: `StrataError` `malformedInput` when either is not valid JSON of that shape (a
    ///   key of the wrong length, a value that is not one); nothing is added then.
    /// - Complexity: O(n) in the bytes of the row.
    public mutating func upsert(table: Int, key: String, fields: String, version: Int64, timestamp: Double) throws(StrataError) {
        var key = key, fields = fields
        let result: Result<Void, StrataError> = key.withUTF8 { k in
            fields.withUTF8 { f in
                do throws(StrataError) {
                    return .success(try upsert(table: table, key: UnsafeRawBufferPointer(k), fields: UnsafeRawBufferPointer(f), version: version, timestamp: timestamp))
                } catch { return .failure(error) }
            }
        }
        try result.get()
    }

    /// Adds an upsert as ``upsert(table:key:fields:version:timestamp:)-(_,String,_,_,_)`` does, from
    /// the UTF-8 bytes of the key and the fields (a server hands over its result rows' bytes
    /// without making strings of them).
    public mutating func upsert(table: Int, key: UnsafeRawBufferPointer, fields: UnsafeRawBufferPointer, version: Int64, timestamp: Double) throws(StrataError) {
        // Written in place; a row that turns out malformed is cut off again.
        let mark = upserts[table].bytes.count
        do throws(WireCodecError) {
            try Self.writeUpsert(shapes[table], tables[table], key, fields, version, timestamp, into: &upserts[table])
        } catch {
            upserts[table].truncate(to: mark)
            throw StrataError(.malformedInput, "a stored row of table '\(tables[table].name)' is not valid wire JSON: \(error.message)")
        }
    }

    private static func writeUpsert(
        _ shape: Shape, _ t: Table, _ k: UnsafeRawBufferPointer, _ f: UnsafeRawBufferPointer, _ version: Int64, _ timestamp: Double,
        into out: inout JSONWriter
    ) throws(WireCodecError) {
        if !out.bytes.isEmpty { out.byte(UInt8(ascii: ",")) }
        out.raw(#"{"fields":{"#)
        var r = JSONReader(k)
        try r.beginDocument()
        var i = 0
        if try r.beginArray() {
            repeat {
                let start = r.offset
                try r.skipValue()
                if i < shape.keyMembers.count {
                    shape.keyMembers[i].withUnsafeBytes { out.append($0) }
                    out.append(UnsafeRawBufferPointer(rebasing: k[start..<r.offset]), trimmingWhitespace: true)
                }
                i += 1
            } while try r.nextElement()
        }
        try r.endDocument()
        guard i == shape.keyMembers.count else { throw WireCodecError("the key has \(i) values; table '\(t.name)' has \(shape.keyMembers.count) key fields") }

        // Which declared fields the row lists: a bit each (a table of more than 64 fields, rare,
        // takes an array).
        var listedBits: UInt64 = 0
        var listedMore = shape.fieldNames.count > 64 ? [Bool](repeating: false, count: shape.fieldNames.count) : []
        var fr = JSONReader(f)
        try fr.beginDocument()
        if try fr.beginObject() {
            repeat {
                let start = fr.offset
                let name = try fr.readKey()
                let (isKey, declared) = fr.withBytes(of: name) { n in (index(of: n, in: shape.keyNames) != nil, index(of: n, in: shape.fieldNames)) }
                if let d = declared {
                    if d < 64 { listedBits |= 1 << UInt64(d) } else { listedMore[d] = true }
                }
                try fr.skipValue()
                if !isKey {
                    out.byte(UInt8(ascii: ","))
                    out.append(UnsafeRawBufferPointer(rebasing: f[start..<fr.offset]), trimmingWhitespace: true)
                }
            } while try fr.nextMember()
        }
        try fr.endDocument()
        for d in shape.nullMembers.indices {
            let listed = d < 64 ? listedBits & (1 << UInt64(d)) != 0 : listedMore[d]
            if !listed { shape.nullMembers[d].withUnsafeBytes { out.append($0) } }
        }
        out.raw(#"},"timestamp":"#)
        do { try out.double(timestamp) } catch { out.raw("0") }
        out.raw(#","version":""#)
        out.int(version)
        out.raw(#""}"#)
    }

    /// The position of the name whose bytes are `n` (names compare by their bytes).
    @inline(__always)
    private static func index(of n: UnsafeRawBufferPointer, in names: [[UInt8]]) -> Int? {
        for (i, name) in names.enumerated() where name.count == n.count {
            if name.withUnsafeBytes({ $0.count == 0 || memcmp($0.baseAddress!, n.baseAddress!, n.count) == 0 }) { return i }
        }
        return nil
    }

    /// Adds a delete of the row of `tables[table]` whose key is the JSON array `key`.
    ///
    /// - Throws: `StrataError` `malformedInput` when `key` is not a JSON array; nothing is
    ///   added then.
    /// - Complexity: O(n) in the bytes of the key.
    public mutating func delete(table: Int, key: String) throws(StrataError) {
        var key = key
        let result: Result<Void, StrataError> = key.withUTF8 { k in
            do throws(StrataError) { return .success(try delete(table: table, key: UnsafeRawBufferPointer(k))) } catch { return .failure(error) }
        }
        try result.get()
    }

    /// Adds a delete as ``delete(table:key:)-(_,String)`` does, from the UTF-8 bytes of the key.
    public mutating func delete(table: Int, key k: UnsafeRawBufferPointer) throws(StrataError) {
        do throws(WireCodecError) {
            var r = JSONReader(k)
            try r.beginDocument()
            guard r.nextKind() == .array else { throw r.syntaxError("'['") }
            try r.skipValue()
            try r.endDocument()
            if !deletes[table].bytes.isEmpty { deletes[table].byte(UInt8(ascii: ",")) }
            deletes[table].append(k, trimmingWhitespace: true)
        } catch {
            throw StrataError(.malformedInput, "a stored key of table '\(tables[table].name)' is not valid wire JSON: \(error.message)")
        }
    }

    /// The page's bytes. With `listingEveryTable` (a snapshot), a table without rows is listed
    /// empty, so that a client deletes its rows; otherwise only tables with rows are listed.
    public func finish(since: String?, anchor: String, mode: ServerDelta.Mode, listingEveryTable: Bool = false) -> [UInt8] {
        var out = JSONWriter(capacity: upserts.reduce(256) { $0 + $1.bytes.count } + deletes.reduce(0) { $0 + $1.bytes.count })
        out.raw(#"{"anchor":"#)
        out.string(anchor)
        out.raw(#","mode":"#)
        out.string(mode.rawValue)
        if let since {
            out.raw(#","since":"#)
            out.string(since)
        }
        out.raw(#","tables":["#)
        var first = true
        for (i, t) in tables.enumerated() where listingEveryTable || !upserts[i].bytes.isEmpty || !deletes[i].bytes.isEmpty {
            if !first { out.byte(UInt8(ascii: ",")) }
            first = false
            out.raw(#"{"deletes":["#)
            deletes[i].bytes.withUnsafeBytes { out.append($0) }
            out.raw(#"],"table":"#)
            out.string(t.name)
            out.raw(#","upserts":["#)
            upserts[i].bytes.withUnsafeBytes { out.append($0) }
            out.raw("]}")
        }
        out.raw("]}")
        return out.bytes
    }
}

extension JSONWriter {
    /// Appends bytes of JSON as they are (trailing whitespace left out, when asked).
    mutating func append(_ raw: UnsafeRawBufferPointer, trimmingWhitespace: Bool = false) {
        var end = raw.count
        if trimmingWhitespace {
            while end > 0, raw[end - 1] == 0x20 || raw[end - 1] == 0x0A || raw[end - 1] == 0x0D || raw[end - 1] == 0x09 { end -= 1 }
        }
        append(UnsafeRawBufferPointer(rebasing: raw[0..<end]))
    }
}

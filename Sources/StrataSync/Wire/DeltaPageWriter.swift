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
    /// Per table, the upserts and the deletes written so far, each a comma-separated list.
    private var upserts: [JSONWriter]
    private var deletes: [JSONWriter]

    /// A page of rows of `tables`, in the order the page lists them.
    public init(tables: [Table]) {
        self.tables = tables
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
        let t = tables[table]
        var out = JSONWriter(capacity: key.utf8.count + fields.utf8.count + 64)
        out.raw(#"{"fields":{"#)
        do throws(WireCodecError) {
            try Self.withBytes(key) { (k) throws(WireCodecError) in
                var r = JSONReader(k)
                try r.beginDocument()
                var i = 0
                if try r.beginArray() {
                    repeat {
                        let start = r.offset
                        try r.skipValue()
                        if i < t.keyFields.count {
                            if i > 0 { out.byte(UInt8(ascii: ",")) }
                            out.string(t.keyFields[i])
                            out.byte(UInt8(ascii: ":"))
                            out.append(UnsafeRawBufferPointer(rebasing: k[start..<r.offset]), trimmingWhitespace: true)
                        }
                        i += 1
                    } while try r.nextElement()
                }
                try r.endDocument()
                guard i == t.keyFields.count else { throw WireCodecError("the key has \(i) values; table '\(t.name)' has \(t.keyFields.count) key fields") }
            }
            var listed = [Bool](repeating: false, count: t.fields.count)
            try Self.withBytes(fields) { (f) throws(WireCodecError) in
                var r = JSONReader(f)
                try r.beginDocument()
                if try r.beginObject() {
                    repeat {
                        let start = r.offset
                        let name = try r.readKey()
                        let isKey = r.withBytes(of: name) { n in t.keyFields.contains { $0.utf8.elementsEqual(n) } }
                        if let i = r.withBytes(of: name, { n in t.fields.firstIndex { $0.utf8.elementsEqual(n) } }) { listed[i] = true }
                        try r.skipValue()
                        if !isKey {
                            out.byte(UInt8(ascii: ","))
                            out.append(UnsafeRawBufferPointer(rebasing: f[start..<r.offset]), trimmingWhitespace: true)
                        }
                    } while try r.nextMember()
                }
                try r.endDocument()
            }
            for (i, name) in t.fields.enumerated() where !listed[i] {
                out.byte(UInt8(ascii: ","))
                out.string(name)
                out.raw(":null")
            }
        } catch {
            throw StrataError(.malformedInput, "a stored row of table '\(t.name)' is not valid wire JSON: \(error.message)")
        }
        out.raw(#"},"timestamp":"#)
        do { try out.double(timestamp) } catch { out.raw("0") }
        out.raw(#","version":""#)
        out.int(version)
        out.raw(#""}"#)
        if !upserts[table].bytes.isEmpty { upserts[table].byte(UInt8(ascii: ",")) }
        out.bytes.withUnsafeBytes { upserts[table].append($0) }
    }

    /// Adds a delete of the row of `tables[table]` whose key is the JSON array `key`.
    ///
    /// - Throws: `StrataError` `malformedInput` when `key` is not a JSON array; nothing is
    ///   added then.
    /// - Complexity: O(n) in the bytes of the key.
    public mutating func delete(table: Int, key: String) throws(StrataError) {
        do throws(WireCodecError) {
            try Self.withBytes(key) { (k) throws(WireCodecError) in
                var r = JSONReader(k)
                try r.beginDocument()
                guard r.nextKind() == .array else { throw r.syntaxError("'['") }
                try r.skipValue()
                try r.endDocument()
                if !deletes[table].bytes.isEmpty { deletes[table].byte(UInt8(ascii: ",")) }
                deletes[table].append(k, trimmingWhitespace: true)
            }
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

    /// Calls `body` with the UTF-8 bytes of `text`.
    private static func withBytes<R>(_ text: String, _ body: (UnsafeRawBufferPointer) throws(WireCodecError) -> R) throws(WireCodecError) -> R {
        var text = text
        let result: Result<R, WireCodecError> = text.withUTF8 { b in
            do throws(WireCodecError) { return .success(try body(UnsafeRawBufferPointer(b))) } catch { return .failure(error) }
        }
        return try result.get()
    }
}

extension JSONWriter {
    /// Appends bytes of JSON as they are (trailing whitespace left out, when asked).
    mutating func append(_ raw: UnsafeRawBufferPointer, trimmingWhitespace: Bool = false) {
        var end = raw.count
        if trimmingWhitespace {
            while end > 0, [0x20, 0x0A, 0x0D, 0x09].contains(raw[end - 1]) { end -= 1 }
        }
        append(UnsafeRawBufferPointer(rebasing: raw[0..<end]))
    }
}

import Foundation

/// A table as the store knows it: its schema plus the stable numeric ids of the table and of
/// each field, which is what records store instead of names.
struct TableInfo: Sendable {
    let id: UInt32
    var schema: TableSchema
    /// Field names indexed by field id. Ids are never reused, so old records stay readable.
    var fieldNames: [String]
    var fieldIDs: [String: Int]
    /// The declared definition per field id (`nil` for property-bag fields).
    var definitions: [FieldDefinition?]
    /// Field ids of the primary key, in key order.
    var keyFieldIDs: [Int]
    /// The table's secondary indexes.
    var indexes: [IndexInfo] = []
    /// The named views over the table.
    var views: [ViewInfo] = []
    /// Ids of dropped fields: their names stay readable in old operations, but no longer resolve.
    var dropped: Set<Int> = []

    init(id: UInt32, schema: TableSchema, fieldNames: [String], dropped: Set<Int> = []) {
        self.id = id
        self.schema = schema
        self.fieldNames = fieldNames
        self.dropped = dropped
        var ids: [String: Int] = [:]
        for (i, n) in fieldNames.enumerated() where !dropped.contains(i) { ids[n] = i }
        self.fieldIDs = ids
        self.definitions = fieldNames.enumerated().map { dropped.contains($0.offset) ? nil : schema.field($0.element) }
        self.keyFieldIDs = schema.primaryKey.map { ids[$0]! }
    }

    var name: String { schema.name }
    var isPropertyBag: Bool { schema.mode == .propertyBag }

    /// The id of the live field called `name`, or `nil`. Names compare by their UTF-8 bytes: a
    /// name that Swift's `==` calls equal to a field's but in another Unicode form is not that
    /// field (``twin(of:)`` finds it, for the error). A table never holds two such names.
    ///
    /// Every edit resolves each field it names. A table of up to 16 fields compares names
    /// instead of hashing one: two short names compare in a few instructions (Swift keeps up to
    /// 15 UTF-8 bytes inline), a hash costs a few hundred.
    @inline(__always)
    func fieldID(_ name: String) -> Int? {
        guard fieldNames.count <= 16 else {
            // `fieldIDs` hashes as `==` compares: the entry found may be the name's twin.
            guard let id = fieldIDs[name], fieldNames[id].sameBytes(name) else { return nil }
            return id
        }
        // From the end, as `fieldIDs` is built: a name dropped and added again has its live id last.
        // The same string first (`sameRepresentation`, a few instructions a name), then the
        // same bytes: a table's live names differ in their bytes, so both find the same field.
        var i = fieldNames.count - 1
        while i >= 0 {
            if fieldNames[i].sameRepresentation(name) && (dropped.isEmpty || !dropped.contains(i)) { return i }
            i -= 1
        }
        i = fieldNames.count - 1
        while i >= 0 {
            if fieldNames[i].sameBytes(name) && (dropped.isEmpty || !dropped.contains(i)) { return i }
            i -= 1
        }
        return nil
    }

    /// The live field name that Swift's `==` calls equal to `name` but whose bytes differ: `name`
    /// in another Unicode form. Not on the path of an edit that names its fields as the table does.
    func twin(of name: String) -> String? {
        guard let id = fieldIDs[name], !fieldNames[id].sameBytes(name) else { return nil }
        return fieldNames[id]
    }

    /// `fieldNotFound` for `name`: in another Unicode form than a field of the table (``twin(of:)``),
    /// or unknown (`detail` adds to that message, e.g. the table's fields).
    func unknownField(_ name: String, detail: String = "") -> StrataError {
        if let twin = twin(of: name) { return StrataError(.fieldNotFound, RowRule.twinMessage(table: self.name, name, twin)) }
        return StrataError(.fieldNotFound, "table '\(self.name)' has no field '\(name)'\(detail)")
    }

    /// Adds a property-bag field, unless the table has the name in another Unicode form: a
    /// table's names never include two that Swift's `==` calls equal, so that a row's fields
    /// stay a `[String: Value]` (``Row/values``) and a lookup by `==` finds at most one.
    mutating func addNewField(_ name: String) throws(StrataError) -> Int {
        if let twin = twin(of: name) {
            throw StrataError(.fieldNotFound, "table '\(self.name)' cannot take the field '\(name)' (\(name.codePoints)): it has the field '\(twin)' (\(twin.codePoints)), which differs from it only in Unicode form; Strata compares field names by their bytes, and a table holds one of two such names: use the table's form")
        }
        return addField(name)
    }

    func isKeyField(_ id: Int) -> Bool { keyFieldIDs.contains(id) }

    /// The field's name, or a placeholder for an id the catalog does not know (a damaged store).
    func fieldName(_ id: Int) -> String { id < fieldNames.count ? fieldNames[id] : "#\(id)" }

    /// Adds a property-bag field and returns its new id.
    mutating func addField(_ name: String) -> Int {
        let id = fieldNames.count
        fieldNames.append(name)
        fieldIDs[name] = id
        definitions.append(nil)
        return id
    }
}

/// The schema catalog: every table with its ids. Stored as JSON under the `catalog` meta key
/// (it changes rarely and is never on the per-edit path), with a version number under
/// `catalogVersion` so that every transaction can cheaply tell whether its cached copy is current.
struct Catalog: Sendable {
    var version: UInt64 = 0
    var nextTableID: UInt32 = 1
    var nextIndexID: UInt32 = 1
    var tables: [UInt32: TableInfo] = [:]
    var tableIDs: [String: UInt32] = [:]

    func table(named name: String) throws(StrataError) -> TableInfo {
        // `tableIDs` hashes as `==` compares; a table's name is its bytes.
        guard let id = tableIDs[name], let t = tables[id], t.schema.name.sameBytes(name) else {
            let known = tableIDs.keys.sorted().joined(separator: ", ")
            throw StrataError(.tableNotFound, "no table named '\(name)' (tables: \(known.isEmpty ? "none" : known))")
        }
        return t
    }

    func table(id: UInt32) throws(StrataError) -> TableInfo {
        guard let t = tables[id] else { throw StrataError(.corruptRecord, "a record names table id \(id), which the catalog does not have") }
        return t
    }

    mutating func add(_ schema: TableSchema) -> TableInfo {
        let info = TableInfo(id: nextTableID, schema: schema, fieldNames: schema.fields.map(\.name))
        nextTableID += 1
        tables[info.id] = info
        tableIDs[schema.name] = info.id
        return info
    }

    // MARK: Persistence

    private struct Stored: Codable {
        struct Table: Codable {
            var id: UInt32
            var schema: TableSchema
            var fieldNames: [String]
            var indexes: [IndexInfo]?
            var views: [ViewInfo]?
            var dropped: [Int]?
        }
        var nextTableID: UInt32
        var nextIndexID: UInt32?
        var tables: [Table]
    }

    func encoded() throws -> [UInt8] {
        let stored = Stored(
            nextTableID: nextTableID,
            nextIndexID: nextIndexID,
            tables: tables.values.sorted { $0.id < $1.id }.map { .init(id: $0.id, schema: $0.schema, fieldNames: $0.fieldNames, indexes: $0.indexes, views: $0.views, dropped: $0.dropped.sorted()) }
        )
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return Array(try encoder.encode(stored))
    }

    init() {}

    init(decoding bytes: UnsafeRawBufferPointer, version: UInt64) throws(StrataError) {
        let stored: Stored
        do {
            stored = try JSONDecoder().decode(Stored.self, from: Data(bytes))
        } catch {
            throw StrataError(.corruptRecord, "the schema catalog cannot be read: \(error)")
        }
        // Ids are handed out by `+= 1`: the next ones must have room.
        let nextIndex = stored.nextIndexID ?? 1
        guard stored.nextTableID < UInt32.max, nextIndex < UInt32.max else {
            throw StrataError(.corruptRecord, "the schema catalog (meta entry 'catalog') is damaged: its next table id \(stored.nextTableID) or next index id \(nextIndex) is out of range")
        }
        self.version = version
        self.nextTableID = stored.nextTableID
        self.nextIndexID = stored.nextIndexID ?? 1
        for t in stored.tables {
            var info = TableInfo(id: t.id, schema: t.schema, fieldNames: t.fieldNames, dropped: Set(t.dropped ?? []))
            info.indexes = t.indexes ?? []
            info.views = t.views ?? []
            tables[t.id] = info
            tableIDs[t.schema.name] = t.id
        }
    }
}

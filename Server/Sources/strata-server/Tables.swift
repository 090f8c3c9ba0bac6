import Foundation
import Strata
import StrataSync

/// The tables the server keeps, read from a JSON file that mirrors the client's `TableSchema`:
///
/// ```json
/// {"tables": [{"name": "tasks", "primaryKey": ["id"], "serverAssignedKey": false,
///              "fields": [{"name": "id", "type": "int"}, {"name": "title", "type": "string"},
///                         {"name": "notes", "type": "string", "nullable": true},
///                         {"name": "done", "type": "bool", "default": {"bool": false}}]}],
///  "associations": [{"child": "items", "field": "list", "parent": "lists"}]}
/// ```
///
/// A table with `"mode": "propertyBag"` lists only its key fields and takes any other field.
struct TableConfig: Codable, Sendable {
    struct Field: Codable, Sendable {
        var name: String
        var type: ValueType
        var nullable: Bool?
        var `default`: Value?
    }

    struct Table: Codable, Sendable {
        var name: String
        var mode: TableSchema.Mode?
        var primaryKey: [String]
        var fields: [Field]
        /// Inserts get a key drawn from the server's key sequence, returned as `newKey` (a single
        /// int key field only).
        var serverAssignedKey: Bool?

        var isPropertyBag: Bool { mode == .propertyBag }
        /// The field called `name`, compared by its UTF-8 bytes (another Unicode form of a
        /// field's name is not that field, as in a client's store).
        func field(_ name: String) -> Field? { fields.first { $0.name.utf8.elementsEqual(name.utf8) } }
        /// Whether `name` is a key field, compared by its bytes.
        func isKeyField(_ name: String) -> Bool { primaryKey.contains { $0.utf8.elementsEqual(name.utf8) } }
    }

    var tables: [Table]
    var associations: [Association]?

    /// Reads and checks a tables file.
    static func load(path: String) throws -> TableConfig {
        let data: Data
        do { data = try Data(contentsOf: URL(fileURLWithPath: path)) } catch {
            throw ServerError("cannot read the tables file \(path): \(error.localizedDescription)")
        }
        let config: TableConfig
        do { config = try JSONDecoder().decode(TableConfig.self, from: data) } catch {
            throw ServerError("the tables file \(path) is not valid: \(error)")
        }
        try config.validate()
        return config
    }

    func validate() throws {
        var names = Set<String>()
        for t in tables {
            guard !t.name.isEmpty, names.insert(t.name).inserted else { throw ServerError("table '\(t.name)' is listed twice or has no name") }
            guard !t.primaryKey.isEmpty else { throw ServerError("table '\(t.name)' needs a primary key") }
            // The clients' rule for a table's names (`TableSchema`): no name twice, and no two
            // that Swift's `==` calls equal (NFC and NFD forms), which a client refuses.
            var fieldNames = Set<String>()
            for f in t.fields where !fieldNames.insert(f.name).inserted {
                throw ServerError("table '\(t.name)': field '\(f.name)' is listed twice, or in two Unicode forms (field names compare by their bytes, and a table holds one of two such names)")
            }
            for k in t.primaryKey where t.field(k) == nil { throw ServerError("table '\(t.name)': key field '\(k)' is not among its fields") }
            if t.serverAssignedKey == true, t.primaryKey.count != 1 || t.field(t.primaryKey[0])?.type != .int {
                throw ServerError("table '\(t.name)': a server-assigned key needs a single int key field")
            }
        }
        for a in associations ?? [] where !names.contains(a.child) || !names.contains(a.parent) {
            throw ServerError("association \(a.child).\(a.field) → \(a.parent) names an unknown table")
        }
    }

    /// The table called `name`, compared by its UTF-8 bytes: two names that Swift's `==` calls
    /// equal (NFC and NFD forms) are two names, as in a client's store.
    subscript(name: String) -> Table? { tables.first { $0.name.utf8.elementsEqual(name.utf8) } }
}

/// A fatal configuration or start-up problem, printed as one line.
struct ServerError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A request the server refuses, with the HTTP status and a message for the client.
struct RequestError: Error {
    var status: Int
    var code: String
    var message: String
    /// With a 409 `batchIDReused`: the highest batch number stored for the client.
    var highestBatchNumber: UInt64?
    init(_ status: Int, _ code: String, _ message: String) {
        self.status = status
        self.code = code
        self.message = message
    }
    static func bad(_ message: String) -> RequestError { RequestError(400, "badRequest", message) }
}

extension TableConfig.Table {
    /// The table as a client declares it: what `RowRule` checks rows against.
    var schema: TableSchema {
        TableSchema(
            name: name, mode: mode ?? .fixed,
            fields: fields.map { FieldDefinition($0.name, $0.type, nullable: $0.nullable ?? false, default: $0.default) },
            primaryKey: primaryKey)
    }
}

/// A table of the tables file, with its schema built once: every row of every batch is checked
/// against it.
struct ServerTable: Sendable {
    let config: TableConfig.Table
    let schema: TableSchema

    init(_ config: TableConfig.Table) {
        self.config = config
        self.schema = config.schema
    }

    var name: String { config.name }
    var primaryKey: [String] { config.primaryKey }
    func isKeyField(_ name: String) -> Bool { config.isKeyField(name) }
    var fields: [TableConfig.Field] { config.fields }
    var isPropertyBag: Bool { config.isPropertyBag }
    var serverAssignedKey: Bool { config.serverAssignedKey == true }

    /// Checks and normalizes a value for `field` by the clients' own rule (`RowRule`: the field
    /// exists, its type, nullability, finiteness; an int for a double field becomes a double, as
    /// the client stores it), so that the server takes only what every client can store.
    func check(_ value: Value, field name: String, row: String) throws(RequestError) -> Value {
        do {
            return try RowRule.admit(value, field: name, of: schema)
        } catch {
            throw .bad("\(row): \(error.message)")
        }
    }

    /// The most bytes a row's table name and key (its JSON, as stored) take together.
    /// PostgreSQL refuses an index entry over about 2,700 bytes (a third of a page), and
    /// `strata_rows` is indexed on (table, key). `RowRule.maxKeyBytes` bounds a key well below
    /// this, except one made mostly of control characters, which JSON writes 6 bytes each: such
    /// a key is refused here rather than fail inside the batch's transaction, for good.
    static let maxStoredKeyBytes = 2000

    /// The row key as stored (normalized values), checked by the clients' rule (`RowRule`: key
    /// fields, types, encoded size) and against ``maxStoredKeyBytes``.
    func checkKey(_ key: RowKey, row: String) throws(RequestError) -> RowKey {
        let checked: RowKey
        do {
            checked = try RowRule.admit(key: key, of: schema)
        } catch {
            throw .bad("\(row): \(error.message)")
        }
        let size = name.utf8.count + ((try? WireFormat.encode(checked.values).count) ?? 0)
        guard size <= Self.maxStoredKeyBytes else {
            throw .bad("\(row): the key takes \(size) bytes as the server stores it, with its table name; the server takes at most \(Self.maxStoredKeyBytes)")
        }
        return checked
    }
}

extension Dictionary where Key == String {
    /// The value under `name` compared by its UTF-8 bytes: `self[name]` hashes and compares as
    /// Swift's `==` does, and finds an entry under `name` in another Unicode form too.
    subscript(bytes name: String) -> Value? {
        guard let i = index(forKey: name), self[i].key.utf8.elementsEqual(name.utf8) else { return nil }
        return self[i].value
    }
}

import Foundation
import Strata

/// The tables file: one description of the tables, shared by `strata-server` (which runs with
/// it), the `strata` CLI (`strata create`, `strata sync --tables`) and apps (which create their
/// store's tables from it, bundled as a resource), so the schema is written once.
///
/// ```json
/// {"tables": [{"name": "tasks", "primaryKey": ["id"],
///              "fields": [{"name": "id", "type": "int"}, {"name": "title", "type": "string"},
///                         {"name": "notes", "type": "string", "nullable": true},
///                         {"name": "done", "type": "bool", "default": {"bool": false}}]},
///             {"name": "comments", "primaryKey": ["id"], "serverAssignedKey": true,
///              "fields": [{"name": "id", "type": "int"}, {"name": "task", "type": "int"}]},
///             {"name": "settings", "mode": "propertyBag", "primaryKey": ["name"],
///              "fields": [{"name": "name", "type": "string"}]}],
///  "associations": [{"child": "comments", "field": "task", "parent": "tasks"}]}
/// ```
///
/// ```swift
/// let file = try TablesFile(contentsOf: Bundle.main.url(forResource: "tables", withExtension: "json")!)
/// try file.createTables(in: store)     // the tables, and the associations SyncClient orders uploads by
/// ```
public struct TablesFile: Sendable, Hashable, Codable {
    /// One typed field of a table.
    public struct Field: Sendable, Hashable, Codable {
        /// The field's name.
        public var name: String
        /// The type of its values.
        public var type: ValueType
        /// Whether it may hold `null`; absent means not.
        public var nullable: Bool?
        /// The value an insert stores when the field is not given (`{"int": 0}`).
        public var `default`: Value?

        /// A field as the file lists it.
        public init(name: String, type: ValueType, nullable: Bool? = nil, default: Value? = nil) {
            self.name = name
            self.type = type
            self.nullable = nullable
            self.default = `default`
        }
    }

    /// One table.
    public struct Table: Sendable, Hashable, Codable {
        /// The table's name.
        public var name: String
        /// `propertyBag` for a table of any fields (it lists only its key fields); absent means fixed.
        public var mode: TableSchema.Mode?
        /// The primary key's fields, in order.
        public var primaryKey: [String]
        /// The declared fields.
        public var fields: [Field]
        /// Whether inserts get their key from the server, returned as `newKey` (a single int key
        /// field only).
        public var serverAssignedKey: Bool?

        /// A table as the file lists it.
        public init(name: String, mode: TableSchema.Mode? = nil, primaryKey: [String], fields: [Field], serverAssignedKey: Bool? = nil) {
            self.name = name
            self.mode = mode
            self.primaryKey = primaryKey
            self.fields = fields
            self.serverAssignedKey = serverAssignedKey
        }

        /// Whether the table takes any field.
        public var isPropertyBag: Bool { mode == .propertyBag }

        /// The declared field called `name`, compared by its bytes.
        public func field(_ name: String) -> Field? { fields.first { $0.name.utf8.elementsEqual(name.utf8) } }

        /// The table as a store declares it.
        public var schema: TableSchema {
            TableSchema(
                name: name, mode: mode ?? .fixed,
                fields: fields.map { FieldDefinition($0.name, $0.type, nullable: $0.nullable ?? false, default: $0.default) },
                primaryKey: primaryKey)
        }
    }

    /// The tables, in the file's order.
    public var tables: [Table]
    /// References between the tables, which order uploads (parents first) and follow
    /// server-assigned keys.
    public var associations: [Association]

    /// A tables file of these tables and associations (not checked until ``validate()``).
    public init(tables: [Table], associations: [Association] = []) {
        self.tables = tables
        self.associations = associations
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        tables = try c.decode([Table].self, forKey: .tables)
        associations = try c.decodeIfPresent([Association].self, forKey: .associations) ?? []
    }

    /// Reads and checks the tables file at `url`.
    ///
    /// - Throws: `StrataError` `io` when the file cannot be read, `malformedInput` when it is
    ///   not a valid tables file (the message names the file and what is wrong).
    public init(contentsOf url: URL) throws(StrataError) {
        let data: Data
        do { data = try Data(contentsOf: url) } catch {
            throw StrataError(.io, "cannot read the tables file '\(url.path)': \(error.localizedDescription)", cause: error)
        }
        do {
            try self.init(json: data)
        } catch {
            throw StrataError(error.code, "the tables file '\(url.path)' is not valid: \(error.message)")
        }
    }

    /// Reads and checks a tables file's JSON.
    ///
    /// - Throws: `StrataError` `malformedInput` when it is not a valid tables file.
    public init(json: Data) throws(StrataError) {
        do {
            self = try JSONDecoder().decode(TablesFile.self, from: json)
        } catch {
            throw StrataError(.malformedInput, "\(error)")
        }
        try validate()
    }

    /// Checks that the tables hold together: distinct non-empty names, a primary key among each
    /// table's fields, a valid schema (names, types, defaults: what a store accepts), a
    /// server-assigned key only on a single int key field, and associations between listed
    /// tables through a declared field (or any field of a property bag).
    ///
    /// - Throws: `StrataError` `malformedInput` naming the table or association.
    public func validate() throws(StrataError) {
        var names = Set<[UInt8]>()
        for t in tables {
            guard !t.name.isEmpty, names.insert(Array(t.name.utf8)).inserted else {
                throw StrataError(.malformedInput, "table '\(t.name)' is listed twice or has no name")
            }
            guard !t.primaryKey.isEmpty else { throw StrataError(.malformedInput, "table '\(t.name)' needs a primary key") }
            for k in t.primaryKey where t.field(k) == nil {
                throw StrataError(.malformedInput, "table '\(t.name)': key field '\(k)' is not among its fields")
            }
            if t.serverAssignedKey == true, t.primaryKey.count != 1 || t.field(t.primaryKey[0])?.type != .int {
                throw StrataError(.malformedInput, "table '\(t.name)': a server-assigned key needs a single int key field")
            }
            do { try t.schema.validate() } catch {
                throw StrataError(.malformedInput, error.message)
            }
        }
        for a in associations {
            guard let child = self[table: a.child], self[table: a.parent] != nil, child.isPropertyBag || child.field(a.field) != nil else {
                throw StrataError(.malformedInput, "association \(a.child).\(a.field) → \(a.parent) names a table or field the file does not define")
            }
        }
    }

    /// The table called `name`, compared by its UTF-8 bytes: two names that Swift's `==` calls
    /// equal (NFC and NFD forms) are two names, as in a store.
    public subscript(table name: String) -> Table? { tables.first { $0.name.utf8.elementsEqual(name.utf8) } }

    /// The tables as a store declares them.
    public var schemas: [TableSchema] { tables.map(\.schema) }

    /// Creates the file's tables in `store` and stores its associations with it, in one write
    /// transaction: a ``SyncClient`` given no associations orders uploads by them. A table that
    /// exists with the same definition is left as it is; one with another definition is an
    /// error (`tableExists`, saying how to change it), and nothing is created.
    ///
    /// - Throws: `StrataError` `tableExists`, `invalidSchema`.
    public func createTables(in store: Store) throws(StrataError) {
        try strataErrors {
            try store.write { tx in
                for schema in schemas { try tx.createTable(schema) }
                try tx.setAssociations(associations)
            }
        }
    }
}

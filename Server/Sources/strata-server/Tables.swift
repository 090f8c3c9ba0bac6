import Foundation
import Strata
import StrataSync

/// The tables the server keeps: the tables file, read and checked by StrataSync's `TablesFile`,
/// the one loader the CLI and apps use too (its format is in docs/server.md).
typealias TableConfig = TablesFile

extension TablesFile {
    /// Reads and checks the tables file at `path`; a problem is a fatal start-up error.
    static func load(path: String) throws -> TablesFile {
        do {
            return try TablesFile(contentsOf: URL(fileURLWithPath: path))
        } catch {
            throw ServerError(error.message)
        }
    }
}

extension TablesFile.Table {
    /// Whether `name` is a key field, compared by its bytes.
    func isKeyField(_ name: String) -> Bool { primaryKey.contains { $0.utf8.elementsEqual(name.utf8) } }
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

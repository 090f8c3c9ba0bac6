import Foundation

/// A JSON scalar, the bridge between rows and `Codable` records. Records are a convenience
/// beside the `Row` API and are not on the write path's hot loop.
enum JSONScalar: Codable {
    case null, bool(Bool), int(Int64), double(Double), string(String)

    init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null; return }
        if let b = try? c.decode(Bool.self) { self = .bool(b); return }
        if let i = try? c.decode(Int64.self) { self = .int(i); return }
        if let d = try? c.decode(Double.self) { self = .double(d); return }
        if let s = try? c.decode(String.self) { self = .string(s); return }
        throw DecodingError.dataCorruptedError(in: c, debugDescription: "records hold scalar fields only: nested objects and arrays have no column to go to")
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .int(let i): try c.encode(i)
        case .double(let d): try c.encode(d)
        case .string(let s): try c.encode(s)
        }
    }
}

enum RecordCoding {
    static func encoder() -> JSONEncoder {
        let e = JSONEncoder()
        e.dateEncodingStrategy = .secondsSince1970
        e.dataEncodingStrategy = .base64
        return e
    }

    static func decoder() -> JSONDecoder {
        let d = JSONDecoder()
        d.dateDecodingStrategy = .secondsSince1970
        d.dataDecodingStrategy = .base64
        return d
    }

    /// A record's fields as row values, typed by the table's field definitions where it has them.
    static func fields<T: Encodable>(of record: T, for t: TableInfo) throws -> FieldValues {
        let scalars: [String: JSONScalar]
        do {
            scalars = try decoder().decode([String: JSONScalar].self, from: try encoder().encode(record))
        } catch {
            throw StrataError(.typeMismatch, "a \(T.self) cannot be stored in table '\(t.name)': \(error)")
        }
        var pairs: [(String, Value)] = []
        for (name, scalar) in scalars.sorted(by: { $0.key < $1.key }) {
            let def = t.fieldID(name).flatMap { t.definitions[$0] }
            pairs.append((name, try value(scalar, as: def?.type, field: name, table: t.name)))
        }
        return FieldValues(pairs)
    }

    static func value(_ s: JSONScalar, as type: ValueType?, field: String, table: String) throws -> Value {
        func mismatch() -> StrataError {
            StrataError(.typeMismatch, "field '\(field)' of table '\(table)' holds \(type!) values; the record gives \(s)")
        }
        switch (s, type) {
        case (.null, _): return .null
        case (.bool(let b), .bool?), (.bool(let b), nil): return .bool(b)
        case (.int(let i), .int?), (.int(let i), nil): return .int(i)
        case (.int(let i), .double?): return .double(Double(i))
        case (.double(let d), .double?), (.double(let d), nil): return .double(d)
        case (.int(let i), .timestamp?): return .timestamp(Date(timeIntervalSince1970: Double(i)))
        case (.double(let d), .timestamp?): return .timestamp(Date(timeIntervalSince1970: d))
        case (.string(let str), .string?), (.string(let str), nil): return .string(str)
        case (.string(let str), .bytes?):
            guard let data = Data(base64Encoded: str) else { throw mismatch() }
            return .bytes(Array(data))
        default: throw mismatch()
        }
    }

    static func scalar(_ v: Value) -> JSONScalar {
        switch v {
        case .null: .null
        case .bool(let b): .bool(b)
        case .int(let i): .int(i)
        case .double(let d): .double(d)
        case .string(let s): .string(s)
        case .bytes(let b): .string(Data(b).base64EncodedString())
        case .timestamp(let d): .double(d.timeIntervalSince1970)
        }
    }
}

extension Row {
    /// The row as a `Decodable` record: its fields by name (dates as `Date`, bytes as `Data`).
    ///
    /// - Throws: ``StrataError`` `typeMismatch` naming the field when the row does not fit `T`.
    public func decode<T: Decodable>(_ type: T.Type) throws(StrataError) -> T {
        let object = Dictionary(uniqueKeysWithValues: zip(fieldNames, currents.map(RecordCoding.scalar)))
        do {
            return try RecordCoding.decoder().decode(T.self, from: try RecordCoding.encoder().encode(object))
        } catch let DecodingError.keyNotFound(key, _) {
            throw StrataError(.typeMismatch, "row \(self.key) of table '\(table)' does not fit \(T.self): it has no field '\(key.stringValue)'")
        } catch let DecodingError.typeMismatch(_, context), let DecodingError.valueNotFound(_, context) {
            let field = context.codingPath.map(\.stringValue).joined(separator: ".")
            throw StrataError(.typeMismatch, "row \(self.key) of table '\(table)' does not fit \(T.self): field '\(field)' holds \(self[field])")
        } catch {
            throw StrataError(.typeMismatch, "row \(self.key) of table '\(table)' does not fit \(T.self): \(error)")
        }
    }
}

extension Snapshot {
    /// The row with `key`, decoded as a `T` (see ``Row/decode(_:)``), or `nil`.
    public func record<T: Decodable>(_ type: T.Type, from table: String, key: RowKey) throws(StrataError) -> T? {
        try row(table, key: key)?.decode(T.self)
    }

    /// The rows of a query, decoded as `T`s.
    public func records<T: Decodable>(_ type: T.Type, _ query: Query) throws(StrataError) -> [T] {
        return try strataErrors {
            try rows(query).map { try $0.decode(T.self) }
        }
    }
}

extension Transaction {
    /// Inserts an `Encodable` record: its properties are the row's fields (the key included).
    public func insert<T: Encodable>(_ record: T, into table: String) throws(StrataError) {
        try strataErrors {
            try insert(table, try RecordCoding.fields(of: record, for: try catalog.table(named: table)))
        }
    }

    /// Inserts the record, or updates the row with its key to the record's values.
    public func upsert<T: Encodable>(_ record: T, into table: String) throws(StrataError) {
        try strataErrors {
            try upsert(table, try RecordCoding.fields(of: record, for: try catalog.table(named: table)))
        }
    }
}

/// One typed field of a table.
public struct FieldDefinition: Codable, Sendable, Hashable {
    /// The field's name, unique in its table.
    public var name: String
    /// The type every non-null value of the field has.
    public var type: ValueType { didSet { defaultValue = Self.converted(defaultValue, type) } }
    /// Whether the field may hold `null`. Primary key fields never may.
    public var isNullable: Bool
    /// The value an insert stores when the field is not given; `nil` means the insert must give
    /// it (unless the field is nullable, when it stays `null`). An int given for a double field
    /// is stored as a double, as edits and merges convert it: `.double("balance", default: 0)`.
    public var defaultValue: Value? { didSet { if let d = defaultValue, case .int = d { defaultValue = Self.converted(d, type) } } }

    /// A field named `name` of type `type`; `default` is the value an insert stores when the field is not given.
    public init(_ name: String, _ type: ValueType, nullable: Bool = false, default defaultValue: Value? = nil) {
        self.name = name
        self.type = type
        self.isNullable = nullable
        self.defaultValue = Self.converted(defaultValue, type)
    }

    /// An int default of a double field as a double; any other value as it is.
    private static func converted(_ value: Value?, _ type: ValueType) -> Value? {
        if case .int(let i)? = value, type == .double { return .double(Double(i)) }
        return value
    }

    /// A bool field named `name`.
    public static func bool(_ name: String, nullable: Bool = false, default d: Value? = nil) -> Self { Self(name, .bool, nullable: nullable, default: d) }
    /// An int (`Int64`) field named `name`.
    public static func int(_ name: String, nullable: Bool = false, default d: Value? = nil) -> Self { Self(name, .int, nullable: nullable, default: d) }
    /// A double field named `name`.
    public static func double(_ name: String, nullable: Bool = false, default d: Value? = nil) -> Self { Self(name, .double, nullable: nullable, default: d) }
    /// A string field named `name`.
    public static func string(_ name: String, nullable: Bool = false, default d: Value? = nil) -> Self { Self(name, .string, nullable: nullable, default: d) }
    /// A bytes (BLOB) field named `name`.
    public static func bytes(_ name: String, nullable: Bool = false, default d: Value? = nil) -> Self { Self(name, .bytes, nullable: nullable, default: d) }
    /// A timestamp field named `name`.
    public static func timestamp(_ name: String, nullable: Bool = false, default d: Value? = nil) -> Self { Self(name, .timestamp, nullable: nullable, default: d) }
}

/// The definition of a table: its name, its mode, its fields and its primary key.
///
/// - A **fixed** table has typed fields; an edit naming an unknown field, or giving a value of the
///   wrong type, is rejected.
/// - A **property bag** declares only its primary key fields; any other field name may be used
///   with values of any type, as in a document store.
///
/// ```swift
/// let tasks = TableSchema.fixed("tasks", primaryKey: ["id"], fields: [
///     .int("id"), .string("title"), .bool("done", default: false), .string("notes", nullable: true),
/// ])
/// let settings = TableSchema.propertyBag("settings", key: [.string("name")])
/// ```
public struct TableSchema: Codable, Sendable, Hashable {
    /// Whether a table has typed fields or takes any field.
    public enum Mode: String, Codable, Sendable {
        /// Typed fields, all declared.
        case fixed
        /// Declared key fields; any other field, of any type.
        case propertyBag
    }

    /// The table's name, unique in the store.
    public var name: String
    /// Whether the table is fixed or a property bag.
    public var mode: Mode
    /// All fields of a fixed table; the key fields of a property bag.
    public var fields: [FieldDefinition]
    /// The names of the primary key fields, in key order.
    public var primaryKey: [String]

    /// A table definition; ``fixed(_:primaryKey:fields:)`` and ``propertyBag(_:key:)`` are the usual ways to make one.
    public init(name: String, mode: Mode, fields: [FieldDefinition], primaryKey: [String]) {
        self.name = name
        self.mode = mode
        self.fields = fields
        self.primaryKey = primaryKey
    }

    /// A table with a fixed set of typed fields.
    public static func fixed(_ name: String, primaryKey: [String] = ["id"], fields: [FieldDefinition]) -> TableSchema {
        TableSchema(name: name, mode: .fixed, fields: fields, primaryKey: primaryKey)
    }

    /// A table whose rows may hold any fields besides the declared key fields.
    public static func propertyBag(_ name: String, key: [FieldDefinition]) -> TableSchema {
        TableSchema(name: name, mode: .propertyBag, fields: key, primaryKey: key.map(\.name))
    }

    /// The definition of the field called `name`, if declared. Names compare by their UTF-8
    /// bytes: a name in another Unicode form than the declared one (`"e\u{301}"` for `"\u{e9}"`)
    /// is not that field.
    public func field(_ name: String) -> FieldDefinition? { fields.first { $0.name.sameBytes(name) } }

    /// The declared name that Swift's `==` calls equal to `name` but whose bytes differ, if any:
    /// `name` in another Unicode form.
    package func twin(of name: String) -> String? {
        fields.first { $0.name == name && !$0.name.sameBytes(name) }?.name
    }

    /// Whether `other` is this definition with every name in the same bytes (`==` calls two
    /// names in different Unicode forms equal).
    func isIdentical(to other: TableSchema) -> Bool {
        self == other && name.sameBytes(other.name)
            && zip(fields, other.fields).allSatisfy { $0.name.sameBytes($1.name) }
            && zip(primaryKey, other.primaryKey).allSatisfy { $0.sameBytes($1) }
    }

    /// Checks the definition; throws ``StrataError/Code/invalidSchema`` saying what is wrong.
    package func validate() throws(StrataError) {
        func bad(_ why: String) -> StrataError { StrataError(.invalidSchema, "table '\(name)': \(why)") }
        guard !name.isEmpty else { throw StrataError(.invalidSchema, "a table needs a non-empty name") }
        guard !primaryKey.isEmpty else { throw bad("a primary key of at least one field is required") }
        var seen = Set<String>()
        for f in fields {
            guard !f.name.isEmpty else { throw bad("a field needs a non-empty name") }
            let (inserted, other) = seen.insert(f.name)
            guard inserted else {
                // A `Set<String>` finds the other Unicode form of a name too. Two such fields
                // would be two names to Strata (it compares bytes) that read as one: refused.
                if other.sameBytes(f.name) { throw bad("field '\(f.name)' is declared twice") }
                throw bad("fields '\(other)' (\(other.codePoints)) and '\(f.name)' (\(f.name.codePoints)) differ only in Unicode form; Strata compares field names by their bytes, so they would be two fields that read as one: declare one of them")
            }
            if let d = f.defaultValue, !d.isNull, d.type != f.type {
                throw bad("the default of field '\(f.name)' is \(d.type!), not \(f.type)")
            }
            if f.defaultValue?.isNull == true && !f.isNullable {
                throw bad("field '\(f.name)' is not nullable but its default is null")
            }
        }
        guard Set(primaryKey).count == primaryKey.count else { throw bad("the primary key names a field twice") }
        for k in primaryKey {
            guard let f = field(k) else {
                if let twin = twin(of: k) {
                    throw bad("primary key field '\(k)' (\(k.codePoints)) is not declared: the field '\(twin)' (\(twin.codePoints)) differs from it in Unicode form, and Strata compares field names by their bytes")
                }
                throw bad("primary key field '\(k)' is not declared")
            }
            guard !f.isNullable else { throw bad("primary key field '\(k)' cannot be nullable") }
        }
        if mode == .propertyBag && fields.count != primaryKey.count {
            throw bad("a property bag declares only its key fields")
        }
    }
}

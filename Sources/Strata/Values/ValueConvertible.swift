import Foundation

/// A Swift type whose values a store holds as a ``Value``: written from variables, read back
/// typed.
///
/// With it, edits take variables as they are, and reads give them back:
///
/// ```swift
/// let id = UUID(), title = "Buy milk", due = Date.now, priority = 2
/// try store.write { tx in
///     try tx.insert("tasks", ["id": id, "title": title, "due": due, "priority": priority])
///     try tx.update("tasks", key: id, ["done": true])
/// }
/// let task = try store.read { try $0.row("tasks", key: id) }!
/// let t = try task["title", as: String.self]          // "Buy milk"
/// let notes = try task["notes", as: String?.self]     // nil when the field is null
/// ```
///
/// How each type is stored:
///
/// | Swift | stored as | read back from |
/// |---|---|---|
/// | `String` | `string` | `string` |
/// | `Bool` | `bool` | `bool` |
/// | `Int`, `Int8`, `Int16`, `Int32`, `Int64`, `UInt8`, `UInt16`, `UInt32` | `int` (Int64) | an `int` in the type's range |
/// | `Double` | `double` | `double`, or an `int` a `Double` holds exactly |
/// | `Date` | `timestamp` (seconds since 1970, a `Double`) | `timestamp` |
/// | `Data` | `bytes` | `bytes` |
/// | `UUID` | `string`, lowercase (`"3f2504e0-4f89-11d3-9a0c-0305e82c3301"`) | a `string` in either case |
/// | `Optional` of any of these | `null` for `nil` | `null` as `nil` |
/// | ``Value`` | itself | anything |
///
/// - `UInt64` and `UInt` do not conform: an `int` is an Int64, and half of their range does
///   not fit. Convert with `Int64(exactly:)` where the values allow it, or store them as text.
/// - A `UUID` is stored in RFC 9562's lowercase form, as PostgreSQL and JavaScript print it,
///   so that a key the app writes and the same key coming back from a server are equal byte for
///   byte. Foundation's `uuidString` is uppercase: `key: id` and `key: "\(id.uuidString)"` name
///   two different rows. Pass the `UUID` itself.
/// - A `Date` is stored as seconds since 1970 in a `Double`, so it reads back as
///   `Date(timeIntervalSince1970: date.timeIntervalSince1970)`. That is the same instant, but
///   not always the same `Date`: Foundation counts from 2001, and a `Date.now` can come back up
///   to a quarter of a microsecond off (the `timestamp` values compare equal).
///
/// Literals keep their own types as before (`["id": 7]` is an `int`), and a
/// ``FieldValues`` of ``Value``s is still the cheapest way to write in a loop: fields given as
/// Swift variables are converted to ``Value``s once, at the call, through this protocol.
public protocol ValueConvertible: Sendable {
    /// This value as the store holds it.
    var strataValue: Value { get }

    /// The Swift value that `value` holds, or `nil` when it holds another type or a number out
    /// of this type's range. (An `Optional` reads ``Value/null`` as `.some(nil)`.)
    init?(strataValue value: Value)
}

extension Value: ValueConvertible {
    /// The value itself.
    public var strataValue: Value { self }
    /// `value`, whatever it holds.
    public init?(strataValue value: Value) { self = value }

    /// The value a Swift value is stored as: `Value(title)`, `Value(id)`, `Value(due)`.
    ///
    /// Converts where the type is known, with no existential on the way; for building a
    /// ``FieldValues`` from variables in a hot loop.
    @inlinable
    public init(_ value: some ValueConvertible) { self = value.strataValue }
}

extension String: ValueConvertible {
    public var strataValue: Value { .string(self) }
    public init?(strataValue value: Value) {
        guard case .string(let s) = value else { return nil }
        self = s
    }
}

extension Bool: ValueConvertible {
    public var strataValue: Value { .bool(self) }
    public init?(strataValue value: Value) {
        guard case .bool(let b) = value else { return nil }
        self = b
    }
}

extension Double: ValueConvertible {
    public var strataValue: Value { .double(self) }
    /// A `double`, or an `int` that a `Double` holds exactly (a number the server sent as `3`).
    public init?(strataValue value: Value) {
        switch value {
        case .double(let d): self = d
        case .int(let i):
            guard let d = Double(exactly: i) else { return nil }
            self = d
        default: return nil
        }
    }
}

extension Date: ValueConvertible {
    public var strataValue: Value { .timestamp(self) }
    public init?(strataValue value: Value) {
        guard case .timestamp(let d) = value else { return nil }
        self = d
    }
}

extension Data: ValueConvertible {
    public var strataValue: Value { .bytes(Array(self)) }
    public init?(strataValue value: Value) {
        guard case .bytes(let b) = value else { return nil }
        self = Data(b)
    }
}

extension UUID: ValueConvertible {
    /// The lowercase string form (see ``ValueConvertible`` for why not `uuidString`).
    public var strataValue: Value { .string(uuidString.lowercased()) }
    /// A `string` holding a UUID in either case.
    public init?(strataValue value: Value) {
        guard case .string(let s) = value, let id = UUID(uuidString: s) else { return nil }
        self = id
    }
}

/// The conversion of the integer types whose every value an Int64 holds. (`UInt64` and `UInt`
/// do not conform: `Int64(self)` would trap for half of their values.)
extension ValueConvertible where Self: FixedWidthInteger {
    /// An `int`.
    public var strataValue: Value { .int(Int64(self)) }
    /// An `int` within this type's range.
    public init?(strataValue value: Value) {
        guard case .int(let i) = value, let n = Self(exactly: i) else { return nil }
        self = n
    }
}

extension Int: ValueConvertible {}
extension Int8: ValueConvertible {}
extension Int16: ValueConvertible {}
extension Int32: ValueConvertible {}
extension Int64: ValueConvertible {}
extension UInt8: ValueConvertible {}
extension UInt16: ValueConvertible {}
extension UInt32: ValueConvertible {}

extension Optional: ValueConvertible where Wrapped: ValueConvertible {
    /// ``Value/null`` for `nil`.
    public var strataValue: Value { self?.strataValue ?? .null }
    /// `nil` (a successful read) for ``Value/null``; otherwise what `Wrapped` reads.
    public init?(strataValue value: Value) {
        if value.isNull {
            self = .none
            return
        }
        guard let wrapped = Wrapped(strataValue: value) else { return nil }
        self = .some(wrapped)
    }
}

/// Names `String?` as `String?` (not `Optional<String>`) in error messages.
protocol OptionalTypeName { static var typeName: String { get } }
extension Optional: OptionalTypeName {
    static var typeName: String { "\(strataTypeName(Wrapped.self))?" }
}
func strataTypeName(_ type: Any.Type) -> String {
    (type as? any OptionalTypeName.Type)?.typeName ?? "\(type)"
}

extension RowKey {
    /// A key of one Swift value: `RowKey(id)` for a `UUID`, a `String`, an `Int`, ….
    @inlinable
    public init(_ value: some ValueConvertible) { self.init(value.strataValue) }
}

extension FieldValues {
    /// Fields given as Swift variables, in the order given: `FieldValues(["title": title, "due": due])`.
    ///
    /// The edits take the same form directly (`tx.insert("tasks", ["title": title])`); a literal
    /// of literals and ``Value``s keeps the dictionary-literal initializer, with no conversion.
    @_disfavoredOverload
    public init(_ fields: KeyValuePairs<String, (any ValueConvertible)?>) {
        self.init(fields.map { ($0.key, $0.value?.strataValue ?? .null) })
    }
}

/// A condition on a row's fields, for queries and named views.
///
/// ```swift
/// let due: Condition = .and([.equals("done", false), .lessThan("priority", 3), .isNotNull("notes")])
/// ```
public indirect enum Condition: Sendable, Hashable, Codable {
    /// The field equals the value (`equals(field, nil)` matches a null field).
    case equals(String, Value)
    /// The field differs from the value (a null field differs from every non-null value).
    case notEquals(String, Value)
    /// The field is less than the value; a null field never matches.
    case lessThan(String, Value)
    /// The field is less than or equal to the value; a null field never matches.
    case lessOrEqual(String, Value)
    /// The field is greater than the value; a null field never matches.
    case greaterThan(String, Value)
    /// The field is greater than or equal to the value; a null field never matches.
    case greaterOrEqual(String, Value)
    /// `low ≤ field ≤ high`.
    case between(String, Value, Value)
    /// The field equals one of the values.
    case isIn(String, [Value])
    /// The field is null.
    case isNull(String)
    /// The field holds a value.
    case isNotNull(String)
    /// Every condition holds (an empty list always holds).
    case and([Condition])
    /// At least one condition holds.
    case or([Condition])
    /// The condition does not hold.
    case not(Condition)

    /// Whether `row` satisfies the condition. Comparisons use ``Value/order(_:_:)``; a null field
    /// satisfies only `isNull`, `notEquals` a non-null value, and `equals(null)`.
    public func matches(_ row: Row) -> Bool {
        matches { row[$0] }
    }

    /// Whether a row whose fields hold `value(field)` satisfies the condition: the one
    /// evaluation, for a row and for a row key alone (a live query's key check).
    @inline(__always)
    func matches(_ value: (String) -> Value) -> Bool {
        switch self {
        case .equals(let f, let v): return Value.order(value(f), v) == 0
        case .notEquals(let f, let v): return Value.order(value(f), v) != 0
        case .lessThan(let f, let v): return !value(f).isNull && Value.order(value(f), v) < 0
        case .lessOrEqual(let f, let v): return !value(f).isNull && Value.order(value(f), v) <= 0
        case .greaterThan(let f, let v): return !value(f).isNull && Value.order(value(f), v) > 0
        case .greaterOrEqual(let f, let v): return !value(f).isNull && Value.order(value(f), v) >= 0
        case .between(let f, let lo, let hi): return !value(f).isNull && Value.order(value(f), lo) >= 0 && Value.order(value(f), hi) <= 0
        case .isIn(let f, let vs): return vs.contains { Value.order(value(f), $0) == 0 }
        case .isNull(let f): return value(f).isNull
        case .isNotNull(let f): return !value(f).isNull
        case .and(let ps): return ps.allSatisfy { $0.matches(value) }
        case .or(let ps): return ps.contains { $0.matches(value) }
        case .not(let p): return !p.matches(value)
        }
    }

    /// The conjuncts of the condition that read only `keyFields`: a row key alone decides them,
    /// and a row's key never changes, so a row whose key fails one of them never matches.
    func keyOnlyConjuncts(_ keyFields: Set<String>) -> [Condition] {
        let conjuncts: [Condition] = if case .and(let ps) = self { ps.flatMap { $0.keyOnlyConjuncts(keyFields) } } else { [self] }
        return conjuncts.filter { !$0.fields.isEmpty && $0.fields.isSubset(of: keyFields) }
    }

    /// The field names the condition reads.
    var fields: Set<String> {
        switch self {
        case .equals(let f, _), .notEquals(let f, _), .lessThan(let f, _), .lessOrEqual(let f, _), .greaterThan(let f, _),
            .greaterOrEqual(let f, _), .between(let f, _, _), .isIn(let f, _), .isNull(let f), .isNotNull(let f):
            [f]
        case .and(let ps), .or(let ps): ps.reduce(into: Set<String>()) { $0.formUnion($1.fields) }
        case .not(let p): p.fields
        }
    }
}

extension Value {
    /// A total order over values, the one queries sort by: null first, then booleans, numbers
    /// (ints and doubles compared by value), strings (by UTF-8 bytes), bytes, timestamps. Returns
    /// a negative number, zero or a positive number.
    public static func order(_ a: Value, _ b: Value) -> Int {
        func rank(_ v: Value) -> Int {
            switch v {
            case .null: 0
            case .bool: 1
            case .int, .double: 2
            case .string: 3
            case .bytes: 4
            case .timestamp: 5
            }
        }
        let (ra, rb) = (rank(a), rank(b))
        if ra != rb { return ra < rb ? -1 : 1 }
        switch (a, b) {
        case (.null, .null): return 0
        case (.bool(let x), .bool(let y)): return x == y ? 0 : (x ? 1 : -1)
        case (.int(let x), .int(let y)): return x == y ? 0 : (x < y ? -1 : 1)
        case (.string(let x), .string(let y)):
            // Bytes, not Swift's `==` (canonical equivalence): "é" and "e" + U+0301 differ here
            // as they do in the store's keys and indexes.
            return x.utf8.elementsEqual(y.utf8) ? 0 : (x.utf8.lexicographicallyPrecedes(y.utf8) ? -1 : 1)
        case (.bytes(let x), .bytes(let y)): return x == y ? 0 : (x.lexicographicallyPrecedes(y) ? -1 : 1)
        case (.timestamp(let x), .timestamp(let y)): return x == y ? 0 : (x < y ? -1 : 1)
        default:
            // Both are numbers (same rank, and every other pair of equal rank is handled above).
            let (x, y) = (a.doubleValue ?? 0, b.doubleValue ?? 0)
            return x == y ? 0 : (x < y ? -1 : 1)
        }
    }
}

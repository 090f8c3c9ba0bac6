/// Field names with values, as given to an insert, update or upsert.
///
/// Written as a dictionary literal — `["title": "Buy milk", "done": false]` — but kept as an
/// ordered list, so that passing fields costs no hashing.
public struct FieldValues: Sendable, Sequence, ExpressibleByDictionaryLiteral {
    public typealias Element = (name: String, value: Value)

    /// The fields in the order given.
    public var pairs: [Element]

    public init(dictionaryLiteral elements: (String, Value)...) {
        pairs = elements.map { (name: $0.0, value: $0.1) }
    }

    /// Fields in the order given.
    public init(_ pairs: [(String, Value)]) {
        self.pairs = pairs.map { (name: $0.0, value: $0.1) }
    }

    /// The fields of a dictionary, sorted by name.
    public init(_ dictionary: [String: Value]) {
        pairs = dictionary.sorted { $0.key < $1.key }.map { (name: $0.key, value: $0.value) }
    }

    public func makeIterator() -> IndexingIterator<[Element]> { pairs.makeIterator() }

    /// The value given for `name`, if any. Names compare by their UTF-8 bytes, as a table's
    /// fields do: `"e\u{301}"` does not find a value given for `"\u{e9}"`.
    public subscript(name: String) -> Value? { pairs.first { $0.name.sameBytes(name) }?.value }
}

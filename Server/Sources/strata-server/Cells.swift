import PostgresNIO

/// The cells of a result row, decoded one by one in column order.
///
/// Why not PostgresNIO's tuple form (`rows.decode((String, Int64).self)`): it is generic over a
/// parameter pack, and builds the tuple's type metadata at run time for every row. Under pull
/// load that lookup alone took about 9% of the server's CPU (`perf`, 2026-11-28); decoding each
/// cell by its concrete type costs none of it.
struct Cells {
    private var iterator: PostgresRow.Iterator

    init(_ row: PostgresRow) { iterator = row.makeIterator() }

    /// The next cell, as a `T`.
    mutating func next<T: PostgresDecodable>(_: T.Type = T.self) throws -> T {
        guard let cell = iterator.next() else { throw PostgresDecodingError.Code.missingData }
        return try cell.decode(T.self)
    }

    /// The next cell's bytes as PostgreSQL sent them (text columns: their UTF-8), without making
    /// a `String` of them; `nil` for SQL NULL.
    mutating func nextBytes() throws -> ByteBuffer? {
        guard let cell = iterator.next() else { throw PostgresDecodingError.Code.missingData }
        return cell.bytes
    }
}

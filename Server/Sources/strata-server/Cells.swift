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

    /// Passes over the next `n` cells without reading them.
    mutating func skip(_ n: Int) {
        for _ in 0..<n { _ = iterator.next() }
    }

    /// The next cell, a `timestamptz` in PostgreSQL's binary format (microseconds since
    /// 2000-01-01 UTC), as seconds since 1970.
    ///
    /// Why not `extract(epoch FROM …)::float8` in the query: PostgreSQL computes it in `numeric`
    /// for every row served. The result is the same `Double`: the microseconds since 1970 are an
    /// integer a `Double` holds exactly (below 2^53, until the year 2255), and one division by 10^6 rounds it once,
    /// to the nearest, as PostgreSQL's conversion of the exact `numeric` does.
    mutating func nextTimestamp() throws -> Double {
        guard let cell = iterator.next() else { throw PostgresDecodingError.Code.missingData }
        guard cell.dataType == .timestamptz, cell.format == .binary, var bytes = cell.bytes,
              let micros = bytes.readInteger(as: Int64.self), bytes.readableBytes == 0 else {
            throw PostgresDecodingError.Code.typeMismatch
        }
        let (since1970, overflow) = micros.addingReportingOverflow(Self.micros2000)
        guard !overflow else { throw PostgresDecodingError.Code.failure }
        return Double(since1970) / 1_000_000
    }

    /// 2000-01-01 UTC, PostgreSQL's epoch, in microseconds since 1970.
    private static let micros2000: Int64 = 946_684_800 * 1_000_000
}

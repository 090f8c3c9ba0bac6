extension Snapshot {
    /// The rows of a query: those matching its condition, in its order, up to its limit.
    ///
    /// - Complexity: O(n log n) for n rows of the table.
    public func rows(_ query: Query) throws -> [Row] {
        var rows = try sortedMatches(query)
        if let limit = query.limit { rows = Array(rows.prefix(limit)) }
        return rows
    }

    /// The number of rows matching the query's condition (its limit ignored).
    ///
    /// - Complexity: O(n) for n rows of the table.
    public func count(_ query: Query) throws -> Int {
        try validate(query)
        var n = 0
        try forEachRow(query.table) { row in
            if query.filter?.matches(row) ?? true { n += 1 }
            return true
        }
        return n
    }

    /// One page of a query: up to `size` rows after `after` (from the start when `nil`). A page
    /// continues from the last row seen, not from an offset, so rows inserted or deleted before
    /// it between two pages neither repeat nor shift the next page.
    ///
    /// - Complexity: O(n log n) for n rows of the table.
    public func page(_ query: Query, size: Int, after: PageToken? = nil) throws -> Page {
        precondition(size > 0, "a page holds at least one row")
        var rows = try sortedMatches(query)
        if let limit = query.limit { rows = Array(rows.prefix(limit)) }
        var start = 0
        if let after {
            // The first row after the token: binary search in the query's order.
            var (lo, hi) = (0, rows.count)
            while lo < hi {
                let mid = (lo + hi) / 2
                if Self.compare(query, sortValues(rows[mid], query), rows[mid].key, after.sortValues, after.key) <= 0 { lo = mid + 1 } else { hi = mid }
            }
            start = lo
        }
        let slice = Array(rows[start..<min(start + size, rows.count)])
        let next = start + size < rows.count ? slice.last.map { PageToken(sortValues: sortValues($0, query), key: $0.key) } : nil
        return Page(rows: slice, next: next)
    }

    func sortValues(_ row: Row, _ query: Query) -> [Value] { query.orderBy.map { row[$0.field] } }

    /// Orders (sort values, key) pairs as the query does: by each sort key, then by primary key.
    static func compare(_ query: Query, _ a: [Value], _ ak: RowKey, _ b: [Value], _ bk: RowKey) -> Int {
        for (i, s) in query.orderBy.enumerated() {
            let c = Value.order(a[i], b[i])
            if c != 0 { return s.descending ? -c : c }
        }
        for (x, y) in zip(ak.values, bk.values) {
            let c = Value.order(x, y)
            if c != 0 { return c }
        }
        return 0
    }

    /// Checks that the query names a table and, for a fixed table, fields it has.
    func validate(_ query: Query) throws {
        let t = try catalog.table(named: query.table)
        guard !t.isPropertyBag else { return }
        let fields = (query.filter?.fields ?? []).union(query.orderBy.map(\.field))
        for f in fields.sorted() where t.fieldIDs[f] == nil {
            throw StrataError(.fieldNotFound, "the query names field '\(f)', which table '\(t.name)' does not have")
        }
    }

    func sortedMatches(_ query: Query) throws -> [Row] {
        try validate(query)
        var rows: [Row] = []
        try forEachRow(query.table) { row in
            if query.filter?.matches(row) ?? true { rows.append(row) }
            return true
        }
        if query.orderBy.isEmpty { return rows }  // already in key order
        let keyed = rows.map { (sortValues($0, query), $0) }
        return keyed.sorted { Self.compare(query, $0.0, $0.1.key, $1.0, $1.1.key) < 0 }.map(\.1)
    }
}

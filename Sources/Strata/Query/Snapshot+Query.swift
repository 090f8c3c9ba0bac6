import LMDB

extension Snapshot {
    /// The rows of a query: those matching its condition, in its order, up to its limit.
    ///
    /// - Throws: ``StrataError`` `tableNotFound`, `fieldNotFound`, `invalidOperation` (a
    ///   negative limit).
    /// - Complexity: O(n log n) for n rows of the table.
    public func rows(_ query: Query) throws(StrataError) -> [Row] {
        return try strataErrors {
            var rows = try sortedMatches(query)
            if let limit = query.limit { rows = Array(rows.prefix(limit)) }
            return rows
        }
    }

    /// The number of rows matching the query's condition (its limit ignored).
    ///
    /// - Complexity: O(n) for n rows of the table.
    public func count(_ query: Query) throws(StrataError) -> Int {
        return try strataErrors {
            try validate(query)
            var n = 0
            try forEachRow(query.table) { row in
                if query.filter?.matches(row) ?? true { n += 1 }
                return true
            }
            return n
        }
    }

    /// One page of a query: up to `size` rows after `after` (from the start when `nil`). A page
    /// continues from the last row seen, not from an offset, so rows inserted or deleted before
    /// it between two pages neither repeat nor shift the next page.
    ///
    /// When the planner walks an index in the query's order (``explain(_:)`` says
    /// `index … in order`: one ascending sort field, the first field of an index, and no condition
    /// that picks index ranges) and the query has no limit, a page is a key range of that index:
    /// it seeks to the token and reads about `size` rows. Otherwise every page builds and sorts
    /// the whole result (``explain(_:)`` then says `then sort`); declare an index on the sort
    /// field, or use a named view (``page(view:size:after:)``), for large paged lists.
    ///
    /// - Throws: ``StrataError`` `tableNotFound`, `fieldNotFound`, `invalidOperation` (a `size`
    ///   below 1, a negative limit).
    /// - Complexity: O(log n + size) along an index; otherwise O(n log n) for n rows of the table.
    public func page(_ query: Query, size: Int, after: PageToken? = nil) throws(StrataError) -> Page {
        return try strataErrors {
            try Self.checkPageSize(size)
            try validate(query)
            let t = try catalog.table(named: query.table)
            if query.limit == nil, case .indexOrder(let index) = plan(query, t) {
                return try indexPage(query, t, index, size: size, after: after)
            }
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
    }

    /// A page read along an index in the query's order: from the run of entries holding the
    /// token's sort value, until one row more than the page is known (to tell if another follows).
    private func indexPage(_ query: Query, _ t: TableInfo, _ index: IndexInfo, size: Int, after: PageToken?) throws -> Page {
        var from: [UInt8]? = nil
        if let after {
            guard after.sortValues.count == 1 else {
                throw StrataError(.invalidOperation, "the page token does not belong to this query (it has \(after.sortValues.count) sort values, the query 1)")
            }
            from = IndexKeys.prefix(index, [after.sortValues[0]])
        }
        func isAfter(_ row: Row) -> Bool {
            guard let after else { return true }
            return Self.compare(query, sortValues(row, query), row.key, after.sortValues, after.key) > 0
        }
        let rows = try inIndexOrder(query, t, index, from: from) { result in result.lazy.filter(isAfter).count > size }
            .filter(isAfter)
        let slice = Array(rows.prefix(size))
        let next = rows.count > size ? slice.last.map { PageToken(sortValues: sortValues($0, query), key: $0.key) } : nil
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
    /// Refuses a page size below 1: a page that can hold no row could never move past a token.
    static func checkPageSize(_ size: Int) throws(StrataError) {
        guard size > 0 else {
            throw StrataError(.invalidOperation, "a page size of \(size) was asked for; a page holds at least one row")
        }
    }

    func validate(_ query: Query) throws {
        let t = try catalog.table(named: query.table)
        if let limit = query.limit, limit < 0 {
            throw StrataError(.invalidOperation, "the query of table '\(t.name)' has a limit of \(limit); a limit is 0 or more")
        }
        guard !t.isPropertyBag else { return }
        let fields = (query.filter?.fields ?? []).union(query.orderBy.map(\.field))
        for f in fields.sorted() where t.fieldID(f) == nil {
            if let twin = t.twin(of: f) { throw StrataError(.fieldNotFound, "the query names field '\(f)': " + RowRule.twinMessage(table: t.name, f, twin)) }
            throw StrataError(.fieldNotFound, "the query names field '\(f)', which table '\(t.name)' does not have")
        }
    }

    func sortedMatches(_ query: Query) throws -> [Row] {
        try validate(query)
        let t = try catalog.table(named: query.table)
        switch plan(query, t) {
        case .indexOrder(let index):
            return try inIndexOrder(query, t, index)
        case .indexRanges(let index, let ranges):
            var rows = try candidates(t, index, ranges).filter { query.filter?.matches($0) ?? true }
            if !query.orderBy.isEmpty { rows = sorted(rows, query) }
            return rows
        case .scan:
            var rows: [Row] = []
            try forEachRow(query.table) { row in
                if query.filter?.matches(row) ?? true { rows.append(row) }
                return true
            }
            return query.orderBy.isEmpty ? rows : sorted(rows, query)  // a scan is in key order
        }
    }

    func sorted(_ rows: [Row], _ query: Query) -> [Row] {
        rows.map { (sortValues($0, query), $0) }.sorted { Self.compare(query, $0.0, $0.1.key, $1.0, $1.1.key) < 0 }.map(\.1)
    }

    // MARK: Plans

    /// How a query reads its rows.
    enum Plan {
        /// Walk an index whose first field is the (single, ascending) sort field.
        case indexOrder(IndexInfo)
        /// Read the rows of some ranges of an index, then filter and sort.
        case indexRanges(IndexInfo, [(low: [UInt8], high: [UInt8])])
        /// Read the whole table.
        case scan
    }

    /// A description of how the query would be run: `index <name> in order`, `index <name>
    /// ranges (<count>)` or `scan`; the last two followed by `, then sort (…)` when the query
    /// has a sort order, which is then applied to the whole result (by ``page(_:size:after:)``
    /// too, for every page).
    public func explain(_ query: Query) throws(StrataError) -> String {
        return try strataErrors {
            try validate(query)
            // A sort the plan does not give is done on the whole result, for every page too.
            let sort = query.orderBy.isEmpty ? "" : ", then sort (no index gives this order: each page sorts the whole result)"
            switch plan(query, try catalog.table(named: query.table)) {
            case .indexOrder(let i): return "index \(i.name) in order"
            case .indexRanges(let i, let r): return "index \(i.name) ranges (\(r.count))" + sort
            case .scan: return "scan" + sort
            }
        }
    }

    func plan(_ query: Query, _ t: TableInfo) -> Plan {
        // Indexes serve only declared (typed) fields: their order then matches the query order.
        guard !t.isPropertyBag, !t.indexes.isEmpty else { return .scan }
        let conjuncts: [Condition] = switch query.filter {
        case .and(let ps)?: ps
        case let p?: [p]
        case nil: []
        }
        for c in conjuncts {
            for index in t.indexes {
                if let ranges = self.ranges(c, index, t) { return .indexRanges(index, ranges) }
            }
        }
        if query.orderBy.count == 1, !query.orderBy[0].descending, let id = t.fieldID(query.orderBy[0].field),
            let index = t.indexes.first(where: { $0.fieldIDs.first == id })
        {
            return .indexOrder(index)
        }
        return .scan
    }

    /// The index key ranges holding every row a condition can match, or `nil` when the condition
    /// does not bound the index's first field.
    func ranges(_ c: Condition, _ index: IndexInfo, _ t: TableInfo) -> [(low: [UInt8], high: [UInt8])]? {
        guard let first = index.fieldIDs.first, let def = t.definitions[first] else { return nil }
        func bound(_ v: Value) -> [UInt8]? {
            // A value of another type than the field's cannot be found in this index's order.
            guard let typed = try? t.coerce(v, FieldDefinition(def.name, def.type, nullable: true)) else { return nil }
            var w = ByteWriter(capacity: 32)
            w.appendBigEndian(index.id)
            IndexKeys.appendBounded(typed, to: &w)
            return w.bytes
        }
        var all = ByteWriter(capacity: 4)
        all.appendBigEndian(index.id)
        let (start, end) = (all.bytes, all.bytes)
        switch c {
        case .equals(let f, let v) where f == def.name:
            return bound(v).map { [($0, $0)] }
        case .isIn(let f, let vs) where f == def.name:
            let bounds = vs.compactMap(bound)
            return bounds.count == vs.count ? bounds.map { ($0, $0) } : nil
        case .between(let f, let lo, let hi) where f == def.name:
            guard let l = bound(lo), let h = bound(hi) else { return nil }
            return [(l, h)]
        case .lessThan(let f, let v) where f == def.name, .lessOrEqual(let f, let v) where f == def.name:
            return bound(v).map { [(start, $0)] }
        case .greaterThan(let f, let v) where f == def.name, .greaterOrEqual(let f, let v) where f == def.name:
            return bound(v).map { [($0, end)] }
        default:
            return nil
        }
    }

    /// The rows whose index entries fall in `ranges` (bounds inclusive; an empty-valued high bound
    /// means "to the end of the index").
    func candidates(_ t: TableInfo, _ index: IndexInfo, _ ranges: [(low: [UInt8], high: [UInt8])]) throws -> [Row] {
        var keys: [[UInt8]] = []
        var seen = Set<[UInt8]>()
        try txn.scan(databases.index) { c in
            for (low, high) in ranges {
                var e = try c.seek(atLeast: low)
                let openEnd = high.count == 4
                while let entry = e, entry.key.starts(with: high.prefix(4)) {
                    if !openEnd {
                        let head = entry.key.prefix(high.count)
                        if !(head.elementsEqual(high) || head.lexicographicallyPrecedes(high)) { break }
                    }
                    // The row key follows the value part; rebuild the `rows` key from it.
                    var w = ByteWriter(capacity: 32)
                    w.appendBigEndian(t.id)
                    w.append(UnsafeRawBufferPointer(rebasing: entry.key[try rowKeyStart(entry.key, index)...]))
                    if seen.insert(w.bytes).inserted { keys.append(w.bytes) }
                    e = try c.next()
                }
            }
        }
        keys.sort { $0.lexicographicallyPrecedes($1) }
        var rows: [Row] = []
        for k in keys {
            if let row = try rowAt(k, t), row.status != .deleted { rows.append(row) }
        }
        return rows
    }

    /// Where the row key starts in an index entry: after the id and one key encoding per field.
    func rowKeyStart(_ entry: UnsafeRawBufferPointer, _ index: IndexInfo) throws(StrataError) -> Int {
        var r = ByteReader(entry, offset: 4)
        for _ in index.fieldIDs { _ = try KeyCodec.readComponent(&r) }
        return r.offset
    }

    func rowAt(_ rowsKey: [UInt8], _ t: TableInfo) throws(StrataError) -> Row? {
        let txn = try self.txn
        return try withBytes(rowsKey) { (k) throws(StrataError) -> Row? in
            guard let record = try lmdb({ () throws(LMDBError) in try txn.get(k, in: databases.rows) }) else { return nil }
            return try Row(table: t, rowsKey: k, record: record)
        }
    }

    /// Walks an index in order. Entries with equal indexed prefixes (equal values, or long
    /// values cut to the same prefix) form a run, re-sorted by the query's full order.
    ///
    /// `from` starts the walk at the first entry at or after it (an index prefix, so at the
    /// start of a run); `enough` ends it after a run, when the rows so far suffice.
    func inIndexOrder(_ query: Query, _ t: TableInfo, _ index: IndexInfo, from: [UInt8]? = nil, enough: (([Row]) -> Bool)? = nil) throws -> [Row] {
        var result: [Row] = []
        var run: [Row] = []
        var runValues: [UInt8] = []
        func closeRun() {
            result += sorted(run, query)
            run.removeAll()
        }
        var prefix = ByteWriter(capacity: 4)
        prefix.appendBigEndian(index.id)
        try txn.scan(databases.index) { c in
            var e = try c.seek(atLeast: from ?? prefix.bytes)
            while let entry = e, entry.key.starts(with: prefix.bytes) {
                let split = try rowKeyStart(entry.key, index)
                // A run is cut on the sort field (the index's first) alone: rows equal in it are
                // ordered by primary key, whatever the index's other fields hold.
                var r = ByteReader(entry.key, offset: 4)
                _ = try KeyCodec.readComponent(&r)
                let values = Array(entry.key[..<r.offset])
                if values != runValues {
                    closeRun()
                    if let limit = query.limit, result.count >= limit { return }
                    if let enough, enough(result) { return }
                    runValues = values
                }
                var w = ByteWriter(capacity: 32)
                w.appendBigEndian(t.id)
                w.append(UnsafeRawBufferPointer(rebasing: entry.key[split...]))
                if let row = try rowAt(w.bytes, t), row.status != .deleted, query.filter?.matches(row) ?? true {
                    run.append(row)
                }
                e = try c.next()
            }
        }
        closeRun()
        return result
    }
}

extension Snapshot {
    /// The row of `table` whose `field` equals `value` — a lookup by an alternate id, such as a
    /// client-generated id beside the server's key. With a (unique) index on the field this is
    /// an index lookup, otherwise a scan; with several matches, the first in key order.
    ///
    /// - Complexity: O(log n) with an index on `field`, O(n) without.
    public func row(_ table: String, where field: String, equals value: Value) throws(StrataError) -> Row? {
        try rows(Query(table, where: .equals(field, value), limit: 1)).first
    }
}

extension Snapshot {
    /// The row whose primary key is `id`, or else the row a unique index finds under `id` — one
    /// lookup for an item known by its key or by an alternate id (a client-generated id beside
    /// the server's key, say). The primary key is tried first, then each unique index with as
    /// many fields as `id` has values, in the order the indexes were created. A value whose type
    /// does not fit a key or an index (a string for an int key) simply does not match there.
    ///
    /// Returns `nil` when nothing matches; rows deleted locally are not found.
    ///
    /// - Throws: ``StrataError`` `tableNotFound`.
    /// - Complexity: O(u log n) for u unique indexes.
    public func row(_ table: String, keyOrAlternateID id: RowKey) throws(StrataError) -> Row? {
        let t = try catalog.table(named: table)
        // Each value converted to a field's type, or nil when it cannot be of that type.
        func fit(_ values: [Value], _ fieldIDs: [Int]) -> [Value]? {
            guard values.count == fieldIDs.count else { return nil }
            var out: [Value] = []
            for (v, fid) in zip(values, fieldIDs) {
                guard !v.isNull, let def = t.definitions[fid], let typed = try? t.coerce(v, def) else { return nil }
                out.append(typed)
            }
            return out
        }
        if let key = fit(id.values, t.keyFieldIDs), let row = try row(table, key: RowKey(key)) {
            return row
        }
        for index in t.indexes where index.unique {
            guard let values = fit(id.values, index.fieldIDs) else { continue }
            let conditions = zip(index.fieldIDs, values).map { Condition.equals(t.fieldNames[$0], $1) }
            let query = Query(table, where: conditions.count == 1 ? conditions[0] : .and(conditions), limit: 1)
            if let row = try rows(query).first { return row }
        }
        return nil
    }
}

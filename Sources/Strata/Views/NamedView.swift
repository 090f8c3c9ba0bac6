import LMDB

/// A named view: a query kept materialized, in its order, as rows change.
struct ViewInfo: Sendable, Codable, Hashable {
    let id: UInt32
    let name: String
    let query: Query
}

/// A named view as ``Snapshot/namedViews`` lists it.
public struct ViewDefinition: Sendable, Hashable {
    /// The view's name, unique in the store.
    public let name: String
    /// The query the view keeps materialized.
    public let query: Query
}

/// Entries of the `view` database: view id (4 bytes BE), each sort field's value in the
/// order-preserving key encoding (bounded as for indexes; complemented for a descending field,
/// which reverses its order since the encoding is prefix-free), then the row key; the value is
/// the row key again, so a reader never has to parse the sort part.
enum ViewKeys {
    static func entry(_ view: ViewInfo, _ row: Row, rowKey: ArraySlice<UInt8>) -> [UInt8] {
        var w = ByteWriter(capacity: 64)
        w.appendBigEndian(view.id)
        w.append(sortPart(view.query, row.keyless(view.query)))
        w.append(Array(rowKey))
        return w.bytes
    }

    /// The encoded sort values, each complemented when its field sorts descending.
    static func sortPart(_ query: Query, _ values: [Value]) -> [UInt8] {
        var out: [UInt8] = []
        for (s, v) in zip(query.orderBy, values) {
            var w = ByteWriter(capacity: 16)
            IndexKeys.appendBounded(v, to: &w)
            out += s.descending ? w.bytes.map { ~$0 } : w.bytes
        }
        return out
    }
}

extension Row {
    /// The row's values of a query's sort fields.
    func keyless(_ query: Query) -> [Value] { query.orderBy.map { self[$0.field] } }
}

extension StoreDatabases {
    /// The named-view entries of table `t` to delete and put for a row that changed from `old`
    /// to `new`, checked against LMDB's key limit but not written (see
    /// ``updateIndexesAndViews(_:target:old:new:in:checkingUniqueness:)``).
    func viewChanges(_ t: TableInfo, target: UnsafeRawBufferPointer, rowKey: [UInt8], old: UnsafeRawBufferPointer?, new: UnsafeRawBufferPointer?) throws(StrataError) -> [(old: [UInt8]?, new: [UInt8]?)] {
        guard !t.views.isEmpty else { return [] }
        // A view holds the rows the app can read: not those deleted locally.
        func visible(_ record: UnsafeRawBufferPointer?) throws(StrataError) -> Row? {
            guard let record else { return nil }
            let row = try Row(table: t, rowsKey: target, record: record)
            return row.status == .deleted ? nil : row
        }
        let (before, after) = (try visible(old), try visible(new))
        var changes: [(old: [UInt8]?, new: [UInt8]?)] = []
        for view in t.views {
            let o = before.flatMap { view.query.filter?.matches($0) ?? true ? ViewKeys.entry(view, $0, rowKey: rowKey[...]) : nil }
            let n = after.flatMap { view.query.filter?.matches($0) ?? true ? ViewKeys.entry(view, $0, rowKey: rowKey[...]) : nil }
            guard o != n else { continue }
            if let n { try checkEntryKey(n, of: "view '\(view.name)'", table: t, target: target) }
            changes.append((o, n))
        }
        return changes
    }
}

extension Transaction {
    /// Defines a named view — a query kept materialized in its order as rows change — and builds
    /// it from the table's current rows. Read it with ``Snapshot/page(view:size:after:)``.
    /// Defining a view identical to an existing one does nothing.
    ///
    /// - Throws: ``StrataError`` `invalidSchema` (a name taken by another view, or a limit: a
    ///   view holds every matching row), `tableNotFound`, `fieldNotFound`, `invalidValue` (a
    ///   matching row whose entry — the sort values, text and bytes cut to 200 bytes each, plus
    ///   the row key — would be longer than LMDB's key limit of 511 bytes).
    /// - Complexity: O(n log n) for the n rows of the table.
    public func createView(_ name: String, _ query: Query) throws(StrataError) {
        try strataErrors {
            guard !name.isEmpty else { throw StrataError(.invalidSchema, "a view needs a name") }
            guard query.limit == nil else {
                throw StrataError(.invalidSchema, "view '\(name)' has a limit; a view holds every matching row, read it page by page")
            }
            try snapshot.validate(query)
            if let (table, existing) = try catalog.view(named: name) {
                guard existing.query == query else {
                    throw StrataError(.invalidSchema, "a view named '\(name)' exists on table '\(table.name)' with another query")
                }
                return
            }
            var t = try catalog.table(named: query.table)
            let view = ViewInfo(id: try catalog.nextIndexID, name: name, query: query)
            var entries: [([UInt8], [UInt8])] = []
            try snapshot.scanTable(t, in: databases.rows) { k, record in
                let row = try Row(table: t, rowsKey: k, record: record)
                if row.status != .deleted, query.filter?.matches(row) ?? true {
                    let rowKey = Array(k[4...])
                    let entry = ViewKeys.entry(view, row, rowKey: rowKey[...])
                    try databases.checkEntryKey(entry, of: "view '\(name)'", table: t, target: k)
                    entries.append((entry, rowKey))
                }
                return true
            }
            let writer = try self.writer
            try lmdb { () throws(LMDBError) in
                for (k, v) in entries { try writer.put(k, v, in: databases.view) }
            }
            t.views.append(view)
            workingCatalog.tables[t.id] = t
            workingCatalog.nextIndexID += 1
            markCatalogChanged()
            // The entries for existing rows come from no operation: checkpoint them with the commit.
            requestCheckpoint()
        }
    }
}

extension Store {
    /// Defines a named view; see ``Transaction/createView(_:_:)``.
    public func createView(_ name: String, _ query: Query) throws(StrataError) {
        try strataErrors {
            try write { try $0.createView(name, query) }
        }
    }
}

extension Catalog {
    func view(named name: String) -> (TableInfo, ViewInfo)? {
        for t in tables.values {
            if let v = t.views.first(where: { $0.name == name }) { return (t, v) }
        }
        return nil
    }
}

extension Snapshot {
    /// The named views of the store.
    public var namedViews: [ViewDefinition] {
        get throws(StrataError) { try catalog.tables.values.sorted { $0.id < $1.id }.flatMap { $0.views.map { ViewDefinition(name: $0.name, query: $0.query) } } }
    }

    /// One page of a named view: up to `size` rows after `after`, read from the view's entries
    /// in order — a key range, never a re-run of the query.
    ///
    /// - Throws: ``StrataError`` `tableNotFound` (no view of that name), `invalidOperation` (a
    ///   `size` below 1).
    /// - Complexity: O(size · log n).
    public func page(view name: String, size: Int, after: PageToken? = nil) throws(StrataError) -> Page {
        try Self.checkPageSize(size)
        guard let (t, view) = try catalog.view(named: name) else {
            throw StrataError(.tableNotFound, "no view named '\(name)'")
        }
        let q = view.query
        var start = ByteWriter(capacity: 64)
        start.appendBigEndian(view.id)
        let prefix = start.bytes
        if let after { start.append(ViewKeys.sortPart(q, after.sortValues)) }
        var rows: [Row] = []
        var run: [Row] = []
        var runKey: [UInt8] = []
        var more = false
        // Rows whose sort prefixes are equal form a run, re-sorted by the full order; a page ends
        // at a run's end so that no row is split from its equals.
        func closeRun() {
            let sorted = sorted(run, q).filter { row in
                guard let after else { return true }
                return Self.compare(q, sortValues(row, q), row.key, after.sortValues, after.key) > 0
            }
            rows += sorted
            run.removeAll()
        }
        try txn.scan(databases.view) { c in
            var e = try c.seek(atLeast: start.bytes)
            while let entry = e, entry.key.starts(with: prefix) {
                let sortEnd = entry.key.count - entry.value.count
                let key = Array(entry.key[..<sortEnd])
                if key != runKey {
                    closeRun()
                    if rows.count >= size {
                        more = true
                        return
                    }
                    runKey = key
                }
                var w = ByteWriter(capacity: 32)
                w.appendBigEndian(t.id)
                w.append(entry.value)
                if let row = try rowAt(w.bytes, t) { run.append(row) }
                e = try c.next()
            }
        }
        closeRun()
        if rows.count > size {
            more = true
            rows = Array(rows.prefix(size))
        }
        let next = more ? rows.last.map { PageToken(sortValues: sortValues($0, q), key: $0.key) } : nil
        return Page(rows: rows, next: next)
    }

    /// Every row of a named view, in its order.
    public func rows(view name: String) throws(StrataError) -> [Row] {
        var all: [Row] = []
        var token: PageToken? = nil
        repeat {
            let page = try page(view: name, size: 500, after: token)
            all += page.rows
            token = page.next
        } while token != nil
        return all
    }
}

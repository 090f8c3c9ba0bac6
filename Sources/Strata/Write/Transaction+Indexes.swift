import LMDB

extension Transaction {
    /// Declares a secondary index on `fields` of `table` and builds it from the table's rows, in
    /// this transaction. Queries filtering or sorting on the first field then scan the index
    /// instead of the table. A `unique` index also refuses any edit that would give two rows the
    /// same values (rows with a null in those fields excepted) — use one for an alternate id.
    ///
    /// Declaring an index identical to an existing one does nothing.
    ///
    /// - Throws: ``StrataError`` `fieldNotFound`, `invalidSchema` (no fields, a name used by
    ///   another index), `duplicateKey` (a unique index over rows that already repeat a value),
    ///   `invalidValue` (a row whose entry — the indexed values, text and bytes cut to 200 bytes
    ///   each, plus the row key — would be longer than LMDB's key limit of 511 bytes).
    /// - Complexity: O(n log n) for the n rows of the table.
    public func createIndex(_ name: String, on table: String, fields: [String], unique: Bool = false) throws(StrataError) {
        try strataErrors {
            var t = try catalog.table(named: table)
            guard !name.isEmpty, !fields.isEmpty, Set(fields).count == fields.count else {
                throw StrataError(.invalidSchema, "an index needs a name and distinct fields")
            }
            var ids: [Int] = []
            for f in fields {
                if let id = t.fieldID(f) {
                    ids.append(id)
                } else if t.isPropertyBag {
                    ids.append(try t.addNewField(f))
                } else {
                    throw t.unknownField(f, detail: " to index")
                }
            }
            if let existing = t.indexes.first(where: { $0.name == name }) {
                guard existing.fieldIDs == ids && existing.unique == unique else {
                    throw StrataError(.invalidSchema, "table '\(table)' has an index '\(name)' with another definition")
                }
                return
            }
            let index = IndexInfo(id: try catalog.nextIndexID, name: name, fieldIDs: ids, unique: unique)
            // Build every entry (and check uniqueness) before writing any.
            var entries: [[UInt8]] = []
            var seen: [[Value]: RowKey] = [:]
            try snapshot.scanTable(t, in: databases.rows) { k, record in
                let values = try IndexKeys.values(index, table: t, target: k, record: record)
                if unique && !values.contains(where: \.isNull) {
                    let key = try t.decodeKey(k)
                    if let other = seen.updateValue(key, forKey: values) {
                        throw StrataError(.duplicateKey, "index '\(name)' cannot be unique: rows \(other) and \(key) of table '\(table)' both hold \(values.map(\.description).joined(separator: ", "))")
                    }
                }
                let entry = IndexKeys.prefix(index, values) + Array(k[4...])
                try databases.checkEntryKey(entry, of: "index '\(name)'", table: t, target: k)
                entries.append(entry)
                return true
            }
            let writer = try self.writer
            try lmdb { () throws(LMDBError) in
                for e in entries { try writer.put(e, [], in: databases.index) }
            }
            t.indexes.append(index)
            workingCatalog.tables[t.id] = t
            workingCatalog.nextIndexID += 1
            markCatalogChanged()
            // The entries for existing rows come from no operation: checkpoint them with the commit.
            requestCheckpoint()
        }
    }
}

extension Transaction {
    /// Runs `body` without checking unique indexes edit by edit, then checks every unique index
    /// of `tables` once over their rows.
    ///
    /// For changes that are whole only together — an import replacing a table's rows, in which
    /// a value may pass from a row removed later to a row written earlier, or two rows swap
    /// their values — where a check after each edit would refuse what ends consistent.
    ///
    /// - Throws: ``StrataError`` `duplicateKey` naming the index and two rows that hold the same
    ///   values. The edits of `body` are then written: the caller must roll back the transaction.
    func deferringUniqueness(of tables: [String], _ body: () throws -> Void) throws {
        let outer = uniquenessDeferred
        uniquenessDeferred = true
        defer { uniquenessDeferred = outer }
        try body()
        if outer { return }  // the outermost call checks
        uniquenessDeferred = false
        for name in tables {
            let t = try catalog.table(named: name)
            for index in t.indexes where index.unique {
                var seen: [[Value]: RowKey] = [:]
                try snapshot.scanTable(t, in: databases.rows) { k, record in
                    let values = try IndexKeys.values(index, table: t, target: k, record: record)
                    guard !values.contains(where: \.isNull) else { return true }
                    let key = try t.decodeKey(k)
                    if let other = seen.updateValue(key, forKey: values) {
                        throw StrataError(.duplicateKey, "index '\(index.name)' of table '\(name)' is unique, and rows \(other) and \(key) both hold \(values.map(\.description).joined(separator: ", "))")
                    }
                    return true
                }
            }
        }
    }
}

extension Store {
    /// Declares (and builds) a secondary index; see ``Transaction/createIndex(_:on:fields:unique:)``.
    public func createIndex(_ name: String, on table: String, fields: [String], unique: Bool = false) throws(StrataError) {
        try strataErrors {
            try write { try $0.createIndex(name, on: table, fields: fields, unique: unique) }
        }
    }
}

extension Snapshot {
    /// The indexes declared on `table`.
    public func indexes(_ table: String) throws(StrataError) -> [IndexDefinition] {
        let t = try catalog.table(named: table)
        return t.indexes.map { IndexDefinition(name: $0.name, table: table, fields: $0.fieldIDs.map(t.fieldName), unique: $0.unique) }
    }
}

extension Transaction {
    /// Adds a field to a fixed table. Existing rows get the field's default (or null), recorded
    /// as `schemaChange` operations that leave them as pending as they were; the log replays
    /// across the change.
    ///
    /// Adding a field the table already has with this very definition does nothing, so a
    /// migration step may run it again; a field of that name with another definition is an error.
    ///
    /// - Throws: ``StrataError`` `invalidSchema` (the name exists with another definition; a
    ///   non-nullable field without a default on a table that has rows; a default of another
    ///   type), `invalidOperation` (a property bag, which takes any field without declaring it).
    /// - Complexity: O(n log n) for the n rows of the table when the field has a default.
    public func addField(_ field: FieldDefinition, to table: String) throws(StrataError) {
        try strataErrors {
            let t = try catalog.table(named: table)
            guard !t.isPropertyBag else {
                throw StrataError(.invalidOperation, "table '\(table)' is a property bag: it takes any field without declaring it")
            }
            var schema = t.schema
            if let existing = schema.fields.first(where: { $0.name.utf8.elementsEqual(field.name.utf8) }) {
                if existing == field { return }
                throw StrataError(.invalidSchema, "table '\(table)' already has a field '\(field.name)', defined as \(SchemaChange.describe(existing)) where \(SchemaChange.describe(field)) was asked for; a field's definition cannot change in place: add a field under a new name and copy the values")
            }
            // Another Unicode form of a field's name is refused by `validate()`, saying so.
            guard t.fieldID(field.name) == nil else {
                throw StrataError(.invalidSchema, "table '\(table)' already has a field '\(field.name)'")
            }
            schema.fields.append(field)
            try schema.validate()
            let rows = try snapshot.rows(table, includingDeleted: true)
            if !field.isNullable && field.defaultValue == nil && !rows.isEmpty {
                throw StrataError(.invalidSchema, "field '\(field.name)' is not nullable and has no default, but table '\(table)' has rows; give it a default")
            }
            replace(t, schema: schema, fieldNames: t.fieldNames + [field.name], dropped: t.dropped)
            guard let value = field.defaultValue, !value.isNull else { return }
            for row in rows {
                var state = RowState(row)
                state.fields[field.name] = .clean(value)
                try setRowState(table, key: row.key, state, kind: .schemaChange, origin: .server)
            }
        }
    }

    /// Drops a field of a fixed table: its values are removed from every row (recorded as
    /// `schemaChange` operations, so a pending change of only that field is no longer pending),
    /// and the name no longer resolves. Old operations still show the field's values by name.
    ///
    /// - Throws: ``StrataError`` `fieldNotFound`, `invalidOperation` (a key field, a property bag,
    ///   a field an index or view uses).
    /// - Complexity: O(n log n) for the n rows of the table.
    public func dropField(_ name: String, from table: String) throws(StrataError) {
        try strataErrors {
            let t = try catalog.table(named: table)
            guard !t.isPropertyBag else {
                throw StrataError(.invalidOperation, "table '\(table)' is a property bag: its fields are not declared")
            }
            guard let id = t.fieldID(name) else { throw t.unknownField(name) }
            guard !t.isKeyField(id) else { throw StrataError(.invalidOperation, "'\(name)' is a primary key field of table '\(table)'") }
            let users = t.indexes.filter { $0.fieldIDs.contains(id) }.map(\.name)
                + t.views.filter { $0.query.orderBy.contains { $0.field == name } || ($0.query.filter?.fields.contains(name) ?? false) }.map(\.name)
            guard users.isEmpty else {
                throw StrataError(.invalidOperation, "field '\(name)' of table '\(table)' is used by \(users.joined(separator: ", ")); drop those first")
            }
            for row in try snapshot.rows(table, includingDeleted: true) where !row.original(name).isNull || !row[name].isNull {
                var state = RowState(row)
                state.fields[name] = nil
                try setRowState(table, key: row.key, state, kind: .schemaChange, origin: .server)
            }
            var schema = t.schema
            schema.fields.removeAll { $0.name == name }
            replace(t, schema: schema, fieldNames: t.fieldNames, dropped: t.dropped.union([id]))
        }
    }

    /// Stores a table's new schema and field list in the catalog, keeping its indexes and views.
    private func replace(_ t: TableInfo, schema: TableSchema, fieldNames: [String], dropped: Set<Int>) {
        var updated = TableInfo(id: t.id, schema: schema, fieldNames: fieldNames, dropped: dropped)
        updated.indexes = t.indexes
        updated.views = t.views
        workingCatalog.tables[t.id] = updated
        markCatalogChanged()
    }
}

extension Store {
    /// Adds a field to a fixed table; see ``Transaction/addField(_:to:)``.
    public func addField(_ field: FieldDefinition, to table: String) throws(StrataError) {
        try strataErrors {
            try write { try $0.addField(field, to: table) }
        }
    }

    /// Drops a field of a fixed table; see ``Transaction/dropField(_:from:)``.
    public func dropField(_ name: String, from table: String) throws(StrataError) {
        try strataErrors {
            try write { try $0.dropField(name, from: table) }
        }
    }
}

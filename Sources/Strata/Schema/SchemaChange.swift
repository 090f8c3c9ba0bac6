/// What tells a stored table definition from a wanted one, said as the steps that change it:
/// the advice of a `tableExists` error.
enum SchemaChange {
    /// One sentence per difference, then where such changes go.
    static func advice(from stored: TableSchema, to wanted: TableSchema) -> String {
        var steps: [String] = []
        if stored.mode != wanted.mode || stored.primaryKey != wanted.primaryKey {
            steps.append("its mode and primary key (\(stored.mode.rawValue), \(stored.primaryKey)) cannot change (\(wanted.mode.rawValue), \(wanted.primaryKey) was asked for): create a table under another name and copy the rows")
        }
        let storedFields = Dictionary(stored.fields.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        let wantedFields = Dictionary(wanted.fields.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        let added = wanted.fields.filter { storedFields[$0.name] == nil }
        let dropped = stored.fields.filter { wantedFields[$0.name] == nil }
        let changed = wanted.fields.filter { f in storedFields[f.name].map { $0 != f } ?? false }
        if !added.isEmpty {
            steps.append("add \(added.map { "'\($0.name)'" }.joined(separator: ", ")) with addField(_:to:)")
        }
        if !dropped.isEmpty {
            steps.append("drop \(dropped.map { "'\($0.name)'" }.joined(separator: ", ")) with dropField(_:from:)")
        }
        for f in changed {
            steps.append("field '\(f.name)' is \(describe(storedFields[f.name]!)), not \(describe(f)), and a field's definition cannot change in place: add a field under a new name and copy the values")
        }
        if steps.isEmpty { steps.append("the fields are the same but in another order, which cannot change") }
        return steps.joined(separator: "; ") + ". Make such changes once per store with a Migrator step (see docs/schema.md)"
    }

    /// A field's definition in a few words: `int, not null, default 0`.
    static func describe(_ f: FieldDefinition) -> String {
        var parts = [f.type.rawValue, f.isNullable ? "nullable" : "not null"]
        if let d = f.defaultValue { parts.append("default \(d)") }
        return parts.joined(separator: ", ")
    }
}

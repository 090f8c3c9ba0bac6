import Foundation

extension TableInfo {
    /// The longest encoded row key (table id included): ``RowRule/maxKeyBytes``.
    static var maxKeyBytes: Int { RowRule.maxKeyBytes }

    /// The one check of a value entering the store, whatever brings it — an edit, a merge, a
    /// reset, a conflict resolution, a briefcase import (``Transaction`` edits,
    /// `setRowState` and `mergeServerValues` all call it). The rule itself is ``RowRule``'s,
    /// which the sync server applies too; this form finds the field's definition by its id.
    func admit(_ value: Value, field id: Int?, name fieldName: String, nullable: Bool? = nil) throws(StrataError) -> Value {
        // Not `id.flatMap { definitions[$0] }`: that closure took a copy of the whole table.
        let def: FieldDefinition? = if let id { definitions[id] } else { nil }
        return try RowRule.admit(value, table: name, field: fieldName, definition: def, nullable: nullable)
    }

    /// Refuses a NaN or infinite double or timestamp, naming the field.
    func checkFinite(_ value: Value, _ fieldName: String) throws(StrataError) {
        try RowRule.checkFinite(value, table: name, field: fieldName)
    }

    /// Checks `value` against a declared field; an int given for a double field is converted.
    /// A NaN or infinite double or timestamp is refused (see ``RowRule``).
    func coerce(_ value: Value, _ def: FieldDefinition) throws(StrataError) -> Value {
        try RowRule.coerce(value, table: name, def)
    }

    /// Writes the `rows` key of `key` — table id, then the order-preserving key components —
    /// into `w`, checking the key against the primary key.
    /// `oneIntKey` is ``hasOneIntKey``, when the caller worked it out once for many keys.
    func encodeKey(_ key: RowKey, into w: inout ByteWriter, oneIntKey: Bool? = nil) throws(StrataError) {
        // One int under one int key field, most tables' key, is written here: the general
        // check takes each definition by copy and costs about 800 instructions per key. The
        // same bytes, and nothing that check would refuse: an int for an int field passes
        // `coerce` as it is, and its 13 bytes are within the key limit.
        if key.values.count == 1, case .int(let i) = key.values[0], oneIntKey ?? hasOneIntKey {
            // The table id and `KeyCodec`'s int component, made on the stack and put in place
            // of the writer's bytes by one call: emptying the writer and three appends cost
            // about 200 instructions a key, once per merged server row.
            var k: (UInt64, UInt64) = (0, 0)
            withUnsafeMutableBytes(of: &k) { b in
                b.storeBytes(of: id.bigEndian, toByteOffset: 0, as: UInt32.self)
                b.storeBytes(of: KeyCodec.tagInt, toByteOffset: 4, as: UInt8.self)
                b.storeBytes(of: KeyCodec.intBits(i).bigEndian, toByteOffset: 5, as: UInt64.self)
            }
            withUnsafeBytes(of: &k) { w.replaceAll(with: UnsafeRawBufferPointer(rebasing: $0[0..<13])) }
            assert(w.bytes == { var g = ByteWriter(); g.appendBigEndian(id); KeyCodec.append(.int(i), to: &g); return g.bytes }(), "the one-int key differs from KeyCodec's")
            return
        }
        // The closure takes the one array it reads, not a copy of the whole table.
        let definitions = self.definitions
        try RowRule.encodeKey(key, of: schema, tableID: id, definitions: keyFieldIDs.lazy.map { definitions[$0]! }, into: &w)
    }

    /// Whether the primary key is one field of type int. (Its definition is copied to find
    /// out: about 150 instructions, which a merge of many rows spends once.)
    var hasOneIntKey: Bool { keyFieldIDs.count == 1 && definitions[keyFieldIDs[0]]?.type == .int }

    /// Decodes the row key from a `rows` key (table id included).
    func decodeKey(_ rowsKey: UnsafeRawBufferPointer) throws(StrataError) -> RowKey {
        var r = ByteReader(rowsKey, offset: 4)
        return try KeyCodec.readKey(&r, count: keyFieldIDs.count)
    }
}

extension Catalog {
    /// A readable name for a `rows` key: `table key`, or the raw bytes if it cannot be decoded.
    func describe(rowsKey k: UnsafeRawBufferPointer) -> String {
        if k.count >= 4 {
            var r = ByteReader(k)
            if let id = try? r.bigEndian32(), let t = tables[id], let key = try? t.decodeKey(k) {
                return "\(t.name) \(key)"
            }
        }
        return k.map { String($0, radix: 16) }.joined()
    }
}

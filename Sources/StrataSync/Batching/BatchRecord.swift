import Foundation
@_spi(ValueCoding) import Strata

/// The batch in flight as the store keeps it: a versioned binary record in the store's own value
/// encoding, read back by every call that checks an acknowledgement against it.
///
/// Layout (version 1), strings and keys as encoded values, counts as varints:
///
/// ```
/// 0x01  id  clientID  number  changeCount  change…
/// change = table  keyCount key-value…  kind(0 insert, 1 update, 2 delete)
///          valueCount (name value)…  originalCount (name value)…
/// ```
///
/// Stores written before this record kept the batch as its JSON payload; such a record starts
/// with `{` (0x7B), which no version byte will be, and is still read.
enum BatchRecord {
    static let version: UInt8 = 1

    static func encode(_ batch: Batch) -> [UInt8] {
        var out: [UInt8] = [version]
        out.reserveCapacity(64 + batch.changes.count * 48)
        ValueCoding.append(.string(batch.id), to: &out)
        ValueCoding.append(.string(batch.clientID), to: &out)
        ValueCoding.appendVarint(batch.number, to: &out)
        ValueCoding.appendVarint(UInt64(batch.changes.count), to: &out)
        for c in batch.changes {
            ValueCoding.append(.string(c.table), to: &out)
            ValueCoding.appendVarint(UInt64(c.key.values.count), to: &out)
            for v in c.key.values { ValueCoding.append(v, to: &out) }
            out.append(kindCode(c.kind))
            // Sorted, so that one batch is always the same bytes.
            for fields in [c.values, c.originals] {
                ValueCoding.appendVarint(UInt64(fields.count), to: &out)
                for (name, value) in fields.sorted(by: { $0.key < $1.key }) {
                    ValueCoding.append(.string(name), to: &out)
                    ValueCoding.append(value, to: &out)
                }
            }
        }
        return out
    }

    /// - Throws: `StrataError` `corruptRecord` for bytes that are not a batch record, naming the
    ///   property they came from.
    static func decode(_ bytes: [UInt8], property: String) throws(StrataError) -> Batch {
        func damaged(_ what: String) -> StrataError {
            StrataError(.corruptRecord, "the store is damaged: the in-flight batch (property \(property)) \(what)")
        }
        guard let first = bytes.first else { throw damaged("is empty") }
        if first == UInt8(ascii: "{") {
            do {
                return try WireFormat.decode(Batch.self, from: Data(bytes))
            } catch {
                throw damaged("is neither a batch record nor a batch payload: \(error.message)")
            }
        }
        guard first == version else {
            throw damaged("has record version \(first); this version of Strata reads version \(version) (was the store written by a newer one?)")
        }
        var at = 1
        func value() throws(StrataError) -> Value {
            do { return try ValueCoding.readValue(bytes, at: &at) } catch { throw damaged("is cut short or garbled at byte \(at): \(error.message)") }
        }
        func varint() throws(StrataError) -> UInt64 {
            do { return try ValueCoding.readVarint(bytes, at: &at) } catch { throw damaged("is cut short or garbled at byte \(at): \(error.message)") }
        }
        func string() throws(StrataError) -> String {
            guard case .string(let s) = try value() else { throw damaged("holds a non-string where a name belongs, before byte \(at)") }
            return s
        }
        func count() throws(StrataError) -> Int {
            let n = try varint()
            // Every entry takes at least one byte: a larger count is damage, not a reason to allocate.
            guard n <= UInt64(bytes.count - at) else { throw damaged("has a count of \(n) at byte \(at) with only \(bytes.count - at) bytes left") }
            return Int(n)
        }
        let id = try string()
        let clientID = try string()
        let number = try varint()
        let n = try count()
        var changes: [RowChange] = []
        changes.reserveCapacity(n)
        for _ in 0..<n {
            let table = try string()
            var key: [Value] = []
            for _ in 0..<(try count()) { key.append(try value()) }
            guard at < bytes.count, let kind = kind(bytes[at]) else { throw damaged("has no valid change kind at byte \(at)") }
            at += 1
            var maps: [[String: Value]] = [[:], [:]]
            for m in 0..<2 {
                for _ in 0..<(try count()) {
                    let name = try string()
                    maps[m][name] = try value()
                }
            }
            changes.append(RowChange(table: table, key: RowKey(key), kind: kind, values: maps[0], originals: maps[1]))
        }
        guard at == bytes.count else { throw damaged("has \(bytes.count - at) bytes after its last change") }
        return Batch(id: id, clientID: clientID, number: number, changes: changes)
    }

    private static func kindCode(_ kind: RowChange.Kind) -> UInt8 {
        switch kind {
        case .insert: 0
        case .update: 1
        case .delete: 2
        }
    }

    private static func kind(_ code: UInt8) -> RowChange.Kind? {
        switch code {
        case 0: .insert
        case 1: .update
        case 2: .delete
        default: nil
        }
    }
}

import Foundation
@_spi(ValueCoding) import Strata

/// The batch in flight and everything its acknowledgement reads, as one value: the store keeps
/// it in one property (`SyncClient.inFlightProperty`), read and written as a whole in the
/// transactions that freeze, send, merge around and acknowledge the batch.
///
/// The batch counter, the last acknowledged batch id and the rows set aside stay properties of
/// their own: they outlive the batch (the next batch numbers on, a repeated ack is recognised
/// after the batch is over, a row set aside waits for the app), while this record ends with it.
package struct InFlightRecord: Sendable, Hashable {
    /// The batch, as frozen.
    package var batch: Batch
    /// Whether it was handed to the transport.
    package var state: BatchState
    /// The last LSN when the batch was frozen: the acknowledgement reads the history after it.
    package var frozenAt: UInt64
    /// The server's deletes merged since the freeze that the acknowledgement must meet
    /// (`AckRules.remembersDelete`): delete changes, one per row, the first note kept.
    package var serverDeletes: [RowChange] = []
    /// What the device held under the key of an insert of the batch when a merge brought a
    /// server row there (`AckRules.notesEcho`): an insert of its values, or a delete for no row.
    package var echoes: [RowChange] = []
    /// The rows of the batch that a delta merged since the freeze upserted, changed or not
    /// (`AckRules.awaitsSnapshot`): update changes without values.
    package var listed: [RowChange] = []
    /// Whether a snapshot was merged since the freeze (`AckRules.awaitsSnapshot`).
    package var snapshotMerged = false

    package init(batch: Batch, state: BatchState, frozenAt: UInt64) {
        self.batch = batch
        self.state = state
        self.frozenAt = frozenAt
    }

    /// Adds `changes` to the notes at `notes`, the first note of a row kept.
    mutating func note(_ changes: [RowChange], in notes: WritableKeyPath<InFlightRecord, [RowChange]>) {
        guard !changes.isEmpty else { return }
        var seen = Set(self[keyPath: notes].map { SyncClient.rowID($0.table, $0.key) })
        self[keyPath: notes] += changes.filter { seen.insert(SyncClient.rowID($0.table, $0.key)).inserted }
    }
}

/// The binary records of the batch in flight, in the store's own value encoding.
///
/// Layouts, strings and keys as encoded values, counts and LSNs as varints:
///
/// ```
/// version 2 (InFlightRecord):
///   0x02  state(0 pending, 1 sent)  frozenAt  snapshotMerged(0, 1)  batch
///         deleteCount change…  echoCount change…  listedCount change…
/// version 1 (the batch alone; stores written before version 2):
///   0x01  batch
/// batch  = id  clientID  number  changeCount  change…
/// change = table  keyCount key-value…  kind(0 insert, 1 update, 2 delete)
///          valueCount (name value)…  originalCount (name value)…
/// ```
///
/// Stores written before version 1 kept the batch as its JSON payload; such a record starts
/// with `{` (0x7B), which no version byte will be, and is still read. With versions 0 and 1 the
/// rest of the in-flight state was in properties of its own (`SyncClient.legacyInFlightProperties`).
enum BatchRecord {
    /// The version of the batch-only record (``encode(_:)``).
    static let version: UInt8 = 1
    /// The version of the whole in-flight record (``encode(_:)-InFlightRecord``).
    static let inFlightVersion: UInt8 = 2

    /// The batch alone, as version 1.
    static func encode(_ batch: Batch) -> [UInt8] {
        var out: [UInt8] = [version]
        out.reserveCapacity(64 + batch.changes.count * 48)
        append(batch, to: &out)
        return out
    }

    static func encode(_ record: InFlightRecord) -> [UInt8] {
        var out: [UInt8] = [inFlightVersion, record.state == .sent ? 1 : 0]
        out.reserveCapacity(64 + record.batch.changes.count * 48)
        ValueCoding.appendVarint(record.frozenAt, to: &out)
        out.append(record.snapshotMerged ? 1 : 0)
        append(record.batch, to: &out)
        for notes in [record.serverDeletes, record.echoes, record.listed] {
            ValueCoding.appendVarint(UInt64(notes.count), to: &out)
            for c in notes { append(c, to: &out) }
        }
        return out
    }

    /// A key as its value count and its values (`Reader.key()` reads it).
    static func append(_ key: RowKey, to out: inout [UInt8]) {
        ValueCoding.appendVarint(UInt64(key.values.count), to: &out)
        for v in key.values { ValueCoding.append(v, to: &out) }
    }

    private static func append(_ batch: Batch, to out: inout [UInt8]) {
        ValueCoding.append(.string(batch.id), to: &out)
        ValueCoding.append(.string(batch.clientID), to: &out)
        ValueCoding.appendVarint(batch.number, to: &out)
        ValueCoding.appendVarint(UInt64(batch.changes.count), to: &out)
        for c in batch.changes { append(c, to: &out) }
    }

    private static func append(_ c: RowChange, to out: inout [UInt8]) {
        ValueCoding.append(.string(c.table), to: &out)
        append(c.key, to: &out)
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

    /// The batch of a record of any version.
    ///
    /// - Throws: `StrataError` `corruptRecord` for bytes that are not a batch record, naming the
    ///   property they came from.
    static func decode(_ bytes: [UInt8], property: String) throws(StrataError) -> Batch {
        switch try decodeAny(bytes, property: property) {
        case .batch(let batch): batch
        case .record(let record): record.batch
        }
    }

    /// What a stored record holds: the whole in-flight record (version 2), or the batch alone
    /// (version 1 or JSON), whose other state an older version kept in properties of its own.
    enum Stored {
        case record(InFlightRecord)
        case batch(Batch)
    }

    static func decodeAny(_ bytes: [UInt8], property: String) throws(StrataError) -> Stored {
        var r = Reader(bytes: bytes, property: property, subject: "the in-flight batch")
        guard let first = bytes.first else { throw r.damaged("is empty") }
        if first == UInt8(ascii: "{") {
            do {
                return .batch(try WireFormat.decode(Batch.self, from: Data(bytes)))
            } catch {
                throw r.damaged("is neither a batch record nor a batch payload: \(error.message)")
            }
        }
        r.at = 1
        let stored: Stored
        switch first {
        case version:
            stored = .batch(try r.batch())
        case inFlightVersion:
            let state: BatchState = switch try r.byte("state") {
            case 0: .pending
            case 1: .sent
            case let b: throw r.damaged("has state \(b) at byte \(r.at - 1), not 0 (pending) or 1 (sent)")
            }
            let frozenAt = try r.varint()
            let snapshotMerged = try r.byte("snapshot mark")
            guard snapshotMerged <= 1 else { throw r.damaged("has snapshot mark \(snapshotMerged) at byte \(r.at - 1), not 0 or 1") }
            var record = InFlightRecord(batch: try r.batch(), state: state, frozenAt: frozenAt)
            record.snapshotMerged = snapshotMerged == 1
            record.serverDeletes = try r.changes()
            record.echoes = try r.changes()
            record.listed = try r.changes()
            stored = .record(record)
        default:
            throw r.damaged("has record version \(first); this version of Strata reads versions \(version) and \(inFlightVersion) (was the store written by a newer one?)")
        }
        guard r.at == bytes.count else { throw r.damaged("has \(bytes.count - r.at) bytes after its last change") }
        return stored
    }

    /// Reads a record front to back (this one, and ``SetAsideRecord``'s); every error names the
    /// property and the byte.
    struct Reader {
        let bytes: [UInt8]
        let property: String
        /// What the record holds, as its errors name it ("the in-flight batch").
        let subject: String
        var at = 0

        func damaged(_ what: String) -> StrataError {
            StrataError(.corruptRecord, "the store is damaged: \(subject) (property \(property)) \(what)")
        }

        mutating func value() throws(StrataError) -> Value {
            do { return try ValueCoding.readValue(bytes, at: &at) } catch { throw damaged("is cut short or garbled at byte \(at): \(error.message)") }
        }

        mutating func varint() throws(StrataError) -> UInt64 {
            do { return try ValueCoding.readVarint(bytes, at: &at) } catch { throw damaged("is cut short or garbled at byte \(at): \(error.message)") }
        }

        mutating func byte(_ what: String) throws(StrataError) -> UInt8 {
            guard at < bytes.count else { throw damaged("is cut short before its \(what), at byte \(at)") }
            at += 1
            return bytes[at - 1]
        }

        mutating func string() throws(StrataError) -> String {
            guard case .string(let s) = try value() else { throw damaged("holds a non-string where a string belongs, before byte \(at)") }
            return s
        }

        mutating func count() throws(StrataError) -> Int {
            let n = try varint()
            // Every entry takes at least one byte: a larger count is damage, not a reason to allocate.
            guard n <= UInt64(bytes.count - at) else { throw damaged("has a count of \(n) at byte \(at) with only \(bytes.count - at) bytes left") }
            return Int(n)
        }

        mutating func batch() throws(StrataError) -> Batch {
            let id = try string()
            let clientID = try string()
            let number = try varint()
            return Batch(id: id, clientID: clientID, number: number, changes: try changes())
        }

        mutating func changes() throws(StrataError) -> [RowChange] {
            let n = try count()
            var changes: [RowChange] = []
            changes.reserveCapacity(n)
            for _ in 0..<n { changes.append(try change()) }
            return changes
        }

        mutating func key() throws(StrataError) -> RowKey {
            var key: [Value] = []
            for _ in 0..<(try count()) { key.append(try value()) }
            return RowKey(key)
        }

        mutating func kind() throws(StrataError) -> RowChange.Kind {
            guard at < bytes.count, let kind = BatchRecord.kind(bytes[at]) else { throw damaged("has no valid change kind at byte \(at)") }
            at += 1
            return kind
        }

        mutating func change() throws(StrataError) -> RowChange {
            let table = try string()
            let key = try key()
            let kind = try kind()
            var maps: [[String: Value]] = [[:], [:]]
            for m in 0..<2 {
                for _ in 0..<(try count()) {
                    let name = try string()
                    maps[m][name] = try value()
                }
            }
            return RowChange(table: table, key: key, kind: kind, values: maps[0], originals: maps[1])
        }
    }

    static func kindCode(_ kind: RowChange.Kind) -> UInt8 {
        switch kind {
        case .insert: 0
        case .update: 1
        case .delete: 2
        }
    }

    static func kind(_ code: UInt8) -> RowChange.Kind? {
        switch code {
        case 0: .insert
        case 1: .update
        case 2: .delete
        default: nil
        }
    }
}

import Foundation
@_spi(ValueCoding) import Strata
@testable import StrataSync
import StrataTesting
import StrataWorkload
import Testing

/// The lists of rows set aside (the rows the server rejected, the server rows this store
/// refused) as binary records (`SetAsideRecord`), and stores whose lists an earlier version
/// kept as JSON.
@Suite struct SetAsideRecordTests {
    static func randomString(_ g: inout SplitMix64) -> String { BatchRecordTests.randomChange(&g).table }

    /// Rows with every kind of change and key value, keys of one to three fields, and strings
    /// that need every kind of escaping (``BatchRecordTests/randomChange(_:)``).
    static func randomRejected(_ g: inout SplitMix64) -> RejectedRow {
        let c = BatchRecordTests.randomChange(&g)
        return RejectedRow(table: c.table, key: c.key, kind: c.kind, reason: randomString(&g), batchID: randomString(&g))
    }

    static func randomRefused(_ g: inout SplitMix64) -> RefusedServerRow {
        let c = BatchRecordTests.randomChange(&g)
        // A refused row's key may lack fields, down to none.
        let key = g.below(8) == 0 ? RowKey([]) : c.key
        return RefusedServerRow(table: c.table, key: key, reason: randomString(&g), anchor: randomString(&g))
    }

    @Test func everyFieldOfEveryRowReadsBack() throws {
        let seed = testSeed("everyFieldOfEveryRowReadsBack")
        var g = SplitMix64(seed: seed)
        for i in 0..<400 {
            let rejected = (0..<g.below(6)).map { _ in Self.randomRejected(&g) }
            let record = SetAsideRecord.encode(rejected)
            #expect(try SetAsideRecord.rejectedRows(record, property: "p") == rejected, "list \(i) (seed \(seed))")
            #expect(SetAsideRecord.encode(rejected) == record, "one list, one record")
            let refused = (0..<g.below(6)).map { _ in Self.randomRefused(&g) }
            #expect(try SetAsideRecord.refusedServerRows(SetAsideRecord.encode(refused), property: "p") == refused, "list \(i) (seed \(seed))")
            // The JSON earlier versions stored reads as the same list.
            #expect(try SetAsideRecord.rejectedRows(Array(WireFormat.encoder.encode(rejected)), property: "p") == rejected, "list \(i) (seed \(seed))")
            #expect(try SetAsideRecord.refusedServerRows(Array(WireFormat.encoder.encode(refused)), property: "p") == refused, "list \(i) (seed \(seed))")
        }
    }

    /// Every prefix of a record, trailing bytes, a version this library does not write, a bad
    /// change kind and a cut JSON list are damage, reported with the property's name.
    @Test func aDamagedListIsReportedNotGuessed() throws {
        let rejected = Self.rejectedFixture
        let record = SetAsideRecord.encode(rejected)
        var damaged: [[UInt8]] = (0..<record.count).map { Array(record.prefix($0)) }
        damaged.append(record + [0])
        damaged.append([2] + record.dropFirst())
        damaged.append(Array(Self.rejectedJSON.utf8.prefix(40)))
        // The first row's kind, after the version, the count, its table and its key.
        var head: [UInt8] = [SetAsideRecord.version, UInt8(rejected.count)]
        ValueCoding.append(.string(rejected[0].table), to: &head)
        BatchRecord.append(rejected[0].key, to: &head)
        #expect(record.starts(with: head) && record[head.count] == BatchRecord.kindCode(rejected[0].kind))
        var badKind = record
        badKind[head.count] = 3
        damaged.append(badKind)
        for bytes in damaged {
            let e = #expect(throws: StrataError.self) { try SetAsideRecord.rejectedRows(bytes, property: SyncClient.rejectedProperty) }
            #expect(e?.code == .corruptRecord && e?.message.contains(SyncClient.rejectedProperty) == true, "\(bytes.count) bytes: \(String(describing: e))")
        }
        let e = #expect(throws: StrataError.self) { try SetAsideRecord.refusedServerRows([9, 0], property: SyncClient.refusedServerRowsProperty) }
        #expect(e?.code == .corruptRecord && e?.message.contains("record version 9") == true && e?.message.contains(SyncClient.refusedServerRowsProperty) == true, "\(String(describing: e))")
    }

    /// A damaged list fails the calls that read it with that error, and the store stays as it was.
    @Test func aDamagedListInTheStoreFailsItsReadersAndChangesNothing() throws {
        try withStore { store in
            let sync = SyncClient(store: store)
            try sync.merge(ServerDelta(anchor: "v1", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "one"])])]))
            let rejected = Array(SetAsideRecord.encode(Self.rejectedFixture).dropLast())
            let refused = Array(SetAsideRecord.encode(Self.refusedFixture).dropLast())
            try store.write { tx in
                try tx.setStrataProperty(SyncClient.rejectedProperty, .bytes(rejected))
                try tx.setStrataProperty(SyncClient.refusedServerRowsProperty, .bytes(refused))
            }
            let before = try observable(store)
            let calls: [(String, () throws -> Void)] = [
                (SyncClient.rejectedProperty, { _ = try sync.rejectedRows() }),
                (SyncClient.rejectedProperty, { try sync.retryRejected("tasks", key: 7) }),
                (SyncClient.refusedServerRowsProperty, { _ = try sync.refusedServerRows() }),
                (SyncClient.refusedServerRowsProperty, {
                    try sync.merge(ServerDelta(since: "v1", anchor: "v2", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 2, "title": "two"])])]))
                }),
            ]
            for (property, call) in calls {
                let e = #expect(throws: StrataError.self) { try call() }
                #expect(e?.code == .corruptRecord && e?.message.contains(property) == true && e?.message.contains("cut short") == true, "\(String(describing: e))")
            }
            #expect(try observable(store) == before)
            #expect(try store.read { try $0.property(SyncClient.rejectedProperty)?.bytesValue } == rejected)
            #expect(try store.read { try $0.property(SyncClient.refusedServerRowsProperty)?.bytesValue } == refused)
        }
    }

    // MARK: Lists an earlier version stored

    static let rejectedFixture = [
        RejectedRow(table: "tasks", key: 7, kind: .update, reason: "title is locked by the project's owner", batchID: "device-a-12"),
        RejectedRow(table: "tâches", key: RowKey([.string("équipe 🚀"), .int(-3)]), kind: .insert, reason: "quota \"exceeded\"\nfor 日本語", batchID: "device-a-12"),
        RejectedRow(table: "files", key: RowKey([.bytes([0, 255, 16]), .string("v2")]), kind: .delete, reason: "", batchID: "device-a-13"),
    ]

    static let refusedFixture = [
        RefusedServerRow(table: "tasks", key: 2, reason: "field 'title' holds string values, not int 5", anchor: "v2"),
        RefusedServerRow(table: "réglages", key: RowKey([.string("naïve 🌍"), .int(9)]), reason: "the row sets field 'colour', which table 'réglages' does not have", anchor: "v2"),
        RefusedServerRow(table: "tasks", key: RowKey([]), reason: "the row lacks a key field of table 'tasks' (id)", anchor: "v3"),
    ]

    /// The properties as the code before the records (up to commit 4931ba1) wrote the two lists
    /// above, byte for byte.
    static let rejectedJSON = #"[{"batchID":"device-a-12","key":[{"int":7}],"kind":"update","reason":"title is locked by the project's owner","table":"tasks"},{"batchID":"device-a-12","key":[{"string":"équipe 🚀"},{"int":-3}],"kind":"insert","reason":"quota \"exceeded\"\nfor 日本語","table":"tâches"},{"batchID":"device-a-13","key":[{"bytes":"AP8Q"},{"string":"v2"}],"kind":"delete","reason":"","table":"files"}]"#
    static let refusedJSON = #"[{"anchor":"v2","key":[{"int":2}],"reason":"field 'title' holds string values, not int 5","table":"tasks"},{"anchor":"v2","key":[{"string":"naïve 🌍"},{"int":9}],"reason":"the row sets field 'colour', which table 'réglages' does not have","table":"réglages"},{"anchor":"v3","key":[],"reason":"the row lacks a key field of table 'tasks' (id)","table":"tasks"}]"#

    @Test func theFixturesAreWhatEarlierVersionsWrote() throws {
        // The types are still `Codable` with the same encoder, so this holds the literals (and
        // this file's encoding of them) to the old format.
        #expect(try WireFormat.encoder.encode(Self.rejectedFixture) == Data(Self.rejectedJSON.utf8))
        #expect(try WireFormat.encoder.encode(Self.refusedFixture) == Data(Self.refusedJSON.utf8))
    }

    func property(_ name: String, _ store: Store) throws -> [UInt8]? {
        try store.read { try $0.property(name)?.bytesValue }
    }

    /// Read as it is; the next save of the list, here the app's retry of one row, writes the rest
    /// as a record.
    @Test func rejectedRowsKeptAsJSONAreReadAndRewrittenOnTheNextSave() throws {
        try withStore { store in
            let sync = SyncClient(store: store)
            try store.write { try $0.setStrataProperty(SyncClient.rejectedProperty, .bytes(Array(Self.rejectedJSON.utf8))) }
            #expect(try sync.rejectedRows() == Self.rejectedFixture)
            #expect(try property(SyncClient.rejectedProperty, store) == Array(Self.rejectedJSON.utf8), "a read leaves the list as it is")
            try sync.retryRejected("files", key: Self.rejectedFixture[2].key)
            let kept = Array(Self.rejectedFixture.prefix(2))
            #expect(try property(SyncClient.rejectedProperty, store) == SetAsideRecord.encode(kept))
            #expect(try sync.rejectedRows() == kept)
        }
    }

    /// Read as it is; the next save of the list, here a merge that brings one of its rows in a
    /// form the store can hold, writes the rest as a record.
    @Test func refusedServerRowsKeptAsJSONAreReadAndRewrittenOnTheNextSave() throws {
        try withStore { store in
            let sync = SyncClient(store: store)
            try sync.merge(ServerDelta(anchor: "v3", tables: []))
            try store.write { try $0.setStrataProperty(SyncClient.refusedServerRowsProperty, .bytes(Array(Self.refusedJSON.utf8))) }
            #expect(try sync.refusedServerRows() == Self.refusedFixture)
            #expect(try property(SyncClient.refusedServerRowsProperty, store) == Array(Self.refusedJSON.utf8), "a read leaves the list as it is")
            try sync.merge(ServerDelta(since: "v3", anchor: "v4", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 2, "title": "mended"])])]))
            let kept = Array(Self.refusedFixture.dropFirst())
            #expect(try property(SyncClient.refusedServerRowsProperty, store) == SetAsideRecord.encode(kept))
            #expect(try sync.refusedServerRows() == kept)
            #expect(try store.read { try $0.row("tasks", key: 2)?["title"] } == "mended")
        }
    }
}

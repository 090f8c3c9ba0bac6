import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// One validation for every way data enters — edits, merges (both merge paths), resets,
/// conflict resolutions, briefcase imports: non-finite numbers and times, nulls and missing
/// values for required fields, empty field names are refused with a clear error and nothing
/// changes. And keys compare byte for byte everywhere (no Unicode normalisation).
@Suite struct ValidationTests {
    static let readings = TableSchema.fixed("readings", primaryKey: ["id"], fields: [
        .int("id"), .double("v"), .timestamp("at", nullable: true), .string("label", nullable: true),
    ])
    static let bag = TableSchema.propertyBag("bag", key: [.int("id")])

    static func withStores<R>(_ body: (Store) throws -> R) throws -> R {
        try withStore { store in
            try store.createTable(readings)
            try store.createTable(bag)
            try store.createTable(.fixed("byDouble", primaryKey: ["k"], fields: [.double("k")]))
            try store.write { tx in
                try tx.insert("readings", ["id": 1, "v": 1.5])
                try tx.acknowledge("readings", key: 1)
                try tx.insert("readings", ["id": 2, "v": 2.5])
                try tx.acknowledge("readings", key: 2)
                try tx.update("readings", key: 2, ["v": 3.5])  // pending: merged field by field
                try tx.insert("bag", ["id": 1, "x": 1])
            }
            return try body(store)
        }
    }

    static let bad: [(String, Value)] = [
        ("NaN", .double(.nan)), ("+infinity", .double(.infinity)), ("-infinity", .double(-.infinity)),
        ("NaN timestamp", .timestamp(Date(timeIntervalSince1970: .nan))),
    ]

    @Test(arguments: bad.map(\.0))
    func nonFiniteValuesAreRefusedWhereverTheyEnter(_ name: String) throws {
        let value = Self.bad.first { $0.0 == name }!.1
        let field = if case .timestamp = value { "at" } else { "v" }
        try Self.withStores { store in
            let before = try observableAll(store)
            let sync = SyncClient(store: store)
            // A row of `base` with the bad value in `field` (which may be one of base's).
            func with(_ base: [String: Value]) -> [String: Value] { base.merging([field: value]) { $1 } }
            var attempts: [(String, () throws -> Void)] = [
                ("insert", { try store.write { try $0.insert("readings", FieldValues(with(["id": 9, "v": 1]))) } }),
                ("update", { try store.write { try $0.update("readings", key: 1, [field: value]) } }),
                ("property-bag insert", { try store.write { try $0.insert("bag", ["id": 2, "y": value]) } }),
                ("property", { try store.write { try $0.setProperty("p", value) } }),
            ]
            // A server row is set aside with the reason instead (`RefusedServerRowTests`).
            let merges: [(String, () throws -> MergeReport)] = [
                ("merge of a clean row", { try sync.merge(ServerDelta(anchor: "a", tables: [TableDelta("readings", upserts: [ServerRow(["id": 1, field: value])])])) }),
                ("merge of a pending row", { try sync.merge(ServerDelta(anchor: "a", tables: [TableDelta("readings", upserts: [ServerRow(["id": 2, field: value])])])) }),
                ("merge of a new row", { try sync.merge(ServerDelta(anchor: "a", tables: [TableDelta("readings", upserts: [ServerRow(with(["id": 5, "v": 1]))])])) }),
                ("merge into a property bag", { try sync.merge(ServerDelta(anchor: "a", tables: [TableDelta("bag", upserts: [ServerRow(["id": 1, "x": value])])])) }),
            ]
            let rowsBefore = try observableRows(store)
            for (what, merge) in merges {
                let report = try merge()
                #expect(report.refusedRows.count == 1 && report.refusedRows.first?.reason.contains("finite") == true, "\(what): \(report)")
                #expect(try observableRows(store) == rowsBefore, "\(what) changed the rows")
            }
            if field == "v" {
                attempts.append(("key of a double", { try store.write { try $0.insert("byDouble", ["k": value]) } }))
            }
            // A reset refuses the row too; the rows the snapshot leaves out go, as in any reset.
            let row1 = try store.read { try $0.row("readings", key: 1) }
            let reset = try sync.reset(with: ServerDelta(anchor: "a", tables: [TableDelta("readings", upserts: [ServerRow(with(["id": 1, "v": 1]))])]), keepLocalChanges: true)
            #expect(reset.refusedRows.count == 1 && reset.refusedRows.first?.reason.contains("finite") == true, "reset: \(reset)")
            #expect(try store.read { try $0.row("readings", key: 1) } == row1)
            let afterMerges = try observableAll(store)
            for (what, attempt) in attempts {
                let e = #expect(throws: StrataError.self, "\(what)") { try attempt() }
                #expect(e?.code == .invalidValue, "\(what): \(String(describing: e))")
                #expect(e?.message.contains("finite") == true, "\(what)")
                #expect(try observableAll(store) == afterMerges, "\(what) changed the store")
            }
            _ = before
            // Uploads are never blocked: the next batch encodes.
            let batch = try #require(try sync.nextBatch())
            #expect(try WireFormat.encoder.encode(batch).isEmpty == false)
        }
    }

    @Test func aMergeCannotClearARequiredField() throws {
        try Self.withStores { store in
            let before = try observableAll(store)
            let sync = SyncClient(store: store)
            let rowsBefore = try observableRows(store)
            for id in [1, 2] {  // a row merged on its record and one merged field by field
                let report = try sync.merge(ServerDelta(anchor: "a", tables: [TableDelta("readings", upserts: [ServerRow(["id": .int(Int64(id)), "v": .null])])]))
                #expect(report.refusedRows.first?.reason.contains("'v'") == true && report.refusedRows.first?.reason.contains("null") == true, "row \(id): \(report)")
                #expect(try observableRows(store) == rowsBefore)
            }
            // Resolving a conflict with a null for a required field.
            try store.write { try $0.update("readings", key: 1, ["v": 9.5]) }
            try SyncClient(store: store, policy: .deferred).merge(ServerDelta(anchor: "a1", tables: [TableDelta("readings", upserts: [ServerRow(["id": 1, "v": 8.5])])]))
            let mid = try observableAll(store)
            #expect(try sync.conflicts().first?.fields == ["v"])
            let r = #expect(throws: StrataError.self) { try sync.resolve("readings", key: 1, with: .values(["v": .null])) }
            #expect(r?.code == .nullNotAllowed)
            #expect(try observableAll(store) == mid)
            // A reset whose snapshot lacks a required value.
            let report = try sync.reset(with: ServerDelta(anchor: "a", tables: [TableDelta("readings", upserts: [ServerRow(["id": 7, "label": "no v"])])]), keepLocalChanges: false)
            #expect(report.refusedRows.first?.reason.contains("required field 'v'") == true, "\(report)")
            #expect(try store.read { try $0.row("readings", key: 7) } == nil)
            _ = before
        }
    }

    /// A merged server row whose index or named-view entry would be over LMDB's 511-byte key
    /// limit (a 400-character key plus a 150-character indexed title) is refused like an edit:
    /// nothing is logged, and the next checkpoint does not meet the entry.
    @Test(arguments: ["index", "view"])
    func aMergeCannotMakeAnIndexOrViewEntryOverTheKeyLimit(_ kind: String) throws {
        try withStore { store in
            try store.createTable(.fixed("notes", primaryKey: ["id"], fields: [.string("id"), .string("title")]))
            if kind == "index" {
                try store.createIndex("notes_by_title", on: "notes", fields: ["title"])
            } else {
                try store.createView("notes_by_title", Query("notes", orderBy: [.ascending("title")]))
            }
            let (id, other, long) = (String(repeating: "k", count: 400), String(repeating: "m", count: 400), String(repeating: "t", count: 150))
            let sync = SyncClient(store: store)
            try sync.merge(ServerDelta(anchor: "a1", tables: [TableDelta("notes", upserts: [ServerRow(["id": .string(id), "title": "short"])])]))
            let before = try observableAll(store)
            let rowsBefore = try observableRows(store)
            for row in [ServerRow(["id": .string(id), "title": .string(long)]), ServerRow(["id": .string(other), "title": .string(long)])] {
                // Set aside, as a row this store cannot hold (`RefusedServerRowTests`).
                let report = try sync.merge(ServerDelta(anchor: "a2", tables: [TableDelta("notes", upserts: [row])]))
                #expect(report.refusedRows.first?.reason.contains("'notes_by_title'") == true, "\(report)")
                #expect(try observableRows(store) == rowsBefore)
            }
            _ = before
            try store.checkpoint()
            try store.write { tx in try tx.insert("notes", ["id": "x", "title": "fine"]) }
            try store.checkpoint()
        }
    }

    /// Rewrites a briefcase's body with `transform` and a fresh checksum, as a damaged or
    /// foreign writer could produce it.
    static func rewrite(_ path: String, _ transform: ([UInt8]) -> [UInt8]) throws {
        var bytes = Array(try Data(contentsOf: URL(fileURLWithPath: path)))
        bytes.removeLast(8)
        bytes = transform(bytes)
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        func mix(_ b: UInt8) { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        withUnsafeBytes(of: UInt64(bytes.count).littleEndian) { for b in $0 { mix(b) } }
        for b in bytes { mix(b) }
        withUnsafeBytes(of: h.littleEndian) { bytes += $0 }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }

    static func replace(_ bytes: [UInt8], _ old: [UInt8], _ new: [UInt8]) -> [UInt8] {
        guard let i = (0...(bytes.count - old.count)).first(where: { Array(bytes[$0..<$0 + old.count]) == old }) else { return bytes }
        return Array(bytes[..<i]) + new + Array(bytes[(i + old.count)...])
    }

    @Test func aBriefcaseIsCheckedAsAnEditIs() throws {
        try Self.withStores { source in
            let file = FileManager.default.temporaryDirectory.appendingPathComponent("bc-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: file) }
            try source.exportBriefcase(to: file)
            try withStore { target in
                try target.createTable(Self.readings)
                try target.createTable(Self.bag)
                try target.write { try $0.insert("readings", ["id": 3, "v": 0.5]) }
                let before = try observableAll(target)
                let variants: [(String, StrataError.Code, ([UInt8]) -> [UInt8])] = [
                    // 1.5 (little-endian bits) becomes NaN.
                    ("a NaN", .invalidValue, { Self.replace($0, withUnsafeBytes(of: (1.5).bitPattern.littleEndian, Array.init), withUnsafeBytes(of: Double.nan.bitPattern.littleEndian, Array.init)) }),
                    // The property bag's field "x" gets an empty name.
                    ("an empty field name", .fieldNotFound, { Self.replace($0, [5, 1, UInt8(ascii: "x")], [5, 0]) }),
                    // The row's v (1.5) becomes null: a required field without a value.
                    ("a null required field", .nullNotAllowed, { b in
                        // Both the original and the current value of the clean field.
                        let v = [4] + withUnsafeBytes(of: (1.5).bitPattern.littleEndian, Array.init)
                        return Self.replace(Self.replace(b, v, [0]), v, [0])
                    }),
                ]
                for (what, code, transform) in variants {
                    let copy = file + ".\(code)"
                    defer { try? FileManager.default.removeItem(atPath: copy) }
                    try FileManager.default.copyItem(atPath: file, toPath: copy)
                    try Self.rewrite(copy, transform)
                    #expect(try Data(contentsOf: URL(fileURLWithPath: copy)) != Data(contentsOf: URL(fileURLWithPath: file)), "\(what): the patch did not apply")
                    let e = #expect(throws: StrataError.self, "\(what)") { try target.importBriefcase(from: copy) }
                    #expect(e?.code == code, "\(what): \(String(describing: e))")
                    #expect(try observableAll(target) == before, "\(what) changed the store")
                }
                try target.importBriefcase(from: file)
                #expect(try target.read { try $0.row("readings", key: 1)?["v"] } == 1.5)
            }
        }
    }

    /// "é" as one code point and as "e" + U+0301 are two keys, for the store and the merge alike.
    @Test func keysEqualOnlyAfterNormalisationAreTwoKeysEverywhere() throws {
        try withStore { store in
            try store.createTable(.fixed("words", primaryKey: ["w"], fields: [.string("w"), .int("n", nullable: true)]))
            let composed: Value = "caf\u{E9}", decomposed: Value = "cafe\u{301}"
            #expect(composed != decomposed && RowKey(composed) != RowKey(decomposed))
            #expect(Set([RowKey(composed), RowKey(decomposed)]).count == 2)
            try store.write { tx in
                try tx.insert("words", ["w": composed, "n": 1])
                try tx.insert("words", ["w": decomposed, "n": 2])
                try tx.insert("words", ["w": "other", "n": 3])
            }
            let sync = SyncClient(store: store)
            // A delta listing both is two rows, not one listed twice.
            try sync.merge(ServerDelta(anchor: "a1", tables: [TableDelta("words", upserts: [
                ServerRow(["w": composed, "n": 10]), ServerRow(["w": decomposed, "n": 20]),
            ])]))
            #expect(try store.read { try $0.row("words", key: RowKey(composed))?["n"] } == 10)
            #expect(try store.read { try $0.row("words", key: RowKey(decomposed))?["n"] } == 20)
            // Listing one form twice is still refused.
            let twice = #expect(throws: StrataError.self) {
                try sync.merge(ServerDelta(since: "a1", anchor: "a2", tables: [TableDelta("words", upserts: [ServerRow(["w": composed, "n": 1]), ServerRow(["w": composed, "n": 2])])]))
            }
            #expect(twice?.code == .invalidOperation)
            // A snapshot listing one form deletes the other (and "other").
            try store.write { tx in for k in [composed, decomposed, "other"] { try tx.acknowledge("words", key: RowKey(k)) } }
            try sync.merge(ServerDelta(since: "a1", anchor: "a3", mode: .snapshot, tables: [TableDelta("words", upserts: [ServerRow(["w": composed, "n": 10])])]))
            #expect(try store.read { try $0.rows("words").map(\.key) } == [RowKey(composed)])
            // Queries compare the same way, with or without an index.
            try store.write { tx in try tx.insert("words", ["w": decomposed, "n": 5]) }
            #expect(try store.read { try $0.rows(Query("words", where: .equals("n", 5))).map(\.key) } == [RowKey(decomposed)])
            #expect(try store.read { try $0.rows(Query("words", where: .equals("w", decomposed))).map(\.key) } == [RowKey(decomposed)])
        }
    }
}

extension ValidationTests {
    /// Both forms go up as two rows, are acknowledged as two rows, and come back as two rows.
    @Test func bothFormsOfAKeySyncAsTwoRows() async throws {
        try await withStoreAsync { store in
            try store.createTable(.fixed("words", primaryKey: ["w"], fields: [.string("w"), .int("n", nullable: true)]))
            let composed: Value = "caf\u{E9}", decomposed: Value = "cafe\u{301}"
            try await store.write { tx in
                try tx.insert("words", ["w": composed, "n": 1])
                try tx.insert("words", ["w": decomposed, "n": 2])
            }
            let server = InMemorySyncServer(keyFields: ["words": ["w"]])
            let sync = SyncClient(store: store)
            let report = try await sync.sync(with: server)
            #expect(report.acks.map(\.acknowledged) == [2])
            #expect(server.rows("words").count == 2)
            #expect(try await store.read { try $0.pendingRows() }.isEmpty)
            server.write("words", key: RowKey(decomposed), ["n": 20])
            _ = try await sync.sync(with: server)
            let values = try await store.read { try $0.rows("words").map { $0["n"] } }
            #expect(Set(values) == [1, 20])
        }
    }
}

/// Every table's rows with their state, every property, the log length.
/// The rows of every table, the log's length and the tables: what a refused server row must
/// leave as it was (the anchor and the list of refused rows move).
func observableRows(_ store: Store) throws -> [String] {
    try store.read { snap in
        try snap.tables.flatMap { t in try snap.rows(t.name, includingDeleted: true).map(\.description) }
            + ["lsn \(try snap.lastLSN)", "tables \(snap.tables.map(\.name))"]
    }
}

func observableAll(_ store: Store) throws -> [String] {
    try store.read { snap in
        try snap.tables.flatMap { t in try snap.rows(t.name, includingDeleted: true).map(\.description) }
            + (try snap.properties()).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
            + ["lsn \(try snap.lastLSN)", "tables \(snap.tables.map(\.name))"]
    }
}

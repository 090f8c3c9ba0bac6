import Foundation
import LMDB
@testable import Strata
import StrataWorkload
import Testing

/// A seeded mutator over every decoder of stored or received bytes: no input may crash the
/// process; each either decodes or throws a `StrataError`.
@Suite struct FuzzTests {
    static func mutate(_ bytes: [UInt8], _ g: inout SplitMix64) -> [UInt8] {
        var b = bytes
        for _ in 0..<(1 + g.next() % 3) {
            switch g.next() % 4 {
            case 0 where !b.isEmpty: b[Int(g.next() % UInt64(b.count))] ^= UInt8(1 + g.next() % 255)
            case 1 where !b.isEmpty: b = Array(b.prefix(Int(g.next() % UInt64(b.count))))
            case 2: b.insert(UInt8(truncatingIfNeeded: g.next()), at: b.isEmpty ? 0 : Int(g.next() % UInt64(b.count)))
            default: b += (0..<(g.next() % 12)).map { _ in [0xFF, 0x80, 0x00, 0x7F][Int(g.next() % 4)] }
            }
        }
        return b
    }

    @Test func mutatedRecordsKeysAndOperationsNeverCrash() throws {
        let seed = testSeed("mutatedRecords")
        var g = SplitMix64(seed: seed)
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.createTable(.propertyBag("bag", key: [.string("k")]))
            try store.write { tx in
                for i in 0..<40 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)"), "notes": i % 3 == 0 ? nil : "n"]) }
                for i in 0..<20 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
                for i in 0..<20 { try tx.update("tasks", key: .init(.int(Int64(i))), ["title": "u", "updated": 1.5]) }
                try tx.insert("bag", ["k": "a\u{0}b", "x": .bytes([0, 1]), "when": .timestamp(Date())])
            }
            let catalog = try store.read { try $0.catalog }
            // The records are read from LMDB itself: write the overlay there first.
            try store.checkpoint()
            var rows: [([UInt8], [UInt8])] = []
            var ops: [(UInt64, [UInt8])] = []
            try store.env.read { txn in
                try txn.withCursor(store.databases.rows) { c in
                    var e = try c.first()
                    while let x = e { rows.append((Array(x.key), Array(x.value))); e = try c.next() }
                }
                try txn.withCursor(store.databases.log) { c in
                    var e = try c.first()
                    var lsn: UInt64 = 0
                    while let x = e { lsn += 1; ops.append((lsn, Array(x.value))); e = try c.next() }
                }
            }
            // The log of a store written before format 4 too (its operations are formats 2 and
            // 3), so that every record layout still read is mutated.
            let older = try Self.olderOperations()
            var decoded = 0
            var refused = 0
            for _ in 0..<4000 {
                let (key, record) = rows[Int(g.next() % UInt64(rows.count))]
                let pick = Int(g.next() % UInt64(ops.count + older.ops.count))
                let (lsn, op) = pick < ops.count ? ops[pick] : older.ops[pick - ops.count]
                let opCatalog = pick < ops.count ? catalog : older.catalog
                let badKey = Self.mutate(key, &g)
                let badRecord = Self.mutate(record, &g)
                // Resealed, so that the decoder, not the checksum, meets the damage (as with a
                // record written damaged, or a checksum collision).
                let badOp = Self.resealed(Self.mutate(op, &g), lsn: lsn)
                for attempt in 0..<4 {
                    do {
                        switch attempt {
                        case 0:
                            let t = try catalog.table(id: UInt32(key[3]))
                            _ = try withBytes(badKey) { (k) throws(StrataError) in
                                try withBytes(record) { (r) throws(StrataError) in try Row(table: t, rowsKey: k, record: r) }
                            }
                        case 1:
                            let t = try catalog.table(id: UInt32(key[3]))
                            _ = try withBytes(key) { (k) throws(StrataError) in
                                try withBytes(badRecord) { (r) throws(StrataError) in try Row(table: t, rowsKey: k, record: r) }
                            }
                        case 2:
                            _ = try withBytes(badOp) { (o) throws(StrataError) in
                                try LogEntry(lsn: lsn, record: o, catalog: opCatalog, rules: .everyOperation) { _ in TransactionHeader(id: 1, timestampMicros: 0, schemaVersion: 0) }
                            }
                        default:
                            // Folding a damaged operation into a sound row (as rebuild would).
                            var out = ByteWriter()
                            _ = try withBytes(badOp) { (o) throws(StrataError) in
                                let h = try OperationHeader(o)
                                return try withBytes(record) { (r) throws(StrataError) in try RowFold.apply(old: try StoredRow(r), op: o, header: h, lsn: lsn, into: &out) }
                            }
                        }
                        decoded += 1
                    } catch is StrataError {
                        refused += 1
                    }
                }
            }
            #expect(refused > 1000 && decoded > 100, "\(refused) refused, \(decoded) decoded")
        }
    }

    /// The operations of the format-5 fixture store (`StrataSyncTests/Fixtures/format5-store`):
    /// formats 2 and 3, with the catalog that reads them.
    static func olderOperations() throws -> (ops: [(UInt64, [UInt8])], catalog: Catalog) {
        let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../StrataSyncTests/Fixtures/format5-store/data.mdb").standardized
        return try withTemporaryFolder { path in
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: fixture.path, toPath: path + "/data.mdb")
            let store = try Store(path: path)
            defer { store.close() }
            var ops: [(UInt64, [UInt8])] = []
            try store.env.read { txn in
                try txn.withCursor(store.databases.log) { c in
                    var e = try c.first()
                    while let x = e { ops.append((try Counter.lsn(key: x.key), Array(x.value))); e = try c.next() }
                }
            }
            #expect(Set(ops.map { $0.1[0] }) == [2, 3], "the fixture's operations are formats 2 and 3")
            return (ops, try store.read { try $0.catalog })
        }
    }

    /// `record`, stored at `lsn`, with its checksum recomputed, when it has the size and format
    /// of one that has one.
    static func resealed(_ record: [UInt8], lsn: UInt64) -> [UInt8] {
        guard record.count > RecordFormat.checksumSize, record[0] >= RecordFormat.checksummedFormat, record[0] <= RecordFormat.operationFormat else { return record }
        var w = ByteWriter()
        w.append(record)
        RecordChecksum.seal(&w, lsn: lsn)
        return w.bytes
    }

    /// Changesets come from other devices and servers: a damaged one decodes or is refused as
    /// malformed input. Some mutations set the header's key field count to a random number,
    /// small or huge (a huge one used to trap when the keys were read).
    @Test func mutatedChangesetsNeverCrash() throws {
        var g = SplitMix64(seed: testSeed("mutatedChangesets"))
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.createTable(.propertyBag("bag", key: [.string("name"), .int("n")]))
            try store.write { tx in
                for i in 0..<12 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)"), "notes": i % 3 == 0 ? nil : "n"]) }
                for i in 0..<8 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
                for i in 0..<4 { try tx.update("tasks", key: .init(.int(Int64(i))), ["title": "u"]) }
                for i in 4..<6 { try tx.delete("tasks", key: .init(.int(Int64(i)))) }
                try tx.insert("bag", ["name": "a\u{0}b", "n": 1, "x": .bytes([0, 1])])
            }
            let goods = try store.read { snap in [try snap.pendingChangeset("tasks").bytes, try snap.pendingChangeset("bag").bytes] }
            var decoded = 0
            var refused = 0
            for _ in 0..<3000 {
                var bad = goods[Int(g.next() % 2)]
                if g.next() % 4 == 0 {
                    let count = g.next() >> (g.next() % 64)
                    bad = try ChangesetTests.withKeyCount(count, bad)
                }
                bad = Self.mutate(bad, &g)
                do {
                    _ = try Changeset(bytes: bad).changes()
                    decoded += 1
                } catch let error as StrataError {
                    #expect(error.code == .malformedInput || error.code == .formatVersion, "\(error)")
                    refused += 1
                }
            }
            #expect(refused > 500 && decoded > 50, "\(refused) refused, \(decoded) decoded")
        }
    }

    /// A briefcase's checksum is no proof of origin: mutated bodies, checksummed again, are
    /// imported or refused with a `StrataError`, and a refused one leaves the store as it was.
    @Test func resealedBriefcasesNeverCrashAndImportWholeOrNothing() throws {
        var g = SplitMix64(seed: testSeed("resealedBriefcases"))
        try withTemporaryFolder { dir in
            let a = try Store(path: dir + "/a")
            try a.createTable(tasksSchema)
            try a.createTable(.propertyBag("bag", key: [.string("name")]))
            try a.write { tx in
                for i in 1...6 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)"), "notes": i % 2 == 0 ? "n" : nil]) }
                for i in 1...4 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) }
                try tx.update("tasks", key: 1, ["title": "edited"])
                try tx.delete("tasks", key: 2)
                try tx.insert("bag", ["name": "theme", "value": "dark"])
            }
            let file = dir + "/good.briefcase"
            try a.exportBriefcase(to: file)
            let good = Array(try Data(contentsOf: URL(fileURLWithPath: file)).dropLast(8))
            // Where the rows start, after the magic, the format byte and the JSON header: most
            // mutations go there, since a damaged header is refused as a whole.
            let rowsStart = try withBytes(good) { (b) throws(StrataError) in
                var r = ByteReader(b, offset: BriefcaseFormat.magic.count + 1)
                let n = try r.varint()
                return r.offset + Int(n)
            }
            let b = try Store(path: dir + "/b")
            try b.createTable(tasksSchema)
            try b.createIndex("byTitle", on: "tasks", fields: ["title"], unique: true)
            func contents() throws -> [Row] { try b.read { snap in try snap.tables.flatMap { try snap.rows($0.name, includingDeleted: true) } } }
            var imported = 0
            var refused = 0
            for i in 0..<400 {
                var w = ByteWriter()
                w.append(g.next() % 4 == 0 ? Self.mutate(good, &g) : Array(good[..<rowsStart]) + Self.mutate(Array(good[rowsStart...]), &g))
                var d = Digest()
                w.withUnsafeBytes { d.add($0) }
                w.appendLittleEndian(d.value)
                let path = dir + "/bad.briefcase"
                try Data(w.bytes).write(to: URL(fileURLWithPath: path))
                let before = try contents()
                do {
                    try b.importBriefcase(from: path)
                    imported += 1
                } catch {
                    refused += 1
                    #expect(try contents() == before, "case \(i) changed the store: \(error)")
                }
            }
            #expect(refused > 100, "\(refused) refused, \(imported) imported")
            #expect(try b.verify().isConsistent)
        }
    }

    @Test func mutatedValuesNeverCrash() {
        var g = SplitMix64(seed: testSeed("mutatedValues"))
        let samples: [Value] = [.null, true, 42, -7, 2.5, "text", "ünï\u{0}", .bytes([0, 255, 1]), .timestamp(Date(timeIntervalSince1970: 1e9))]
        for _ in 0..<20_000 {
            let bad = Self.mutate(samples[Int(g.next() % UInt64(samples.count))].encoded, &g)
            _ = try? withBytes(bad) { (b) throws(StrataError) in try Value(decoding: b) }
            _ = try? withBytes(bad) { (b) throws(StrataError) -> RowKey in
                var r = ByteReader(b)
                return try KeyCodec.readKey(&r, count: 2)
            }
        }
    }
}

/// A store file damaged on disk is reported on open or by `verify()`, never read as if whole.
@Suite struct DamagedFileTests {
    /// A small store, copied compacted (so every page of the file is live) into `body`'s folder.
    static func withDamageableCopy(_ body: (String, [UInt8]) throws -> Void) throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                for i in 0..<300 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("MARKER-\(i)-" + String(repeating: "x", count: 40))]) }
            }
            try withTemporaryFolder { copy in
                try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
                try store.copy(to: copy, compact: true)
                try body(copy, Array(try Data(contentsOf: URL(fileURLWithPath: copy + "/data.mdb"))))
            }
        }
    }

    @Test(arguments: [0.95, 0.5, 0.1])
    func aTruncatedFileIsRefusedOnOpen(keeping fraction: Double) throws {
        try Self.withDamageableCopy { path, bytes in
            try Data(bytes.prefix(Int(Double(bytes.count) * fraction))).write(to: URL(fileURLWithPath: path + "/data.mdb"))
            // The page check at open (quick, by default) finds the pages past the end.
            let e = #expect(throws: StrataError.self) { try Store(path: path) }
            #expect(e?.code == .corruptStore && e?.message.contains("past the end of the file") == true, "\(String(describing: e))")
            // Without it, the file's length against its last page still refuses it.
            var unchecked = StoreOptions()
            unchecked.checkAtOpen = .none
            let bare = #expect(throws: StrataError.self) { try Store(path: path, options: unchecked) }
            #expect(bare?.code == .corruptRecord && bare?.message.contains("truncated") == true, "\(String(describing: bare))")
        }
    }

    @Test func aFileShorterThanItsHeaderIsRefused() throws {
        try Self.withDamageableCopy { path, bytes in
            try Data(bytes.prefix(100)).write(to: URL(fileURLWithPath: path + "/data.mdb"))
            let e = #expect(throws: StrataError.self) { try Store(path: path) }
            #expect(e?.message.contains("not an LMDB file") == true, "\(String(describing: e))")
        }
    }

    /// A byte changed inside a stored value (a row's or an operation's copy of a title): the
    /// views no longer equal the fold of the log, and `verify()` says so — in the operation,
    /// its checksum names it (LSN 18 inserted row 17).
    @Test func aChangedValueIsFoundByVerify() throws {
        try Self.withDamageableCopy { path, bytes in
            let marker = Array("MARKER-17-".utf8)
            let offsets = (0...(bytes.count - marker.count)).filter { bytes[$0..<$0 + marker.count].elementsEqual(marker) }
            // One copy in the `rows` record, one in the operation.
            #expect(offsets.count == 2)
            var outcomes: [String] = []
            for offset in offsets {
                var damaged = bytes
                damaged[offset + marker.count + 3] ^= 0x01  // an "x" becomes a "y"
                try Data(damaged).write(to: URL(fileURLWithPath: path + "/data.mdb"))
                let store = try Store(path: path)
                let report = try store.verify()
                #expect(!report.isConsistent)
                outcomes.append((report.damagedOperations.map(\.description) + report.differences.map(\.description)).joined(separator: "; "))
            }
            #expect(outcomes.sorted() == [
                "LSN 18: its checksum does not match its content and LSN 18: the record or its key is damaged",
                "rows: tasks 17 different",
            ], "\(outcomes)")
        }
    }
}

/// Inputs that once failed, or sit on a decoder's edge, kept as regression tests. When a fuzz run
/// finds a crash, its seed reproduces it; once fixed, the minimal input goes here.
@Suite struct RegressionCorpusTests {
    /// Bytes that no decoder may accept, with what each exercises.
    static let malformedOperations: [(String, [UInt8])] = [
        ("empty", []),
        ("format byte only", [1]),
        ("a newer operation format", [9, 0, 0, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0]),
        ("a varint that never ends", [1, 0, 0] + Array(repeating: 0xFF, count: 11)),
        ("a target longer than the record", [1, 0, 0, 0, 0, 0, 0x7F, 0, 0, 0, 1]),
        ("a target shorter than a table id", [1, 0, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0]),
        ("an annotation longer than the record", [1, 0, 0, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0x40]),
    ]

    @Test(arguments: malformedOperations.indices)
    func malformedOperationHeadersAreRefused(_ i: Int) {
        let (what, bytes) = Self.malformedOperations[i]
        #expect(throws: StrataError.self, "\(what)") { try withBytes(bytes) { (b) throws(StrataError) in _ = try OperationHeader(b) } }
    }

    @Test func malformedValuesAreRefused() {
        for bytes: [UInt8] in [[], [0xFF], [0x7F, 1, 2], Array(repeating: 0xFF, count: 12)] {
            #expect(throws: StrataError.self, "\(bytes)") { try withBytes(bytes) { (b) throws(StrataError) in _ = try Value(decoding: b) } }
        }
    }

    /// A key count far beyond the bytes (a damaged changeset or record header) used to trap
    /// reserving room for that many values; it is a truncated key.
    @Test func aKeyCountBeyondItsBytesIsRefused() {
        for count in [1 << 40, Int.max, 3] {
            let e = #expect(throws: StrataError.self, "count \(count)") {
                try withBytes([KeyCodec.tagInt, 0, 0, 0, 0, 0, 0, 0, 1, KeyCodec.tagTrue]) { (b) throws(StrataError) in
                    var r = ByteReader(b)
                    return try KeyCodec.readKey(&r, count: count)
                }
            }
            #expect(e?.code == .corruptRecord, "\(String(describing: e))")
        }
    }

    /// Found by the query tests: comparing two nulls used to trap on a forced unwrap.
    @Test func nullsCompareEqual() {
        #expect(Value.order(.null, .null) == 0)
    }
}

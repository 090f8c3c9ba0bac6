import Foundation
import LMDB
@testable import Strata
@testable import StrataSync
import Testing

/// The 2 → 3 migration, on a store written by format 2 (`Fixtures/format2-store`, see its commit:
/// row 1 with a deferred conflict on title and a local-only edit of notes, row 2 conflicted on
/// priority, row 3 deleted here and changed on the server, row 4 a pending insert).
@Suite struct MigrationTests {
    static func withFormat2Store<R>(_ body: (String) throws -> R) throws -> R {
        let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/format2-store/data.mdb")
        return try withTemporaryFolder { path in
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: fixture.path, toPath: path + "/data.mdb")
            return try body(path)
        }
    }

    static func withFixture<R>(_ name: String, _ body: (String) throws -> R) throws -> R {
        let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/\(name)/data.mdb")
        return try withTemporaryFolder { path in
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: fixture.path, toPath: path + "/data.mdb")
            return try body(path)
        }
    }

    static func format(_ path: String) throws -> UInt64? {
        let env = try Environment(path: path, options: { var o = EnvironmentOptions(); o.maxDatabases = 16; return o }())
        let meta = try env.write { try $0.openDatabase("meta") }
        return try env.read { txn in try txn.get(Array("format".utf8), in: meta).map { $0.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } } }
    }

    @Test func aFormat2StoreIsMigratedAndItsConflictsReadAsFormat2ReportedThem() throws {
        try Self.withFormat2Store { path in
            #expect(try Self.format(path) == 2)
            let store = try Store(path: path)
            #expect(try Self.format(path) == Store.formatVersion)
            #expect(try store.verify().isConsistent)
            let sync = SyncClient(store: store)
            let conflicts = try sync.conflicts()
            // Format 2 did not record the conflicting fields in the rows: the merge's audit
            // record gives them, so the local-only edit of notes is not taken for a conflict.
            #expect(conflicts.map(\.key) == [1, 2, 3])
            #expect(conflicts[0].fields == ["title"])
            #expect(conflicts[0].server == ["title": "Buy soy milk"] && conflicts[0].local == ["title": "Buy oat milk"])
            #expect(conflicts[1].fields == ["priority"])
            #expect(conflicts[2].isDeletedLocally && conflicts[2].fields == ["title"])
            // What the row alone says (no audit at hand): format 2's changed fields.
            #expect(try store.read { try $0.row("tasks", key: 1)?.conflictingFields } == ["title", "notes"])
            #expect(try store.read { try $0.pendingRows("tasks").map { "\($0.key) \($0.status)" } } == ["1 updated", "2 updated", "3 deleted", "4 inserted"])

            // The bug this format fixes, on a migrated row: taking the server's title keeps the
            // local edit of notes pending.
            try sync.resolve("tasks", key: 1, with: .server)
            let one = try #require(try store.read { try $0.row("tasks", key: 1) })
            #expect(one["title"] == "Buy soy milk" && one["notes"] == "1 litre" && one.original("notes") == "2 litres" && !one.isConflicted)

            // Resolving works on the migrated rows, and a new deferred merge records its fields.
            try sync.resolve("tasks", key: 2, with: .server)
            #expect(try store.read { try $0.row("tasks", key: 2) }.map { "\($0["priority"]) \($0.isPending)" } == "7 false")
            try store.write { tx in try tx.update("tasks", key: 4, ["notes": "weekly"]) }
            try store.write { tx in try tx.acknowledge("tasks", key: 4) }
            try store.write { tx in try tx.update("tasks", key: 4, ["title": "Water the plants", "notes": "daily"]) }
            try SyncClient(store: store, policy: .deferred).merge(ServerDelta(since: "a1", anchor: "a2", tables: [
                TableDelta("tasks", upserts: [ServerRow(["id": 4, "title": "Water ferns"])]),
            ]))
            #expect(try sync.conflicts().first { $0.key == 4 }?.fields == ["title"])
            try sync.resolve("tasks", key: 4, with: .server)
            let row = try #require(try store.read { try $0.row("tasks", key: 4) })
            #expect(row["title"] == "Water ferns" && row["notes"] == "daily" && row.original("notes") == "weekly")
            #expect(try store.verify().isConsistent)
            _ = try store.rebuild()
            #expect(try sync.conflicts().map(\.key) == [3])
        }
    }

    /// The 4 → 5 migration, on a store written by format 4 (`Fixtures/format4-store`, see its
    /// commit: tables tasks and people, 17 operations, task 1 in a deferred conflict on title,
    /// task 3 a pending insert, task 4 a pending delete, people 1 and 2 with pending updates).
    /// Its operations are not rewritten: they stay valid without a checksum; new ones carry one.
    @Test func aFormat4StoreIsMigratedAndNewOperationsCarryChecksums() throws {
        try Self.withFixture("format4-store") { path in
            #expect(try Self.format(path) == 4)
            let store = try Store(path: path)
            defer { store.close() }
            #expect(try Self.format(path) == Store.formatVersion)
            let report = try store.verify()
            #expect(report.isConsistent && report.damagedOperations.isEmpty && report.operations == 17)
            #expect(report.operationsWithoutChecksum == 17)
            #expect(report.description.contains("17 operation(s) from before log format 3 carry no checksum"), "\(report)")

            // The same rows, pending states and conflict as format 4 wrote them.
            func summary(_ table: String) throws -> [String] {
                try store.read { s in
                    try s.rows(table, includingDeleted: true).map { r in
                        "\(r.key) " + r.fieldNames.sorted().map { "\($0)=\(r[$0])" }.joined(separator: ",") + (r.isPending ? " pending" : "")
                    }
                }
            }
            #expect(try summary("tasks") == [
                "1 done=false,id=1,notes=\"2 litres\",priority=1,title=\"Buy oat milk\" pending",
                "2 done=false,id=2,notes=null,priority=5,title=\"Call Ann\"",
                "3 done=false,id=3,notes=\"weekly\",priority=0,title=\"Water plants\" pending",
                "4 done=false,id=4,notes=null,priority=0,title=\"Old task\" pending",
            ])
            #expect(try summary("people") == ["1 age=40,id=1,name=\"Anne\" pending", "2 age=36,id=2,name=\"Bob\" pending"])
            #expect(try store.read { try $0.pendingRows("tasks").map { "\($0.key) \($0.status)" } } == ["1 updated", "3 inserted", "4 deleted"])
            let conflicts = try SyncClient(store: store).conflicts()
            #expect(conflicts.map(\.key) == [1] && conflicts.first?.fields == ["title"])
            #expect(conflicts.first?.server == ["title": "Buy soy milk"] && conflicts.first?.local == ["title": "Buy oat milk"])
            #expect(try store.read { try $0.history("tasks", key: 1).map(\.lsn) } == [1, 6, 11, 15])

            // A new edit is written with a checksum: verify counts it as checked (an operation
            // after the migration without one would be reported damaged).
            try store.write { tx in try tx.update("people", key: 2, ["age": 37]) }
            let after = try store.verify()
            #expect(after.isConsistent && after.operations == 18 && after.operationsWithoutChecksum == 17)
            #expect(try store.read { try $0.history("people", key: 2).map(\.lsn) } == [5, 10, 14, 18])
            _ = try store.rebuild()
            #expect(try store.verify().isConsistent)
        }
    }

    /// The 5 → 6 migration, on a store written by format 5 (`Fixtures/format5-store`, see its
    /// commit: the format-4 fixture opened, then a transaction of three operations (18–20), one of
    /// two (21–22) and a single one (23)). Its operations keep their formats (2 and 3) and their
    /// transaction ids and times; new ones are format 4 (5 since store format 7), and every read of the log — history,
    /// the listing, compaction, rebuild, replay — works across the formats.
    @Test func aFormat5StoreIsMigratedAndReadAcrossLogFormats() throws {
        try Self.withFixture("format5-store") { path in
            #expect(try Self.format(path) == 5)
            let store = try Store(path: path)
            defer { store.close() }
            #expect(try Self.format(path) == Store.formatVersion)
            let old = try store.read { try $0.operations() }
            #expect(old.count == 23)
            // Counter ids, as format 5 wrote them; one time per transaction.
            #expect(old.suffix(6).map(\.transactionID) == [5, 5, 5, 6, 6, 7], "\(old.map(\.transactionID))")
            #expect(Set(old[17...19].map(\.timestamp)).count == 1 && old[20].timestamp == old[21].timestamp && old[19].timestamp <= old[20].timestamp)
            #expect(try store.read { try $0.history("tasks", key: 5) }.map(\.lsn) == [18, 21])
            let report = try store.verify()
            #expect(report.isConsistent && report.operations == 23 && report.operationsWithoutChecksum == 17)

            // New transactions: ids are their first LSN, above every older id.
            try store.write { tx in
                try tx.update("tasks", key: 5, ["priority": 3])
                try tx.update("people", key: 1, ["age": 41])
            }
            try store.write { tx in try tx.update("tasks", key: 2, ["notes": "soon"]) }
            let all = try store.read { try $0.operations() }
            #expect(Array(all.prefix(23)) == old)
            #expect(all.suffix(3).map(\.transactionID) == [24, 24, 26])
            #expect(all.suffix(3).map(\.lsn) == [24, 25, 26])
            #expect(try store.read { try $0.history("tasks", key: 5) }.map(\.lsn) == [18, 21, 24])
            #expect(try store.read { try $0.history("tasks", key: 2) }.map(\.lsn) == [2, 7, 16, 19, 26])
            // Time travel folds a row's chain across the formats.
            let asOf: [UInt64: [String]] = try store.read { s in
                var out: [UInt64: [String]] = [:]
                for lsn: UInt64 in [16, 19, 25, 26] {
                    let r = try #require(try s.row("tasks", key: 2, asOf: lsn))
                    out[lsn] = ["\(r["priority"])", "\(r["notes"])"]
                }
                return out
            }
            #expect(asOf == [16: ["5", "null"], 19: ["4", "null"], 25: ["4", "null"], 26: ["4", "\"soon\""]], "\(asOf)")
            #expect(try store.read { try $0.row("tasks", key: 5, asOf: 24)?["priority"] } == 3)
            #expect(try store.read { try $0.row("tasks", key: 5, asOf: 21)?["priority"] } == 2)

            #expect(try store.verify().isConsistent)
            _ = try store.rebuild()
            #expect(try store.verify().isConsistent)
            try withTemporaryFolder { copy in
                let replayed = try store.replay(into: copy + "/replayed", through: 25)
                defer { replayed.close() }
                #expect(try replayed.read { try $0.operations() } == Array(all.prefix(25)))
            }
            // strata log lists every format.
            let listing = try store.read { s in try s.operations(from: 22, through: 24).map { "\($0.lsn) \($0.kind) \($0.transactionID)" } }
            #expect(listing == ["22 delete 6", "23 update 7", "24 update 24"])

            store.close()
            let env = try Environment(path: path, options: { var o = EnvironmentOptions(); o.maxDatabases = 16; return o }())
            let log = try env.write { try $0.openDatabase("log") }
            let formats = try env.read { txn in
                try txn.withCursor(log) { c in
                    var formats: [UInt8] = []
                    var e = try c.first()
                    while let x = e { formats.append(x.value[0]); e = try c.next() }
                    return formats
                }
            }
            #expect(formats == Array(repeating: 2, count: 17) + Array(repeating: 3, count: 6) + [5, 5, 5])
        }
    }

    /// The 6 → 7 migration, on a store written by format 6 (`Fixtures/format6-store`, see its
    /// commit: the format-5 fixture opened, then tasks 6 inserted and tasks 1's notes changed
    /// (24–25), people 2's age (26), tasks 6 acknowledged (27)). Its records keep their formats
    /// (2, 3 and 4) and are not resealed: `lsnCoveredFrom` says that from LSN 28 on every
    /// checksum covers its record's LSN. New records are format 5; compaction and salvage
    /// rewrite a format-4 record as format 5, sealed for its LSN.
    @Test func aFormat6StoreIsMigratedAndNewChecksumsCoverTheirLSN() throws {
        try Self.withFixture("format6-store") { path in
            #expect(try Self.format(path) == 6)
            let formats = { () throws -> [UInt8] in
                let env = try Environment(path: path, options: { var o = EnvironmentOptions(); o.maxDatabases = 16; return o }())
                let log = try env.write { try $0.openDatabase("log") }
                return try env.read { txn in
                    try txn.withCursor(log) { c in
                        var formats: [UInt8] = []
                        var e = try c.first()
                        while let x = e { formats.append(x.value[0]); e = try c.next() }
                        return formats
                    }
                }
            }
            let before = try formats()
            #expect(before == Array(repeating: 2, count: 17) + Array(repeating: 3, count: 6) + Array(repeating: 4, count: 4))

            let store = try Store(path: path)
            #expect(try Self.format(path) == Store.formatVersion)
            let rules = try store.env.read { try $0.checksumRules(in: store.databases) }
            #expect(rules == ChecksumRules(checksumsFrom: 18, lsnCoveredFrom: 28))
            let report = try store.verify()
            #expect(report.isConsistent && report.operations == 27, "\(report)")
            #expect(report.operationsWithoutChecksum == 17 && report.operationsWithoutLSNInChecksum == 10, "\(report)")
            #expect(report.description.contains("10 operation(s) from before log format 5 carry a checksum that does not cover their LSN"), "\(report)")
            let old = try store.read { try $0.operations() }
            #expect(old.suffix(4).map { "\($0.lsn) \($0.kind) \($0.table) \($0.key) \($0.transactionID)" } == [
                "24 insert tasks 6 24", "25 update tasks 1 24", "26 update people 2 26", "27 acknowledge tasks 6 27",
            ])
            #expect(try store.read { try $0.history("tasks", key: 1).map(\.lsn) } == [1, 6, 11, 15, 25])
            #expect(try store.read { try $0.row("tasks", key: 1)?["notes"] } == "3 litres")
            #expect(try store.read { try $0.row("people", key: 2)?["age"] } == 38)

            // New records are format 5, their checksums covering their LSN; history and time
            // travel read across the formats.
            try store.write { tx in
                try tx.update("tasks", key: 6, ["title": "Sweep the yard"])
                try tx.update("people", key: 2, ["age": 39])
            }
            let after = try store.verify()
            #expect(after.isConsistent && after.operations == 29 && after.operationsWithoutLSNInChecksum == 10, "\(after)")
            #expect(try store.read { try $0.history("people", key: 2).map(\.lsn) } == [5, 10, 14, 26, 29])
            #expect(try store.read { try $0.row("people", key: 2, asOf: 26)?["age"] } == 38)
            #expect(try store.read { try $0.operations(from: 28).map(\.transactionID) } == [28, 28])

            // A record older than the counter put under an LSN from it is damage: its checksum
            // does not cover the LSN, where every one from LSN 28 on must.
            do {
                let found = try store.env.read { txn in try txn.get(withUnsafeBytes(of: UInt64(25).bigEndian) { Array($0) }, in: store.databases.log).map { Array($0) } }
                let old25 = try #require(found)
                let status = old25.withUnsafeBytes { RecordChecksum.status($0, lsn: 29, rules: rules) }
                #expect(status == .damaged("it has format 4, whose checksum does not cover its LSN, where every operation from LSN 28 on has one that does"), "\(status)")
                #expect(old25.withUnsafeBytes { RecordChecksum.status($0, lsn: 25, rules: rules) } == .validWithoutLSN)
            }

            // Compaction whose horizon splits transaction 24 (nothing pending holds it back):
            // LSN 25 is rewritten to carry the header, as format 5; 26 and 27 stay format 4.
            try SyncClient(store: store).resolve("tasks", key: 1, with: .server)
            let pending = try store.read { try $0.pendingRows() }
            #expect(!pending.isEmpty)
            try store.write { tx in for row in pending { try tx.acknowledge(row.table, key: row.key) } }
            let opsBefore = try store.read { try $0.operations(from: 25) }
            let last = try store.read { try $0.lastLSN }
            let compacted = try store.compact(retaining: .operations(Int(last - 24)))
            #expect(compacted.horizon == 24, "\(compacted)")
            #expect(try store.read { try $0.operations() } == opsBefore)
            let v = try store.verify()
            #expect(v.isConsistent && v.operationsWithoutLSNInChecksum == 2, "\(v)")
            store.close()
            #expect(try formats() == [5, 4, 4] + Array(repeating: 5, count: Int(last) - 27))

            // Salvage of the compacted store: what it rewrites (records whose predecessor was
            // folded into the base snapshot start their row's chain afresh) it seals for their
            // LSN, as format 5; its counters say what it kept as it was; the new store verifies.
            try withTemporaryFolder { copy in
                let salvage = try Store.salvage(from: path, into: copy + "/salvaged")
                #expect(salvage.lostRanges.isEmpty && salvage.recoveredOperations == opsBefore.count, "\(salvage)")
                let salvaged = try Store(path: copy + "/salvaged")
                defer { salvaged.close() }
                let records = try salvaged.env.read { txn in
                    try txn.withCursor(salvaged.databases.log) { c in
                        var out: [(UInt64, [UInt8])] = []
                        var e = try c.first()
                        while let x = e { out.append((try Counter.lsn(key: x.key), Array(x.value))); e = try c.next() }
                        return out
                    }
                }
                let uncovered = records.filter { $0.1[0] < RecordFormat.lsnCoveredFormat }.map(\.0)
                let rules = try salvaged.env.read { try $0.checksumRules(in: salvaged.databases) }
                #expect(rules == ChecksumRules(checksumsFrom: 1, lsnCoveredFrom: (uncovered.max() ?? 0) + 1))
                for (lsn, record) in records {
                    let status = record.withUnsafeBytes { RecordChecksum.status($0, lsn: lsn, rules: rules) }
                    #expect(status == (record[0] == RecordFormat.lsnCoveredFormat ? .valid : .validWithoutLSN), "LSN \(lsn): \(status)")
                }
                let v = try salvaged.verify()
                #expect(v.isConsistent && v.operationsWithoutLSNInChecksum == uncovered.count, "\(v)")
                #expect(try salvaged.read { try $0.operations() } == opsBefore)
            }
        }
    }

    /// The audits that format 2 and format 4 stores hold in their log (the resolution and policy
    /// written as strings) read back as the typed cases, and re-encode to the same bytes.
    @Test(arguments: ["format2-store", "format4-store"])
    func oldStoresAuditsDecodeToTheirCases(fixture: String) throws {
        try Self.withFixture(fixture) { path in
            let store = try Store(path: path)
            defer { store.close() }
            let entries = try store.read { try $0.operations(from: 1) }.filter { $0.origin == .server }
            let audits = entries.compactMap { MergeAudit($0) }
            #expect(!entries.isEmpty && audits.count == entries.filter { !$0.annotation.isEmpty }.count)
            let conflicted = audits.filter { $0.conflict != nil }
            #expect(!conflicted.isEmpty)
            for a in conflicted {
                #expect(a.resolution == .deferred && a.policy == .deferred, "\(a)")
            }
            for a in audits where a.conflict == nil {
                #expect(a.resolution == nil && a.policy == nil, "\(a)")
            }
            for e in entries where !e.annotation.isEmpty {
                #expect(try #require(MergeAudit(e)).encoded == e.annotation)
            }
        }
    }
}

import Foundation
@testable import LMDB
@testable import Strata
import StrataWorkload
import Testing

/// Rebuild, verify and replay fold the log through memory, and flush to the store when their
/// memory limit is reached. Whatever the limit, the result must be the live views byte for byte.
@Suite struct BulkFoldTests {
    /// A unique index whose values move between rows: folded in key order instead of log order,
    /// a row may take a value that a row later in key order gives up.
    static func swapEmails(_ store: Store, rounds: Int) throws {
        try store.write { tx in
            try tx.createTable(.fixed("users", fields: [.int("id"), .string("email", nullable: true)]))
            try tx.createIndex("users_by_email", on: "users", fields: ["email"], unique: true)
            for id in 1...3 { try tx.insert("users", ["id": .int(Int64(id)), "email": .string("e\(id)")]) }
        }
        for round in 0..<rounds {
            // Rotate e1, e2, e3 one place through a free value, one write at a time.
            let ids = [1, 2, 3].map { 1 + ($0 + round) % 3 }
            try store.write { try $0.update("users", key: RowKey(.int(Int64(ids[0]))), ["email": "free"]) }
            try store.write { try $0.update("users", key: RowKey(.int(Int64(ids[1]))), ["email": .string("e\(ids[0])")]) }
            try store.write { try $0.update("users", key: RowKey(.int(Int64(ids[2]))), ["email": .string("e\(ids[1])")]) }
            try store.write { try $0.update("users", key: RowKey(.int(Int64(ids[0]))), ["email": .string("e\(ids[2])")]) }
        }
    }

    static func users(_ store: Store) throws -> [String] {
        try store.read { snap in try snap.rows(Query("users", orderBy: [.ascending("email")])).map(\.description) }
    }

    /// 1 byte flushes after every operation; 6,000 bytes every dozen rows or so.
    @Test(arguments: [1, 6_000, StoreOptions().foldMemoryLimit])
    func foldingThroughMemoryGivesTheLiveViewsAtAnyLimit(limit: Int) throws {
        let seed = testSeed("foldingThroughMemoryGivesTheLiveViewsAtAnyLimit(\(limit))")
        var rng = SplitMix64(seed: seed)
        var options = StoreOptions()
        options.foldMemoryLimit = limit
        try withStore(options) { store, _ in
            try CompactionTests.randomHistory(store, &rng, transactions: 120)
            try Self.swapEmails(store, rounds: 5)
            // A base snapshot for the fold to start from, then more history on top.
            let report = try store.compact(retaining: .operations(100))
            #expect(report.baseRows > 0)
            try CompactionTests.randomHistory(store, &rng, transactions: 120)
            let tables = try CompactionTests.tables(store)
            let users = try Self.users(store)
            let last = try store.read { try $0.lastLSN }

            // verify folds into a scratch store and compares it with the live views, which the
            // write path kept one operation at a time.
            let verified = try store.verify()
            #expect(verified.isConsistent, "\(verified)")
            #expect(verified.operations == (try store.read { try $0.operations().count }))
            #expect(verified.live["rows"]!.entries > 10)

            try store.rebuild()
            #expect(try CompactionTests.tables(store) == tables)
            #expect(try Self.users(store) == users)
            #expect(try store.verify().isConsistent)

            // Replays, to the end and to a point in the middle, equal the store then.
            let middle = report.horizon + (last - report.horizon) / 2
            for through in [last, middle] {
                try withTemporaryFolder { scratch in
                    let replayed = try store.replay(into: scratch, through: through)
                    let keys = (0..<30).map { RowKey(.int(Int64($0))) }
                    let rows = try replayed.read { snap in try keys.map { try snap.row("tasks", key: $0, includingDeleted: true) } }
                    let then = try store.read { snap in try keys.map { try snap.row("tasks", key: $0, asOf: through, includingDeleted: true) } }
                    #expect(rows == then, "replay through \(through)")
                    #expect(try replayed.verify().isConsistent)
                    if through == last {
                        #expect(try CompactionTests.tables(replayed) == tables)
                        #expect(try Self.users(replayed) == users)
                    }
                }
            }
        }
    }

    /// A broken chain (an operation that does not follow its row's last one) is reported, not
    /// folded, whether the row is in memory or was flushed before.
    @Test(arguments: [1, StoreOptions().foldMemoryLimit])
    func aBrokenChainIsReported(limit: Int) throws {
        var options = StoreOptions()
        options.foldMemoryLimit = limit
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "a"])
                try tx.insert("tasks", ["id": 2, "title": "b"])
            }
            try store.write { try $0.update("tasks", key: 1, ["title": "c"]) }
            // Point operation 3 (row 1's update) at LSN 2 (row 2's insert).
            try store.env.write { txn in
                var key = UInt64(3).bigEndian
                let lsnKey = withUnsafeBytes(of: &key) { Array($0) }
                var record = Array(try txn.get(lsnKey, in: store.databases.log)!)
                let header = try withBytes(record) { (r) throws(StrataError) in try OperationHeader(r) }
                // The previous LSN is the varint right after the target: 1, one byte.
                #expect(record[header.target.upperBound] == 1)
                record[header.target.upperBound] = 2
                // Resealed: the fold's chain check, not the checksum, is under test.
                var sealed = ByteWriter()
                sealed.append(record)
                RecordChecksum.seal(&sealed, lsn: 3)
                try txn.put(lsnKey, sealed.bytes, in: store.databases.log)
            }
            let e = #expect(throws: StrataError.self) { try store.verify() }
            #expect(e?.code == .corruptRecord && e?.message.contains("operation 3 follows LSN 2") == true, "\(String(describing: e))")
        }
    }
}

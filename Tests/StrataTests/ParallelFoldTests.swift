import Foundation
@testable import LMDB
@testable import Strata
import StrataWorkload
import Testing

/// Rebuild, verify and replay fold the log on several threads, rows partitioned by key hash.
/// Whatever the number of threads and the memory limit, the store they write must be the one the
/// sequential fold writes, byte for byte.
@Suite struct ParallelFoldTests {
    /// Every entry of every database of `store`, in order.
    static func dump(_ store: Store) throws -> [String: [[UInt8]]] {
        let v = store.databases
        let databases = ["log": v.log, "rows": v.rows, "pending": v.pending, "gone": v.gone, "index": v.index, "view": v.view, "base": v.base, "meta": v.meta]
        return try store.env.read { txn in
            try databases.mapValues { db in
                try txn.withCursor(db) { c in
                    var entries: [[UInt8]] = []
                    var e = try c.first()
                    while let entry = e {
                        entries.append(Array(entry.key))
                        entries.append(Array(entry.value))
                        e = try c.next()
                    }
                    return entries
                }
            }
        }
    }

    /// Where two dumps of a database first differ, `nil` when they are equal. A new store (a
    /// replay) draws its own client id: that meta entry is left out.
    static func firstDifference(_ a: [[UInt8]], _ b: [[UInt8]]) -> String? {
        func comparable(_ d: [[UInt8]]) -> [[UInt8]] {
            var out: [[UInt8]] = []
            for i in stride(from: 0, to: d.count, by: 2) where d[i] != Array("clientID".utf8) { out += [d[i], d[i + 1]] }
            return out
        }
        let (x, y) = (comparable(a), comparable(b))
        guard let i = (0..<min(x.count, y.count)).first(where: { x[$0] != y[$0] }) ?? (x.count == y.count ? nil : min(x.count, y.count)) else { return nil }
        return "entry \(i / 2) (of \(x.count / 2) and \(y.count / 2)): \(i < x.count ? x[i] : []) against \(i < y.count ? y[i] : [])"
    }

    /// Makes a random store at `path` (see `fillRandomStore`) and returns its horizon and its last LSN.
    @discardableResult
    static func randomStore(at path: String, _ rng: inout SplitMix64) throws -> (horizon: UInt64, last: UInt64) {
        try fillRandomStore(at: path, &rng)
        let store = try Store(path: path)
        defer { store.close() }
        return (try store.read { try $0.horizon }, try store.read { try $0.lastLSN })
    }

    /// A store with a base snapshot, an index, a unique index whose values move between rows, a
    /// named view, gone and pending rows, and a few hundred rows in a second table.
    static func fillRandomStore(at path: String, _ rng: inout SplitMix64) throws {
        var options = StoreOptions()
        options.durability = .noSync
        let store = try Store(path: path, options: options)
        try CompactionTests.randomHistory(store, &rng, transactions: 100)
        try BulkFoldTests.swapEmails(store, rounds: 4)
        try store.write { tx in
            try tx.createTable(.fixed("items", fields: [.int("id"), .int("n"), .string("label", nullable: true)]))
            try tx.createIndex("items_by_n", on: "items", fields: ["n"])
        }
        for _ in 0..<40 {
            try store.write { tx in
                for _ in 0..<10 {
                    let key = RowKey(.int(Int64(rng.next() % 400)))
                    if try tx.snapshot.row("items", key: key) == nil {
                        try tx.insert("items", ["id": key.values[0], "n": .int(Int64(rng.next() % 50))])
                    } else if rng.next() % 4 == 0 {
                        try tx.delete("items", key: key)
                    } else {
                        try tx.update("items", key: key, ["label": .string("l\(rng.next() % 9)")])
                    }
                }
            }
        }
        let report = try store.compact(retaining: .operations(150))
        #expect(report.baseRows > 0)
        try CompactionTests.randomHistory(store, &rng, transactions: 100)
        try store.write { tx in
            for row in try tx.snapshot.rows("items").prefix(100) { try tx.update("items", key: row.key, ["n": .int(Int64(rng.next() % 50))]) }
        }
    }

    /// Copies the store at `source` to a new folder, opens it with `workers` fold threads and a
    /// fold memory limit of `limit`, and returns, dumped: its replay through `through`, the copy
    /// rebuilt in place, and whether verify found the copy consistent before the rebuild.
    static func fold(_ source: String, through: UInt64, workers: Int, limit: Int) throws -> (replayed: [String: [[UInt8]]], rebuilt: [String: [[UInt8]]], verified: VerifyReport) {
        try withTemporaryFolder { folder in
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: source + "/data.mdb", toPath: folder + "/data.mdb")
            var options = StoreOptions()
            options.durability = .noSync
            options.foldWorkers = workers
            options.foldMemoryLimit = limit
            let store = try Store(path: folder, options: options)
            let verified = try store.verify()
            let replayed = try withTemporaryFolder { target in try dump(try store.replay(into: target, through: through)) }
            try store.rebuild()
            return (replayed, try dump(store), verified)
        }
    }

    /// 1 byte flushes after every batch; 6,000 bytes every few dozen rows; 60,000 bytes every few
    /// hundred, which verify writes into its scratch store in transactions of 1,875 bytes of rows
    /// (a 32nd of the limit); the default never flushes before the end.
    @Test(arguments: [1, 6_000, 60_000, StoreOptions().foldMemoryLimit])
    func theParallelFoldWritesWhatTheSequentialFoldWrites(limit: Int) throws {
        let seed = testSeed("theParallelFoldWritesWhatTheSequentialFoldWrites(\(limit))")
        var rng = SplitMix64(seed: seed)
        try withTemporaryFolder { source in
            let (horizon, last) = try Self.randomStore(at: source, &rng)
            let through = horizon + 1 + rng.next() % (last - horizon)
            let sequential = try Self.fold(source, through: through, workers: 1, limit: limit)
            #expect(sequential.verified.isConsistent, "\(sequential.verified)")
            #expect(sequential.rebuilt["rows"]!.count / 2 > 200, "a store with a few hundred rows")
            #expect(sequential.rebuilt["base"]!.count > 0 && sequential.rebuilt["index"]!.count > 0 && sequential.rebuilt["view"]!.count > 0)
            for workers in [2, 3, 5] {
                let parallel = try Self.fold(source, through: through, workers: workers, limit: limit)
                #expect(parallel.verified.isConsistent, "\(workers) workers: \(parallel.verified)")
                #expect(parallel.verified.rebuilt.mapValues(\.digest) == sequential.verified.rebuilt.mapValues(\.digest), "\(workers) workers: verify")
                for (name, entries) in sequential.rebuilt {
                    #expect(Self.firstDifference(parallel.rebuilt[name]!, entries) == nil, "\(workers) workers: rebuild, database \(name)")
                }
                for (name, entries) in sequential.replayed {
                    #expect(Self.firstDifference(parallel.replayed[name]!, entries) == nil, "\(workers) workers: replay through \(through), database \(name)")
                }
            }
        }
    }

    /// Text keys on both sides of 16 bytes (with the table id), many of them alike in their
    /// first 16 bytes and differing after, are rebuilt, replayed and verified with one thread and
    /// two, flushing often and never: the views come back byte for byte as the write path left
    /// them.
    @Test(arguments: [1, 2_000, StoreOptions().foldMemoryLimit])
    func keysAlikeInTheirFirstSixteenBytesFoldToTheirOwnRows(limit: Int) throws {
        let seed = testSeed("keysAlikeInTheirFirstSixteenBytesFoldToTheirOwnRows(\(limit))")
        var rng = SplitMix64(seed: seed)
        try withTemporaryFolder { source in
            var options = StoreOptions()
            options.durability = .noSync
            let store = try Store(path: source, options: options)
            try store.write { tx in
                try tx.createTable(.fixed("notes", primaryKey: ["name"], fields: [.string("name"), .int("n"), .string("tag", nullable: true)]))
                try tx.createIndex("notes_by_n", on: "notes", fields: ["n"])
            }
            // Short names, whose keys end before or at 16 bytes, and long ones whose first 16
            // bytes (the table id and "customer-000") are all the same.
            let names = (0..<60).map { i in "c-" + String(repeating: "0", count: i % 8) + String(i) }
                + (0..<60).map { i in "customer-0000" + String(i) }
            for _ in 0..<60 {
                try store.write { tx in
                    for _ in 0..<8 {
                        let name = names[Int(rng.next() % UInt64(names.count))]
                        let key = RowKey(.string(name))
                        if try tx.snapshot.row("notes", key: key) == nil {
                            try tx.insert("notes", ["name": .string(name), "n": .int(Int64(rng.next() % 20))])
                        } else if rng.next() % 5 == 0 {
                            try tx.delete("notes", key: key)
                        } else {
                            try tx.update("notes", key: key, ["tag": .string("t\(rng.next() % 7)"), "n": .int(Int64(rng.next() % 20))])
                        }
                    }
                }
            }
            for row in try store.read({ try $0.pendingRows("notes") }).prefix(40) {
                try store.write { try $0.acknowledge("notes", key: row.key) }
            }
            try store.checkpoint()
            let live = try Self.dump(store)
            let last = try store.read { try $0.lastLSN }
            store.close()
            #expect(live["rows"]!.count / 2 > 60, "a store with many rows")
            for workers in [1, 2] {
                let folded = try Self.fold(source, through: last, workers: workers, limit: limit)
                #expect(folded.verified.isConsistent, "\(workers) workers: \(folded.verified)")
                for name in ["rows", "pending", "gone", "index"] {
                    #expect(Self.firstDifference(folded.rebuilt[name]!, live[name]!) == nil, "\(workers) workers: rebuild, database \(name)")
                    #expect(Self.firstDifference(folded.replayed[name]!, live[name]!) == nil, "\(workers) workers: replay, database \(name)")
                }
            }
        }
    }

    /// Two keys with the same 64-bit hash are still two rows: a lookup compares the whole key.
    /// (The hash is forced equal here; in a real fold a collision is rare, which is why the
    /// rebuild tests above cannot reach this.)
    @Test func keysWithTheSameHashKeepTheirOwnSlots() {
        let p = FoldPartition()
        let keys: [[UInt8]] = [
            [0, 0, 0, 1, 7],                                             // short
            [0, 0, 0, 1, 7, 0],                                          // the same, one zero longer
            Array(repeating: 9, count: 16),                              // exactly 16 bytes
            Array(repeating: 9, count: 16) + [1],                        // the same 16, then more
            Array(repeating: 9, count: 16) + [2],
            Array(repeating: 9, count: 16) + [1, 0],
        ]
        let slots = keys.map { k in k.withUnsafeBytes { p.slot(for: $0, hash: 42) } }
        #expect(slots.map(\.created) == Array(repeating: true, count: keys.count), "each key its own slot: \(slots)")
        #expect(Set(slots.map(\.slot)).count == keys.count)
        for (k, first) in zip(keys, slots) {
            let again = k.withUnsafeBytes { p.slot(for: $0, hash: 42) }
            #expect(again.slot == first.slot && !again.created, "key \(k) found again")
        }
    }

    /// The first failure in log order is the one reported, whichever thread folds the row.
    @Test(arguments: [1, 2, 4])
    func aBrokenChainIsReportedAtItsLSN(workers: Int) throws {
        var options = StoreOptions()
        options.foldWorkers = workers
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            for id in 1...200 { try store.write { try $0.insert("tasks", ["id": .int(Int64(id)), "title": "a"]) } }
            for id in 1...200 { try store.write { try $0.update("tasks", key: RowKey(.int(Int64(id))), ["title": "b"]) } }
            // Break the chains of the updates of rows 50 and 150 (LSNs 250 and 350): each now
            // names the insert of the row before it.
            try store.env.write { txn in
                for lsn in [UInt64(350), 250] {
                    var key = lsn.bigEndian
                    let lsnKey = withUnsafeBytes(of: &key) { Array($0) }
                    var record = Array(try txn.get(lsnKey, in: store.databases.log)!)
                    let header = try withBytes(record) { (r) throws(StrataError) in try OperationHeader(r) }
                    #expect(header.prevLSN == lsn - 200)
                    // The previous LSN is the varint right after the target; the new one has the same length.
                    var w = ByteWriter(capacity: 2)
                    w.appendVarint(lsn - 201)
                    var old = ByteWriter(capacity: 2)
                    old.appendVarint(lsn - 200)
                    #expect(w.bytes.count == old.bytes.count)
                    record.replaceSubrange(header.target.upperBound..<header.target.upperBound + w.bytes.count, with: w.bytes)
                    // Resealed: the fold's chain check, not the checksum, is under test.
                    var sealed = ByteWriter()
                    sealed.append(record)
                    RecordChecksum.seal(&sealed, lsn: lsn)
                    try txn.put(lsnKey, sealed.bytes, in: store.databases.log)
                }
            }
            for attempt in [{ _ = try store.verify() }, { try store.rebuild() }] {
                let e = #expect(throws: StrataError.self) { try attempt() }
                #expect(e?.code == .corruptRecord && e?.message.contains("operation 250 follows LSN 49") == true, "\(String(describing: e))")
            }
        }
    }
}

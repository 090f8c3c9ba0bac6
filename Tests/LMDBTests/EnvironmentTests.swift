import Foundation
import LMDB
import Testing

private func withEnvironment<R>(_ options: EnvironmentOptions = EnvironmentOptions(), _ body: (Environment) throws -> R) throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("lmdb-test-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    var options = options
    options.syncMode = .noSync
    return try body(try Environment(path: path, options: options))
}

private func be(_ i: UInt64) -> [UInt8] { withUnsafeBytes(of: i.bigEndian) { Array($0) } }

@Suite struct EnvironmentTests {
    @Test func putGetDeleteRoundTrip() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            try env.write { txn in
                try txn.put([1, 2], [9, 9, 9], in: db)
                try txn.put([3], [], in: db)
            }
            try env.read { txn throws in
                #expect(try txn.get([1, 2], in: db).map(Array.init) == [9, 9, 9])
                #expect(try txn.get([3], in: db).map(Array.init) == [])
                // MDB_NOTFOUND is nil, not an error.
                #expect(try txn.get([4], in: db) == nil)
            }
            let deleted = try env.write { try $0.delete([1, 2], in: db) }
            let deletedAgain = try env.write { try $0.delete([1, 2], in: db) }
            #expect(deleted && !deletedAgain)
        }
    }

    @Test func throwingWriteCommitsNothing() throws {
        struct Stop: Error {}
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            #expect(throws: Stop.self) {
                try env.write { txn in
                    try txn.put([1], [1], in: db)
                    throw Stop()
                }
            }
            #expect(try env.read { try $0.get([1], in: db) } == nil)
        }
    }

    @Test func swallowedErrorStillAbortsTheTransaction() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            try env.write { try $0.put([5], [5], in: db) }
            #expect(throws: LMDBError.self) {
                try env.write { txn in
                    try txn.put([6], [6], in: db)
                    // Appending a key below the last one fails; the closure ignores the error.
                    try? txn.put([1], [1], in: db, flags: .append)
                }
            }
            #expect(try env.read { try $0.get([6], in: db) } == nil)
        }
    }

    @Test func appendNeedsIncreasingBigEndianKeys() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("log")
            try env.write { txn in
                for i in UInt64(1)...1000 { try txn.put(be(i), [1], in: db, flags: .append) }
            }
            let error = #expect(throws: LMDBError.self) {
                try env.write { try $0.put(be(10), [1], in: db, flags: .append) }
            }
            #expect(error?.isKeyExists == true)
            #expect(try env.read { try $0.stats(db).entries } == 1000)
        }
    }

    @Test func cursorWalksInKeyOrder() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            try env.write { txn in
                for i: UInt64 in [5, 1, 9, 3, 7] { try txn.put(be(i), be(i * 10), in: db) }
            }
            let (forward, backward, sought) = try env.read { txn throws in
                try txn.withCursor(db) { c -> ([UInt8], [UInt8], UInt8?) in
                    var f: [UInt8] = []
                    var e = try c.first()
                    while let x = e { f.append(x.key[7]); e = try c.next() }
                    var b: [UInt8] = []
                    e = try c.last()
                    while let x = e { b.append(x.key[7]); e = try c.previous() }
                    let s = try c.seek(atLeast: be(4))?.key[7]
                    return (f, b, s)
                }
            }
            #expect(forward == [1, 3, 5, 7, 9])
            #expect(backward == [9, 7, 5, 3, 1])
            #expect(sought == 5)
        }
    }

    /// The checkpoint's writer: puts and deletes in key order through one cursor, over entries
    /// already there and new ones, on enough keys for several pages and splits.
    @Test func aWriteCursorPutsAndDeletesInKeyOrder() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            try env.write { txn in for i in UInt64(0)..<3000 where i % 3 != 0 { try txn.put(be(i), be(i), in: db) } }
            let missing = try env.write { txn in
                try txn.withWriteCursor(db) { c throws(LMDBError) in
                    var missing = 0
                    for i in UInt64(0)..<3000 {
                        let key = be(i)
                        if i % 4 == 0 {
                            if try !withBytes(key, { k throws(LMDBError) in try c.delete(k) }) { missing += 1 }
                        } else {
                            let value = [UInt8](repeating: UInt8(i % 251), count: 40)
                            try withBytes(key) { k throws(LMDBError) in try withBytes(value) { v throws(LMDBError) in try c.put(k, v) } }
                        }
                    }
                    return missing
                }
            }
            // What the cursor left: every key not a multiple of 4, with its new value.
            var expected: [UInt64: UInt64] = [:]
            for i in UInt64(0)..<3000 where i % 4 != 0 { expected[i] = i % 251 }
            // Keys 0, 12, 24, ...: a multiple of 4 and of 3 had no entry to delete.
            #expect(missing == 250)
            try env.read { txn throws in
                var seen = 0
                try txn.withCursor(db) { c in
                    var e = try c.first()
                    while let (k, v) = e {
                        let key = k.loadUnaligned(as: UInt64.self).bigEndian
                        #expect(expected[key] == UInt64(v.first!) && v.count == 40, "key \(key)")
                        seen += 1
                        e = try c.next()
                    }
                }
                #expect(seen == expected.count)
            }
        }
    }

    /// A write cursor's failure dooms its transaction, as a put of the transaction's own does.
    @Test func aWriteCursorsFailureAbortsTheTransaction() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            #expect(throws: LMDBError.self) {
                try env.write { txn in
                    try txn.put([1], [1], in: db)
                    try? txn.withWriteCursor(db) { c throws(LMDBError) in
                        // Over LMDB's key size limit (511 bytes by default).
                        let key = [UInt8](repeating: 7, count: 600)
                        try withBytes(key) { k throws(LMDBError) in try withBytes([1]) { v throws(LMDBError) in try c.put(k, v) } }
                    }
                }
            }
            #expect(try env.read { try $0.get([1], in: db) } == nil)
        }
    }

    @Test func mapGrowsWhenFull() throws {
        var options = EnvironmentOptions()
        options.mapSize = 64 * 1024
        try withEnvironment(options) { env in
            let db = try env.openDatabase("blobs")
            let value = [UInt8](repeating: 7, count: 4000)
            // 8 MB in transactions of 200 KB each, and one of 2 MB: far beyond the 64 KB map.
            for t in UInt64(0)..<40 {
                try env.write { txn in
                    for i in UInt64(0)..<50 { try txn.put(be(t * 100 + i), value, in: db) }
                }
            }
            try env.write { txn in
                for i in UInt64(0)..<500 { try txn.put(be(100_000 + i), value, in: db) }
            }
            #expect(try env.read { try $0.stats(db).entries } == 2500)
            #expect(env.mapSize > 8_000_000)
        }
    }

    /// A read nested in a read on one thread, while another thread's write waits to grow the
    /// map. The growth waits for the outer read to end; with a lock that prefers writers (as
    /// Darwin's does) a nested read that took the lock again would queue behind the growth and
    /// never start: a deadlock (this test then hangs). The nested read is part of the outer
    /// one's hold, so it starts, and the write completes once the outer read ends.
    ///
    /// Linux only: the test learns that the growth is queued from glibc's writer-preferring
    /// lock refusing a new reader, which is the behaviour asked for there.
    #if canImport(Glibc)
    @Test func aNestedReadDoesNotWaitForAQueuedGrowth() throws {
        var options = EnvironmentOptions()
        options.mapSize = 64 * 1024
        options.growthLockPrefersWriters = true
        try withEnvironment(options) { env in
            let db = try env.openDatabase("blobs")
            try env.write { try $0.put(be(1), [1], in: db) }
            let writer = Writer(env, db, key: 2, bytes: 1 << 20)
            try env.read { outer in
                writer.start()
                // The write, far larger than the map, runs out of room and waits to grow it.
                while !env.growthIsWaiting { sched_yield() }
                let inner = try env.read { try $0.get(be(1), in: db).map(Array.init) }
                #expect(inner == [1])
                #expect(try outer.get(be(2), in: db) == nil)
            }
            try writer.finish()
            #expect(try env.read { try $0.get(be(2), in: db)?.count } == 1 << 20)
            #expect(env.mapSize > 1 << 20)
        }
    }
    #endif

    /// Growing the map ahead of a write is a convenience: a write that fits does not wait for
    /// other threads' reads to end so that the map can grow first (before, it waited for them
    /// — here, for a read that waits for the write: a deadlock, and this test hangs). The map
    /// grows at a later write that finds no reader.
    @Test func aWriteThatFitsDoesNotWaitForReadersToGrowTheMapAhead() throws {
        var options = EnvironmentOptions()
        options.mapSize = 1 << 20
        try withEnvironment(options) { env in
            let db = try env.openDatabase("blobs")
            // 600 KB in one write: the largest write seen asks for twice that much room ahead.
            try env.write { txn in
                for i in UInt64(0)..<150 { try txn.put(be(1000 + i), [UInt8](repeating: 7, count: 4000), in: db) }
            }
            #expect(env.mapSize == 1 << 20)
            try env.read { _ in
                let writer = Writer(env, db, key: 2, bytes: 8)
                writer.start()
                try writer.finish()
            }
            #expect(env.mapSize == 1 << 20, "grown while a reader held the map")
            try env.write { try $0.put(be(3), [3], in: db) }
            #expect(env.mapSize > 1 << 20)
            #expect(try env.read { try $0.stats(db).entries } == 152)
        }
    }

    @Test func compactCopyHoldsTheSameData() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            try env.write { txn in for i in UInt64(0)..<100 { try txn.put(be(i), be(i), in: db) } }
            let copyPath = env.path + "-copy"
            try FileManager.default.createDirectory(atPath: copyPath, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: copyPath) }
            try env.copy(to: copyPath, compact: true)
            let copy = try Environment(path: copyPath)
            let copied = try copy.openDatabase("items", create: false)
            #expect(try copy.read { try $0.stats(copied).entries } == 100)
            #expect(try copy.read { try $0.get(be(42), in: copied).map(Array.init) } == be(42))
        }
    }

    #if os(Linux)
    /// A bulk load's pages leave the process's resident memory when asked, and every value reads
    /// the same afterwards (they come back from the file).
    @Test func releasedPagesLeaveResidentMemoryAndReadTheSame() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            let value = [UInt8](repeating: 7, count: 1000)
            try env.write { txn in for i in UInt64(0)..<20_000 { try txn.put(be(i), value + be(i), in: db) } }
            /// Reads every value, checking each: maps every page of the tree.
            func readAll() throws -> Int {
                try env.read { txn throws in
                    try txn.withCursor(db) { c in
                        var n = 0
                        var e = try c.first()
                        while let x = e {
                            #expect(x.value.count == 1008 && x.value.suffix(8).elementsEqual(x.key) && x.value.first == 7)
                            n += 1
                            e = try c.next()
                        }
                        return n
                    }
                }
            }
            #expect(try readAll() == 20_000)
            let before = try residentKiB(ofFileEndingIn: env.path + "/data.mdb")
            #expect(before > 10_000, "20,000 values of 1 KB read through the map: about 20 MB resident, not \(before) KiB")
            #expect(env.releaseMappedPages())
            let after = try residentKiB(ofFileEndingIn: env.path + "/data.mdb")
            #expect(after < 1_000, "after releasing: \(after) KiB of the file still resident (\(before) before)")
            #expect(try readAll() == 20_000)
        }
    }
    #endif
}

/// `LMDBError.ResultCode`: real LMDB failures come out as codes that can be compared, switched
/// over and matched in a `catch`, each with its name.
@Suite struct ResultCodeTests {
    @Test func realFailuresMatchTheirCodes() throws {
        try withEnvironment { env in
            let db = try env.openDatabase("items")
            try env.write { try $0.put([5], [5], in: db) }
            // A key below the last one with `append`: MDB_KEYEXIST, matched by pattern.
            var matched = false
            do {
                try env.write { try $0.put([1], [1], in: db, flags: .append) }
            } catch LMDBError.ResultCode.keyExists {
                matched = true
            }
            #expect(matched)
            // A key longer than LMDB takes (511 bytes): MDB_BAD_VALSIZE, switched over.
            let tooLong = #expect(throws: LMDBError.self) {
                try env.write { try $0.put([UInt8](repeating: 7, count: 600), [1], in: db) }
            }
            switch tooLong?.resultCode {
            case .badValueSize?: break
            default: Issue.record("a 600-byte key gave \(String(describing: tooLong))")
            }
            #expect(tooLong?.resultCode.description == "badValueSize")
            // A named database that does not exist, opened without creating it: MDB_NOTFOUND.
            let missing = #expect(throws: LMDBError.self) { try env.openDatabase("missing", create: false) }
            #expect(missing?.resultCode == .notFound && missing?.isKeyExists == false && missing?.isDamage == false)
            // A closed environment: `closed`, which is EBADF.
            env.close()
            let closed = #expect(throws: LMDBError.self) { try env.read { try $0.get([5], in: db) } }
            #expect(closed?.resultCode == .closed && closed?.code == EBADF)
            #expect("\(closed!.resultCode)" == "closed")
        }
        #expect(LMDBError.ResultCode(rawValue: 12_345).description == "code 12345")
        #expect(LMDBError(.diskFull, operation: "mdb_put").code == ENOSPC)
    }

}

/// A write of `bytes` bytes under `key`, run on a thread of its own; `finish()` waits for it and
/// rethrows its error.
private final class Writer: @unchecked Sendable {
    // @unchecked: `result` is written by the thread before it signals `done`, and read only
    // after `done` was waited for.
    private let env: Environment
    private let db: Database
    private let key: UInt64
    private let bytes: Int
    private let done = DispatchSemaphore(value: 0)
    private var result: Result<Void, any Error> = .success(())

    init(_ env: Environment, _ db: Database, key: UInt64, bytes: Int) {
        self.env = env
        self.db = db
        self.key = key
        self.bytes = bytes
    }

    func start() {
        Thread {
            self.result = Result { try self.env.write { try $0.put(be(self.key), [UInt8](repeating: 9, count: self.bytes), in: self.db) } }
            self.done.signal()
        }.start()
    }

    func finish() throws {
        done.wait()
        try result.get()
    }
}

#if os(Linux)
/// The resident KiB of this process's mappings of the file whose path ends in `suffix`
/// (`/proc/self/smaps`).
private func residentKiB(ofFileEndingIn suffix: String) throws -> Int {
    var total = 0, inFile = false
    // Read to the end: /proc files report a size of 0, which `String(contentsOfFile:)` believes.
    guard let smaps = FileHandle(forReadingAtPath: "/proc/self/smaps") else { throw CocoaError(.fileReadNoPermission) }
    defer { try? smaps.close() }
    for line in String(decoding: smaps.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n") {
        let range = line.prefix { $0 != " " }
        if range.contains("-"), range.allSatisfy({ $0 == "-" || $0.isHexDigit }) {   // "start-end perms … path"
            inFile = line.hasSuffix(suffix)
        } else if inFile, line.hasPrefix("Rss:") {
            total += Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) ?? 0
        }
    }
    return total
}
#endif

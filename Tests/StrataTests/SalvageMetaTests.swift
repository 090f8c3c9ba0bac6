import Foundation
import LMDB
@testable import Strata
import Testing

/// Salvage of the `meta` database when its B-tree has more than one leaf: every property and
/// pin is recovered as of the damaged store's last transaction, not from whichever copy of a
/// leaf page LMDB happened to leave behind.
@Suite struct SalvageMetaTests {
    static let propertyCount = 60

    static func name(_ i: Int) -> String { "prop-" + (i < 10 ? "0\(i)" : "\(i)") }

    /// A long value (so that 60 of them fill several leaf pages), naming the round that wrote it.
    static func value(_ i: Int, round: Int) -> Value {
        .string("\(name(i)) round \(round) " + String(repeating: "v", count: 300))
    }

    /// The raw LMDB environment of the closed store at `path`, and its `meta` database.
    static func rawMeta(_ path: String) throws -> (Environment, Database) {
        let env = try Environment(path: path, options: { var o = EnvironmentOptions(); o.maxDatabases = 16; return o }())
        return (env, try env.openDatabase("meta", create: false))
    }

    /// The page size of the closed store at `path`.
    static func pageSize(_ path: String) throws -> Int {
        let (env, _) = try rawMeta(path)
        defer { env.close() }
        return env.pageBytes
    }

    /// Zeroes page `page` of the closed store at `path`.
    static func zeroPage(_ path: String, _ page: Int) throws {
        let pageSize = try pageSize(path)
        let handle = try #require(FileHandle(forWritingAtPath: path + "/data.mdb"))
        try handle.seek(toOffset: UInt64(page * pageSize))
        try handle.write(contentsOf: Data(repeating: 0, count: pageSize))
        try handle.close()
    }

    /// A store of 40 rows and `propertyCount` long properties, written over several
    /// transactions: every third property overwritten in each of four rounds (so older copies of
    /// their leaf pages are left in the file), a few then removed, and one pin. Returns the
    /// properties as the last transaction left them.
    static func makeStoreWithASplitMetaTree(_ path: String) throws -> [String: Value] {
        let store = try Store(path: path)
        defer { store.close() }
        try store.createTable(tasksSchema)
        try store.write { tx in
            for i in 1...40 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string(String(repeating: "x", count: 200))]) }
        }
        var expected: [String: Value] = [:]
        for i in 0..<propertyCount { expected[name(i)] = value(i, round: 0) }
        let first = expected
        try store.write { tx in for (n, v) in first { try tx.setProperty(n, v) } }
        for round in 1...4 {
            let changed = stride(from: round % 3, to: propertyCount, by: 3).map { ($0, value($0, round: round)) }
            for (i, v) in changed { expected[name(i)] = v }
            try store.write { tx in for (i, v) in changed { try tx.setProperty(name(i), v) } }
        }
        let removed = stride(from: 5, to: propertyCount, by: 11).map(name)
        for n in removed { expected[n] = nil }
        try store.write { tx in
            for n in removed { try tx.setProperty(n, nil) }
            try tx.pinLog("test.pin", after: 7)
        }
        try store.checkpoint()
        return expected
    }

    /// The case this suite is about: a damaged log page, and properties on every leaf of a split
    /// `meta` tree, several of them overwritten or removed since their first copy was written.
    @Test func everyPropertyOfASplitMetaTreeIsSalvagedWithItsNewestValue() throws {
        try withTemporaryFolder { base in
            let (damaged, recovered) = (base + "/damaged", base + "/recovered")
            let expected = try Self.makeStoreWithASplitMetaTree(damaged)
            do {
                let (env, meta) = try Self.rawMeta(damaged)
                defer { env.close() }
                let stats = try env.read { try $0.stats(meta) }
                #expect(stats.leafPages > 2 && stats.depth > 1, "the meta tree did not split: \(stats)")
            }
            // Older values are still in the file (in pages LMDB freed): the test must tell them
            // from the current ones.
            let file = try Data(contentsOf: URL(fileURLWithPath: damaged + "/data.mdb"))
            let stale = (0..<Self.propertyCount).filter { i in
                guard case .string(let s) = Self.value(i, round: 0), expected[Self.name(i)] != Self.value(i, round: 0) else { return false }
                return file.range(of: Data(s.utf8)) != nil
            }
            #expect(!stale.isEmpty, "no older copy of an overwritten property is left in the file")

            try SalvageRecoveryTests.zeroLogPage(damaged, holding: 1)
            let report = try Store.salvage(from: damaged, into: recovered)
            #expect(report.recoveredOperations > 0 && !report.lostRanges.isEmpty, "\(report)")
            #expect(!report.metaIncomplete, "\(report)")
            let store = try Store(path: recovered)
            defer { store.close() }
            let properties = try store.read { try $0.properties() }
            for (n, v) in expected where properties[n] != v {
                Issue.record("\(n): salvaged \(properties[n].map { "\($0)".prefix(20) } ?? "nothing"), expected \("\(v)".prefix(20))")
            }
            let removed = Set(properties.keys).subtracting(expected.keys)
            #expect(removed.isEmpty, "removed properties came back: \(removed.sorted())")
            #expect(try store.read { try $0.logPins }["test.pin"] == 7)
            #expect(try store.verify().isConsistent)
        }
    }

    /// The leaf of `meta` that the last transaction rewrote is unreadable: its entries are read
    /// from the tree of the transaction before (LMDB's other meta page), the rest from the last
    /// one, and the report says that `meta` may not be current.
    @Test func aMetaLeafUnreadableInTheLastTransactionIsReadAsTheTransactionBeforeLeftIt() throws {
        try withTemporaryFolder { base in
            let (damaged, recovered) = (base + "/damaged", base + "/recovered")
            var expected = try Self.makeStoreWithASplitMetaTree(damaged)
            let middle = Self.name(Self.propertyCount / 2)
            // Two last transactions, each changing one property (small, so that it is inline in
            // its leaf page): the first is what the damaged leaf is read back as.
            let page: Int = try {
                let (env, meta) = try Self.rawMeta(damaged)
                defer { env.close() }
                let key = Array(("p:" + middle).utf8)
                try env.write { txn in try txn.put(key, Value.string("before").encoded, in: meta) }
                try env.write { txn in try txn.put(key, Value.string("last").encoded, in: meta) }
                return try env.read { txn in
                    let value = try #require(try txn.get(key, in: meta))
                    return try #require(env.page(of: value.baseAddress!))
                }
            }()
            try Self.zeroPage(damaged, page)
            expected[middle] = "before"

            let report = try Store.salvage(from: damaged, into: recovered)
            #expect(report.metaIncomplete && report.description.contains("meta"), "\(report)")
            let store = try Store(path: recovered)
            defer { store.close() }
            #expect(try store.read { try $0.properties() } == expected)
        }
    }

    /// Neither of LMDB's meta pages leads to `meta` (their main database roots point nowhere):
    /// salvage still finds the catalog on the leaf page holding it, and the report says that
    /// `meta` may be incomplete.
    @Test func withNoLMDBMetaPageLeadingToMetaTheCatalogIsStillFound() throws {
        try withTemporaryFolder { base in
            let (damaged, recovered) = (base + "/damaged", base + "/recovered")
            _ = try Self.makeStoreWithASplitMetaTree(damaged)
            let pageSize = try Self.pageSize(damaged)
            // The main database's md_root in each meta page (after the 16-byte page header:
            // magic, version, address, map size, then the free and main databases' MDB_db, whose
            // md_root is at 40), set to page 0, which no tree can have as a page.
            let handle = try #require(FileHandle(forWritingAtPath: damaged + "/data.mdb"))
            for page in 0..<2 {
                try handle.seek(toOffset: UInt64(page * pageSize + 16 + 24 + 48 + 40))
                try handle.write(contentsOf: Data(repeating: 0, count: 8))
            }
            try handle.close()
            let report = try Store.salvage(from: damaged, into: recovered)
            #expect(report.metaIncomplete && report.recoveredOperations == 40, "\(report)")
            let store = try Store(path: recovered)
            defer { store.close() }
            #expect(try store.read { try $0.rows("tasks").count } == 40)
        }
    }
}

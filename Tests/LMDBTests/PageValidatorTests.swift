import CLMDB
import Foundation
import LMDB
import Testing

/// `body` gets a fresh folder, removed afterwards.
private func withFolder<R>(_ body: (String) throws -> R) throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("lmdb-pages-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try body(path)
}

private func be(_ i: UInt64) -> [UInt8] { withUnsafeBytes(of: i.bigEndian) { Array($0) } }

/// Opens an environment in `path`, runs `body`, closes it: the file is then whole on disk.
private func withStore(_ path: String, _ body: (Environment) throws -> Void) throws {
    var options = EnvironmentOptions()
    options.syncMode = .noSync
    options.mapSize = 256 << 20
    options.maxDatabases = 64
    let env = try Environment(path: path, options: options)
    try body(env)
    try env.sync()
    env.close()
}

/// Puts `pairs` into the database `name` opened with LMDB flags `flags` (DUPSORT and the like,
/// which the wrapper does not offer), in one raw transaction; `delete` removes them instead.
private func rawPut(_ env: Environment, _ name: String, flags: Int32, _ pairs: [([UInt8], [UInt8])], delete: Bool = false) throws {
    var txn: OpaquePointer?
    try #require(mdb_txn_begin(env.handle, nil, 0, &txn) == 0)
    var dbi = MDB_dbi()
    try #require(mdb_dbi_open(txn, name, UInt32(flags | MDB_CREATE), &dbi) == 0)
    for (k, v) in pairs {
        var key = k, value = v
        let rc = key.withUnsafeMutableBytes { kp in
            value.withUnsafeMutableBytes { vp in
                var kv = MDB_val(mv_size: kp.count, mv_data: kp.baseAddress)
                var vv = MDB_val(mv_size: vp.count, mv_data: vp.baseAddress)
                return delete ? mdb_del(txn, dbi, &kv, &vv) : mdb_put(txn, dbi, &kv, &vv, 0)
            }
        }
        try #require(rc == 0)
    }
    try #require(mdb_txn_commit(txn) == 0)
}

private func fileBytes(_ path: String) throws -> [UInt8] {
    try Array(Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb")))
}

private func validate(_ bytes: [UInt8], _ options: PageValidator.Options = PageValidator.Options()) -> PageReport {
    bytes.withUnsafeBytes { PageValidator.validate(bytes: $0, options: options) }
}

// Little-endian field access for damaging a copy of a file.
private func u16(_ b: [UInt8], _ i: Int) -> Int { Int(b[i]) | Int(b[i + 1]) << 8 }
private func u64(_ b: [UInt8], _ i: Int) -> UInt64 { (0..<8).reduce(UInt64(0)) { $0 | UInt64(b[i + $1]) << (8 * $1) } }
private func set16(_ b: inout [UInt8], _ i: Int, _ v: Int) { b[i] = UInt8(v & 0xFF); b[i + 1] = UInt8(v >> 8 & 0xFF) }
private func set32(_ b: inout [UInt8], _ i: Int, _ v: UInt32) { for k in 0..<4 { b[i + k] = UInt8(v >> (8 * k) & 0xFF) } }
private func set64(_ b: inout [UInt8], _ i: Int, _ v: UInt64) { for k in 0..<8 { b[i + k] = UInt8(v >> (8 * k) & 0xFF) } }

/// The file offset of node `index` of the page at `page` (4096-byte pages).
private func nodeOffset(_ b: [UInt8], page: UInt64, _ index: Int) -> Int {
    let base = Int(page) * 4096
    return base + u16(b, base + 16 + 2 * index)
}

/// Stores of varied shapes for PageValidatorTests, each built by one function in a fresh folder.
enum PageValidatorShape: String, CaseIterable, Sendable {
    case small, overflowValues, dupSort, dupFixed, integerAndReverseKeys, manyNamedDatabases, grownThenDeleted, empty

    func build(_ path: String) throws {
        try withStore(path) { env in
            switch self {
            case .small:
                let db = try env.openDatabase("items")
                try env.write { txn in for i in UInt64(0)..<20 { try txn.put(be(i), be(i * 7), in: db) } }
            case .overflowValues:
                let db = try env.openDatabase("blobs")
                try env.write { txn in
                    for i in UInt64(0)..<40 {
                        try txn.put(be(i), [UInt8](repeating: UInt8(i), count: 2000 + Int(i) * 997), in: db)
                    }
                }
                // Replaced by smaller and larger values, and some removed: runs freed and reused.
                try env.write { txn in
                    for i in UInt64(0)..<40 where i % 3 == 0 { try txn.put(be(i), [UInt8](repeating: 1, count: 5000), in: db) }
                    for i in UInt64(0)..<40 where i % 5 == 1 { _ = try txn.delete(be(i), in: db) }
                }
            case .dupSort:
                // Few duplicates per key stay in a sub-page; many go to a sub-database.
                var pairs: [([UInt8], [UInt8])] = []
                for k in UInt64(0)..<300 {
                    let dups = k % 50 == 0 ? 600 : Int(k % 5) + 1
                    for d in 0..<dups { pairs.append((be(k), Array("dup-\(d)-of-\(k)".utf8))) }
                }
                try rawPut(env, "dups", flags: MDB_DUPSORT, pairs)
                try rawPut(env, "dups", flags: MDB_DUPSORT, pairs.enumerated().filter { $0.offset % 4 == 0 }.map(\.element), delete: true)
            case .dupFixed:
                var pairs: [([UInt8], [UInt8])] = []
                for k in UInt64(0)..<200 {
                    let dups = k % 40 == 0 ? 2000 : Int(k % 7) + 1
                    for d in 0..<UInt64(dups) { pairs.append((be(k), withUnsafeBytes(of: d) { Array($0) })) }
                }
                try rawPut(env, "fixed", flags: MDB_DUPSORT | MDB_DUPFIXED | MDB_INTEGERDUP, pairs)
                try rawPut(env, "fixedrev", flags: MDB_DUPSORT | MDB_DUPFIXED | MDB_REVERSEDUP, pairs)
            case .integerAndReverseKeys:
                let ints = (UInt64(0)..<3000).map { (withUnsafeBytes(of: $0 &* 2_654_435_761) { Array($0) }, be($0)) }
                try rawPut(env, "ints", flags: MDB_INTEGERKEY, ints)
                let words = (0..<3000).map { (Array("key-\($0 * 7919 % 3001)-suffix".utf8), be(UInt64($0))) }
                try rawPut(env, "reversed", flags: MDB_REVERSEKEY, words)
            case .manyNamedDatabases:
                for n in 0..<60 {
                    let db = try env.openDatabase("table-\(n)")
                    try env.write { txn in for i in UInt64(0)..<UInt64(n * 10) { try txn.put(be(i), be(i), in: db) } }
                }
            case .grownThenDeleted:
                let db = try env.openDatabase("log")
                for batch in UInt64(0)..<20 {
                    try env.write { txn in
                        for i in batch * 2000..<(batch + 1) * 2000 { try txn.put(be(i), [UInt8](repeating: UInt8(i % 251), count: 60), in: db) }
                    }
                }
                for batch in UInt64(0)..<20 {
                    try env.write { txn in
                        for i in batch * 2000..<(batch + 1) * 2000 where i % 3 != 0 { _ = try txn.delete(be(i), in: db) }
                    }
                }
            case .empty:
                _ = try env.openDatabase("nothing")
            }
        }
    }
}

/// A store holding a bit of every shape, for the damage tests.
private func buildMixed(_ path: String) throws {
    try withStore(path) { env in
        let items = try env.openDatabase("items")
        try env.write { txn in for i in UInt64(0)..<3000 { try txn.put(be(i), [UInt8](repeating: UInt8(i % 251), count: 30), in: items) } }
        let small = try env.openDatabase("small")
        try env.write { txn in for i in UInt64(0)..<10 { try txn.put(be(i), be(i), in: small) } }
        let blobs = try env.openDatabase("blobs")
        try env.write { txn in for i in UInt64(0)..<4 { try txn.put(be(i), [UInt8](repeating: 9, count: 20_000), in: blobs) } }
        var pairs: [([UInt8], [UInt8])] = []
        for k in UInt64(0)..<60 { for d in 0..<(k == 7 ? 400 : 3) { pairs.append((be(k), Array("d\(d)".utf8))) } }
        try rawPut(env, "dups", flags: MDB_DUPSORT, pairs)
        try env.write { txn in for i in UInt64(0)..<3000 where i % 2 == 0 { _ = try txn.delete(be(i), in: items) } }
    }
}

@Suite struct PageValidatorTests {
    @Test(arguments: PageValidatorShape.allCases)
    func aCleanStoreChecksClean(_ shape: PageValidatorShape) throws {
        try withFolder { path in
            try shape.build(path)
            let report = try PageValidator.validate(path: path)
            #expect(report.isClean, "\(report)")
            #expect(report.usedMeta != nil)
            #expect(report.metas.count == 2 && report.metas.allSatisfy(\.isValid))
            #expect(report.databases.first?.name == "<free>")
            #expect(report.databases.dropFirst().first?.name == "<main>")
            let quick = try PageValidator.validate(path: path + "/data.mdb", options: .quick)
            #expect(quick.isClean, "\(quick)")
            #expect(quick.pagesWalked <= report.pagesWalked)
        }
    }

    @Test func reportsNamedDatabasesAndWhichMetaIsUsed() throws {
        try withFolder { path in
            try PageValidatorShape.manyNamedDatabases.build(path)
            let report = try PageValidator.validate(path: path)
            #expect(Set(report.databases.map(\.name)).isSuperset(of: (0..<60).map { "table-\($0)" }))
            #expect(report.databases.first { $0.name == "table-59" }?.entries == 590)
            let used = try #require(report.usedMeta)
            #expect(report.metas[used].transactionID > report.metas[1 - used].transactionID)
        }
    }

    @Test func aMissingFileIsAnErrorAndAnEmptyOneIsClean() throws {
        try withFolder { path in
            #expect(throws: LMDBError.self) { try PageValidator.validate(path: path + "/nothing") }
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            _ = FileManager.default.createFile(atPath: path + "/data.mdb", contents: Data())
            #expect(try PageValidator.validate(path: path).isClean)
            _ = FileManager.default.createFile(atPath: path + "/data.mdb", contents: Data(repeating: 0, count: 5000))
            let short = try PageValidator.validate(path: path)
            #expect(short.findings.contains { $0.kind == .fileSize })
        }
    }

    // MARK: Targeted damage

    /// The mixed store's bytes and its clean report.
    private func mixed() throws -> ([UInt8], PageReport) {
        try withFolder { path in
            try buildMixed(path)
            let bytes = try fileBytes(path)
            let report = validate(bytes)
            #expect(report.isClean, "\(report)")
            return (bytes, report)
        }
    }

    private func expectFinding(_ bytes: [UInt8], _ kinds: Set<PageFinding.Kind>, sourceLocation: SourceLocation = #_sourceLocation) {
        let report = validate(bytes)
        #expect(!report.isClean, sourceLocation: sourceLocation)
        #expect(report.findings.contains { kinds.contains($0.kind) }, "\(report)", sourceLocation: sourceLocation)
        #expect(validate(bytes, .quick).usedMeta != nil || !kinds.isDisjoint(with: [.metaPage]), sourceLocation: sourceLocation)
    }

    @Test(arguments: [UInt64(0), 1])
    func aFreeListRootOnAMetaPageIsFound(_ root: UInt64) throws {
        var (bytes, report) = try mixed()
        let used = try #require(report.usedMeta)
        set64(&bytes, used * 4096 + 40 + 40, root)
        expectFinding(bytes, [.metaPage])
        #expect(!validate(bytes, .quick).isClean)
    }

    @Test func aHugeLastPageIsFound() throws {
        var (bytes, report) = try mixed()
        let used = try #require(report.usedMeta)
        set64(&bytes, used * 4096 + 136, 1 << 60)
        expectFinding(bytes, [.metaPage])
    }

    @Test(arguments: [5000, 8, 0xFFFF])
    func aLeafsUpperBoundIsFound(_ upper: Int) throws {
        var (bytes, report) = try mixed()
        let leaf = try #require(report.databases.first { $0.name == "small" }?.root)
        set16(&bytes, Int(leaf) * 4096 + 14, upper)
        expectFinding(bytes, [.pageBounds])
        #expect(!validate(bytes, .quick).isClean)
    }

    @Test(arguments: [4095, 0xFFFF, 20])
    func aNodeOffsetOutsideThePageIsFound(_ offset: Int) throws {
        var (bytes, report) = try mixed()
        let leaf = try #require(report.databases.first { $0.name == "small" }?.root)
        set16(&bytes, Int(leaf) * 4096 + 16 + 2 * 3, offset)
        expectFinding(bytes, [.nodeBounds])
    }

    /// A branch page's child pointing at the branch itself (a loop), at a meta page, past the
    /// file, or at another child (a shared page).
    @Test(arguments: ["self", "meta", "pastTheFile", "sibling"])
    func aBranchChildOutOfPlaceIsFound(_ target: String) throws {
        var (bytes, report) = try mixed()
        let items = try #require(report.databases.first { $0.name == "items" })
        #expect(items.depth >= 2)
        let root = try #require(items.root)
        let node = nodeOffset(bytes, page: root, 1)
        let child: UInt64 = switch target {
        case "self": root
        case "meta": 1
        case "pastTheFile": UInt64(bytes.count / 4096 + 10)
        default: u64(bytes, nodeOffset(bytes, page: root, 0)) & 0xFFFF_FFFF_FFFF
        }
        set16(&bytes, node, Int(child & 0xFFFF))
        set16(&bytes, node + 2, Int(child >> 16 & 0xFFFF))
        set16(&bytes, node + 4, Int(child >> 32 & 0xFFFF))
        expectFinding(bytes, [.pageReachedTwice, .pageOutOfRange])
    }

    @Test func anOverflowRunPastTheEndIsFound() throws {
        var (bytes, report) = try mixed()
        let leaf = try #require(report.databases.first { $0.name == "blobs" }?.root)
        let node = nodeOffset(bytes, page: leaf, 0)
        #expect(u16(bytes, node + 4) == 1)  // F_BIGDATA
        let overflow = u64(bytes, node + 8 + u16(bytes, node + 6))
        set32(&bytes, Int(overflow) * 4096 + 12, 1_000_000)
        expectFinding(bytes, [.overflow])
        // And the value's page number itself past the end.
        set64(&bytes, node + 8 + u16(bytes, node + 6), UInt64(bytes.count / 4096 + 3))
        expectFinding(bytes, [.pageOutOfRange])
    }

    @Test func keysOutOfOrderAreFound() throws {
        var (bytes, report) = try mixed()
        let leaf = try #require(report.databases.first { $0.name == "small" }?.root)
        let node = nodeOffset(bytes, page: leaf, 4)
        bytes[node + 8] = 0xFF
        expectFinding(bytes, [.keyOrder])
    }

    /// The file offsets of the leaf nodes of a tree of depth 1 or 2 rooted at `root`.
    private func leafNodes(_ b: [UInt8], root: UInt64) -> [Int] {
        func nodes(_ page: UInt64) -> [Int] {
            let base = Int(page) * 4096
            return (0..<(u16(b, base + 12) - 16) / 2).map { nodeOffset(b, page: page, $0) }
        }
        guard u16(b, Int(root) * 4096 + 10) == 1 else { return nodes(root) }
        return nodes(root).flatMap { n in nodes(u64(b, n) & 0xFFFF_FFFF_FFFF) }
    }

    @Test func aDamagedSubPageIsFound() throws {
        var (bytes, report) = try mixed()
        let root = try #require(report.databases.first { $0.name == "dups" }?.root)
        let node = try #require(leafNodes(bytes, root: root).first { u16(bytes, $0 + 4) == 0x04 })
        let subPage = node + 8 + u16(bytes, node + 6)
        let original = bytes
        // The first duplicate made larger than the second.
        let first = subPage + u16(bytes, subPage + 16 + 0)
        bytes[first + 8] = 0xFF
        expectFinding(bytes, [.keyOrder])
        // Its bounds past the node's data.
        bytes = original
        set16(&bytes, subPage + 14, 4000)
        expectFinding(bytes, [.subPage])
    }

    @Test func aDamagedSubDatabaseIsFound() throws {
        var (bytes, report) = try mixed()
        let root = try #require(report.databases.first { $0.name == "dups" }?.root)
        let node = try #require(leafNodes(bytes, root: root).first { u16(bytes, $0 + 4) == 0x06 })
        let record = node + 8 + u16(bytes, node + 6)
        let subRoot = u64(bytes, record + 40)
        let original = bytes
        set16(&bytes, Int(subRoot) * 4096 + 10, 0x04)
        expectFinding(bytes, [.pageKind])
        bytes = original
        set64(&bytes, record + 32, 7)  // md_entries
        expectFinding(bytes, [.counts])
    }

    @Test func budgetsStopTheWalk() throws {
        let (bytes, _) = try mixed()
        var options = PageValidator.Options()
        options.pageBudget = 3
        let report = validate(bytes, options)
        #expect(report.stoppedEarly && !report.isClean)
        options.pageBudget = nil
        options.timeBudget = .zero
        #expect(validate(bytes, options).stoppedEarly)
    }

    // MARK: Random damage

    /// Random bytes of random pages changed, over and over: the validator returns a report every
    /// time (a crash or a hang fails the test run). Prints its seed; `PAGE_VALIDATOR_SEED` replays one.
    @Test func randomDamageNeverCrashes() throws {
        let (clean, _) = try mixed()
        let seed = ProcessInfo.processInfo.environment["PAGE_VALIDATOR_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
        print("PageValidatorTests.randomDamageNeverCrashes seed \(seed)")
        var rng = SplitMix64(seed: seed)
        let pages = clean.count / 4096
        var found = 0
        let trials = 400
        for _ in 0..<trials {
            var bytes = clean
            let flips = Int.random(in: 1...8, using: &rng)
            for _ in 0..<flips {
                let page = Int.random(in: 0..<pages, using: &rng)
                // Half the changes in the header and first node pointers, where they hurt most.
                let offset = Bool.random(using: &rng) ? Int.random(in: 0..<64, using: &rng) : Int.random(in: 0..<4096, using: &rng)
                bytes[page * 4096 + offset] = Bool.random(using: &rng) ? UInt8.random(in: 0...255, using: &rng) : bytes[page * 4096 + offset] ^ (1 << UInt8.random(in: 0..<8, using: &rng))
            }
            let report = validate(bytes)
            _ = validate(bytes, .quick)
            if !report.isClean { found += 1 }
        }
        print("PageValidatorTests.randomDamageNeverCrashes: \(found) of \(trials) damaged copies reported damaged")
        #expect(found > 0)
    }
}

/// A small seeded generator, so that a failing trial can be replayed.
private struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

import Foundation
@testable import Strata
import StrataWorkload
import Testing

/// The overlay's copy-on-write B-tree against a plain sorted model: lookups, ordered scans from
/// any key, tombstones, and versions that must not see each other's later changes.
@Suite struct OverlayTreeTests {
    /// Keys of 1 to 12 bytes, or (one in four) 13 to 24, from a small alphabet with zero in it,
    /// so that prefixes, equal keys, keys that differ only in their length or zero bytes, and
    /// keys that differ only past the eighth or the sixteenth byte (where the comparison stops
    /// using the entries' inline prefixes) all occur.
    static func randomKey(_ g: inout SplitMix64) -> [UInt8] {
        let count = g.next() % 4 == 0 ? 13 + Int(g.next() % 12) : 1 + Int(g.next() % 12)
        return (0..<count).map { _ in UInt8(g.next() % 4) }
    }

    static func less(_ a: [UInt8], _ b: [UInt8]) -> Bool { a.lexicographicallyPrecedes(b) }

    @Test func agreesWithASortedModelAcrossVersions() throws {
        let seed = testSeed("OverlayTreeTests")
        var g = SplitMix64(seed: seed)
        let arena = EntryArena()
        var tree = OverlayTree()
        var model: [[UInt8]: [UInt8]?] = [:]
        // Earlier versions and what they held when they were taken.
        var versions: [(OverlayTree, [[UInt8]: [UInt8]?])] = []
        for step in 0..<6_000 {
            let key = Self.randomKey(&g)
            let value: [UInt8]? = g.next() % 5 == 0 ? nil : (0..<Int(g.next() % 20)).map { _ in UInt8(truncatingIfNeeded: g.next()) }
            let entry = key.withUnsafeBytes { k in
                value.map { v in v.withUnsafeBytes { arena.store(k, $0) } } ?? arena.store(k, nil)
            }
            let replaced = tree.set(entry)
            #expect((replaced != nil) == (model[key] != nil), "step \(step): set reported the wrong replacement")
            model[key] = .some(value)
            if step % 500 == 0 { versions.append((tree, model)) }
        }
        #expect(tree.count == model.count)
        try Self.check(tree, model, &g)
        // Every version still reads as it was when it was taken.
        for (old, oldModel) in versions { try Self.check(old, oldModel, &g) }
    }

    static func check(_ tree: OverlayTree, _ model: [[UInt8]: [UInt8]?], _ g: inout SplitMix64) throws {
        for (key, value) in model {
            let found = key.withUnsafeBytes { tree.find($0) }
            #expect(found != nil)
            #expect(found!.map { Array($0) } == value)
        }
        let sorted = model.keys.sorted(by: less)
        var cursor = OverlayCursor(tree)
        var all: [[UInt8]] = []
        var e = cursor.first()
        while let x = e {
            all.append(Array(x.key))
            #expect(x.value.map { Array($0) } == model[Array(x.key)]!)
            e = cursor.next()
        }
        #expect(all == sorted)
        for _ in 0..<50 {
            let probe = randomKey(&g)
            let expected = sorted.first { !less($0, probe) }
            let got = probe.withUnsafeBytes { cursor.seek(atLeast: $0) }.map { Array($0.key) }
            #expect(got == expected)
            #expect(probe.withUnsafeBytes { tree.find($0) } == nil ? model[probe] == nil : model[probe] != nil)
        }
    }
}

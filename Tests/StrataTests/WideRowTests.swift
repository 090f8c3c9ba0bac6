import Foundation
import Strata
import StrataWorkload
import Testing

/// A property-bag row may have tens of thousands of fields: looking one up by name is a hash
/// lookup and a binary search (it was a scan of the row's fields, so reading every field of a
/// 100,000-field row took minutes). These tests pin down that the lookup finds exactly what the
/// row holds, on rows that hold every field of the table and rows that hold a scattered few.
@Suite struct WideRowTests {
    @Test func everyFieldOfAWideRowIsFoundByName() throws {
        let seed = testSeed("everyFieldOfAWideRowIsFoundByName")
        var g = SplitMix64(seed: seed)
        try withStore { store, _ in
            try store.createTable(.propertyBag("bag", key: [.int("id")]))
            let n = 6_000
            var wide: [String: Value] = ["id": 1]
            for i in 0..<n { wide["f\(i)"] = .int(Int64(i)) }
            // A second row with a random sample of the fields, so field ids in it are sparse.
            var sparse: [String: Value] = ["id": 2]
            for i in 0..<n where g.below(7) == 0 { sparse["f\(i)"] = .string("s\(i)") }
            try store.write { tx in
                try tx.insert("bag", FieldValues(wide))
                try tx.insert("bag", FieldValues(sparse))
                try tx.acknowledge("bag", key: 1)
                try tx.acknowledge("bag", key: 2)
            }
            // Change a random tenth of the wide row's fields, so originals differ from currents.
            var changed: [String: Value] = [:]
            for i in 0..<n where g.below(10) == 0 { changed["f\(i)"] = .int(Int64(-i - 1)) }
            try store.write { try $0.update("bag", key: 1, FieldValues(changed)) }

            let (row1, row2, again) = try store.read { s in
                (try s.row("bag", key: 1)!, try s.row("bag", key: 2)!, try s.row("bag", key: 1)!)
            }
            #expect(row1.fieldNames.count == n + 1)
            for i in 0..<n {
                let f = "f\(i)"
                let current = changed[f] ?? .int(Int64(i))
                if row1[f] != current || row1.original(f) != .int(Int64(i)) || row1.isChanged(f) != (changed[f] != nil) {
                    Issue.record("row 1, \(f): \(row1[f]) / \(row1.original(f))")
                    break
                }
                if row2[f] != (sparse[f] ?? .null) || row2.isChanged(f) {
                    Issue.record("row 2, \(f): \(row2[f]), expected \(sparse[f] ?? .null)")
                    break
                }
            }
            #expect(row1["id"] == 1 && row2["id"] == 2)
            #expect(row1["nosuch"] == .null && row1.original("nosuch") == .null && !row1.isChanged("nosuch"))
            #expect(Set(row1.changedFields) == Set(changed.keys))
            #expect(row1 == again && row1.hashValue == again.hashValue && row1 != row2)

            // What reads a row by field name end to end: the upload change and a briefcase.
            let change = try #require(try store.read { try $0.pendingRows("bag") }.first)
            #expect(change.changedFields.count == changed.count)
            let file = FileManager.default.temporaryDirectory.appendingPathComponent("strata-wide-\(UUID().uuidString).briefcase").path
            defer { try? FileManager.default.removeItem(atPath: file) }
            try store.exportBriefcase(to: file)
            try withStore { copy, _ in
                try copy.importBriefcase(from: file)
                let imported = try copy.read { try $0.row("bag", key: 1)! }
                #expect(imported.values == row1.values && imported.originalValues == row1.originalValues)
            }
        }
    }
}

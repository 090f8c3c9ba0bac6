import Foundation
@testable import LMDB
@testable import Strata
import Synchronization
import Testing

/// Everything a store holds that a user can observe: rows with their state, and the log.
private func state(_ store: Store) throws -> [String] {
    try store.read { snap in
        var out = ["lastLSN \(try snap.lastLSN)", "tables \(try snap.tables.map(\.name))"]
        for t in try snap.tables {
            out += try snap.rows(t.name, includingDeleted: true).map(\.description)
            out += try snap.fieldNames(t.name)
        }
        out += try snap.operations().map { "\($0.lsn) \($0.kind) \($0.key)" }
        return out
    }
}

@Suite struct BadInputTests {
    /// A store with one synced and one pending row, so every error is checked against both.
    private func prepared(_ body: (Store) throws -> Void) throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.createTable(.propertyBag("settings", key: [.string("name")]))
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "synced"])
                try tx.acknowledge("tasks", key: 1)
                try tx.update("tasks", key: 1, ["title": "changed"])
                try tx.insert("tasks", ["id": 2, "title": "new"])
                try tx.insert("settings", ["name": "theme", "value": "dark"])
            }
            try body(store)
        }
    }

    static let cases: [(String, StrataError.Code, @Sendable (Transaction) throws -> Void)] = [
        ("unknown table", .tableNotFound, { try $0.insert("nope", ["id": 1]) }),
        ("unknown field in a fixed table", .fieldNotFound, { try $0.update("tasks", key: 1, ["colour": "red"]) }),
        ("unknown field on insert", .fieldNotFound, { try $0.insert("tasks", ["id": 3, "title": "x", "colour": "red"]) }),
        ("wrong value type", .typeMismatch, { try $0.update("tasks", key: 1, ["priority": "high"]) }),
        ("wrong key type", .typeMismatch, { try $0.update("tasks", key: "one", ["title": "x"]) }),
        ("missing primary key", .missingField, { try $0.insert("tasks", ["title": "x"]) }),
        ("missing required field", .missingField, { try $0.insert("tasks", ["id": 3]) }),
        ("null in a non-nullable field", .nullNotAllowed, { try $0.update("tasks", key: 1, ["title": nil]) }),
        ("null key", .nullNotAllowed, { try $0.delete("tasks", key: RowKey(.null)) }),
        ("duplicate insert", .duplicateKey, { try $0.insert("tasks", ["id": 2, "title": "again"]) }),
        ("duplicate insert of a synced row", .duplicateKey, { try $0.insert("tasks", ["id": 1, "title": "again"]) }),
        ("update of a missing row", .rowNotFound, { try $0.update("tasks", key: 99, ["title": "x"]) }),
        ("delete of a missing row", .rowNotFound, { try $0.delete("tasks", key: 99) }),
        ("key with too many parts", .invalidKey, { try $0.delete("tasks", key: [1, 2]) }),
        ("key too long", .invalidKey, { try $0.insert("settings", ["name": .string(String(repeating: "k", count: 600))]) }),
        ("primary key change", .invalidOperation, { try $0.update("tasks", key: 1, ["id": 5]) }),
        ("field given twice", .invalidOperation, { try $0.update("tasks", key: 1, FieldValues([("title", "a"), ("title", "b")])) }),
        ("revert of a field of an inserted row", .invalidOperation, { try $0.revert("tasks", key: 2, field: "title") }),
        ("table redefined differently", .tableExists, { try $0.createTable(.fixed("tasks", fields: [.int("id")])) }),
        ("invalid schema", .invalidSchema, { try $0.createTable(.fixed("bad", primaryKey: ["missing"], fields: [.int("id")])) }),
    ]

    @Test(arguments: cases.indices)
    func rejectedWithAClearErrorAndNoChange(_ i: Int) throws {
        let (name, code, edit) = Self.cases[i]
        try prepared { store in
            let before = try state(store)
            let error = #expect(throws: StrataError.self, "\(name)") { try store.write { try edit($0) } }
            #expect(error?.code == code, "\(name): \(error.map(String.init(describing:)) ?? "-")")
            #expect(error?.message.isEmpty == false)
            #expect(try state(store) == before, "\(name) changed the store")
        }
    }

    @Test(arguments: cases.indices)
    func aCaughtErrorLeavesTheRestOfTheTransactionIntact(_ i: Int) throws {
        let (name, code, edit) = Self.cases[i]
        try prepared { store in
            try store.write { tx in
                try tx.update("tasks", key: 2, ["priority": 4])
                do {
                    try edit(tx)
                    Issue.record("\(name) did not throw")
                } catch let e as StrataError {
                    #expect(e.code == code)
                }
                try tx.update("tasks", key: 2, ["done": true])
            }
            let row = try #require(try store.read { try $0.row("tasks", key: 2) })
            #expect(row["priority"] == 4 && row["done"] == true)
            #expect(try store.verify().isConsistent, "\(name)")
        }
    }

    @Test func errorsNameWhatWasWrong() throws {
        try prepared { store in
            let e = #expect(throws: StrataError.self) { try store.write { try $0.update("tasks", key: 1, ["priority": "high"]) } }
            #expect(e?.message.contains("priority") == true && e?.message.contains("tasks") == true)
            let e2 = #expect(throws: StrataError.self) { try store.write { try $0.insert("task", ["id": 1]) } }
            #expect(e2?.message.contains("'task'") == true && e2?.message.contains("tasks") == true)
        }
    }
}

@Suite struct AtomicityTests {
    struct Stop: Error {}

    @Test func aThrowingWriteLeavesNoTrace() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                for i in 1...10 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": .string("t\(i)")]) }
            }
            let before = try state(store)
            #expect(throws: Stop.self) {
                try store.write { tx in
                    try tx.update("tasks", key: 1, ["title": "changed"])
                    try tx.delete("tasks", key: 2)
                    try tx.insert("tasks", ["id": 11, "title": "new"])
                    try tx.createTable(.fixed("other", fields: [.int("id")]))
                    throw Stop()
                }
            }
            #expect(try state(store) == before)
            #expect(try store.verify().isConsistent)
            // The next write continues the log densely.
            try store.write { try $0.update("tasks", key: 3, ["done": true]) }
            let lsns = try store.read { try $0.operations().map(\.lsn) }
            #expect(lsns == Array(1...11))
        }
    }

    @Test func editsOfOneWriteShareATransactionID() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "a"])
                try tx.insert("tasks", ["id": 2, "title": "b"])
            }
            try store.write { try $0.delete("tasks", key: 1) }
            let ids = try store.read { try $0.operations().map(\.transactionID) }
            #expect(ids.count == 3 && ids[0] == ids[1] && ids[2] > ids[1])
        }
    }
}

@Suite struct StorageTests {
    @Test func aTinyMapAbsorbsManyMegabytes() throws {
        var options = StoreOptions()
        options.initialMapSize = 64 * 1024
        try withStore(options) { store, _ in
            try store.createTable(.fixed("blobs", fields: [.int("id"), .bytes("data")]))
            let blob = [UInt8](repeating: 0xAB, count: 100_000)
            for t in 0..<10 {
                try store.write { tx in
                    for i in 0..<10 { try tx.insert("blobs", ["id": .int(Int64(t * 10 + i)), "data": .bytes(blob)]) }
                }
            }
            // One transaction larger than everything before it.
            try store.write { tx in
                for i in 100..<150 { try tx.insert("blobs", ["id": .int(Int64(i)), "data": .bytes(blob)]) }
            }
            #expect(try store.read { try $0.count("blobs") } == 150)
            // The views are written behind: after a checkpoint the file holds the rows as well
            // as the log.
            try store.checkpoint()
            #expect(store.sizeInBytes > 30_000_000)
            #expect(try store.read { try $0.row("blobs", key: 149) }?["data"] == .bytes(blob))
            #expect(try store.verify().isConsistent)
        }
    }

    /// A snapshot keeps reading its own state while a commit and a checkpoint (which rewrites
    /// the views in LMDB and empties the overlay) happen under it.
    @Test func aSnapshotOutlivesACheckpoint() throws {
        var options = StoreOptions()
        options.overlayBudget = Int.max
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in for i in 1...50 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "before"]) } }
            try store.read { snap in
                let before = try snap.rows("tasks")
                let pendingBefore = try snap.pendingRows().count
                // Another thread: change every row, then checkpoint.
                let done = DispatchSemaphore(value: 0)
                Thread {
                    try? store.write { tx in for i in 1...50 { try tx.update("tasks", key: .init(.int(Int64(i))), ["title": "after"]) } }
                    try? store.write { tx in for i in 1...25 { try tx.acknowledge("tasks", key: .init(.int(Int64(i)))) } }
                    try? store.checkpoint()
                    done.signal()
                }.start()
                done.wait()
                #expect(try snap.rows("tasks") == before)
                #expect(try snap.rows("tasks").allSatisfy { $0["title"] == "before" })
                #expect(try snap.pendingRows().count == pendingBefore)
            }
            #expect(try store.read { try $0.rows("tasks").allSatisfy { $0["title"] == "after" } })
            #expect(try store.read { try $0.pendingRows().count } == 25)
            #expect(try store.verify().isConsistent)
        }
    }

    /// Views are written behind: commits leave the views in LMDB as they were until a
    /// checkpoint, and a reopened store folds what was left behind.
    @Test func commitsWriteTheLogAndACheckpointWritesTheViews() throws {
        var options = StoreOptions()
        options.overlayBudget = Int.max
        try withTemporaryFolder { path in
            do {
                let store = try Store(path: path, options: options)
                try store.createTable(tasksSchema)
                try store.write { tx in for i in 1...20 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
                let inLMDB = try store.env.read { try $0.stats(store.databases.rows).entries }
                #expect(inLMDB == 0)
                #expect(try store.read { try $0.count("tasks") } == 20)
                let report = try store.verify()
                #expect(report.isConsistent && report.live["rows@checkpoint"]?.entries == 0, "\(report)")
                try store.checkpoint()
                #expect(try store.env.read { try $0.stats(store.databases.rows).entries } == 20)
                try store.write { tx in try tx.delete("tasks", key: 20) }
                #expect(try store.env.read { try $0.stats(store.databases.rows).entries } == 20)
            }
            // Closed with an overlay: the close checkpointed it.
            let store = try Store(path: path, options: options)
            #expect(try store.read { try $0.count("tasks") } == 19)
            #expect(try store.read { try $0.pendingRows().count } == 19)
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func verifyFindsAViewThatDisagreesWithTheLog() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                for i in 1...5 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) }
            }
            #expect(try store.verify().isConsistent)
            // Damage the rows view behind the store's back (once it is in LMDB): drop row 3's
            // pending entry.
            try store.checkpoint()
            var key = ByteWriter(capacity: 16)
            try store.read { try $0.catalog.table(named: "tasks") }.encodeKey(3, into: &key)
            _ = try store.env.write { try $0.delete(key.bytes, in: store.databases.pending) }
            let report = try store.verify()
            #expect(!report.isConsistent)
            #expect(report.differences.map(\.description) == ["pending: tasks 3 missing"])
            #expect(report.differences == [VerifyReport.Difference(view: .pending, entry: "tasks 3", kind: .missing)])
            try store.rebuild()
            #expect(try store.verify().isConsistent)
            #expect(try store.read { try $0.pendingRows().count } == 5)
        }
    }

    @Test func openingRefusesANewerFormatAndAMissingStore() throws {
        try withTemporaryFolder { path in
            var options = StoreOptions()
            options.createIfMissing = false
            let missing = #expect(throws: StrataError.self) { try Store(path: path, options: options) }
            #expect(missing?.code == .io)
            do {
                let store = try Store(path: path)
                try store.env.write { try $0.setMeta(MetaKey.format, Store.formatVersion + 1, in: store.databases) }
            }
            let newer = #expect(throws: StrataError.self) { try Store(path: path) }
            #expect(newer?.code == .formatVersion)
        }
    }

    @Test func concurrentReadersSeeConsistentSnapshots() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { try $0.insert("tasks", ["id": 0, "title": "counter", "priority": 0]) }
            // Each write adds two rows and sets the counter row's priority to the row count, so
            // any consistent snapshot has: count - 1 == priority of row 0, and an odd count.
            let writes = 300
            let failures = Locked(0)
            let done = Locked(false)
            DispatchQueue.concurrentPerform(iterations: 4) { worker in
                if worker == 0 {
                    for w in 0..<writes {
                        try! store.write { tx in
                            try tx.insert("tasks", ["id": .int(Int64(2 * w + 1)), "title": "a"])
                            try tx.insert("tasks", ["id": .int(Int64(2 * w + 2)), "title": "b"])
                            try tx.update("tasks", key: 0, ["priority": .int(Int64(2 * w + 2))])
                        }
                    }
                    done.withLock { $0 = true }
                } else {
                    var reads = 0
                    while !done.withLock({ $0 }) || reads < 10 {
                        reads += 1
                        let ok = try! store.read { snap in
                            let n = try snap.count("tasks")
                            let p = try snap.row("tasks", key: 0)!["priority"].intValue!
                            return n % 2 == 1 && Int64(n - 1) == p
                        }
                        if !ok { failures.withLock { $0 += 1 } }
                    }
                }
            }
            #expect(failures.withLock { $0 } == 0)
            #expect(try store.read { try $0.count("tasks") } == 2 * writes + 1)
        }
    }
}

@Suite struct WritePathTests {
    @Test func upsertInsertsThenUpdatesOnlyTheGivenFields() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { try $0.upsert("tasks", ["id": 1, "title": "first", "priority": 3]) }
            try store.write { try $0.acknowledge("tasks", key: 1) }
            try store.write { try $0.upsert("tasks", ["id": 1, "title": "second"]) }
            let row = try #require(try store.read { try $0.row("tasks", key: 1) })
            #expect(row["title"] == "second" && row.original("title") == "first")
            // Not reset to its default: an upsert of an existing row is an update.
            #expect(row["priority"] == 3)
            #expect(try store.read { try $0.history("tasks", key: 1).map(\.kind) } == [.insert, .acknowledge, .update])
        }
    }

    @Test func intsAreAcceptedForDoubleFieldsAndNothingElseIsCoerced() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { try $0.insert("tasks", ["id": 1, "title": "t", "updated": 3]) }
            #expect(try store.read { try $0.row("tasks", key: 1) }?["updated"] == .double(3))
            #expect(throws: StrataError.self) { try store.write { try $0.update("tasks", key: 1, ["done": 1]) } }
        }
    }

    @Test func asyncWritesAndReads() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(tasksSchema)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for i in 0..<20 {
                    group.addTask { try await store.write { try $0.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
                }
                try await group.waitForAll()
            }
            #expect(try await store.read { try $0.count("tasks") } == 20)
        }
    }
}

func withTemporaryFolderAsync<R>(_ body: (String) async throws -> R) async throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-test-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try await body(path)
}

@Suite struct HistoryTests {
    @Test func historySurvivesRemovalAndContinuesWhenTheKeyReturns() throws {
        var options = StoreOptions()
        options.checkInvariants = true
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            try store.write { try $0.insert("tasks", ["id": 1, "title": "first life"]) }
            try store.write { try $0.insert("tasks", ["id": 2, "title": "neighbour"]) }
            // A local insert that is deleted leaves no row at all…
            try store.write { try $0.delete("tasks", key: 1) }
            #expect(try store.read { try $0.row("tasks", key: 1, includingDeleted: true) } == nil)
            // …but its history is still there.
            #expect(try store.read { try $0.history("tasks", key: 1).map(\.kind) } == [.insert, .delete])
            try store.write { try $0.insert("tasks", ["id": 1, "title": "second life"]) }
            try store.write { try $0.update("tasks", key: 1, ["done": true]) }
            let history = try store.read { try $0.history("tasks", key: 1) }
            #expect(history.map(\.kind) == [.insert, .delete, .insert, .update])
            #expect(history.map(\.lsn) == [1, 3, 4, 5])
            #expect(history[2].changes.first { $0.field == "title" }?.current == "second life")
            #expect(try store.read { try $0.history("tasks", key: 2).map(\.lsn) } == [2])
            #expect(try store.read { try $0.history("tasks", key: 3) }.isEmpty)
            #expect(try store.verify().isConsistent)
            try store.rebuild()
            #expect(try store.read { try $0.history("tasks", key: 1).map(\.lsn) } == [1, 3, 4, 5])
        }
    }
}

@Suite struct LargeValueTests {
    @Test func rowsOfTensOfMegabytesWork() throws {
        var options = StoreOptions()
        options.initialMapSize = 1 << 20
        try withStore(options) { store, _ in
            try store.createTable(.fixed("files", primaryKey: ["name"], fields: [.string("name"), .bytes("data")]))
            var big = [UInt8](repeating: 0, count: 30 << 20)
            for i in stride(from: 0, to: big.count, by: 4096) { big[i] = UInt8(truncatingIfNeeded: i / 4096) }
            try store.write { try $0.insert("files", ["name": "video", "data": .bytes(big)]) }
            try store.write { try $0.acknowledge("files", key: "video") }
            big[12345] = 7
            try store.write { try $0.update("files", key: "video", ["data": .bytes(big)]) }
            let row = try #require(try store.read { try $0.row("files", key: "video") })
            #expect(row["data"] == .bytes(big) && row.isChanged("data"))
            #expect(try store.verify().isConsistent)
        }
    }
}

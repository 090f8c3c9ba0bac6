import Foundation
import Strata
import StrataWorkload
import Synchronization
import Testing

@Suite struct TimeTravelTests {
    /// A row as of a random LSN equals that row in a replay of the log up to that LSN.
    @Test func aRowAsOfAnLSNEqualsAReplayUpToIt() throws {
        let seed = testSeed("aRowAsOfAnLSN")
        var g = SplitMix64(seed: seed)
        try withStore { store, path in
            try store.createTable(tasksSchema)
            for _ in 0..<60 {
                try store.write { tx in
                    for _ in 0..<5 {
                        let key = RowKey(.int(Int64(g.next() % 8)))
                        switch g.next() % 5 {
                        case 0: try? tx.insert("tasks", ["id": key.values[0], "title": .string("t\(g.next() % 4)")])
                        case 1, 2: try? tx.update("tasks", key: key, ["title": .string("u\(g.next() % 4)")])
                        case 3: try? tx.delete("tasks", key: key)
                        default: try? tx.acknowledge("tasks", key: key)
                        }
                    }
                }
            }
            let last = try store.read { try $0.lastLSN }
            for _ in 0..<12 {
                let lsn = 1 + g.next() % last
                let replayPath = path + "-replay-\(lsn)"
                defer { try? FileManager.default.removeItem(atPath: replayPath) }
                let replayed = try store.replay(into: replayPath, through: lsn)
                #expect(try replayed.read { try $0.lastLSN } == lsn)
                for id in 0..<8 {
                    let key = RowKey(.int(Int64(id)))
                    let asOf = try store.read { try $0.row("tasks", key: key, asOf: lsn, includingDeleted: true) }
                    let expected = try replayed.read { try $0.row("tasks", key: key, includingDeleted: true) }
                    #expect(asOf == expected, "row \(id) as of \(lsn)")
                }
            }
        }
    }
}

@Suite struct NotificationTests {
    @Test func observersGetTheChangedKeysOfCommittedTransactionsOnly() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let seen = Locked<[CommitNotification]>([])
            let token = store.observe { n in seen.withLock { $0.append(n) } }
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "a"])
                try tx.insert("tasks", ["id": 2, "title": "b"])
            }
            struct Stop: Error {}
            _ = try? store.write { tx in
                try tx.insert("tasks", ["id": 3, "title": "never"])
                throw Stop()
            }
            try store.write { tx in
                try tx.acknowledge("tasks", key: 1)
                try tx.update("tasks", key: 1, ["title": "changed"])
                try tx.delete("tasks", key: 2)
                try tx.update("tasks", key: 1, ["title": "changed"])  // no change: not reported
            }
            let events = seen.withLock { $0 }
            #expect(events.count == 2)
            #expect(events[0].changes.map(\.key) == [1, 2] && events[0].changes.allSatisfy { $0.kind == .inserted && $0.origin == .local })
            #expect(events[0].lsns == 1...2)
            #expect(events[1].changes.map { "\($0.key) \($0.kind) \($0.origin)" } == ["1 updated server", "1 updated local", "2 deleted local"])
            token.cancel()
            try store.write { try $0.insert("tasks", ["id": 9, "title": "unseen"]) }
            #expect(seen.withLock { $0.count } == 2)
        }
    }

    @Test func changesArriveAsAnAsyncSequence() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(tasksSchema)
            let stream = store.changes()
            try await store.write { try $0.insert("tasks", ["id": 1, "title": "a"]) }
            try await store.write { try $0.delete("tasks", key: 1) }
            var kinds: [RowChangeEvent.Kind] = []
            for await n in stream {
                kinds += n.changes.map(\.kind)
                if kinds.count == 2 { break }
            }
            #expect(kinds == [.inserted, .deleted])
        }
    }

    /// A consumer that falls behind holds only as many change sets as its buffer keeps, the
    /// newest; the stream still ends when the store closes.
    @Test func aBoundedChangeStreamKeepsTheNewestChangeSets() async throws {
        try await withTemporaryFolderAsync { path in
            let store = try Store(path: path)
            try store.createTable(tasksSchema)
            let stream = store.changes(bufferingPolicy: .bufferingNewest(2))
            // A lone synchronous writer delivers before its write returns: ten change sets
            // reach the stream before anything consumes it. (A function of its own, so that the
            // synchronous `write` is the one called.)
            func writeTen() throws -> UInt64 {
                for id in 1...10 { try store.write { try $0.insert("tasks", ["id": .int(Int64(id)), "title": "t"]) } }
                return try store.read { try $0.lastLSN }
            }
            let last = try writeTen()
            store.close()
            var lsns: [UInt64] = []
            for await n in stream { lsns.append(n.lsns.lowerBound) }
            #expect(lsns == [last - 1, last])
        }
    }
}

@Suite struct ProgressTests {
    @Test func rebuildVerifyAndReplayReportProgressUpToTheLogLength() throws {
        try withStore { store, path in
            try store.createTable(tasksSchema)
            try store.write { tx in for i in 0..<25_000 { try tx.insert("tasks", ["id": .int(Int64(i)), "title": "t"]) } }
            for run in ["rebuild", "verify", "replay"] {
                var reports: [(Int, Int)] = []
                switch run {
                case "rebuild": try store.rebuild { reports.append(($0, $1)) }
                case "verify": _ = try store.verify { reports.append(($0, $1)) }
                default: try store.replay(into: path + "-replay", through: 20_000) { reports.append(($0, $1)) }
                }
                let total = run == "replay" ? 20_000 : 25_000
                #expect(reports.map(\.0) == [10_000, 20_000] + (total == 25_000 ? [25_000] : [20_000]), "\(run)")
                #expect(reports.allSatisfy { $0.1 == total }, "\(run)")
            }
        }
    }
}

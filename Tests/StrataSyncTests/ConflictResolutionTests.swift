import Foundation
import Strata
import StrataSync
import StrataWorkload
import Testing

/// Resolving a deferred conflict: every combination of roles for three fields — untouched,
/// changed only here, changed only on the server, changed on both sides to different values —
/// under every choice, against the rule written out per field: the choice decides the fields in
/// conflict and nothing else. Checked on the row, on `conflicts()` and on the next upload batch.
@Suite struct ConflictResolutionTests {
    enum Role: String, CaseIterable, Sendable { case untouched, localOnly, serverOnly, both }
    enum Choice: String, CaseIterable, Sendable { case server, local, values }

    /// The three fields under test, their base, local, server and resolved ("values") values.
    struct FieldCase: Sendable {
        let name: String
        let base: Value, local: Value, server: Value, chosen: Value
    }
    static let fields = [
        FieldCase(name: "title", base: "B", local: "L", server: "S", chosen: "V"),
        FieldCase(name: "priority", base: 1, local: 2, server: 3, chosen: 4),
        FieldCase(name: "notes", base: "b", local: .null, server: "s", chosen: "v"),
    ]

    static var cases: [(Role, Role, Role, Choice)] {
        Role.allCases.flatMap { a in Role.allCases.flatMap { b in Role.allCases.flatMap { c in Choice.allCases.map { (a, b, c, $0) } } } }
    }

    /// The rule, per field: (current, original) after the resolution.
    static func expected(_ role: Role, _ f: FieldCase, _ choice: Choice) -> (current: Value, original: Value) {
        switch role {
        case .untouched: (f.base, f.base)
        case .localOnly: (f.local, f.base)
        case .serverOnly: (f.server, f.server)
        case .both:
            switch choice {
            case .server: (f.server, f.server)
            case .local: (f.local, f.server)
            case .values: (f.chosen, f.server)
            }
        }
    }

    @Test(arguments: cases)
    func resolution(a: Role, b: Role, c: Role, choice: Choice) throws {
        let roles = [a, b, c]
        try withStore { store in
            try store.write { tx in
                var values: [String: Value] = ["id": 1]
                for f in Self.fields { values[f.name] = f.base }
                try tx.insert("tasks", FieldValues(values))
                try tx.acknowledge("tasks", key: 1)
                var edits: [String: Value] = [:]
                for (f, r) in zip(Self.fields, roles) where r == .localOnly || r == .both { edits[f.name] = f.local }
                if !edits.isEmpty { try tx.update("tasks", key: 1, FieldValues(edits)) }
            }
            var server: [String: Value] = ["id": 1]
            for (f, r) in zip(Self.fields, roles) where r == .serverOnly || r == .both { server[f.name] = f.server }
            let sync = SyncClient(store: store, policy: .deferred)
            try sync.merge(ServerDelta(anchor: "a1", tables: [TableDelta("tasks", upserts: [ServerRow(server)])]))
            let inConflict = zip(Self.fields, roles).filter { $0.1 == .both }.map(\.0)
            let context = "\(roles.map(\.rawValue)) \(choice)"

            // conflicts() lists exactly the fields changed on both sides, with both values.
            let conflicts = try sync.conflicts()
            guard !inConflict.isEmpty else {
                #expect(conflicts.isEmpty, "\(context)")
                let e = #expect(throws: StrataError.self) { try sync.resolve("tasks", key: 1, with: .server) }
                #expect(e?.code == .invalidOperation)
                return
            }
            #expect(conflicts.count == 1)
            #expect(conflicts.first?.fields == inConflict.map(\.name), "\(context)")
            #expect(conflicts.first?.local == Dictionary(uniqueKeysWithValues: inConflict.map { ($0.name, $0.local) }), "\(context)")
            #expect(conflicts.first?.server == Dictionary(uniqueKeysWithValues: inConflict.map { ($0.name, $0.server) }), "\(context)")
            // Held back while in conflict.
            #expect(try sync.pendingChanges().isEmpty, "\(context)")

            let resolution: SyncClient.Choice = switch choice {
            case .server: .server
            case .local: .local
            case .values: .values(Dictionary(uniqueKeysWithValues: inConflict.map { ($0.name, $0.chosen) }))
            }
            try sync.resolve("tasks", key: 1, with: resolution)

            let row = try #require(try store.read { try $0.row("tasks", key: 1) })
            #expect(!row.isConflicted && row.conflictingFields.isEmpty, "\(context)")
            var changed: [String: Value] = [:]
            var originals: [String: Value] = [:]
            for (f, r) in zip(Self.fields, roles) {
                let e = Self.expected(r, f, choice)
                #expect(row[f.name] == e.current, "\(context): \(f.name) \(row)")
                #expect(row.original(f.name) == e.original, "\(context): \(f.name) original \(row)")
                if e.current != e.original {
                    changed[f.name] = e.current
                    originals[f.name] = e.original
                }
            }
            #expect(try sync.conflicts().isEmpty)
            // The next upload carries exactly the fields still changed here, against the server's values.
            let batch = try sync.nextBatch()
            if changed.isEmpty {
                #expect(batch == nil, "\(context)")
            } else {
                #expect(batch?.changes == [RowChange(table: "tasks", key: 1, kind: .update, values: changed, originals: originals)], "\(context)")
            }
            #expect(try store.verify().isConsistent)
        }
    }

    /// The row-level conflicts under every choice: a row changed here and deleted on the server,
    /// deleted here and changed on the server, inserted on both sides.
    enum RowCase: String, CaseIterable, Sendable { case updatedHereDeletedThere, deletedHereUpdatedThere, insertedOnBoth }

    @Test(arguments: RowCase.allCases, Choice.allCases)
    func rowConflict(_ rowCase: RowCase, choice: Choice) throws {
        try withStore { store in
            try store.write { tx in
                if rowCase == .insertedOnBoth {
                    try tx.insert("tasks", ["id": 1, "title": "L", "priority": 2, "notes": "mine"])
                    return
                }
                try tx.insert("tasks", ["id": 1, "title": "B", "priority": 1, "notes": "b"])
                try tx.acknowledge("tasks", key: 1)
                if rowCase == .updatedHereDeletedThere { try tx.update("tasks", key: 1, ["title": "L"]) }
                if rowCase == .deletedHereUpdatedThere { try tx.delete("tasks", key: 1) }
            }
            let sync = SyncClient(store: store, policy: .deferred)
            let delta: TableDelta = switch rowCase {
            case .updatedHereDeletedThere: TableDelta("tasks", deletes: [1])
            case .deletedHereUpdatedThere: TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "S"])])
            case .insertedOnBoth: TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "S", "priority": 2])])
            }
            try sync.merge(ServerDelta(anchor: "a1", tables: [delta]))
            let conflict = try #require(try sync.conflicts().first)
            // Only the field that differs: title (notes exist only here, priority agrees).
            #expect(conflict.fields == ["title"], "\(rowCase)")
            switch rowCase {
            case .updatedHereDeletedThere: #expect(conflict.local == ["title": "L"] && conflict.server == ["title": .null] && conflict.isDeletedOnServer)
            case .deletedHereUpdatedThere: #expect(conflict.local == ["title": .null] && conflict.server == ["title": "S"] && conflict.isDeletedLocally)
            case .insertedOnBoth: #expect(conflict.local == ["title": "L"] && conflict.server == ["title": "S"])
            }
            let resolution: SyncClient.Choice = switch choice {
            case .server: .server
            case .local: .local
            case .values: .values(["title": "V"])
            }
            try sync.resolve("tasks", key: 1, with: resolution)
            let row = try store.read { try $0.row("tasks", key: 1, includingDeleted: true) }
            let got = row.map { "\($0.status) \($0["title"]) \($0["notes"])" } ?? "gone"
            let expected: String = switch (rowCase, choice) {
            case (.updatedHereDeletedThere, .server): "gone"
            case (.updatedHereDeletedThere, .local): "inserted \"L\" \"b\""
            case (.updatedHereDeletedThere, .values): "inserted \"V\" \"b\""
            case (.deletedHereUpdatedThere, .server): "unchanged \"S\" \"b\""
            case (.deletedHereUpdatedThere, .local): "deleted \"S\" \"b\""
            case (.deletedHereUpdatedThere, .values): "updated \"V\" \"b\""
            // The local-only notes stay pending whatever is chosen for the title.
            case (.insertedOnBoth, .server): "updated \"S\" \"mine\""
            case (.insertedOnBoth, .local): "updated \"L\" \"mine\""
            case (.insertedOnBoth, .values): "updated \"V\" \"mine\""
            }
            #expect(got == expected, "\(rowCase) \(choice)")
            #expect(row?.isConflicted != true)
            #expect(try store.verify().isConsistent)
        }
    }

    @Test func valuesForAFieldNotInConflictAreRefusedAndNothingChanges() throws {
        try withStore { store in
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "B", "priority": 1])
                try tx.acknowledge("tasks", key: 1)
                try tx.update("tasks", key: 1, ["title": "L", "priority": 2])
            }
            let sync = SyncClient(store: store, policy: .deferred)
            try sync.merge(ServerDelta(anchor: "a1", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "S"])])]))
            let before = try observable(store)
            let e = #expect(throws: StrataError.self) { try sync.resolve("tasks", key: 1, with: .values(["title": "V", "priority": 9])) }
            #expect(e?.code == .invalidOperation)
            #expect(e?.message.contains("'priority'") == true && e?.message.contains("title") == true)
            let wrongType = #expect(throws: StrataError.self) { try sync.resolve("tasks", key: 1, with: .values(["title": 5])) }
            #expect(wrongType?.code == .typeMismatch)
            #expect(try observable(store) == before)
        }
    }

    @Test func localEditsAfterTheMergeKeepTheConflict() throws {
        try withStore { store in
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "B", "priority": 1])
                try tx.acknowledge("tasks", key: 1)
                try tx.update("tasks", key: 1, ["title": "L"])
            }
            let sync = SyncClient(store: store, policy: .deferred)
            try sync.merge(ServerDelta(anchor: "a1", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": "S"])])]))
            // Editing the conflicting field again, and another one, keeps the conflict on title only.
            try store.write { tx in
                try tx.update("tasks", key: 1, ["title": "L2", "priority": 5])
                try tx.revert("tasks", key: 1, field: "priority")
                try tx.update("tasks", key: 1, ["priority": 6])
            }
            #expect(try sync.conflicts().map(\.fields) == [["title"]])
            #expect(try sync.conflicts().first?.local == ["title": "L2"])
            // A second delta that leaves title alone keeps it in conflict; the history shows it.
            try sync.merge(ServerDelta(since: "a1", anchor: "a2", tables: [TableDelta("tasks", upserts: [ServerRow(["id": 1, "done": true])])]))
            #expect(try sync.conflicts().map(\.fields) == [["title"]])
            let last = try store.read { try $0.history("tasks", key: 1) }.last!
            #expect(last.isConflicted)
            // A changeset carries the conflict entry (the server's value as the original) and reads back.
            let change = try #require(try store.read { try $0.pendingChangeset("tasks") }.changes().first)
            #expect(change.isConflicted && change.fields.first { $0.field == "title" }.map { "\($0.original) \($0.current)" } == "\"S\" \"L2\"")
            try sync.resolve("tasks", key: 1, with: .server)
            let row = try #require(try store.read { try $0.row("tasks", key: 1) })
            #expect(row["title"] == "S" && row["priority"] == 6 && row["done"] == true && row.original("priority") == 1)
            // Rebuilding from the log gives the same rows, conflict entries included.
            #expect(try store.verify().isConsistent)
        }
    }

    /// Deferred, then resolved, equals the policy that makes the same choice during the merge:
    /// random local states and server changes over four fields, compared field by field
    /// (values, originals, conflict marks, flags) and by the next upload.
    @Test func deferredThenResolvedEqualsTheChoiceUpFront() throws {
        let seed = testSeed("deferredThenResolvedEqualsTheChoiceUpFront")
        var rng = SplitMix64(seed: seed)
        let titles: [Value] = ["B", "L", "S", "T"]
        let notes: [Value] = [.null, "n1", "n2"]
        let priorities: [Value] = [0, 1, 2]
        func draw(_ field: String, _ rng: inout SplitMix64) -> Value {
            switch field {
            case "title": titles[rng.below(titles.count)]
            case "notes": notes[rng.below(notes.count)]
            case "priority": priorities[rng.below(priorities.count)]
            default: .bool(rng.below(2) == 0)
            }
        }
        let names = ["title", "priority", "done", "notes"]
        for round in 0..<150 {
            // The scenario, drawn once and played on two stores.
            let start = rng.below(4)  // 0 synced, 1 synced then updated, 2 inserted here, 3 deleted here
            var base: [String: Value] = ["id": 1]
            for n in names { base[n] = draw(n, &rng) }
            var edits: [String: Value] = [:]
            for n in names where rng.below(2) == 0 { edits[n] = draw(n, &rng) }
            let serverDeletes = rng.below(5) == 0
            var server: [String: Value] = ["id": 1]
            for n in names where rng.below(2) == 0 { server[n] = draw(n, &rng) }
            // A row inserted here has no server copy, so the server's row is new to the device
            // and must carry its required title.
            if start == 2 && server["title"] == nil { server["title"] = draw("title", &rng) }
            let choice = rng.below(3)
            var picks: [String: Value] = [:]
            for n in names where rng.below(2) == 0 { picks[n] = draw(n, &rng) }
            let chosen = picks

            func play(_ policy: ConflictPolicy, resolve: SyncClient.Choice?) throws -> [String] {
                try withStore { store in
                    try store.write { tx in
                        try tx.insert("tasks", FieldValues(base))
                        if start == 2 { return }
                        try tx.acknowledge("tasks", key: 1)
                        if start == 1 && !edits.isEmpty { try tx.update("tasks", key: 1, FieldValues(edits)) }
                        if start == 3 { try tx.delete("tasks", key: 1) }
                    }
                    let sync = SyncClient(store: store, policy: policy)
                    let delta = serverDeletes ? TableDelta("tasks", deletes: [1]) : TableDelta("tasks", upserts: [ServerRow(server)])
                    try sync.merge(ServerDelta(anchor: "a1", tables: [delta]))
                    if var r = resolve, let c = try sync.conflicts().first {
                        if case .values = r { r = .values(chosen.filter { c.fields.contains($0.key) }) }
                        try sync.resolve("tasks", key: 1, with: r)
                    }
                    let row = try store.read { try $0.row("tasks", key: 1, includingDeleted: true) }
                    let state = row.map { r in
                        "\(r.status) conflicted \(r.isConflicted) " + RowState(r).fields.sorted { $0.key < $1.key }
                            .map { "\($0.key)=\($0.value.original)/\($0.value.current)\($0.value.isInConflict ? "!" : "")" }.joined(separator: " ")
                    } ?? "gone"
                    #expect(try store.verify().isConsistent)
                    func sorted(_ d: [String: Value]) -> String { d.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ") }
                    return [state] + (try sync.pendingChanges().map { "\($0.kind) \($0.key) \(sorted($0.values)) / \(sorted($0.originals))" })
                }
            }
            let upFront: ConflictPolicy
            let later: SyncClient.Choice
            switch choice {
            case 0: (upFront, later) = (.serverWins, .server)
            case 1: (upFront, later) = (.clientWins, .local)
            default: (upFront, later) = (.custom { c in .merged(chosen.filter { c.fields.contains($0.key) }) }, .values(chosen))
            }
            let a = try play(.deferred, resolve: later)
            let b = try play(upFront, resolve: nil)
            #expect(a == b, "round \(round) (seed \(seed)): start \(start), edits \(edits), server \(serverDeletes ? "delete" : "\(server)"), choice \(later)")
        }
    }
}

import Foundation
import Strata
import StrataWorkload
import Testing

/// Random rows and random queries; the store's answer must equal a brute-force filter and sort
/// written independently here.
struct QueryFixture {
    static let titles: [Value] = ["a", "b", "B", "é", "", .null]

    static func fill(_ store: Store, _ g: inout SplitMix64, rows: Int = 300) throws {
        try store.createTable(tasksSchema)
        try store.write { tx in
            for i in 0..<rows {
                try tx.insert("tasks", [
                    "id": .int(Int64(i)), "title": titles[Int(g.next() % 5)], "priority": .int(Int64(g.next() % 5)),
                    "done": .bool(g.next() % 2 == 0), "notes": titles[Int(g.next() % 6)],
                    "updated": g.next() % 4 == 0 ? .null : .double(Double(g.next() % 100) / 4),
                ])
            }
        }
    }

    static func randomPredicate(_ g: inout SplitMix64, depth: Int = 0) -> Condition {
        let fields = ["title", "priority", "done", "notes", "updated"]
        let f = fields[Int(g.next() % 5)]
        func v() -> Value {
            switch f {
            case "priority": .int(Int64(g.next() % 5))
            case "done": .bool(g.next() % 2 == 0)
            case "updated": .double(Double(g.next() % 100) / 4)
            default: titles[Int(g.next() % 5)]
            }
        }
        switch g.next() % (depth < 2 ? 12 : 9) {
        case 0: return .equals(f, v())
        case 1: return .notEquals(f, v())
        case 2: return .lessThan(f, v())
        case 3: return .greaterOrEqual(f, v())
        case 4: return .between(f, v(), v())
        case 5: return .isIn(f, [v(), v()])
        case 6: return .isNull(f)
        case 7: return .isNotNull(f)
        case 8: return .lessOrEqual(f, v())
        case 9: return .and([randomPredicate(&g, depth: depth + 1), randomPredicate(&g, depth: depth + 1)])
        case 10: return .or([randomPredicate(&g, depth: depth + 1), randomPredicate(&g, depth: depth + 1)])
        default: return .not(randomPredicate(&g, depth: depth + 1))
        }
    }

    /// The reference: compare by the query's order, written without Strata's helpers.
    static func bruteForce(_ all: [Row], _ q: Query) -> [Row] {
        func rank(_ v: Value) -> Double {
            switch v {
            case .null: -1e300
            case .bool(let b): b ? -1e299 : -2e299
            case .int(let i): Double(i)
            case .double(let d): d
            default: 1e300
            }
        }
        func less(_ a: Value, _ b: Value) -> Bool {
            if case .string(let x) = a, case .string(let y) = b { return Array(x.utf8).lexicographicallyPrecedes(Array(y.utf8)) }
            if case .string = a { return false }
            if case .string = b { return !(a.isNull || a.boolValue != nil || a.doubleValue != nil) ? false : true }
            return rank(a) < rank(b)
        }
        let matching = all.filter { q.filter?.matches($0) ?? true }
        let sorted = matching.enumerated().sorted { x, y in
            for s in q.orderBy {
                let (a, b) = (x.element[s.field], y.element[s.field])
                if a == b || (a.doubleValue != nil && a.doubleValue == b.doubleValue) { continue }
                return s.descending ? less(b, a) : less(a, b)
            }
            return x.offset < y.offset  // rows come in key order
        }.map(\.element)
        return Array(sorted.prefix(q.limit ?? .max))
    }

    static func randomQuery(_ g: inout SplitMix64) -> Query {
        let sorts: [[Query.SortKey]] = [[], [.ascending("priority")], [.descending("title")], [.ascending("done"), .descending("updated")], [.ascending("notes")]]
        return Query("tasks", where: g.next() % 5 == 0 ? nil : randomPredicate(&g), orderBy: sorts[Int(g.next() % 5)], limit: g.next() % 3 == 0 ? Int(g.next() % 40) : nil)
    }
}

@Suite struct QueryTests {
    @Test func queriesEqualABruteForceFilterAndSort() throws {
        let seed = testSeed("queriesEqualABruteForce")
        var g = SplitMix64(seed: seed)
        try withStore { store, _ in
            try QueryFixture.fill(store, &g)
            let all = try store.read { try $0.rows("tasks") }
            for i in 0..<300 {
                let q = QueryFixture.randomQuery(&g)
                let got = try store.read { try $0.rows(q) }
                #expect(got.map(\.key) == QueryFixture.bruteForce(all, q).map(\.key), "query \(i): \(q)")
                #expect(try store.read { try $0.count(q) } == all.filter { q.filter?.matches($0) ?? true }.count)
            }
        }
    }

    @Test func pagesConcatenatedEqualTheWholeResult() throws {
        let seed = testSeed("pagesConcatenated")
        var g = SplitMix64(seed: seed)
        try withStore { store, _ in
            try QueryFixture.fill(store, &g)
            for _ in 0..<40 {
                var q = QueryFixture.randomQuery(&g)
                q.limit = nil
                let whole = try store.read { try $0.rows(q) }.map(\.key)
                var paged: [RowKey] = []
                var token: PageToken? = nil
                repeat {
                    let page = try store.read { try $0.page(q, size: 1 + Int(g.next() % 17), after: token) }
                    paged += page.rows.map(\.key)
                    token = page.next
                } while token != nil
                #expect(paged == whole, "\(q)")
            }
        }
    }

    @Test func writesBetweenPagesNeitherRepeatNorSkipStableRows() throws {
        let seed = testSeed("writesBetweenPages")
        var g = SplitMix64(seed: seed)
        try withStore { store, _ in
            try QueryFixture.fill(store, &g)
            let q = Query("tasks", orderBy: [.ascending("priority")])
            var seen: [RowKey] = []
            var touched = Set<RowKey>()
            var token: PageToken? = nil
            var next = 1000
            repeat {
                let page = try store.read { try $0.page(q, size: 25, after: token) }
                seen += page.rows.map(\.key)
                token = page.next
                // Between pages: insert new rows, delete some, and move some in the order.
                try store.write { tx in
                    for _ in 0..<3 {
                        let k = RowKey(.int(Int64(next)))
                        try tx.insert("tasks", ["id": k.values[0], "title": "new", "priority": .int(Int64(g.next() % 5))])
                        touched.insert(k)
                        next += 1
                        let victim = RowKey(.int(Int64(g.next() % 300)))
                        if (try? tx.delete("tasks", key: victim)) != nil { touched.insert(victim) }
                        let moved = RowKey(.int(Int64(g.next() % 300)))
                        if (try? tx.update("tasks", key: moved, ["priority": .int(Int64(g.next() % 5))])) != nil { touched.insert(moved) }
                    }
                }
            } while token != nil
            // A row moved in the order between pages may show up on both sides of the token; a row
            // untouched throughout shows up exactly once.
            let repeated = Dictionary(grouping: seen, by: { $0 }).filter { $0.value.count > 1 }.keys
            #expect(repeated.allSatisfy { touched.contains($0) }, "an untouched row was listed twice")
            let stable = try store.read { try $0.rows(q) }.map(\.key).filter { !touched.contains($0) }
            #expect(Set(stable).isSubset(of: Set(seen)), "a row present throughout was skipped")
        }
    }

    /// Paging along an index (one ascending sort field an index starts with): pages seek to the
    /// token in the index; concatenated they equal the whole result, also across runs of equal
    /// and of long (prefix-indexed) values, and with writes between pages.
    @Test func pagesAlongAnIndexEqualTheWholeResult() throws {
        let seed = testSeed("pagesAlongAnIndex")
        var g = SplitMix64(seed: seed)
        try withStore { store, _ in
            try QueryFixture.fill(store, &g)
            try store.write { tx in
                for i in 0..<40 {
                    let long = String(repeating: "long", count: 80) + "\(g.next() % 3)"
                    try tx.insert("tasks", ["id": .int(Int64(500 + i)), "title": .string(long), "priority": .int(Int64(g.next() % 5)), "notes": g.next() % 2 == 0 ? .null : .string(long)])
                }
            }
            for f in ["priority", "title", "notes", "updated"] { try store.createIndex("by_\(f)", on: "tasks", fields: [f, "done"]) }
            var alongIndex = 0
            for i in 0..<60 {
                let field = ["priority", "title", "notes", "updated"][Int(g.next() % 4)]
                let filter: Condition? = g.next() % 2 == 0 ? nil : .not(.equals("done", .bool(g.next() % 2 == 0)))
                let q = Query("tasks", where: filter, orderBy: [.ascending(field)])
                let plan = try store.read { try $0.explain(q) }
                #expect(plan == "index by_\(field) in order", "\(q)")
                if plan.hasSuffix("in order") { alongIndex += 1 }
                let whole = try store.read { try $0.rows(q) }.map(\.key)
                var paged: [RowKey] = []
                var token: PageToken? = nil
                repeat {
                    let page = try store.read { try $0.page(q, size: 1 + Int(g.next() % 17), after: token) }
                    #expect(!page.rows.isEmpty || token == nil, "an empty page before the end")
                    paged += page.rows.map(\.key)
                    token = page.next
                } while token != nil
                #expect(paged == whole, "query \(i): \(q)")
            }
            #expect(alongIndex == 60)

            // Writes between pages: an untouched row is listed exactly once, none is skipped.
            let q = Query("tasks", orderBy: [.ascending("priority")])
            var seen: [RowKey] = []
            var touched = Set<RowKey>()
            var token: PageToken? = nil
            var next = 2000
            repeat {
                let page = try store.read { try $0.page(q, size: 25, after: token) }
                seen += page.rows.map(\.key)
                token = page.next
                try store.write { tx in
                    for _ in 0..<3 {
                        let k = RowKey(.int(Int64(next)))
                        try tx.insert("tasks", ["id": k.values[0], "title": "new", "priority": .int(Int64(g.next() % 5))])
                        touched.insert(k)
                        next += 1
                        let victim = RowKey(.int(Int64(g.next() % 300)))
                        if (try? tx.delete("tasks", key: victim)) != nil { touched.insert(victim) }
                        let moved = RowKey(.int(Int64(g.next() % 300)))
                        if (try? tx.update("tasks", key: moved, ["priority": .int(Int64(g.next() % 5))])) != nil { touched.insert(moved) }
                    }
                }
            } while token != nil
            let repeated = Dictionary(grouping: seen, by: { $0 }).filter { $0.value.count > 1 }.keys
            #expect(repeated.allSatisfy { touched.contains($0) }, "an untouched row was listed twice")
            let stable = try store.read { try $0.rows(q) }.map(\.key).filter { !touched.contains($0) }
            #expect(Set(stable).isSubset(of: Set(seen)), "a row present throughout was skipped")
            // A sort no index gives says so.
            #expect(try store.read { try $0.explain(Query("tasks", orderBy: [.descending("priority")])) }.hasSuffix("each page sorts the whole result)"))
        }
    }

    @Test func queriesNamingUnknownFieldsAreErrors() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let e = #expect(throws: StrataError.self) { try store.read { try $0.rows(Query("tasks", where: .equals("colour", "red"))) } }
            #expect(e?.code == .fieldNotFound && e?.message.contains("colour") == true)
        }
    }
}

@Suite struct RecordTests {
    struct Task: Codable, Equatable {
        var id: Int64
        var title: String
        var priority: Int
        var done: Bool
        var notes: String?
        var updated: Double?
    }

    struct Attachment: Codable, Equatable {
        var name: String
        var data: Data
        var created: Date
    }

    @Test func recordsRoundTripThroughRows() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.createTable(.fixed("files", primaryKey: ["name"], fields: [.string("name"), .bytes("data"), .timestamp("created")]))
            let task = Task(id: 7, title: "Buy milk", priority: 2, done: false, notes: nil, updated: 3)
            let file = Attachment(name: "a.txt", data: Data([0, 1, 2, 255]), created: Date(timeIntervalSince1970: 1_763_700_000.25))
            try store.write { tx in
                try tx.insert(task, into: "tasks")
                try tx.insert(file, into: "files")
            }
            #expect(try store.read { try $0.record(Task.self, from: "tasks", key: 7) } == task)
            #expect(try store.read { try $0.record(Attachment.self, from: "files", key: "a.txt") } == file)
            let row = try #require(try store.read { try $0.row("files", key: "a.txt") })
            #expect(row["data"] == .bytes([0, 1, 2, 255]) && row["created"].dateValue == file.created)
            var changed = task
            changed.done = true
            try store.write { try $0.upsert(changed, into: "tasks") }
            #expect(try store.read { try $0.records(Task.self, Query("tasks", where: .equals("done", true))) } == [changed])
        }
    }

    @Test func aRowThatDoesNotFitIsAClearError() throws {
        struct Wrong: Codable { var id: Int64; var title: Int }
        struct Missing: Codable { var id: Int64; var colour: String }
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { try $0.insert("tasks", ["id": 1, "title": "text"]) }
            let e1 = #expect(throws: StrataError.self) { try store.read { try $0.record(Wrong.self, from: "tasks", key: 1) } }
            #expect(e1?.code == .typeMismatch && e1?.message.contains("title") == true, "\(e1?.message ?? "-")")
            let e2 = #expect(throws: StrataError.self) { try store.read { try $0.record(Missing.self, from: "tasks", key: 1) } }
            #expect(e2?.message.contains("colour") == true, "\(e2?.message ?? "-")")
            struct Nested: Codable { var id: Int64; var title: [String] }
            let e3 = #expect(throws: StrataError.self) { try store.write { try $0.insert(Nested(id: 2, title: ["a"]), into: "tasks") } }
            #expect(e3?.code == .typeMismatch)
        }
    }
}

@Suite struct IndexTests {
    @Test func indexedQueriesEqualTheBruteForceAndUseTheIndex() throws {
        let seed = testSeed("indexedQueries")
        var g = SplitMix64(seed: seed)
        try withStore { store, _ in
            try QueryFixture.fill(store, &g)
            try store.createIndex("by_priority", on: "tasks", fields: ["priority", "title"])
            try store.createIndex("by_title", on: "tasks", fields: ["title"])
            try store.createIndex("by_updated", on: "tasks", fields: ["updated"])
            // Edits after the index exists are indexed in the same transaction.
            try store.write { tx in
                for i in 0..<60 {
                    let key = RowKey(.int(Int64(g.next() % 300)))
                    switch g.next() % 3 {
                    case 0: try? tx.update("tasks", key: key, ["priority": .int(Int64(g.next() % 5)), "title": QueryFixture.titles[Int(g.next() % 5)]])
                    case 1: try? tx.delete("tasks", key: key)
                    // Titles longer than an index key holds: indexed by a prefix, re-checked in full.
                    default: try? tx.insert("tasks", ["id": .int(Int64(1000 + i)), "title": .string(String(repeating: "long", count: 80) + "\(g.next() % 3)"), "priority": 2])
                    }
                }
            }
            let all = try store.read { try $0.rows("tasks") }
            var used = 0
            for i in 0..<400 {
                var q = QueryFixture.randomQuery(&g)
                if i % 3 == 0 { q.filter = .and([.between("priority", .int(Int64(g.next() % 3)), .int(Int64(2 + g.next() % 3))), q.filter ?? .isNotNull("id")]) }
                if i % 4 == 0 { q.orderBy = [.ascending(["priority", "title", "updated"][Int(g.next() % 3)])] }
                let plan = try store.read { try $0.explain(q) }
                if !plan.hasPrefix("scan") { used += 1 }
                let got = try store.read { try $0.rows(q) }
                #expect(got.map(\.key) == QueryFixture.bruteForce(all, q).map(\.key), "query \(i) [\(plan)]: \(q)")
            }
            #expect(used > 150, "the indexes were hardly used")
            #expect(try store.read { try $0.explain(Query("tasks", where: .equals("title", "a"))) } == "index by_title ranges (1)")
            #expect(try store.read { try $0.explain(Query("tasks", orderBy: [.ascending("updated")])) } == "index by_updated in order")
            #expect(try store.verify().isConsistent)
            try store.rebuild()
            #expect(try store.verify().isConsistent)
            #expect(try store.read { try $0.rows(Query("tasks", where: .equals("title", "a"))) }.map(\.key) == all.filter { $0["title"] == "a" }.map(\.key))
        }
    }

    @Test func aUniqueIndexIsAnAlternateIdAndRefusesDuplicates() throws {
        try withStore { store, _ in
            try store.createTable(.fixed("users", fields: [.int("id"), .string("clientID", nullable: true), .string("name")]))
            try store.write { tx in
                try tx.insert("users", ["id": 1, "clientID": "c-1", "name": "Ann"])
                try tx.insert("users", ["id": 2, "clientID": nil, "name": "Bob"])
                try tx.insert("users", ["id": 3, "clientID": nil, "name": "Cy"])  // nulls never collide
            }
            try store.createIndex("by_client", on: "users", fields: ["clientID"], unique: true)
            #expect(try store.read { try $0.row("users", where: "clientID", equals: "c-1") }?["name"] == "Ann")
            #expect(try store.read { try $0.row("users", where: "clientID", equals: "nope") } == nil)
            let before = try store.read { try $0.lastLSN }
            let e = #expect(throws: StrataError.self) { try store.write { try $0.update("users", key: 2, ["clientID": "c-1"]) } }
            #expect(e?.code == .duplicateKey && e?.message.contains("by_client") == true)
            // Caught inside a transaction, the refused edit leaves nothing behind.
            try store.write { tx in
                #expect(throws: StrataError.self) { try tx.insert("users", ["id": 4, "clientID": "c-1", "name": "Dup"]) }
                try tx.update("users", key: 1, ["clientID": "c-9"])
                try tx.update("users", key: 2, ["clientID": "c-1"])  // now free
            }
            #expect(try store.read { try $0.lastLSN } == before + 2)
            #expect(try store.read { try $0.row("users", where: "clientID", equals: "c-1") }?.key == 2)
            #expect(try store.verify().isConsistent)
            try store.write { try $0.insert("users", ["id": 5, "clientID": "c-5", "name": "Eve"]) }
            try store.createIndex("by_client_name", on: "users", fields: ["clientID", "name"], unique: true)
            let dup = #expect(throws: StrataError.self) { try store.write { try $0.insert("users", ["id": 6, "clientID": "c-5", "name": "Eve"]) } }
            #expect(dup?.code == .duplicateKey)
            // A unique index over rows that already repeat a value cannot be declared.
            try store.write { try $0.insert("users", ["id": 7, "clientID": "x", "name": "Ann"]) }
            let repeated = #expect(throws: StrataError.self) { try store.createIndex("names", on: "users", fields: ["name"], unique: true) }
            #expect(repeated?.code == .duplicateKey && repeated?.message.contains("Ann") == true)
            #expect(try store.read { try $0.indexes("users").map(\.name) } == ["by_client", "by_client_name"])
        }
    }
}

@Suite struct NamedViewTests {
    @Test func viewsStayEqualToTheirQueryThroughEditsAndRebuild() throws {
        let seed = testSeed("viewsStayEqual")
        var g = SplitMix64(seed: seed)
        try withStore { store, _ in
            try QueryFixture.fill(store, &g, rows: 120)
            let definitions: [(String, Query)] = [
                ("open", Query("tasks", where: .equals("done", false), orderBy: [.ascending("priority"), .descending("title")])),
                ("recent", Query("tasks", where: .isNotNull("updated"), orderBy: [.descending("updated")])),
                ("everything", Query("tasks")),
                ("by title", Query("tasks", where: .or([.lessThan("priority", 2), .isNull("notes")]), orderBy: [.ascending("title")])),
            ]
            for (name, q) in definitions { try store.createView(name, q) }
            func check(_ context: String) throws {
                for (name, q) in definitions {
                    let view = try store.read { try $0.rows(view: name) }.map(\.key)
                    let fresh = try store.read { try $0.rows(q) }.map(\.key)
                    #expect(view == fresh, "\(context): view '\(name)'")
                    var paged: [RowKey] = []
                    var token: PageToken? = nil
                    repeat {
                        let page = try store.read { try $0.page(view: name, size: 1 + Int(g.next() % 13), after: token) }
                        paged += page.rows.map(\.key)
                        token = page.next
                    } while token != nil
                    #expect(paged == fresh, "\(context): pages of view '\(name)'")
                }
            }
            try check("after definition")
            for round in 0..<12 {
                try store.write { tx in
                    for i in 0..<15 {
                        let key = RowKey(.int(Int64(g.next() % 140)))
                        switch g.next() % 5 {
                        case 0: try? tx.insert("tasks", ["id": key.values[0], "title": .string(String(repeating: "x", count: 210) + "\(g.next() % 3)"), "priority": .int(Int64(g.next() % 5))])
                        case 1: try? tx.update("tasks", key: key, ["done": .bool(g.next() % 2 == 0), "priority": .int(Int64(g.next() % 5))])
                        case 2: try? tx.update("tasks", key: key, ["updated": g.next() % 3 == 0 ? .null : .double(Double(i)), "notes": QueryFixture.titles[Int(g.next() % 6)]])
                        case 3: try? tx.delete("tasks", key: key)
                        default: try? tx.acknowledge("tasks", key: key)
                        }
                    }
                }
                try check("after round \(round)")
            }
            #expect(try store.verify().isConsistent)
            try store.rebuild()
            try check("after rebuild")
            #expect(try store.read { try $0.namedViews.map(\.name) } == definitions.map(\.0))
        }
    }

    @Test func badViewDefinitionsAreRefused() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.createView("open", Query("tasks", where: .equals("done", false)))
            try store.createView("open", Query("tasks", where: .equals("done", false)))  // identical: nothing happens
            let other = #expect(throws: StrataError.self) { try store.createView("open", Query("tasks")) }
            #expect(other?.code == .invalidSchema)
            let limited = #expect(throws: StrataError.self) { try store.createView("top", Query("tasks", limit: 5)) }
            #expect(limited?.code == .invalidSchema)
            let unknown = #expect(throws: StrataError.self) { try store.createView("bad", Query("tasks", orderBy: [.ascending("colour")])) }
            #expect(unknown?.code == .fieldNotFound)
            #expect(throws: StrataError.self) { try store.read { try $0.page(view: "nope", size: 5) } }
        }
    }
}

@Suite struct RefusedBagEditTests {
    /// A property-bag edit refused by a unique index leaves no new field name behind, even when
    /// the transaction goes on and commits.
    @Test func aRefusedEditAddsNoFieldToTheCatalog() throws {
        try withStore { store, _ in
            try store.createTable(.propertyBag("people", key: [.string("id")]))
            try store.write { try $0.insert("people", ["id": "a", "email": "x@y"]) }
            try store.createIndex("by_email", on: "people", fields: ["email"], unique: true)
            _ = try store.write { tx in
                #expect(throws: StrataError.self) { try tx.insert("people", ["id": "b", "email": "x@y", "nickname": "bee"]) }
            }
            #expect(try store.read { try $0.fieldNames("people") } == ["id", "email"])
        }
    }
}

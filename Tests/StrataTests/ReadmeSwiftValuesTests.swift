import Foundation
import Strata
import StrataWorkload
import Testing

/// A fresh folder for an `async` test, removed afterwards.
private func withTemporaryFolder<R>(_ body: (String) async throws -> R) async throws -> R {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-test-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try await body(path)
}

/// Written as an app would be: variables of Swift types in, typed values out, in `async` code.
/// The first test is the "same in an app" sample of docs/getting-started.md, verbatim apart from the folder.
@Suite struct ReadmeSwiftValuesTests {
    @Test func swiftValuesInAnAsyncFunction() async throws {
        try await withTemporaryFolder { folder in
            let store = try Store(path: folder)
            // --- sample swift values begins ---
            try store.createTable(.fixed("todos", primaryKey: ["id"], fields: [
                .string("id"), .string("title"), .timestamp("due", nullable: true), .int("priority"),
                .int("minutes"), .int("colour"), .double("estimate"), .bool("done", default: false),
                .bytes("photo", nullable: true), .string("notes", nullable: true),
            ]))

            let id = UUID(), title = "Buy milk", due = Date.now.addingTimeInterval(86_400), priority = 2
            let minutes: Int32 = 15, colour: UInt8 = 3, estimate = 0.5, photo = Data([0xFF, 0xD8])
            let notes: String? = nil

            try await store.write { tx in
                try tx.insert("todos", ["id": id, "title": title, "due": due, "priority": priority, "minutes": minutes,
                                        "colour": colour, "estimate": estimate, "photo": photo, "notes": notes])
            }
            try await store.write { tx in
                for row in try tx.snapshot.pendingRows("todos") { try tx.acknowledge("todos", key: row.key) }
            }
            let newTitle = "Buy oat milk", done = true
            try await store.write { tx in try tx.update("todos", key: id, ["title": newTitle, "done": done]) }

            let todo = try await store.read { try $0.row("todos", key: id) }!
            let current = try todo["title", as: String.self]          // "Buy oat milk"
            let original = try todo.original("title", as: String.self) // "Buy milk"
            let when = try todo["due", as: Date?.self]                 // `due`, to a quarter of a microsecond
            let small = try todo["colour", as: UInt8.self]             // 3
            let none = try todo["notes", as: String?.self]             // nil: the field is null
            do {
                _ = try todo["title", as: Int.self]
            } catch {
                print(error.localizedDescription)  // field 'title' of row "…" in table 'todos' holds string "Buy oat milk", which does not read as Int
            }

            try await store.write { try $0.revert("todos", key: id, field: "title") }
            let changes = try await store.read { try $0.history("todos", key: id) }   // insert, acknowledge, update, revertField
            // --- sample swift values ends ---

            #expect(current == newTitle && original == title && small == colour && none == nil)
            #expect(when == Date(timeIntervalSince1970: due.timeIntervalSince1970))
            #expect(abs(when!.timeIntervalSince(due)) < 1e-6)
            #expect(changes.map(\.kind) == [.insert, .acknowledge, .update, .revertField])
            // Every other field reads back as the variable written.
            #expect(try todo["id", as: UUID.self] == id)
            #expect(try todo["priority", as: Int.self] == priority)
            #expect(try todo["minutes", as: Int32.self] == minutes)
            #expect(try todo["estimate", as: Double.self] == estimate)
            #expect(try todo["done", as: Bool.self] == done && todo.original("done", as: Bool.self) == false)
            #expect(try todo["photo", as: Data?.self] == photo)
            // The key is the UUID's lowercase text, whichever way it is given.
            #expect(todo.key == RowKey(.string(id.uuidString.lowercased())) && todo.key == RowKey(id))
            #expect(todo.id == Row.ID(table: "todos", key: RowKey(id)))
            let e = #expect(throws: StrataError.self) { try todo["title", as: Int.self] }
            #expect(e?.code == .typeMismatch)
            #expect(e?.message == "field 'title' of row \"\(id.uuidString.lowercased())\" in table 'todos' holds string \"Buy oat milk\", which does not read as Int")
            #expect(e?.localizedDescription == e?.message)
            let after = try await store.read { try $0.row("todos", key: id) }!
            #expect(try after["title", as: String.self] == title && after.id == todo.id)
        }
    }
}

/// Every supported Swift type, written from a variable and read back typed, across its range.
@Suite struct SwiftValuesTests {
    /// A property bag, so that any field takes any type.
    private func withBag<R>(_ body: (Store) throws -> R) throws -> R {
        try withStore { store, _ in
            try store.createTable(.propertyBag("bag", key: [.string("name")]))
            return try body(store)
        }
    }

    /// Writes `value` under a fresh row and reads it back as `T`, from the row and as a key.
    private func roundTrip<T: ValueConvertible & Equatable>(_ value: T, _ store: Store, _ n: Int) throws -> (T, T) {
        let name = "row \(n)"
        try store.write { tx in try tx.insert("bag", ["name": name, "v": value]) }
        let row = try #require(try store.read { try $0.row("bag", key: name) })
        return (try row["v", as: T.self], try row["v", as: T?.self]!)
    }

    @Test func everyTypeRoundTrips() throws {
        let seed = testSeed("SwiftValuesTests.everyTypeRoundTrips")
        var rng = SplitMix64(seed: seed)
        try withBag { store in
            var n = 0
            func check<T: ValueConvertible & Equatable>(_ values: [T]) throws {
                for v in values {
                    n += 1
                    let (read, readOptional) = try roundTrip(v, store, n)
                    #expect(read == v && readOptional == v, "\(T.self) \(v) read back as \(read) (seed \(seed))")
                }
            }
            func ints<I: FixedWidthInteger & ValueConvertible>(_: I.Type) throws {
                try check([I.min, I.max, 0, 1, I.random(in: I.min...I.max, using: &rng), I.random(in: I.min...I.max, using: &rng)])
            }
            try ints(Int.self); try ints(Int8.self); try ints(Int16.self); try ints(Int32.self); try ints(Int64.self)
            try ints(UInt8.self); try ints(UInt16.self); try ints(UInt32.self)
            try check([0.0, -0.0, 1.5, -.greatestFiniteMagnitude, .leastNonzeroMagnitude, Double.random(in: -1e300...1e300, using: &rng)])
            try check([true, false])
            try check(["", "Buy milk", "é", "e\u{301}", "a\u{0}b", String(repeating: "x", count: 5_000)])
            try check([Data(), Data([0]), Data((0..<300).map { _ in UInt8.random(in: 0...255, using: &rng) })])
            try check([UUID(), UUID(), UUID(uuidString: "00000000-0000-0000-0000-000000000000")!])
            try check([Value.int(3), .string("v"), .timestamp(Date(timeIntervalSince1970: 0))])
            // These dates are whole numbers of seconds or quarter seconds both since 1970 and since
            // 2001, so they come back equal; any date comes back as its seconds since 1970.
            try check([Date(timeIntervalSince1970: 0), Date(timeIntervalSince1970: -1e9), Date(timeIntervalSince1970: 1_700_000_000.25), .distantFuture])
            for _ in 0..<20 {
                n += 1
                let d = Date(timeIntervalSinceReferenceDate: Double.random(in: 0...1e9, using: &rng))
                let (read, _) = try roundTrip(d, store, n)
                #expect(read == Date(timeIntervalSince1970: d.timeIntervalSince1970) && abs(read.timeIntervalSince(d)) < 1e-6, "\(d) (seed \(seed))")
            }
            // Optionals: nil is stored as null, a value as itself.
            let some: Int32? = 7, absent: Date? = nil, absentID: UUID? = nil
            try store.write { tx in try tx.insert("bag", ["name": "optionals", "some": some, "absent": absent, "id": absentID, "literal": nil]) }
            let row = try #require(try store.read { try $0.row("bag", key: "optionals") })
            #expect(row["some"] == .int(7) && row["absent"] == .null && row["id"] == .null && row["literal"] == .null)
            #expect(try row["some", as: Int32?.self] == 7 && row["absent", as: Date?.self] == nil && row["id", as: UUID?.self] == nil)
        }
    }

    @Test func valuesAreStoredAsDocumented() throws {
        let id = UUID(), date = Date(timeIntervalSince1970: 1_700_000_000.25), bytes = Data([1, 2])
        #expect(Value(id) == .string(id.uuidString.lowercased()))
        #expect(Value(date) == .timestamp(date) && Value(bytes) == .bytes([1, 2]))
        #expect(Value(Int32(-5)) == .int(-5) && Value(UInt8(200)) == .int(200) && Value(UInt32.max) == .int(4_294_967_295))
        #expect(Value(2.5) == .double(2.5) && Value(true) == .bool(true) && Value(nil as String?) == .null)
        #expect(FieldValues(["a": id, "b": Int16(3), "c": nil]).pairs.map(\.value) == [Value(id), .int(3), .null])
        // An int is an Int64: the unsigned types whose range is wider are left out.
        #expect(!((UInt64(1) as Any) is any ValueConvertible) && !((UInt(1) as Any) is any ValueConvertible))
        #expect((UInt32(1) as Any) is any ValueConvertible)
        // Reading: uppercase UUID text, and a double field holding an int a Double holds exactly.
        #expect(UUID(strataValue: .string(id.uuidString)) == id)
        #expect(Double(strataValue: .int(3)) == 3 && Double(strataValue: .int(Int64.max - 1)) == nil)
    }

    @Test func keysFromVariables() throws {
        try withStore { store, _ in
            try store.createTable(.fixed("notes", primaryKey: ["id"], fields: [.string("id"), .string("text")]))
            try store.createTable(.fixed("counts", primaryKey: ["n"], fields: [.int("n"), .int("c", default: 0)]))
            let id = UUID(), name = "a note", n: Int32 = 12, text = "hello"
            try store.write { tx in
                try tx.insert("notes", ["id": id, "text": text])
                try tx.insert("notes", ["id": name, "text": text])
                try tx.insert("counts", ["n": n])
            }
            try store.write { tx in
                for row in try tx.snapshot.pendingRows() { try tx.acknowledge(row.table, key: row.key) }
                try tx.update("notes", key: id, ["text": "changed"])
                try tx.update("notes", key: name, ["text": text + "!"])
                try tx.update("counts", key: n, ["c": 1])
                try tx.update("counts", key: Int(n), ["c": Int64(2)])
            }
            #expect(try store.read { try $0.row("notes", key: id) }?["text"] == "changed")
            #expect(try store.read { try $0.row("notes", key: name) }?["text"] == "hello!")
            #expect(try store.read { try $0.row("counts", key: n) }?["c"] == 2)
            #expect(try store.read { try $0.history("notes", key: id) }.map(\.kind) == [.insert, .acknowledge, .update])
            try store.write { tx in
                try tx.revert("notes", key: id, field: "text")
                try tx.revert("notes", key: name)
                try tx.delete("counts", key: n)
                try tx.acknowledge("counts", key: n)
            }
            #expect(try store.read { try $0.row("notes", key: id) }?["text"] == "hello")
            #expect(try store.read { try $0.row("notes", key: name) }?.status == .unchanged)
            #expect(try store.read { try $0.row("counts", key: n) } == nil)
            // The same UUID given as Foundation's uppercase text is another key.
            #expect(try store.read { try $0.row("notes", key: id.uuidString) } == nil)
        }
    }

    @Test func wrongReadsSayWhatWasWrong() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in try tx.insert("tasks", ["id": 300, "title": "not a UUID"]) }
            let row = try #require(try store.read { try $0.row("tasks", key: 300) })
            func error<T: ValueConvertible>(_ field: String, _ type: T.Type) -> StrataError? {
                #expect(throws: StrataError.self) { try row[field, as: T.self] }
            }
            let range = error("id", UInt8.self)
            #expect(range?.code == .typeMismatch)
            #expect(range?.message == "field 'id' of row 300 in table 'tasks' holds int 300, which does not read as UInt8")
            #expect(error("title", UUID.self)?.message == "field 'title' of row 300 in table 'tasks' holds string \"not a UUID\", which does not read as UUID")
            #expect(error("title", Int?.self)?.message == "field 'title' of row 300 in table 'tasks' holds string \"not a UUID\", which does not read as Int?")
            let null = error("notes", String.self)
            #expect(null?.code == .typeMismatch)
            #expect(null?.message == "field 'notes' of row 300 in table 'tasks' holds null, which does not read as String; read it as String? to get nil")
            let missing = error("titel", String.self)
            #expect(missing?.code == .fieldNotFound && missing!.message.contains("has no field 'titel'"))
            #expect(try row["titel", as: String?.self] == nil && row["notes", as: String?.self] == nil)
            let original = #expect(throws: StrataError.self) { try row.original("title", as: Bool.self) }
            #expect(original?.message == "the original of field 'title' of row 300 in table 'tasks' holds null, which does not read as Bool; read it as Bool? to get nil")
            // A long value is cut in the message.
            try store.write { tx in try tx.update("tasks", key: 300, ["title": String(repeating: "y", count: 1_000)]) }
            let long = try #require(try store.read { try $0.row("tasks", key: 300) })
            let cut = #expect(throws: StrataError.self) { try long["title", as: Bool.self] }
            #expect(cut.map { $0.message.count < 200 && $0.message.contains("…") } == true)
        }
    }

    @Test func badValuesFromVariablesLeaveTheStoreAsItWas() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            let title = "kept", wrong = 5, notFinite = Double.nan
            try store.write { tx in try tx.insert("tasks", ["id": 1, "title": title]) }
            let before = try store.read { try $0.operations() }
            let mismatch = #expect(throws: StrataError.self) { try store.write { tx in try tx.update("tasks", key: 1, ["title": wrong]) } }
            #expect(mismatch?.code == .typeMismatch)
            let nan = #expect(throws: StrataError.self) { try store.write { tx in try tx.update("tasks", key: 1, ["updated": notFinite]) } }
            #expect(nan?.code == .invalidValue)
            let keyType = #expect(throws: StrataError.self) { try store.write { tx in try tx.delete("tasks", key: title) } }
            #expect(keyType?.code == .typeMismatch)
            #expect(try store.read { try $0.operations() }.map(\.lsn) == before.map(\.lsn))
            #expect(try store.read { try $0.row("tasks", key: 1) }?["title"] == "kept")
        }
    }

    @Test func rowsAreIdentifiableByTableAndKey() throws {
        try withStore { store, _ in
            try store.createTable(tasksSchema)
            try store.createTable(.fixed("other", fields: [.int("id")]))
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "a"])
                try tx.insert("tasks", ["id": 2, "title": "b"])
                try tx.insert("other", ["id": 1])
            }
            let first = try #require(try store.read { try $0.row("tasks", key: 1) })
            try store.write { tx in try tx.update("tasks", key: 1, ["title": "a2"]) }
            let edited = try #require(try store.read { try $0.row("tasks", key: 1) })
            let ids = try store.read { s in try s.rows("tasks").map(\.id) + s.rows("other").map(\.id) }
            #expect(first != edited && first.id == edited.id)
            #expect(Set(ids).count == 3 && ids.first == Row.ID(table: "tasks", key: 1))
            #expect(edited.id.description == "tasks 1")
        }
    }
}

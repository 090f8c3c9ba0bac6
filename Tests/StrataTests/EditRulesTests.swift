import Strata
import Testing

/// Every state a row can be in, crossed with every edit of one field (`title`), against a written
/// table of expected outcomes. "S" is the server's value, "L" a local value, "O" another value.
@Suite struct EditRulesTests {
    enum Setup: String, CaseIterable, Sendable {
        /// Inserted locally with title L, never acknowledged.
        case inserted
        /// Known to the server with title S, unchanged.
        case synced
        /// Known to the server with title S, changed locally to L.
        case dirty
        /// Known to the server with title S, deleted locally.
        case deleted
    }

    enum Edit: String, CaseIterable, Sendable {
        case updateToL, updateToS, updateToO, revertField, revertRow, delete, acknowledge, insertO, insertS
    }

    /// The expected row afterwards (`nil`: no row at all), or the expected error.
    struct Expected: Sendable, CustomStringConvertible {
        var error: StrataError.Code? = nil
        var gone = false
        var status: Row.Status = .unchanged
        var current: Value = .null
        var original: Value = .null
        /// Whether an operation is appended to the log.
        var logged = true
        var description: String { error.map { "error \($0)" } ?? (gone ? "gone" : "\(status) \(current)/\(original)") }
    }

    static func row(_ s: Row.Status, _ current: Value, _ original: Value, logged: Bool = true) -> Expected {
        Expected(status: s, current: current, original: original, logged: logged)
    }
    static let gone = Expected(gone: true)
    static func error(_ code: StrataError.Code) -> Expected { Expected(error: code, logged: false) }

    static let table: [(Setup, Edit, Expected)] = [
        (.inserted, .updateToL, row(.inserted, "L", .null, logged: false)),
        (.inserted, .updateToS, row(.inserted, "S", .null)),
        (.inserted, .updateToO, row(.inserted, "O", .null)),
        (.inserted, .revertField, error(.invalidOperation)),
        (.inserted, .revertRow, gone),
        (.inserted, .delete, gone),
        (.inserted, .acknowledge, row(.unchanged, "L", "L")),
        (.inserted, .insertO, error(.duplicateKey)),
        (.inserted, .insertS, error(.duplicateKey)),

        (.synced, .updateToL, row(.updated, "L", "S")),
        (.synced, .updateToS, row(.unchanged, "S", "S", logged: false)),
        (.synced, .updateToO, row(.updated, "O", "S")),
        (.synced, .revertField, row(.unchanged, "S", "S", logged: false)),
        (.synced, .revertRow, row(.unchanged, "S", "S", logged: false)),
        (.synced, .delete, row(.deleted, "S", "S")),
        (.synced, .acknowledge, row(.unchanged, "S", "S", logged: false)),
        (.synced, .insertO, error(.duplicateKey)),
        (.synced, .insertS, error(.duplicateKey)),

        (.dirty, .updateToL, row(.updated, "L", "S", logged: false)),
        (.dirty, .updateToS, row(.unchanged, "S", "S")),
        (.dirty, .updateToO, row(.updated, "O", "S")),
        (.dirty, .revertField, row(.unchanged, "S", "S")),
        (.dirty, .revertRow, row(.unchanged, "S", "S")),
        (.dirty, .delete, row(.deleted, "S", "S")),
        (.dirty, .acknowledge, row(.unchanged, "L", "L")),
        (.dirty, .insertO, error(.duplicateKey)),
        (.dirty, .insertS, error(.duplicateKey)),

        (.deleted, .updateToL, error(.rowNotFound)),
        (.deleted, .updateToS, error(.rowNotFound)),
        (.deleted, .updateToO, error(.rowNotFound)),
        (.deleted, .revertField, error(.invalidOperation)),
        (.deleted, .revertRow, row(.unchanged, "S", "S")),
        (.deleted, .delete, error(.rowNotFound)),
        (.deleted, .acknowledge, gone),
        (.deleted, .insertO, row(.updated, "O", "S")),
        (.deleted, .insertS, row(.unchanged, "S", "S")),
    ]

    @Test func theTableCoversEveryCombination() {
        let covered = Set(Self.table.map { "\($0.0)-\($0.1)" })
        #expect(covered.count == Setup.allCases.count * Edit.allCases.count)
        #expect(Self.table.count == covered.count)
    }

    @Test(arguments: table)
    func outcome(setup: Setup, edit: Edit, expected: Expected) throws {
        var options = StoreOptions()
        options.checkInvariants = true
        try withStore(options) { store, _ in
            try store.createTable(tasksSchema)
            try store.write { tx in
                switch setup {
                case .inserted:
                    try tx.insert("tasks", ["id": 1, "title": "L"])
                case .synced, .dirty, .deleted:
                    try tx.insert("tasks", ["id": 1, "title": "S"])
                    try tx.acknowledge("tasks", key: 1)
                    if setup == .dirty { try tx.update("tasks", key: 1, ["title": "L"]) }
                    if setup == .deleted { try tx.delete("tasks", key: 1) }
                }
            }
            let before = try store.read { try $0.lastLSN }
            var thrown: StrataError?
            do {
                try store.write { tx in
                    switch edit {
                    case .updateToL: try tx.update("tasks", key: 1, ["title": "L"])
                    case .updateToS: try tx.update("tasks", key: 1, ["title": "S"])
                    case .updateToO: try tx.update("tasks", key: 1, ["title": "O"])
                    case .revertField: try tx.revert("tasks", key: 1, field: "title")
                    case .revertRow: try tx.revert("tasks", key: 1)
                    case .delete: try tx.delete("tasks", key: 1)
                    case .acknowledge: try tx.acknowledge("tasks", key: 1)
                    case .insertO: try tx.insert("tasks", ["id": 1, "title": "O"])
                    case .insertS: try tx.insert("tasks", ["id": 1, "title": "S"])
                    }
                }
            } catch let e as StrataError {
                thrown = e
            }
            let after = try store.read { try $0.lastLSN }
            #expect(thrown?.code == expected.error, "\(setup) + \(edit): \(thrown.map(String.init(describing:)) ?? "no error")")
            #expect((after > before) == expected.logged, "\(setup) + \(edit): logged")
            guard expected.error == nil else { return }
            let row = try store.read { try $0.row("tasks", key: 1, includingDeleted: true) }
            if expected.gone {
                #expect(row == nil, "\(setup) + \(edit): row should be gone")
                #expect(try store.read { try $0.pendingRows() }.isEmpty)
                return
            }
            let r = try #require(row, "\(setup) + \(edit): row missing")
            #expect(r.status == expected.status, "\(setup) + \(edit)")
            #expect(r["title"] == expected.current, "\(setup) + \(edit)")
            #expect(r.original("title") == expected.original, "\(setup) + \(edit)")
            #expect(r.isChanged("title") == (expected.current != expected.original), "\(setup) + \(edit)")
            let pending = try store.read { try $0.pendingRows("tasks") }
            #expect(pending.map(\.key) == (r.isPending ? [1] : []), "\(setup) + \(edit): pending view")
            // A pending delete is invisible to normal reads.
            let visible = try store.read { try $0.row("tasks", key: 1) }
            #expect((visible == nil) == (expected.status == .deleted))
            #expect(try store.verify().isConsistent)
        }
    }
}

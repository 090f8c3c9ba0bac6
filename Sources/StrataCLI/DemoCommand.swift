import ArgumentParser
import Foundation
import Strata
import StrataSync

/// `strata demo`: the life of a small to-do app's store, step by step.
struct DemoCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Walk through the life of a small to-do app's store.",
        discussion: """
            Creates a store (in a temporary folder unless --path is given), edits rows, shows \
            original and current values, reverts a field, merges a server delta that conflicts \
            with a local edit and resolves it, freezes the upload batch and applies its \
            acknowledgement, shows a row's history, and rebuilds and verifies the tables from \
            the log. Needs no server and no network.

            Example:
              strata demo
              strata demo --path /tmp/todo-store --keep
            """
    )

    @Option(help: "The folder for the demo store (default: a new temporary folder).")
    var path: String?

    @Flag(help: "Keep the store afterwards (a temporary store is removed by default).")
    var keep = false

    func validate() throws {
        var isFolder: ObjCBool = false
        if let path, FileManager.default.fileExists(atPath: path, isDirectory: &isFolder), !isFolder.boolValue {
            throw ValidationError("--path '\(path)' is a file; give a folder for the demo store")
        }
        if let path, FileManager.default.fileExists(atPath: path + "/data.mdb") {
            throw ValidationError("'\(path)' already holds a store; the demo needs an empty folder")
        }
    }

    func run() throws {
        try reportingErrors { try runDemo() }
    }

    private func runDemo() throws {
        let folder = path ?? FileManager.default.temporaryDirectory.appendingPathComponent("strata-demo-\(UUID().uuidString)").path
        defer { if !keep { try? FileManager.default.removeItem(atPath: folder) } }
        let store = try Store(path: folder)
        var step = 0
        func say(_ title: String, _ lines: [String] = []) {
            step += 1
            print("\n\(step). \(title)")
            for l in lines { print("   \(l)") }
        }

        say("Open a store", ["folder: \(folder)", "client id: \(store.clientID)"])

        try store.createTable(.fixed("priorities", primaryKey: ["id"], fields: [.int("id"), .string("name")]))
        try store.createTable(.fixed("tasks", primaryKey: ["id"], fields: [
            .int("id"), .string("title"), .int("priority"), .bool("done", default: false), .string("notes", nullable: true),
        ]))
        say("Create tables", try store.tables.map { t in "\(t.name): \(t.fields.map { "\($0.name) \($0.type)" }.joined(separator: ", "))" })

        try store.write { tx in
            try tx.insert("priorities", ["id": 1, "name": "high"])
            try tx.insert("priorities", ["id": 2, "name": "low"])
            try tx.insert("tasks", ["id": 1, "title": "Buy milk", "priority": 2])
            try tx.insert("tasks", ["id": 2, "title": "Write report", "priority": 1, "notes": "due Friday"])
            try tx.insert("tasks", ["id": 3, "title": "Call plumber", "priority": 1])
        }
        try say("Insert five rows in one transaction", store.read { snap in
            try snap.rows("tasks").map(\.description) + ["pending rows: \(try snap.pendingRows().count)"]
        })

        try store.write { tx in
            for t in ["priorities", "tasks"] {
                for row in try tx.snapshot.pendingRows(t) { try tx.acknowledge(t, key: row.key) }
            }
        }
        say("The server accepts the upload: every row is acknowledged", [
            "pending rows: \(try store.read { try $0.pendingRows().count })",
        ])

        try store.write { tx in
            try tx.update("tasks", key: 1, ["title": "Buy oat milk", "done": true])
            try tx.update("tasks", key: 2, ["notes": "due Monday"])
            try tx.delete("tasks", key: 3)
        }
        let milk = try store.read { try $0.row("tasks", key: 1) }!
        say("Work offline: edit two tasks, delete one", [
            "task 1 status: \(milk.status), changed fields: \(milk.changedFields.joined(separator: ", "))",
            "task 1 title: original \(milk.original("title")), current \(milk["title"])",
        ] + (try store.read { try $0.pendingRows().map { "pending: \($0)" } }))

        try store.write { try $0.revert("tasks", key: 1, field: "title") }
        let reverted = try store.read { try $0.row("tasks", key: 1) }!
        say("Revert one field", [
            "task 1 title is back to \(reverted["title"]); still changed: \(reverted.changedFields.joined(separator: ", "))",
        ])

        // The server changed task 1's priority and task 2's notes meanwhile, and added a task.
        let sync = SyncClient(store: store, policy: .serverWins, tablePolicies: ["tasks": .deferred])
        let delta = ServerDelta(anchor: "v2", tables: [TableDelta("tasks", upserts: [
            ServerRow(["id": 1, "title": "Buy milk", "priority": 1, "done": false, "notes": nil], version: "v2"),
            ServerRow(["id": 2, "title": "Write report", "priority": 1, "done": false, "notes": "due Tuesday"], version: "v2"),
            ServerRow(["id": 4, "title": "Pay rent", "priority": 1, "done": false, "notes": nil], version: "v2"),
        ])])
        let report = try sync.merge(delta)
        let conflicts = try sync.conflicts()
        var lines = ["\(report)"]
        for c in report.conflicts {
            lines.append("conflict: \(c.table) \(c.key) field \(c.fields.joined(separator: ", ")) → \(c.resolution)")
        }
        for c in conflicts {
            lines.append("unresolved: \(c.table) \(c.key): local \(c.local), server \(c.server)")
        }
        for key: RowKey in [1, 2] {
            let row = try store.read { try $0.row("tasks", key: key) }!
            lines.append("now: \(row)")
        }
        say("A server delta arrives and is merged field by field (policy for tasks: deferred)", lines)

        try sync.resolve("tasks", key: 2, with: .local)
        let kept = try store.read { try $0.row("tasks", key: 2) }!
        say("The app resolves the conflict: keep the local notes", [
            "\(kept)",
            "task 2 will upload notes \(kept["notes"]) replacing the server's \(kept.original("notes"))",
        ])

        try store.write { try $0.update("tasks", key: 1, ["done": false]) }
        let back = try store.read { try $0.row("tasks", key: 1) }!
        say("Edit a field back to its original value", ["task 1 is \(back.status) again: \(back)"])

        let batch = try sync.nextBatch()!
        say("Freeze the pending rows into upload batch #\(batch.number) (a retry sends the same id and content)",
            batch.changes.map { c in
                let values = c.values.sorted { $0.key < $1.key }.map { "\($0.key) = \($0.value)" }.joined(separator: ", ")
                let originals = c.originals.sorted { $0.key < $1.key }.map { "\($0.key) was \($0.value)" }.joined(separator: ", ")
                return "\(c.kind) \(c.table) \(c.key): \([values, originals].filter { !$0.isEmpty }.joined(separator: "; "))"
            })

        // An in-process server stands in for the app's transport.
        let ack = BatchAck(batchID: batch.id, results: batch.changes.map { .ok($0.table, $0.key) })
        let ackReport = try sync.acknowledge(ack)
        say("The server acknowledges the batch", [
            "acknowledged \(ackReport.acknowledged) rows; pending now: \(try store.read { try $0.pendingRows().count })",
            "task 2 now: \(try store.read { try $0.row("tasks", key: 2) }!)",
        ])

        let history = try store.read { try $0.history("tasks", key: 1) }
        say("History of task 1, operation by operation", history.map { op in
            let fields = op.changes.map { "\($0.field) = \($0.current)\($0.isChanged ? " (server: \($0.original))" : "")" }
            let audit = MergeAudit(op).map { " (delta \($0.anchor))" } ?? ""
            return "LSN \(op.lsn) \(op.kind) [\(op.origin)]\(audit): \(fields.isEmpty ? "-" : fields.joined(separator: ", "))"
        })

        // The whole table as it was before the server's delta, rebuilt from the log into a scratch store.
        let beforeDelta = try store.read { try $0.operations() }.first { $0.origin == .server && $0.kind == .serverChange }!.lsn - 1
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("strata-demo-asof-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let past = try store.replay(into: scratch, through: beforeDelta)
        say("The tasks table as of LSN \(beforeDelta), just before the server's delta", try past.read { snap in
            try snap.rows("tasks", includingDeleted: true).map(\.description)
        })

        let folded = try store.rebuild()
        let verified = try store.verify()
        say("Rebuild every table from the log, then verify", [
            "folded \(folded) operations; \(verified)",
        ])
        print("\nDone.\(keep ? " The store is kept at \(folder)." : "")")
    }
}

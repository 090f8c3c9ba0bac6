import Foundation
import Strata
import StrataSync
import Testing

/// Every combination, for one field, of the local side {unchanged, changed} and the server side
/// {unchanged, changed, changed to the local value, changed to another value}, under every
/// policy, against a written table of outcomes. Base "B", local "X", server "X" or "Y".
@Suite struct FieldMergeTests {
    enum Local: String, CaseIterable, Sendable { case unchanged, changed }
    enum Server: String, CaseIterable, Sendable { case unchanged, changedToLocal, changedToOther }
    enum Policy: String, CaseIterable, Sendable {
        case serverWins, clientWins, deferred, lwwLocalNewer, lwwServerNewer, lwwNoServerTime, lwwTie, customMerged
    }

    struct Expected: Sendable, CustomStringConvertible {
        var current: Value
        var original: Value
        var conflicted = false
        var decision: FieldDecision.Outcome?
        var description: String { "\(current)/\(original)\(conflicted ? " conflicted" : "") \(decision.map { "\($0)" } ?? "-")" }
    }

    /// Outcome for (local, server) when there is no conflict: independent of the policy.
    static let noConflict: [String: Expected] = [
        "unchanged-unchanged": Expected(current: "B", original: "B", decision: nil),
        "unchanged-changedToOther": Expected(current: "Y", original: "Y", decision: .takeServer),
        // Kept local: nothing changes, so nothing is logged; the report counts it.
        "changed-unchanged": Expected(current: "X", original: "B", decision: nil),
        "changed-changedToLocal": Expected(current: "X", original: "X", decision: .settled),
    ]

    /// Outcome of the one conflicting combination (local X, server Y) per policy.
    static let conflict: [Policy: Expected] = [
        .serverWins: Expected(current: "Y", original: "Y", decision: .conflictServer),
        .clientWins: Expected(current: "X", original: "Y", decision: .conflictLocal),
        .deferred: Expected(current: "X", original: "Y", conflicted: true, decision: .conflictDeferred),
        .lwwLocalNewer: Expected(current: "X", original: "Y", decision: .conflictLocal),
        .lwwServerNewer: Expected(current: "Y", original: "Y", decision: .conflictServer),
        .lwwNoServerTime: Expected(current: "Y", original: "Y", decision: .conflictServer),
        .lwwTie: Expected(current: "Y", original: "Y", decision: .conflictServer),
        .customMerged: Expected(current: "X+Y", original: "Y", decision: .conflictMerged),
    ]

    static var cases: [(Local, Server, Policy)] {
        Local.allCases.flatMap { l in Server.allCases.flatMap { s in Policy.allCases.map { (l, s, $0) } } }
    }

    @Test(arguments: cases)
    func outcome(local: Local, server: Server, policy: Policy) throws {
        // "unchanged locally, changed on the server to the local value" is just "unchanged".
        let key = local == .unchanged && server == .changedToLocal ? "unchanged-unchanged" : "\(local)-\(server)"
        let expected = Self.noConflict[key] ?? Self.conflict[policy]!
        try withStore { store in
            try store.write { tx in
                try tx.insert("tasks", ["id": 1, "title": "B"])
                try tx.acknowledge("tasks", key: 1)
                if local == .changed { try tx.update("tasks", key: 1, ["title": "X"]) }
            }
            let localTime = try store.read { try $0.history("tasks", key: 1) }.last!.timestamp
            let serverTitle: Value = switch server {
            case .unchanged: "B"
            case .changedToLocal: local == .changed ? "X" : "B"
            case .changedToOther: "Y"
            }
            let serverTime: Date? = switch policy {
            case .lwwLocalNewer: localTime.addingTimeInterval(-60)
            case .lwwServerNewer: localTime.addingTimeInterval(60)
            case .lwwTie: localTime
            default: nil
            }
            let p: ConflictPolicy = switch policy {
            case .serverWins: .serverWins
            case .clientWins: .clientWins
            case .deferred: .deferred
            case .lwwLocalNewer, .lwwServerNewer, .lwwNoServerTime, .lwwTie: .lastWriterWins
            case .customMerged: .custom { c in
                .merged(["title": .string("\(c.local["title"]!.stringValue!)+\(c.server["title"]!.stringValue!)")])
            }
            }
            let sync = SyncClient(store: store, policy: p)
            let report = try sync.merge(ServerDelta(anchor: "a1", tables: [
                TableDelta("tasks", upserts: [ServerRow(["id": 1, "title": serverTitle], version: "v2", timestamp: serverTime)]),
            ]))
            let row = try #require(try store.read { try $0.row("tasks", key: 1) })
            let context = "\(local) local, server \(server), \(policy): got \(row)"
            #expect(row["title"] == expected.current, "\(context)")
            #expect(row.original("title") == expected.original, "\(context)")
            #expect(row.isConflicted == expected.conflicted, "\(context)")
            #expect(row.isPending == (expected.current != expected.original || expected.conflicted), "\(context)")
            #expect(try sync.anchor() == "a1")
            // The audit in the log records the decision with base, local and server values.
            let last = try store.read { try $0.history("tasks", key: 1) }.last!
            if let decision = expected.decision {
                #expect(last.origin == .server && last.kind == .serverChange, "\(context)")
                let audit = try #require(MergeAudit(last), "\(context)")
                #expect(audit.anchor == "a1" && audit.serverVersion == "v2")
                let d = try #require(audit.decisions.first { $0.field == "title" })
                #expect(d.outcome == decision, "\(context)")
                #expect(d.base == "B" && d.local == (local == .changed ? "X" : "B") && d.server == serverTitle)
                #expect((report.conflicts.count == 1) == (key == "changed-changedToOther"))
            } else {
                #expect(last.origin == .local || last.kind == .acknowledge, "\(context): nothing should be logged")
                #expect(report.fieldsKeptLocal == (key == "changed-unchanged" ? 1 : 0))
                #expect(report.rowsApplied == 0)
            }
        }
    }
}

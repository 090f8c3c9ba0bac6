import Foundation
import Strata
import StrataSync
import StrataTesting
import Testing

/// `InMemorySyncServer` answers as `strata-server` does where a test could tell them apart.
@Suite struct InMemorySyncServerTests {
    /// `decide` answering `ok` for a change the server cannot apply: the conflict stands. Before,
    /// the row was acknowledged `ok` and never written.
    @Test func aDecidedOkThatDoesNotApplyIsAConflict() async throws {
        let server = InMemorySyncServer { c in .ok(c.table, c.key, serverValues: ["stamp": 1]) }
        server.write("tasks", key: 1, ["title": "a"])
        let stale = RowChange(table: "tasks", key: 1, kind: .update, values: ["title": "b"], originals: ["title": "x"])
        let taken = RowChange(table: "tasks", key: 1, kind: .insert, values: ["id": 1, "title": "c"])
        let fine = RowChange(table: "tasks", key: 2, kind: .insert, values: ["id": 2, "title": "d"])
        let ack = try await server.push(Batch(id: "c-1", clientID: "c", number: 1, changes: [stale, taken, fine]))
        #expect(ack.results.map(\.status) == [.conflict, .conflict, .ok])
        #expect(ack.results[2].serverValues == ["stamp": 1])
        #expect(server.rows("tasks")[1] == ["title": "a"])
        #expect(server.rows("tasks")[2] == ["title": "d", "stamp": 1])
    }

    /// Deleting a row the server does not have is `ok` and changes nothing: no version, no
    /// tombstone in the next pull. Before, the version moved and pulls listed the delete.
    @Test func deletingARowTheServerDoesNotHaveChangesNothing() async throws {
        let server = InMemorySyncServer()
        server.write("tasks", key: 1, ["title": "a"])
        let before = try await server.pull(since: nil).anchor
        let ack = try await server.push(Batch(id: "c-1", clientID: "c", number: 1, changes: [RowChange(table: "tasks", key: 5, kind: .delete)]))
        #expect(ack.results.map(\.status) == [.ok])
        let delta = try await server.pull(since: before)
        #expect(delta.anchor == before && delta.tables.isEmpty)
    }

    /// An anchor the server never handed out: one that is not a version is malformed (as
    /// `strata-server`'s 400), one ahead of the server asks for a reset (its 410). Before, both
    /// were read as 0 or served as they came.
    @Test func anAnchorTheServerNeverHandedOutIsRefused() async throws {
        let server = InMemorySyncServer()
        server.write("tasks", key: 1, ["title": "a"])
        await #expect { try await server.pull(since: "v1") } throws: { ($0 as? StrataError)?.code == .malformedInput }
        await #expect { try await server.pull(since: "-1") } throws: { ($0 as? StrataError)?.code == .malformedInput }
        await #expect(throws: ResetRequired.self) { try await server.pull(since: "2") }
        #expect(try await server.pull(since: "1").tables.isEmpty)
        #expect(try await server.pull(since: "0").tables.map(\.upserts.count) == [1])
    }
}

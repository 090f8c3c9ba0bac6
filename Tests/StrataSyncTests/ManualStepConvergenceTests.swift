import Foundation
import Strata
import StrataSync
import StrataTesting
import StrataWorkload
import Testing

/// A parent table whose new rows the server gives its own keys, and a child table naming them.
let stepParents = TableSchema.fixed("sparents", primaryKey: ["id"], fields: [.int("id"), .string("name"), .string("color", nullable: true)])
let stepChildren = TableSchema.fixed("schildren", primaryKey: ["id"], fields: [
    .int("id"), .string("title"), .string("note", nullable: true), .int("parent", nullable: true),
])
let stepLink = Association(child: "schildren", field: "parent", parent: "sparents")

/// Randomized convergence of several clients that run the sync steps themselves —
/// `nextBatch()`, push, `acknowledge(_:)`, pull and `merge(_:)`, `resolve` — in random
/// interleavings: an acknowledgement may come late, after local edits, merges, and other writers'
/// changes; a response may be lost and the batch pushed again. Now and then a client pulls a full
/// snapshot (`pull(since: nil)`, an app's "refresh all") whatever its anchor, batch in flight or
/// not (`AckRules.awaitsSnapshot`). The server (an
/// `InMemorySyncServer`) gives new parent rows its own keys, and is edited directly as a third
/// writer, which now and then sets a field back to a value it held before. At the end everyone
/// settles, and client and server must be equal, nothing pending, every store consistent, no
/// edit lost, and no push may have set a field back to an old value (see `Oracle`).
///
/// A client uses its own keys again: now and then it inserts a child, or a parent under a key
/// the server keeps (a positive one; the server replaces only negative parent keys), under a key
/// it used before and whose row it deleted here — whether or not that delete has reached the
/// server, so the insert may revive a pending delete, follow a delete in flight, or come after
/// the acknowledged one (`AckRules.remembersDelete` must tell the old row's delete from the new
/// row's). The oracle reasons per life of a key (see `Oracle.inserted`). Keys are never shared
/// between clients: the rules for a merge between `nextBatch()` and `acknowledge(_:)` take a
/// key a client chose as its own, and with keys shared between clients a server delete of
/// another client's older row under the key of an insert in flight is taken for a delete of
/// the new one. Insert-insert conflicts are `ConvergenceTests`' (through whole sync rounds).
///
/// `STRATA_SEED` replays a run, `STRATA_TRIAL_SEED` one trial of it, `STRATA_TRIALS` runs more trials.
@Suite struct ManualStepConvergenceTests {
    @Test func clientsRunningTheStepsThemselvesConvergeAndLoseNothing() async throws {
        let seed = testSeed("clientsRunningTheStepsThemselvesConverge")
        let trials = ProcessInfo.processInfo.environment["STRATA_TRIALS"].flatMap(Int.init) ?? 8
        var g = SplitMix64(seed: seed)
        var steps = 0
        var ran = 0
        var again = 0
        var cleared = 0
        var refreshes = 0
        var allowedPutBack = 0
        var setBacks = 0
        // `STRATA_TRIAL_SEED` replays one trial alone, by the seed a failure prints for it.
        let only = ProcessInfo.processInfo.environment["STRATA_TRIAL_SEED"].flatMap(UInt64.init)
        for trial in 0..<(only == nil ? trials : 1) {
            let trialSeed = only ?? g.next()
            let sim = try await Self.trial(trialSeed, "seed \(seed), trial \(trial) (trial seed \(trialSeed))")
            defer { sim.removeFolders() }
            steps += sim.trace.count
            again += sim.trace.count { $0.contains("(key used again)") }
            cleared += sim.trace.count { $0.contains("(anchor cleared)") }
            refreshes += sim.trace.count { $0.contains("snapshot (refresh)") }
            allowedPutBack += sim.oracle.allowedPutBack.count
            setBacks += sim.trace.count { $0.contains("(set back)") }
            ran += 1
        }
        print("clientsRunningTheStepsThemselvesConverge: \(ran) trials, \(steps) steps, \(again) inserts under a key used again, \(cleared) acknowledgements that cleared the anchor, \(refreshes) snapshots pulled at random, \(setBacks) server fields set back to an earlier value, \(allowedPutBack) values put back as the rules allow")
    }

    /// One trial: 150 random steps, then everyone settles and `check` runs. The caller removes
    /// the simulation's folders.
    static func trial(_ trialSeed: UInt64, _ label: String) async throws -> StepSimulation {
        let sim = try StepSimulation(seed: trialSeed, clients: 3)
        do {
            // Half the trials start with a pull by every client, before anything is in flight;
            // in the others a client's first pull, a snapshot, may come while a batch is in
            // flight (`AckRules.awaitsSnapshot`).
            if trialSeed % 2 == 0 {
                for c in sim.clients { try await sim.pullAndMerge(c) }
            }
            for _ in 0..<150 { try await sim.step() }
            try await sim.quiesce()
            try await sim.check(label)
        } catch {
            sim.removeFolders()
            throw error
        }
        return sim
    }

    /// The trial seeds that found a loss in the acknowledgement rules, each fixed since (the
    /// tests and commits that fixed them tell the stories), replayed on every run.
    @Test(arguments: [
        4806652833793780520, 7330045786470116942, 9038748513289842278, 10576372173991561622,
        11076572709239798403, 11589300365223785464, 18323979053735142098,
    ] as [UInt64])
    func trialSeedsThatFoundALossStillConverge(_ trialSeed: UInt64) async throws {
        let sim = try await Self.trial(trialSeed, "trial seed \(trialSeed)")
        sim.removeFolders()
    }
}

/// One client of the simulation, with what the test knows about it.
final class StepClient {
    let id: Int
    let store: Store
    let sync: SyncClient
    let policy: ConflictPolicy
    /// The acknowledgement received for the batch in flight, not applied yet.
    var ack: BatchAck?
    /// The last log entry whose audit was read.
    var lastLSN: UInt64 = 0
    var nextParentKey: Int64 = 1
    var nextChildKey: Int64 = 1
    var nextKeptParentKey: Int64 = 1
    /// Per table, the keys the server keeps that this client inserted rows under, and those of
    /// them whose rows it deleted here since (in order: a `Set`'s order changes from run to run).
    var keptKeys: [String: [RowKey]] = [:]
    var deletedKeys: [String: [RowKey]] = [:]

    init(id: Int, store: Store, policy: ConflictPolicy) {
        self.id = id
        self.store = store
        self.policy = policy
        self.sync = SyncClient(store: store, policy: policy, associations: [stepLink])
    }

    /// Notes that a row was inserted under `key`, one the server keeps.
    func used(_ key: RowKey, _ table: String) {
        if !keptKeys[table, default: []].contains(key) { keptKeys[table, default: []].append(key) }
    }
}

/// "No edit lost": every value a client wrote (values are unique: a client's writes are
/// `c<client>-<n>`, the server writer's `s-<n>`) must have been on the server at some time,
/// unless the same client overwrote that field or deleted the row before (superseded), or a
/// conflict settled it for the server — a merge's audit records it (`conflictServer`), or the test
/// resolved a deferred conflict with `.server` (for a row the server deleted, the whole row goes),
/// or reverted the row to let an acknowledgement through (two edited copies). Likewise every
/// delete: the server must have lacked the row at some time after it, unless it was superseded
/// (the row inserted or edited again here), a conflict on the row went to the server, or it was
/// the delete of a local insert the server never took. A later edit by another writer that brings
/// the row back (an update the server's delete met, uploaded again as an insert by that client's
/// conflict resolution) does not undo this: as in `ConvergenceTests`, a delete counts as arrived
/// once the server lacked the row after it, and what comes after is the later writers' word.
///
/// Which row "the row" is: for a delete of a row the device had from the server, the server's row
/// under its key. For the delete of a local insert carried by the batch in flight, the row the
/// server created from that insert — from the moment the server applied it (the test sees the
/// answer to the push, also one the client lost), under the key the server gave or kept, and not
/// before: under a key the server keeps, the server lacked the row before the push too, and that
/// says nothing about the delete. The acknowledgement alone would tell the client the server's
/// key too late: the server may have deleted the row, and another client revived it, in between
/// (trial seed 10576372173991561622: client 1's insert became 1006, the server's writer deleted
/// 1006, client 0 had edited it later than client 1's delete and kept its edit by resolving the
/// conflict `.local`, and only then came client 1's acknowledgement).
///
/// "No value put back": within one life of a row on the server (from the write that creates it to
/// the delete that ends it), a push never sets a field to a value that field has held before.
/// Values are unique per write (nulls aside), so such a push carries an old value over a later one:
/// another writer's, or one set back (now and then the server's writer sets a field back to a value
/// it held, as an undo would). The rules allow none. A client uploads a field only while it holds a
/// value there the server has not confirmed (docs/sync.md, "Coalescing"), and the acknowledgement
/// of the push that carried it makes the sent value the original (`ok`): the field goes up again
/// only if the app edits it again, which writes a new value. A merge between the push and the
/// acknowledgement that changed the row skips the `ok` (superseded), but a sent field the merge did
/// not show is acknowledged all the same (`AckRules.unseenSent`). Client wins lets a pending edit
/// overwrite a server value it has not merged yet, but that edit's value was never on the server. A
/// row uploaded again as an insert after the server deleted it (a conflict settled for the device)
/// is a new life, with the device's values as they stand. Checked: the accepted inserts and updates
/// of each batch the server applies (a repeated push is answered from its cache), in the fields
/// whose values are unique — not nulls (a stale clear of a field goes unseen) nor parent keys.
///
/// Two orders are allowed (`allowed`). The app's own choice: after the server applied the batch and
/// before the acknowledgement, a merge may meet a sent value, which the device still holds as a
/// pending edit, in a conflict with another writer's later value; an app that resolves it `.local`
/// then chooses the sent value itself, and what the app does after that merge stands
/// (`AckRules.echoed` keeps a field the app set since the merge). Resolved after the
/// acknowledgement, which told the device the server took the value, a conflict that still shows it
/// as pending is a stale one: so it went with the bug `AckRules.unseenSent` fixed, a sent field
/// left pending against its base by a superseded acknowledgement (the first of the two fixed
/// put-backs below is the like of it for a field the merge showed). Likewise an app that resolves
/// a conflict `.server` after the freeze, while its batch carries another value for the field:
/// the push sets the value the app discarded, and the acknowledgement keeps the app's choice as
/// its edit, which goes up again (`resolvedServer`). And a local insert that meets the server's row
/// under its key: with no base, every field that differs is a conflict (docs/sync.md, row-level
/// rules), and client wins keeps the device's values, also those it never edited. Two clients that
/// each kept a row the server deleted, and upload it again as an insert, meet so: the second one's
/// old values of fields it never edited go up over what was written on the first one's row since
/// (trial seed 9038748513289842278).
///
/// Any other put-back fails the test. Two that it found are fixed, both of an update's
/// acknowledgement skipped as superseded (a merge since the freeze changed the row), and both now
/// acknowledged by `AckRules.unseenSent`, with the anchor cleared: a sent value the merge met in a
/// conflict with another writer's later value and kept (client wins, or deferred), left pending
/// though the server took it (`InterleavedMergeTests.aSentValueAMergeKeptIsNotPutBackOverALaterOne`);
/// and the batch's base that a merge before the push wrote back into the current (server wins
/// restoring a row the device had deleted, or a writer's change and change back), taken for an
/// edit of the app's and put over the sent value
/// (`InterleavedMergeTests.aFieldAMergeSetToTheBaseIsNotTakenForAnEdit`).
///
/// Association fields (parent keys, not unique) are left to the equality check.
struct Oracle {
    struct ValueIntent {
        let client: Int
        let table: String
        var key: RowKey
        let field: String
        let value: Value
        let step: Int
        var superseded = false
    }
    struct DeleteIntent {
        let client: Int
        let table: String
        var key: RowKey
        let step: Int
        /// The delete of a local insert (carried by the batch in flight).
        let ofInsert: Bool
        /// The key of the server's row the delete is of, once there is one (see `Oracle`):
        /// `key` for a row the device had from the server; for `ofInsert`, set when the server
        /// applies the insert. `nil` for an insert the server has not applied (or never does).
        var serverKey: RowKey?
        /// The client inserted a row under the key again while the batch in flight carried this
        /// delete (see `Oracle.inserted`).
        var revived = false
        var done = false
        var superseded = false
    }
    var values: [ValueIntent] = []
    var deletes: [DeleteIntent] = []
    /// "table field value" of every value the server ever held.
    var onServer: Set<String> = []
    /// Per client: "field value" of local values a conflict gave up for the server's.
    var discarded: [Int: Set<String>] = [:]
    /// "client table key" of each insert the server applied whose acknowledgement the client
    /// has not applied yet → the key the server holds the row under.
    var applied: [String: RowKey] = [:]
    /// Per client: "table key.field" → the value the batch in flight (frozen, pushed or not)
    /// carries there.
    var sentInFlight: [Int: [String: Value]] = [:]
    /// Per client: "table key" of each delete the batch in flight carries.
    var deletesInFlight: [Int: Set<String>] = [:]
    /// Per table, per row the server holds, per field: the values the field has held since the
    /// row was created there (its current life), oldest first, nulls included.
    var held: [String: [RowKey: [String: [Value]]]] = [:]
    /// Pushes that set a field back to a value it held before in the row's life (see `Oracle`):
    /// unexplained, and allowed.
    var putBack: [String] = []
    var allowedPutBack: [String] = []
    /// Per client: "table key.field" → the value its batch in flight set there, from the push the
    /// server applied until the client applies the acknowledgement.
    var appliedInFlight: [Int: [String: Value]] = [:]
    /// Per client: "table key.field value" of the values the rules let it put back (see
    /// `Oracle`): one its batch in flight had set on the server, which the app then chose in a
    /// conflict with a later value (`resolve` with `.local`), and one a local insert kept (or
    /// deferred) in a conflict with the server's row under its key.
    var allowed: [Int: Set<String>] = [:]

    /// The fields whose values are unique per write (parent keys are not).
    static let uniqueFields = ["sparents": ["name", "color"], "schildren": ["title", "note"]]

    static func insertID(_ client: Int, _ table: String, _ key: RowKey) -> String { "\(client) \(table) \(key)" }

    static func id(_ table: String, _ field: String, _ value: Value) -> String { "\(table) \(field) \(value)" }

    mutating func wrote(_ client: Int, _ table: String, _ key: RowKey, _ field: String, _ value: Value, step: Int) {
        for i in values.indices where values[i].client == client && values[i].table == table && values[i].key == key && values[i].field == field {
            values[i].superseded = true
        }
        // The row is back here (a merge brought it again) and the client edited it: the edit is
        // its last word on the row.
        inserted(client, table, key)
        if !value.isNull && field != "parent" {
            values.append(ValueIntent(client: client, table: table, key: key, field: field, value: value, step: step))
        }
    }

    /// The client inserted a row under `key` (or edited one a merge brought back there): its
    /// deletes of the key are superseded — all but one the batch in flight carries.
    ///
    /// A delete not yet frozen never goes up: an insert over a pending delete revives the row as
    /// an update of the server's, and an insert under the key of an insert in flight that the
    /// device deleted since becomes, at the acknowledgement, an update of the row the server
    /// created. Either way the new insert is the client's last word on the row. A delete the batch
    /// in flight carries goes up whatever the device does since: it ends the old row on the
    /// server, and the new row is another life of the key, created after it. Such a delete is
    /// judged as any (the server must lack the row after it), unless the server does not apply
    /// it (`batchOver`).
    mutating func inserted(_ client: Int, _ table: String, _ key: RowKey) {
        let carried = deletesInFlight[client]?.contains("\(table) \(key)") ?? false
        for i in deletes.indices where deletes[i].client == client && deletes[i].table == table && deletes[i].key == key {
            if carried { deletes[i].revived = true } else { deletes[i].superseded = true }
        }
    }

    /// The client froze a batch.
    mutating func frozen(_ client: Int, _ batch: Batch) {
        deletesInFlight[client] = Set(batch.changes.filter { $0.kind == .delete }.map { "\($0.table) \($0.key)" })
        var sent: [String: Value] = [:]
        for change in batch.changes where change.kind != .delete {
            for (f, v) in change.values { sent["\(change.table) \(change.key).\(f)"] = v }
        }
        sentInFlight[client] = sent
    }

    /// The client applied the acknowledgement of its batch in flight. A delete the server did
    /// not apply stays pending, unless the client inserted the row again meanwhile: the revived
    /// row then stands, and the delete is superseded as if it had never been frozen.
    mutating func batchOver(_ client: Int, _ batch: Batch, _ results: [RowResult]) {
        sentInFlight[client] = nil
        for (change, result) in zip(batch.changes, results) where change.kind == .delete && result.status != .ok {
            for i in deletes.indices where deletes[i].client == client && deletes[i].table == change.table && deletes[i].key == change.key
                && deletes[i].revived && !deletes[i].done {
                deletes[i].superseded = true
            }
        }
        deletesInFlight[client] = nil
        appliedInFlight[client] = nil
    }

    mutating func deleted(_ client: Int, _ table: String, _ key: RowKey, step: Int, ofInsert: Bool) {
        rowGivenUp(client, table, key)
        let serverKey = ofInsert ? applied[Self.insertID(client, table, key)] : key
        deletes.append(DeleteIntent(client: client, table: table, key: key, step: step, ofInsert: ofInsert, serverKey: serverKey))
    }

    /// The server applied an insert of the client's batch (`ok`), under `serverKey`: a delete of
    /// that insert, made or to be made before the acknowledgement, is of this row.
    mutating func insertApplied(_ client: Int, _ table: String, _ key: RowKey, as serverKey: RowKey) {
        applied[Self.insertID(client, table, key)] = serverKey
        for i in deletes.indices where deletes[i].client == client && deletes[i].table == table && deletes[i].key == key
            && deletes[i].ofInsert && deletes[i].serverKey == nil && !deletes[i].done && !deletes[i].superseded {
            deletes[i].serverKey = serverKey
        }
    }

    /// The server applied the client's batch (a first push, not a repeat answered from its
    /// cache): an accepted insert or update must not set a field back to a value it held before
    /// in the row's life (see `Oracle`). Checked against `held` as it was before the push.
    mutating func pushed(_ client: Int, _ batch: Batch, _ results: [RowResult]) {
        for (change, result) in zip(batch.changes, results) where change.kind != .delete && result.status == .ok {
            let key = result.newKey ?? change.key
            for (f, v) in change.values where !v.isNull && Self.uniqueFields[change.table]!.contains(f) {
                let id = "\(change.table) \(key).\(f)"
                appliedInFlight[client, default: [:]][id] = v
                let history = held[change.table]?[key]?[f] ?? []
                guard history.contains(v) else { continue }
                let what = "client \(client)'s batch \(batch.id) set \(id) back to \(v) over \(history.last ?? .null) (held: \(history.map(\.description).joined(separator: " → ")))"
                if allowed[client]?.contains("\(id) \(v)") ?? false {
                    allowedPutBack.append(what)
                } else {
                    putBack.append(what)
                }
            }
        }
    }

    /// A merge (or an acknowledgement) met a conflict on the client's row (`audit`): a local
    /// insert's values it kept, or deferred, against the server's row may go up (see `Oracle`).
    mutating func conflictDecided(_ client: Int, _ table: String, _ key: RowKey, _ audit: MergeAudit) {
        guard audit.conflict == .insertInsert else { return }
        for d in audit.decisions where d.outcome == .conflictLocal || d.outcome == .conflictDeferred {
            let id = "\(table) \(key).\(d.field)"
            // Not so the insert of the batch in flight, merged back: its acknowledgement settles
            // the conflict again, with the sent values as the base (`AckRules.echoed`).
            if appliedInFlight[client]?[id] != d.local { allowed[client, default: []].insert("\(id) \(d.local)") }
        }
    }

    /// The app resolved a conflict on the client's row with `.server` while its frozen batch
    /// carries another value for a field: that batch's push then sets the discarded value on the
    /// server, and the acknowledgement keeps the value the app chose as its edit
    /// (`AckRules.unseenSent`), which goes up again (seed 24, trial seed 11076572709239798403).
    /// The app's choice, made after the freeze, stands, as a `.local` one does.
    mutating func resolvedServer(_ client: Int, _ conflict: UnresolvedConflict) {
        for f in conflict.fields {
            let id = "\(conflict.table) \(conflict.key).\(f)"
            guard let sent = sentInFlight[client]?[id], let chosen = conflict.server[f], chosen != sent else { continue }
            allowed[client, default: []].insert("\(id) \(chosen)")
        }
    }

    /// The app resolved a conflict on the client's row with `.local`.
    mutating func resolvedLocal(_ client: Int, _ conflict: UnresolvedConflict) {
        for f in conflict.fields {
            let id = "\(conflict.table) \(conflict.key).\(f)"
            guard let sent = appliedInFlight[client]?[id], sent == conflict.local[f] else { continue }
            allowed[client, default: []].insert("\(id) \(sent)")
        }
    }

    /// The client applied the acknowledgement of an insert: what `insertApplied` noted for it is
    /// the client's to know now (a later delete of the row is one of a server row).
    mutating func insertAcknowledged(_ client: Int, _ table: String, _ key: RowKey) {
        applied[Self.insertID(client, table, key)] = nil
    }

    /// The client's values in the row are gone with it (deleted here, or a delete conflict
    /// resolved for the server).
    mutating func rowGivenUp(_ client: Int, _ table: String, _ key: RowKey) {
        for i in values.indices where values[i].client == client && values[i].table == table && values[i].key == key {
            values[i].superseded = true
        }
    }

    /// The server refused a local insert (its key was taken): a delete of it made since took
    /// nothing from the server.
    mutating func insertRefused(_ client: Int, _ table: String, _ key: RowKey) {
        // Only deletes of that insert: under a key used again, a delete of an earlier row's
        // insert was of a row the server did create (`serverKey` set).
        for i in deletes.indices where deletes[i].client == client && deletes[i].table == table && deletes[i].key == key
            && deletes[i].ofInsert && deletes[i].serverKey == nil {
            deletes[i].done = true
        }
    }

    /// The acknowledgement moved a client's row to the server's key.
    mutating func rekeyed(_ client: Int, _ table: String, _ old: RowKey, _ new: RowKey) {
        for i in values.indices where values[i].client == client && values[i].table == table && values[i].key == old { values[i].key = new }
        for i in deletes.indices where deletes[i].client == client && deletes[i].table == table && deletes[i].key == old { deletes[i].key = new }
    }

    /// A conflict on the row went to the server: a delete of it made before is settled.
    mutating func conflictWentToServer(_ client: Int, _ table: String, _ key: RowKey) {
        for i in deletes.indices where deletes[i].client == client && deletes[i].table == table && deletes[i].key == key { deletes[i].done = true }
    }

    /// Records what the server holds now.
    mutating func observe(_ server: InMemorySyncServer) {
        for table in ["sparents", "schildren"] {
            let rows = server.rows(table)
            // A row gone from the server ends its life; a row under its key later is another.
            var lives = held[table, default: [:]].filter { rows[$0.key] != nil }
            for (key, fields) in rows {
                for f in Self.uniqueFields[table]! where lives[key]?[f]?.last != fields[f] ?? .null {
                    lives[key, default: [:]][f, default: []].append(fields[f] ?? .null)
                }
            }
            held[table] = lives
            for (_, fields) in rows {
                for (f, v) in fields { onServer.insert(Self.id(table, f, v)) }
            }
            // Only once the server holds (or held) the row the delete is of: see `DeleteIntent.serverKey`.
            for i in deletes.indices where !deletes[i].done && deletes[i].table == table {
                if let key = deletes[i].serverKey, rows[key] == nil { deletes[i].done = true }
            }
        }
    }

    func lost() -> [String] {
        var lost: [String] = []
        for v in values where !v.superseded && !onServer.contains(Self.id(v.table, v.field, v.value))
            && !(discarded[v.client]?.contains("\(v.field) \(v.value)") ?? false) {
            lost.append("client \(v.client)'s \(v.table) \(v.key).\(v.field) = \(v.value) (step \(v.step)) never reached the server")
        }
        for d in deletes where !d.superseded && !d.done {
            guard d.serverKey != nil else { continue }  // an insert the server never applied: nothing there to delete
            lost.append("client \(d.client)'s delete of \(d.table) \(d.key) (step \(d.step)) never reached the server")
        }
        return lost
    }
}

final class StepSimulation {
    var g: SplitMix64
    let server: InMemorySyncServer
    var clients: [StepClient] = []
    var folders: [String] = []
    var oracle = Oracle()
    var trace: [String] = []
    var writes = 0
    var serverKeys: Locked<Int64>

    init(seed: UInt64, clients count: Int) throws {
        g = SplitMix64(seed: seed)
        let keys = Locked<Int64>(1000)
        serverKeys = keys
        // A client inserts a parent under a key of its own (negative); the server gives it one.
        server = InMemorySyncServer(associations: [stepLink]) { c in
            guard c.table == "sparents", c.kind == .insert, case .int(let k) = c.key.values[0], k < 0 else { return nil }
            let new = keys.withLock { $0 += 1; return $0 }
            return .ok(c.table, c.key, newKey: RowKey(.int(new)))
        }
        let policies: [ConflictPolicy] = [.serverWins, .clientWins, .deferred, .lastWriterWins]
        for id in 0..<count {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("strata-steps-\(UUID().uuidString)").path
            folders.append(path)
            var options = StoreOptions()
            options.durability = .noSync
            options.checkInvariants = true
            let store = try Store(path: path, options: options)
            try store.createTable(stepParents)
            try store.createTable(stepChildren)
            clients.append(StepClient(id: id, store: store, policy: policies[g.below(policies.count)]))
        }
        // A few rows to start from, which every client pulls.
        for _ in 0..<2 { serverWrite() }
    }

    func removeFolders() {
        for f in folders { try? FileManager.default.removeItem(atPath: f) }
    }

    func fresh(_ who: String) -> Value {
        writes += 1
        return .string("\(who)-\(writes)")
    }

    func note(_ s: String) { trace.append(s) }

    // MARK: Steps

    func step() async throws {
        let c = clients[g.below(clients.count)]
        // Now and then a full snapshot, pulled and merged at any moment ("refresh all"), batch
        // in flight or not (`AckRules.awaitsSnapshot`).
        if g.below(25) == 0 { return try await pullAndMerge(c, snapshot: true) }
        switch g.below(11) {
        case 0, 1, 2: try localEdit(c)
        case 3: try freeze(c)
        case 4: try await push(c)
        case 5, 6: try acknowledge(c)
        case 7: try await pullAndMerge(c)
        case 8: try resolveConflicts(c)
        default: serverWrite()
        }
    }

    /// An insert, update or delete of a parent or child on client `c`.
    func localEdit(_ c: StepClient) throws {
        let parents = try c.store.read { try $0.rows("sparents") }
        let children = try c.store.read { try $0.rows("schildren") }
        let parentKey: Value = parents.isEmpty || g.below(4) == 0 ? .null : parents[g.below(parents.count)].key.values[0]
        let who = "c\(c.id)"
        let step = trace.count
        switch g.below(8) {
        case 0:
            // Mostly under a key the server replaces (negative); now and then under one it keeps.
            let kept = g.below(3) == 0
            let key: RowKey
            var again = false
            if kept {
                (key, again) = try keptKey(c, "sparents") {
                    c.nextKeptParentKey += 1
                    return Int64((c.id + 1) * 10_000 + 5_000) + c.nextKeptParentKey - 1
                }
            } else {
                key = RowKey(.int(-Int64(c.id * 10_000) - c.nextParentKey))
                c.nextParentKey += 1
            }
            let name = fresh(who)
            let color: Value = g.below(2) == 0 ? .null : fresh(who)
            try c.store.write { try $0.insert("sparents", FieldValues([("id", key.values[0]), ("name", name), ("color", color)])) }
            if kept { c.used(key, "sparents") }
            oracle.inserted(c.id, "sparents", key)
            oracle.wrote(c.id, "sparents", key, "name", name, step: step)
            oracle.wrote(c.id, "sparents", key, "color", color, step: step)
            note("client \(c.id): insert parent \(key)\(again ? " (key used again)" : "") name \(name) color \(color)")
        case 1:
            let (key, again) = try keptKey(c, "schildren") {
                c.nextChildKey += 1
                return Int64((c.id + 1) * 10_000) + c.nextChildKey - 1
            }
            let title = fresh(who)
            let done = (try? c.store.write { try $0.insert("schildren", FieldValues([("id", key.values[0]), ("title", title), ("parent", parentKey)])) }) != nil
            guard done else { return }
            c.used(key, "schildren")
            oracle.inserted(c.id, "schildren", key)
            oracle.wrote(c.id, "schildren", key, "title", title, step: step)
            oracle.wrote(c.id, "schildren", key, "parent", parentKey, step: step)
            note("client \(c.id): insert child \(key)\(again ? " (key used again)" : "") title \(title) parent \(parentKey)")
        case 2, 3, 4, 5:
            let rows = parents + children
            guard !rows.isEmpty else { return }
            let row = rows[g.below(rows.count)]
            let fields = row.table == "sparents" ? ["name", "color"] : ["title", "note", "parent"]
            let field = fields[g.below(fields.count)]
            let value: Value = switch field {
            case "parent": parentKey
            case "color", "note": g.below(4) == 0 ? .null : fresh(who)
            default: fresh(who)
            }
            try c.store.write { try $0.update(row.table, key: row.key, FieldValues([(field, value)])) }
            oracle.wrote(c.id, row.table, row.key, field, value, step: step)
            note("client \(c.id): update \(row.table) \(row.key) \(field) = \(value)")
        default:
            let rows = parents + children
            guard !rows.isEmpty else { return }
            // Now and then a row under a key of the client's own the server keeps: a key to use again.
            let own = rows.filter { c.keptKeys[$0.table, default: []].contains($0.key) }
            let row = !own.isEmpty && g.below(3) == 0 ? own[g.below(own.count)] : rows[g.below(rows.count)]
            // A local insert that no batch in flight carries never reached the server: deleting
            // it takes nothing from there.
            let carried = try c.sync.inFlightBatch()?.batch.changes.contains { $0.kind == .insert && $0.table == row.table && $0.key == row.key } ?? false
            try c.store.write { try $0.delete(row.table, key: row.key) }
            if c.keptKeys[row.table, default: []].contains(row.key) && !c.deletedKeys[row.table, default: []].contains(row.key) {
                c.deletedKeys[row.table, default: []].append(row.key)
            }
            if row.status == .inserted && !carried {
                oracle.rowGivenUp(c.id, row.table, row.key)
            } else {
                oracle.deleted(c.id, row.table, row.key, step: step, ofInsert: row.status == .inserted)
            }
            oracle.observe(server)  // already gone there: nothing to upload
            note("client \(c.id): delete \(row.table) \(row.key)")
        }
    }

    /// A key the server keeps for a new row of `table` on client `c`: mostly, if there is
    /// one, a key the client used before and whose row it deleted here (whether or not that
    /// delete has reached the server; the row may be a pending delete, which the insert
    /// revives), else a fresh one (`next`). Client keys are never shared between clients: each
    /// client draws from its own range.
    func keptKey(_ c: StepClient, _ table: String, next: () -> Int64) throws -> (RowKey, again: Bool) {
        let gone = try c.deletedKeys[table, default: []].filter { key in
            let row = try c.store.read { try $0.row(table, key: key, includingDeleted: true) }
            return row == nil || row?.status == .deleted
        }
        if !gone.isEmpty && g.below(4) != 0 { return (gone[g.below(gone.count)], true) }
        return (RowKey(.int(next())), false)
    }

    /// Freezes a batch of at most a few rows, if none is in flight.
    func freeze(_ c: StepClient) throws {
        guard try c.sync.inFlightBatch() == nil else { return }
        let maxRows = 1 + g.below(4)
        guard let batch = try c.sync.nextBatch(maxRows: maxRows) else { return }
        oracle.frozen(c.id, batch)
        note("client \(c.id): nextBatch(maxRows: \(maxRows)) → \(batch.id): \(batch.changes.map { "\($0.kind.rawValue) \($0.table) \($0.key)" })")
    }

    /// Pushes the batch in flight; now and then the response is lost (the next push gets the
    /// server's cached answer).
    func push(_ c: StepClient) async throws {
        guard let (batch, _) = try c.sync.inFlightBatch() else { return }
        try c.sync.markSent(batch)
        let applied = server.appliedBatches.count
        let ack = try await server.push(batch)
        if server.appliedBatches.count > applied { oracle.pushed(c.id, batch, ack.results) }
        for (change, result) in zip(batch.changes, ack.results) where change.kind == .insert && result.status == .ok {
            oracle.insertApplied(c.id, change.table, change.key, as: result.newKey ?? change.key)
        }
        oracle.observe(server)
        let lost = g.below(4) == 0
        if !lost { c.ack = ack }
        note("client \(c.id): push \(batch.id) → \(ack.results.map { "\($0.key) \($0.status.rawValue)\($0.newKey.map { " → \($0)" } ?? "")" })\(lost ? " (response lost)" : "")")
    }

    /// Applies the acknowledgement received, if any.
    func acknowledge(_ c: StepClient) throws {
        guard let ack = c.ack, let (batch, _) = try c.sync.inFlightBatch(), batch.id == ack.batchID else { return }
        var reverted = Set<RowKey>()
        while true {
            do {
                let report = try c.sync.acknowledge(ack)
                if report.anchorCleared { note("client \(c.id): acknowledge (anchor cleared)") }
                break
            } catch {
                guard error.code == .invalidOperation, error.message.contains("revert") else { throw error }
                // Two edited copies of a row (see InterleavedMergeTests): the app reverts the one under
                // the server's key, giving up its edits, and acknowledges again.
                guard let result = try zip(batch.changes, ack.results).first(where: { change, result in
                    guard let new = result.newKey, !reverted.contains(new) else { return false }
                    return try c.store.read { try $0.row(change.table, key: new, includingDeleted: true)?.isPending } == true
                }) else {
                    print("the whole run:\n" + trace.joined(separator: "\n"))
                    Issue.record("client \(c.id): acknowledge refused: \(error)")
                    throw error
                }
                let (table, key) = (result.0.table, result.1.newKey!)
                let row = try #require(try c.store.read { try $0.row(table, key: key, includingDeleted: true) })
                for f in row.changedFields { oracle.discarded[c.id, default: []].insert("\(f) \(row[f])") }
                if row.status == .deleted { oracle.inserted(c.id, table, key) }  // the delete is given up too
                try c.store.write { try $0.revert(table, key: key) }
                reverted.insert(key)
                note("client \(c.id): acknowledge refused (two edited copies); revert \(table) \(key)")
            }
        }
        c.ack = nil
        oracle.batchOver(c.id, batch, ack.results)
        for (change, result) in zip(batch.changes, ack.results) {
            if change.kind == .insert { oracle.insertAcknowledged(c.id, change.table, change.key) }
            if let new = result.newKey, result.status == .ok { oracle.rekeyed(c.id, change.table, change.key, new) }
            if change.kind == .insert && result.status != .ok { oracle.insertRefused(c.id, change.table, change.key) }
        }
        try readAudits(c)
        note("client \(c.id): acknowledge \(ack.batchID)")
    }

    /// Pulls from the stored anchor and merges; with `snapshot`, pulls a full snapshot
    /// (`pull(since: nil)`) whatever the anchor, as an app's "refresh all" does.
    func pullAndMerge(_ c: StepClient, snapshot: Bool = false) async throws {
        let anchor = snapshot ? nil : try c.sync.anchor()
        let delta = try await server.pull(since: anchor)
        try c.sync.merge(delta)
        try readAudits(c)
        note("client \(c.id): merge\(snapshot ? " snapshot (refresh)" : "") \(anchor ?? "nil") → \(delta.anchor): \(delta.tables.map { "\($0.table) +\($0.upserts.map { $0.fields["id"]!.description }) -\($0.deletes)" })")
    }

    /// Resolves every deferred conflict, each for a random side.
    func resolveConflicts(_ c: StepClient) throws {
        for conflict in try c.sync.conflicts() {
            let server = g.below(2) == 0
            if server {
                for (f, v) in conflict.local { oracle.discarded[c.id, default: []].insert("\(f) \(v)") }
                if conflict.isDeletedLocally { oracle.conflictWentToServer(c.id, conflict.table, conflict.key) }
                // The server deleted the row: its side is no row, local edits of other fields included.
                if conflict.isDeletedOnServer { oracle.rowGivenUp(c.id, conflict.table, conflict.key) }
            }
            if server { oracle.resolvedServer(c.id, conflict) } else { oracle.resolvedLocal(c.id, conflict) }
            try c.sync.resolve(conflict.table, key: conflict.key, with: server ? .server : .local)
            note("client \(c.id): resolve \(conflict.table) \(conflict.key) \(conflict.fields) → \(server ? "server" : "local")")
        }
        try readAudits(c)
    }

    /// Reads the audits written since the last look: values a conflict gave up for the server's.
    func readAudits(_ c: StepClient) throws {
        let entries = try c.store.read { try $0.operations(from: c.lastLSN + 1) }
        for entry in entries {
            c.lastLSN = entry.lsn
            guard let audit = MergeAudit(entry), audit.conflict != nil else { continue }
            oracle.conflictDecided(c.id, entry.table, entry.key, audit)
            guard audit.resolution == .server else { continue }
            for d in audit.decisions where d.outcome == .conflictServer {
                oracle.discarded[c.id, default: []].insert("\(d.field) \(d.local)")
            }
            oracle.conflictWentToServer(c.id, entry.table, entry.key)
        }
    }

    /// Another writer changes the server directly: a field of a row, a delete, or a new row.
    func serverWrite() {
        let parents = server.rows("sparents")
        let children = server.rows("schildren")
        let parentKey: Value = parents.isEmpty || g.below(4) == 0 ? .null : parents.keys.sorted { $0.description < $1.description }[g.below(parents.count)].values[0]
        switch g.below(6) {
        case 0:
            let key = RowKey(.int(serverKeys.withLock { $0 += 1; return $0 }))
            server.write("sparents", key: key, ["name": fresh("s"), "color": g.below(2) == 0 ? .null : fresh("s")])
            note("server: insert parent \(key)")
        case 1:
            let key = RowKey(.int(serverKeys.withLock { $0 += 1; return $0 }))
            server.write("schildren", key: key, ["title": fresh("s"), "note": .null, "parent": parentKey])
            note("server: insert child \(key)")
        case 2, 3, 4:
            let all = parents.map { ("sparents", $0.key, $0.value) } + children.map { ("schildren", $0.key, $0.value) }
            guard !all.isEmpty else { return }
            let (table, key, row) = all.sorted { "\($0.0) \($0.1)" < "\($1.0) \($1.1)" }[g.below(all.count)]
            let fields = table == "sparents" ? ["name", "color"] : ["title", "note", "parent"]
            let field = fields[g.below(fields.count)]
            var full: [String: Value] = table == "sparents" ? ["name": .null, "color": .null] : ["title": .null, "note": .null, "parent": .null]
            for (f, v) in row { full[f] = v }
            // Now and then an undo: the field set back to a value it held earlier in the row's life
            // (a client's, say), not only to null.
            let earlier = (oracle.held[table]?[key]?[field] ?? []).filter { !$0.isNull && $0 != full[field] }
            let setBack = !earlier.isEmpty && g.below(4) == 0
            if setBack {
                full[field] = earlier[g.below(earlier.count)]
            } else {
                full[field] = field == "parent" ? parentKey : (field != "name" && field != "title" && g.below(4) == 0 ? .null : fresh("s"))
            }
            server.write(table, key: key, full)
            note("server: update \(table) \(key) \(field) = \(full[field]!)\(setBack ? " (set back)" : "")")
        default:
            let all = parents.keys.map { ("sparents", $0) } + children.keys.map { ("schildren", $0) }
            guard !all.isEmpty else { return }
            let (table, key) = all.sorted { "\($0.0) \($0.1)" < "\($1.0) \($1.1)" }[g.below(all.count)]
            server.write(table, key: key, nil)
            note("server: delete \(table) \(key)")
        }
        oracle.observe(server)
    }

    // MARK: The end

    /// Every client finishes its batch in flight and syncs, step by step, until nothing is
    /// pending and a whole round changes nothing on the server.
    func quiesce() async throws {
        for round in 0..<20 {
            let before = try await server.pull(since: nil).anchor
            for c in clients {
                if try c.sync.inFlightBatch() != nil {
                    while c.ack == nil { try await push(c) }
                    try acknowledge(c)
                }
                try await pullAndMerge(c)
                // Resolve every deferred conflict (each for a random side) until none is left.
                while try !c.sync.conflicts().isEmpty { try resolveConflicts(c) }
                // Upload until nothing is left, or the server answers a row with a conflict
                // (which the next round's pull settles).
                for _ in 0..<20 {
                    try freeze(c)
                    guard try c.sync.inFlightBatch() != nil else { break }
                    while c.ack == nil { try await push(c) }
                    let ack = c.ack!
                    try acknowledge(c)
                    if ack.results.contains(where: { $0.status != .ok }) { break }
                }
            }
            let after = try await server.pull(since: nil).anchor
            var pending = 0
            for c in clients { pending += try await c.store.read { try $0.pendingRows().count } }
            if before == after && pending == 0 { return }
            note("quiesce round \(round): \(pending) rows pending")
        }
    }

    func check(_ label: String) async throws {
        let tail = trace.suffix(60).joined(separator: "\n")
        var diverged = false
        for c in clients {
            for table in ["sparents", "schildren"] {
                let (theirs, ours) = (serverRows(server, table), try clientRows(c.store, table))
                guard theirs != ours else { continue }
                diverged = true
                // The rows that differ, to read beside the trace.
                print("client \(c.id), \(table): only on the server \(theirs.filter { !ours.contains($0) }), only here \(ours.filter { !theirs.contains($0) })")
            }
        }
        if diverged || !oracle.lost().isEmpty || !oracle.putBack.isEmpty { print("\(label): the whole run:\n" + trace.joined(separator: "\n")) }
        for c in clients {
            for table in ["sparents", "schildren"] {
                #expect(serverRows(server, table) == (try clientRows(c.store, table)), "\(label): client \(c.id) (\(c.policy.kind)) differs from the server in \(table)\n\(tail)")
            }
            #expect(try await c.store.read { try $0.pendingRows() }.isEmpty, "\(label): client \(c.id) still has pending rows")
            #expect(try c.sync.inFlightBatch() == nil, "\(label): client \(c.id) still has a batch in flight")
            #expect(try c.store.verify().isConsistent, "\(label): client \(c.id)'s store is inconsistent")
        }
        let lost = oracle.lost()
        #expect(lost.isEmpty, "\(label): edits lost: \(lost.joined(separator: "; "))\n\(tail)")
        #expect(oracle.putBack.isEmpty, "\(label): values put back over later ones: \(oracle.putBack.joined(separator: "; "))\n\(tail)")
    }
}

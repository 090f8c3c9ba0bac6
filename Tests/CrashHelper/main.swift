import Foundation
import Strata
import StrataSync

// A helper process for the crash, disk-full and reader-slot tests.
//
//   strata-crash-helper <store> <full|noMetaSync|noSync> <seed> [<file size limit in bytes>]
//     Writes until killed. Each iteration is one write transaction: it inserts `parts` rows
//     tagged with the iteration number and sets the counter row (id 0) to it; every few
//     iterations it also merges a server delta, freezes and acknowledges an upload batch, or
//     compacts the log. After each commit it prints "C <n>". With a file size limit
//     (RLIMIT_FSIZE, standing in for a full disk), the first failed write prints
//     "E <code> <message>" and the process exits 0 after one more attempt.
//
//   strata-crash-helper read-and-wait <store> <max readers>
//     Opens the store, begins a read transaction, prints "R", and waits to be killed.
//
//   strata-crash-helper check-readers <store> <max readers>
//     Opens the store, prints "S <stale reader slots cleared on open>", reads, prints "OK".
//
//   strata-crash-helper one-long-row <store> <operations>
//     Creates a table "t" with one row updated until the log holds <operations> operations on
//     it (for measuring `strata history` on a long history), prints "OK".
//
//   strata-crash-helper insert-and-exit <store> <id>
//     Opens the store, inserts row <id> into its table "t" (fields id, v) in one write, prints
//     "OK" and exits without closing: the process makes exactly that one commit (a close would
//     add a checkpoint's).
//   strata-crash-helper create-table-and-exit <store> <name>
//     Opens the store, creates table <name> (fields id, v) and inserts row 1 into it, prints
//     "OK" and exits without closing.
//
//   strata-crash-helper checkpoint <store>
//     Opens the store, checkpoints (its overlay is the log's tail, folded on open), prints "OK".
//
//   strata-crash-helper wide-row <store> <fields>
//     Creates a property bag "bag" with one pending row of <fields> fields (for measuring
//     `strata export` and `strata pending` on a wide row), prints "OK".

//
//   strata-crash-helper group-writer <store> <seed> <threads>
//     Writes from <threads> threads at once until killed, so commits form groups (group commit).
//     Thread t's iteration i inserts 5 rows tagged (t, i) and sets t's counter row (id t) to i;
//     about one closure in eight (chosen from the seed) then throws, its rows marked "doomed",
//     and only that closure must roll back. After each successful write it prints "C <t> <i>".
//
//   strata-crash-helper open-and-read <store> <none|quick|full>
//     Opens an existing store with that `checkAtOpen`, reads every row of every table, the
//     pending rows and the whole log, and prints "OK", or "E <error code> <message>" (the
//     library's open-and-read path, for the corruption campaign).
//
//   strata-crash-helper open <store> <create|existing>
//     Waits for a line on standard input (so that a test can start many at once), then opens the
//     store with `createIfMissing` true or false, and prints "ID <client id>" or
//     "E <error code> <message>".

let arguments = CommandLine.arguments
func usage() -> Never {
    FileHandle.standardError.write(Data("usage: strata-crash-helper <store> <full|noMetaSync|noSync> <seed> [<file size limit>] | read-and-wait <store> <max readers> | check-readers <store> <max readers>\n".utf8))
    exit(64)
}
func say(_ line: String) {
    // Written straight to the pipe (no buffering): the test reads what happened so far.
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

if arguments.count == 4, arguments[1] == "read-and-wait" || arguments[1] == "check-readers", let readers = UInt32(arguments[3]) {
    var options = StoreOptions()
    options.maxReaders = readers
    options.createIfMissing = false
    let store = try Store(path: arguments[2], options: options)
    if arguments[1] == "check-readers" {
        say("S \(store.staleReadersCleared)")
        _ = try store.read { try $0.lastLSN }
        say("OK")
        exit(0)
    }
    try store.read { _ in
        say("R")
        while true { sleep(60) }
    }
}

if arguments.count == 3, arguments[1] == "checkpoint" {
    var options = StoreOptions()
    options.createIfMissing = false
    let store = try Store(path: arguments[2], options: options)
    try store.checkpoint()
    say("OK")
    exit(0)
}

if arguments.count == 4, arguments[1] == "insert-and-exit", let id = Int64(arguments[3]) {
    var options = StoreOptions()
    options.createIfMissing = false
    let store = try Store(path: arguments[2], options: options)
    try store.write { try $0.insert("t", ["id": .int(id), "v": "from another process"]) }
    say("OK")
    exit(0)
}

if arguments.count == 4, arguments[1] == "create-table-and-exit" {
    var options = StoreOptions()
    options.createIfMissing = false
    let store = try Store(path: arguments[2], options: options)
    try store.createTable(.fixed(arguments[3], fields: [.int("id"), .string("v")]))
    try store.write { try $0.insert(arguments[3], ["id": 1, "v": "from another process"]) }
    say("OK")
    exit(0)
}

if arguments.count == 4, arguments[1] == "open-and-read", let check = OpenCheck(rawValue: arguments[3]) {
    var options = StoreOptions()
    options.createIfMissing = false
    options.checkAtOpen = check
    do {
        let store = try Store(path: arguments[2], options: options)
        try store.read { snap in
            for table in try snap.tables {
                try snap.forEachRow(table.name, includingDeleted: true) { _ in true }
            }
            _ = try snap.pendingRows()
            try snap.forEachOperation { _ in true }
        }
        store.close()
        say("OK")
    } catch let error as StrataError {
        say("E \(error.code) \(error.message)")
    } catch {
        say("E \(error)")
    }
    exit(0)
}

if arguments.count == 4, arguments[1] == "open" {
    var options = StoreOptions()
    options.createIfMissing = arguments[3] == "create"
    _ = readLine()
    do {
        let store = try Store(path: arguments[2], options: options)
        say("ID \(store.clientID)")
    } catch {
        say("E \(error.code) \(error.message)")
    }
    exit(0)
}

if arguments.count == 5, arguments[1] == "group-writer", let seed = UInt64(arguments[3]), let threads = Int(arguments[4]) {
    struct Planned: Error {}
    let store = try Store(path: arguments[2])
    try store.createTable(.fixed("group", fields: [.int("id"), .int("thread"), .int("iteration"), .string("payload")]))
    try store.write { tx in
        for t in 0..<threads where try tx.row("group", key: RowKey(.int(Int64(t)))) == nil {
            try tx.insert("group", ["id": .int(Int64(t)), "thread": .int(Int64(t)), "iteration": 0, "payload": ""])
        }
    }
    for t in 0..<threads {
        Thread {
            var i = Int(try! store.read { try $0.row("group", key: RowKey(.int(Int64(t))))?["iteration"].intValue ?? 0 })
            var rng = seed ^ UInt64(t + 1) &* 0x9E37_79B9_7F4A_7C15
            while true {
                i += 1
                rng = rng &* 6364136223846793005 &+ 1442695040888963407
                // About one closure in eight throws after editing: its rows say so, and must
                // never be seen after a rollback (the next attempt reuses their keys).
                let fails = rng >> 61 == 0
                do {
                    try store.write { tx in
                        for part in 0..<5 {
                            try tx.insert("group", ["id": .int(Int64(1_000_000 + t * 100_000 + i * 10 + part)), "thread": .int(Int64(t)),
                                                    "iteration": .int(Int64(i)), "payload": .string(fails ? "doomed" : String(repeating: "g", count: 200 * part))])
                        }
                        try tx.update("group", key: RowKey(.int(Int64(t))), ["iteration": .int(Int64(i))])
                        if fails { throw Planned() }
                    }
                    say("C \(t) \(i)")
                } catch is Planned {
                    i -= 1
                } catch {
                    say("E \(error)")
                    exit(1)
                }
            }
        }.start()
    }
    while true { sleep(60) }
}

if arguments.count == 4, arguments[1] == "one-long-row", let total = Int(arguments[3]) {
    var options = StoreOptions()
    options.durability = .noSync
    let store = try Store(path: arguments[2], options: options)
    try store.createTable(.fixed("t", fields: [.int("id"), .int("n"), .string("text")]))
    try store.write { try $0.insert("t", ["id": 1, "n": 0, "text": "a row with a long history"]) }
    var n = 1
    while n < total {
        try store.write { tx in
            for _ in 0..<min(10_000, total - n) {
                n += 1
                try tx.update("t", key: 1, ["n": .int(Int64(n))])
            }
        }
    }
    try store.flush()
    say("OK")
    exit(0)
}

if arguments.count == 4, arguments[1] == "wide-row", let fields = Int(arguments[3]) {
    var options = StoreOptions()
    options.durability = .noSync
    let store = try Store(path: arguments[2], options: options)
    try store.createTable(.propertyBag("bag", key: [.int("id")]))
    try store.write { try $0.insert("bag", ["id": 1]) }
    var next = 0
    while next < fields {
        let chunk = (next..<min(fields, next + 1_000)).map { ("f\($0)", Value.int(Int64($0))) }
        try store.write { try $0.update("bag", key: 1, FieldValues(chunk)) }
        next += chunk.count
    }
    try store.flush()
    say("OK")
    exit(0)
}

guard arguments.count == 4 || arguments.count == 5, let durability = Durability(rawValue: arguments[2]), var state = UInt64(arguments[3]) else { usage() }
let fileLimit = arguments.count == 5 ? UInt64(arguments[4]) : nil
if arguments.count == 5 && fileLimit == nil { usage() }
func random() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
}

var options = StoreOptions()
options.durability = durability
// A small map, so that map growth (and its retries) happens under the kills too.
options.initialMapSize = 256 * 1024
// The tests choose how often the overlay is checkpointed: after every commit, now and then, or
// never (the whole history stays a log tail for the next open to fold).
if let budget = ProcessInfo.processInfo.environment["STRATA_OVERLAY_BUDGET"].flatMap(Int.init) { options.overlayBudget = budget }
let store = try Store(path: arguments[1], options: options)
try store.createTable(.fixed("crash", fields: [.int("id"), .int("txn"), .int("part"), .string("payload")]))
if let fileLimit {
    // Past the limit a write fails with EFBIG instead of killing the process with SIGXFSZ.
    signal(SIGXFSZ, SIG_IGN)
    var limit = rlimit(rlim_cur: rlim_t(fileLimit), rlim_max: rlim_t(fileLimit))
    // Glibc declares the resources as an enum; Darwin and Musl as plain `Int32` macros.
    #if canImport(Glibc)
    let resource = Int32(RLIMIT_FSIZE.rawValue)
    #else
    let resource = RLIMIT_FSIZE
    #endif
    guard setrlimit(resource, &limit) == 0 else { fatalError("setrlimit failed") }
}
let sync = SyncClient(store: store, policy: .clientWins)
let parts = 5
var n = try store.read { try $0.row("crash", key: 0)?["txn"].intValue ?? 0 }
// Checked by the row, not by `n`: a writer killed after creating the counter row but before its
// first iteration leaves the row with txn 0, and inserting it again would fail.
if try store.read({ try $0.row("crash", key: 0) }) == nil {
    try store.write { try $0.insert("crash", ["id": 0, "txn": 0, "part": 0, "payload": ""]) }
}

/// One iteration of the writer.
@MainActor func iteration() throws {
    n += 1
    let payload = String(repeating: "x", count: Int(random() % 2000))
    try store.write { tx in
        for part in 0..<parts {
            try tx.insert("crash", ["id": .int(n * 100 + Int64(part)), "txn": .int(n), "part": .int(Int64(part)), "payload": .string(payload)])
        }
        try tx.update("crash", key: 0, ["txn": .int(n)])
    }
    say("C \(n)")
    if n % 4 == 0 {
        // A server change to an earlier row, merged in its own transaction.
        let target = Int64(1 + random() % UInt64(n)) * 100
        try sync.merge(ServerDelta(anchor: "a\(n)", tables: [
            TableDelta("crash", upserts: [ServerRow(["id": .int(target), "txn": .int(target / 100), "part": 0, "payload": .string("server \(n)")])]),
        ]))
    }
    if n % 7 == 0, let batch = try sync.nextBatch(maxRows: 10) {
        try sync.markSent(batch)
        try sync.acknowledge(BatchAck(batchID: batch.id, results: batch.changes.map { .ok($0.table, $0.key) }))
    }
    if n % 10 == 0 { try store.compact(retaining: .operations(Int(random() % 60))) }
}

// A pause between iterations (µs), for tests whose reader must keep up with the writer.
let pause = ProcessInfo.processInfo.environment["STRATA_HELPER_PAUSE_US"].flatMap(UInt32.init) ?? 0
while true {
    if pause > 0 { usleep(pause) }
    do {
        try iteration()
    } catch let error as StrataError where fileLimit != nil {
        say("E \(error.code) \(error.message)")
        // The store must still refuse cleanly, not crash, when asked again.
        n -= 1
        do { try iteration() } catch { say("E again") }
        exit(0)
    }
}

import Foundation
import Strata
import StrataSync

// A process that writes to a store until it is killed, for the crash tests. Usage:
//   strata-crash-helper <store> <full|noMetaSync|noSync> <seed>
// Each iteration is one write transaction: it inserts `parts` rows tagged with the iteration
// number and sets the counter row (id 0) to it; every few iterations it also merges a server
// delta and freezes and acknowledges an upload batch. After each commit it prints "C <n>".

let arguments = CommandLine.arguments
guard arguments.count == 4, let durability = Durability(rawValue: arguments[2]), var state = UInt64(arguments[3]) else {
    FileHandle.standardError.write(Data("usage: strata-crash-helper <store> <full|noMetaSync|noSync> <seed>\n".utf8))
    exit(64)
}
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
let store = try Store(path: arguments[1], options: options)
try store.createTable(.fixed("crash", fields: [.int("id"), .int("txn"), .int("part"), .string("payload")]))
let sync = SyncClient(store: store, policy: .clientWins)
let parts = 5
var n = try store.read { try $0.row("crash", key: 0)?["txn"].intValue ?? 0 }
if n == 0 { try store.write { try $0.insert("crash", ["id": 0, "txn": 0, "part": 0, "payload": ""]) } }
while true {
    n += 1
    let payload = String(repeating: "x", count: Int(random() % 2000))
    try store.write { tx in
        for part in 0..<parts {
            try tx.insert("crash", ["id": .int(n * 100 + Int64(part)), "txn": .int(n), "part": .int(Int64(part)), "payload": .string(payload)])
        }
        try tx.update("crash", key: 0, ["txn": .int(n)])
    }
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
    // Written straight to the pipe (no buffering): the test reads what was committed.
    FileHandle.standardOutput.write(Data("C \(n)\n".utf8))
}

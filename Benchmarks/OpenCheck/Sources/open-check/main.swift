import Foundation
import Strata

// Usage: open-check <MB> [<MB> …] [--keep <folder>]
// For each size: builds a store whose data.mdb holds about that many MB (rows of a to-do table,
// each edited once, durability noSync), closes it, then times in this process, with the file in
// the page cache (each figure the median of its runs, after one untimed run):
// - Store(path:) + close() with checkAtOpen .none, .quick and .full;
// - an open after an unclean close (the marker left, as a crash leaves it) with .quick;
// - Store.check quick and full.

func median(_ xs: [Duration]) -> Duration { xs.sorted()[xs.count / 2] }
func ms(_ d: Duration) -> String {
    let (s, a) = d.components
    return String(format: "%.2f ms", Double(s) * 1000 + Double(a) / 1e15)
}
func time(_ runs: Int, _ body: () throws -> Void) rethrows -> Duration {
    try body()
    var all: [Duration] = []
    for _ in 0..<runs {
        let start = ContinuousClock.now
        try body()
        all.append(ContinuousClock.now - start)
    }
    return median(all)
}

let arguments = CommandLine.arguments.dropFirst()
let sizes = arguments.compactMap(Int.init)
let root = FileManager.default.temporaryDirectory.appendingPathComponent("open-check-\(UUID().uuidString)").path
defer { try? FileManager.default.removeItem(atPath: root) }

for megabytes in sizes {
    let path = root + "/\(megabytes)"
    var options = StoreOptions()
    options.durability = .noSync
    options.checkAtOpen = .none
    let build = ContinuousClock.now
    do {
        let store = try Store(path: path, options: options)
        try store.createTable(.fixed("tasks", fields: [.int("id"), .string("title"), .string("notes"), .int("priority", default: 0)]))
        var next: Int64 = 0
        while store.sizeInBytes < megabytes << 20 {
            try store.write { tx in
                for _ in 0..<5000 {
                    next += 1
                    try tx.insert("tasks", ["id": .int(next), "title": .string("task \(next)"), "notes": .string(String(repeating: "n", count: Int(next % 200))), "priority": .int(next % 5)])
                }
            }
            try store.write { tx in
                for id in stride(from: next - 4999, through: next, by: 3) { try tx.update("tasks", key: .init(.int(id)), ["priority": .int(9)]) }
            }
        }
        try store.flush()
        store.close()
    }
    let bytes = (try FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? Int) ?? 0
    print("store of \(bytes >> 20) MB (data.mdb), built in \(ContinuousClock.now - build)")
    for check in OpenCheck.allCases {
        var o = StoreOptions()
        o.checkAtOpen = check
        let runs = check == .full ? 5 : 50
        let t = try time(runs) { try Store(path: path, options: o).close() }
        print("  open + close, checkAtOpen .\(check): \(ms(t))")
    }
    var quick = StoreOptions()
    quick.checkAtOpen = .quick
    let afterCrash = try time(5) {
        FileManager.default.createFile(atPath: path + "/strata-open.marker", contents: Data())
        try Store(path: path, options: quick).close()
    }
    print("  open + close after an unclean close (marker left), .quick chosen: \(ms(afterCrash))")
    let quickCheck = try time(50) { _ = try Store.check(at: path, options: .quick) }
    let fullCheck = try time(5) { _ = try Store.check(at: path) }
    let report = try Store.check(at: path)
    print("  Store.check quick: \(ms(quickCheck)); full: \(ms(fullCheck)) (\(report.pagesRead) pages, \(report.isClean ? "clean" : "NOT clean"))")
    try? FileManager.default.removeItem(atPath: path)
}

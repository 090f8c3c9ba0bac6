import Foundation
import LMDB

/// LMDB with nothing on top: the engine's own limit for what Strata's commits do (append records
/// under increasing 8-byte big-endian keys, durably). One ~100-byte record per edit, `perCommit`
/// records per commit, `count` records; returns records per second. The log first holds
/// `prefill` records, written in one commit before the clock starts: a commit's cost grows with
/// the depth of the tree it appends to (on this machine, 200,000 records cost about 4% of the
/// durable one-record rate), so the peer starts from the log length Strata's edits start from.
public enum RawLMDB {
    public static func appendRate(folder: String, count: Int, perCommit: Int, prefill: Int = 0) throws -> Double {
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        var options = EnvironmentOptions()
        options.mapSize = 1 << 30
        options.syncMode = .full
        let env = try Environment(path: folder, options: options)
        let db = try env.openDatabase("log")
        let value = [UInt8](repeating: 0x5A, count: 100)
        var next: UInt64 = 1
        if prefill > 0 {
            // One commit, not timed.
            try env.write { txn in
                while next <= UInt64(prefill) {
                    var key = next.bigEndian
                    try withUnsafeBytes(of: &key) { k in
                        try value.withUnsafeBytes { v in try txn.put(k, v, in: db, flags: .append) }
                    }
                    next += 1
                }
            }
        }
        let target = next + UInt64(count)
        let start = ContinuousClock.now
        while next < target {
            try env.write { txn in
                let end = min(next + UInt64(perCommit), target)
                while next < end {
                    var key = next.bigEndian
                    try withUnsafeBytes(of: &key) { k in
                        try value.withUnsafeBytes { v in try txn.put(k, v, in: db, flags: .append) }
                    }
                    next += 1
                }
            }
        }
        let d = ContinuousClock.now - start
        return Double(count) / (Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18)
    }
}

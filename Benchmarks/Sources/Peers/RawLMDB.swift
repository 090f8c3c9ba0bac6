import Foundation
import LMDB

/// LMDB with nothing on top: the engine's own limit for what Strata's commits do (append records
/// under increasing 8-byte big-endian keys, durably). One ~100-byte record per record, `perCommit`
/// records per commit, `count` records; returns records per second.
public enum RawLMDB {
    public static func appendRate(folder: String, count: Int, perCommit: Int) throws -> Double {
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        var options = EnvironmentOptions()
        options.mapSize = 1 << 30
        options.syncMode = .full
        let env = try Environment(path: folder, options: options)
        let db = try env.openDatabase("log")
        let value = [UInt8](repeating: 0x5A, count: 100)
        var next: UInt64 = 1
        let start = ContinuousClock.now
        while next <= UInt64(count) {
            try env.write { txn in
                let end = min(next + UInt64(perCommit), UInt64(count) + 1)
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

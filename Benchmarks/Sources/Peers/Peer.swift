import Foundation
import StrataWorkload

/// A system measured on the reference workload: Strata or one of the SQLite peers.
public protocol Peer: AnyObject {
    var name: String { get }
    /// Builds whatever the system needs from the workload, before any timing.
    func prepare(_ workload: ReferenceWorkload)
    /// Inserts the preload rows in one transaction.
    func preload() throws
    /// Makes the preloaded rows count as the server's, so that "pending" means "since the
    /// preload" (not timed: Strata records the acknowledgement, SQLite remembers a sequence number).
    func markPreloadSynced() throws
    /// Applies `range` of the edit stream in one transaction.
    func applyEdits(_ range: Range<Int>) throws
    /// Produces every change since the preload, coalesced per row, as one buffer; returns its size.
    func pendingPayload() throws -> Int
    /// Rebuilds the table from the log alone into an empty store; returns whether it equals the live one.
    func rebuildAndCheck() throws -> Bool
    /// Bytes on disk.
    var sizeOnDisk: Int { get }
}

/// Resident memory from /proc (Linux).
public enum Memory {
    /// Resets the peak resident size, so that a phase can measure its own peak.
    public static func resetPeak() {
        try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
    }

    public static var peak: Int { status("VmHWM") }
    public static var resident: Int { status("VmRSS") }

    private static func status(_ field: String) -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            return (line.split(separator: " ").compactMap { Int($0) }.first ?? 0) * 1024
        }
        return 0
    }
}

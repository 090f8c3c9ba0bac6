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

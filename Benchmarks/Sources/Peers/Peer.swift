import Foundation
import Strata
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
    /// Time travel: row `id`'s values (in ``ReferenceWorkload/columns`` order) right after the
    /// first `edits` edits, `nil` when it did not exist then. `edits` is a multiple of the batch
    /// size (a transaction boundary). `.none` when the system keeps no history (plain SQLite).
    func row(_ id: Int64, afterEdits edits: Int, batch: Int) throws -> [Value]??
    /// The merge phase's local edits: a new title on rows 1…`count`, in one transaction.
    func editTitles(_ count: Int) throws
    /// Merges `delta` (the merge phase's server rows, see ``MergeWorkload``), server wins on
    /// conflicts; returns false when the system has no merge.
    func merge(_ delta: MergeWorkload) throws -> Bool
    /// Writes what commits left for later into the main file: Strata's overlay into its views,
    /// SQLite's WAL into the database (`wal_checkpoint(TRUNCATE)`).
    func checkpoint() throws
    /// Reads row `id` in a read transaction of its own; returns whether it exists.
    func readRow(_ id: Int64) throws -> Bool
}

/// The merge phase: after the preload, the device edits the title of rows 1…`pending`; then a
/// server delta arrives with every preloaded row's priority changed, and for rows 1…`conflicting`
/// a different title too (a conflict, which the server wins).
public struct MergeWorkload: Sendable {
    public let rows: Int
    public let pending: Int
    public let conflicting: Int
    public init(rows: Int, pending: Int, conflicting: Int) {
        self.rows = rows
        self.pending = pending
        self.conflicting = conflicting
    }
    public func serverPriority(_ id: Int64) -> Int64 { id % 5 == 4 ? 0 : id % 5 + 1 }
    public func serverTitle(_ id: Int64) -> String? { id <= Int64(conflicting) ? "server \(id)" : nil }
    public static func localTitle(_ id: Int64) -> String { "local \(id)" }
}

import Foundation
import Strata

/// Where a pull stands: what to ask the server for next.
///
/// A new pull is `PullCursor(since: anchor)`; each ``PulledPage`` names the cursor of the page
/// after it. The cursor is opaque to the app: `sync` stores it with each page it merges, so a sync
/// that is killed or loses its network resumes at the next page.
public struct PullCursor: Sendable, Codable, Hashable {
    /// The anchor the pull started from; `nil` for a snapshot (every row).
    public var since: String?
    /// The version the server runs the pull up to, fixed by its first page (`nil` before it).
    public var until: String?
    /// Where the next page starts: for an incremental pull the anchor of the last page, for a
    /// snapshot the server's position after its last row (opaque).
    public var after: String?

    /// The cursor of a pull's first page, from `anchor` (`nil`: a snapshot).
    public init(since anchor: String?) {
        self.since = anchor
    }

    /// A cursor at any point of a pull.
    public init(since: String?, until: String?, after: String?) {
        self.since = since
        self.until = until
        self.after = after
    }

    /// Whether this pull is a snapshot of every row (no anchor to continue from).
    public var isSnapshot: Bool { since == nil }
}

/// One page of a pull: a delta, and where the next page starts.
public struct PulledPage: Sendable {
    /// The page's changes. An incremental page is a delta of its own (it continues from the
    /// previous page's anchor); the pages of a snapshot are parts of one snapshot.
    public var delta: ServerDelta
    /// The cursor of the next page; `nil` when this page is the last.
    public var next: PullCursor?

    /// A page, and the cursor of the one after it (`nil`: the last).
    public init(delta: ServerDelta, next: PullCursor?) {
        self.delta = delta
        self.next = next
    }
}

extension SyncTransport {
    /// A transport that does not page answers the whole pull as one page: ``SyncTransport/pull(since:)``.
    public func pullPage(_ cursor: PullCursor) async throws -> PulledPage {
        PulledPage(delta: try await pull(since: cursor.since), next: nil)
    }
}

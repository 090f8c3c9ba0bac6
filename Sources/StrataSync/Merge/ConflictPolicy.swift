import Foundation
import Strata

/// How a merge settles a conflict: a field (or a whole row) changed both on this device and on
/// the server, to different results, since the server last confirmed it.
///
/// Choose one per ``SyncClient`` (the default), per table, and per ``SyncClient/merge(_:policy:dryRun:)``
/// call; the most specific wins.
public enum ConflictPolicy: Sendable {
    /// The server's values replace the local ones. The local values stay in the audit record.
    case serverWins
    /// The local values stay; their originals become the server's values, so the next upload
    /// carries the right "old" values.
    case clientWins
    /// The later change wins: the server row's ``ServerRow/timestamp`` against the time of the
    /// row's last local edit. Ties, and a server row without a timestamp, go to the server, so
    /// every client decides the same way.
    case lastWriterWins
    /// Keep both: the row keeps its local values with the server's as originals, is marked
    /// conflicted, and is held back from upload until the app resolves it
    /// (``SyncClient/resolve(_:key:with:)``).
    case deferred
    /// The app decides, seeing the base, local and server values.
    case custom(@Sendable (Conflict) -> Resolution)

    /// Which policy this is, without a custom resolver's closure: what ``MergeAudit/policy`` and
    /// ``MergeReport/ConflictRecord/policy`` record.
    public var kind: Kind {
        switch self {
        case .serverWins: .serverWins
        case .clientWins: .clientWins
        case .lastWriterWins: .lastWriterWins
        case .deferred: .deferred
        case .custom: .custom
        }
    }

    /// The policy that settled a conflict, as recorded in a merge's audit and report.
    ///
    /// The raw values are what audit records hold in the log (and what the CLI prints): they
    /// must not change, or the audits of existing stores would no longer read.
    public enum Kind: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
        /// ``ConflictPolicy/serverWins``.
        case serverWins = "server wins"
        /// ``ConflictPolicy/clientWins``.
        case clientWins = "client wins"
        /// ``ConflictPolicy/lastWriterWins``.
        case lastWriterWins = "last writer wins"
        /// ``ConflictPolicy/deferred``.
        case deferred = "deferred"
        /// ``ConflictPolicy/custom(_:)``.
        case custom = "custom resolver"

        /// The raw value: `server wins`, `client wins`, `last writer wins`, `deferred` or `custom resolver`.
        public var description: String { rawValue }
    }
}

/// A conflict, as a custom resolver sees it.
public struct Conflict: Sendable, Hashable {
    /// What collided.
    public enum Kind: UInt8, Sendable, Hashable, Codable {
        /// Fields changed on both sides to different values.
        case fields = 1
        /// Both sides inserted a row with the same key; there is no common base.
        case insertInsert = 2
        /// The device changed the row; the server deleted it.
        case localUpdateServerDelete = 3
        /// The device deleted the row; the server changed it.
        case localDeleteServerUpdate = 4
    }

    /// The row's table.
    public let table: String
    /// The row's primary key.
    public let key: RowKey
    /// What collided.
    public let kind: Kind
    /// The fields in conflict: for ``Kind/fields`` and ``Kind/insertInsert``, those the two sides
    /// set to different values; for a delete conflict, those the surviving side changed (the
    /// device's edits when the server deleted the row, the server's changes when the device did).
    /// Resolving a ``Kind/localUpdateServerDelete`` for the server removes the whole row, fields
    /// not listed here included.
    public let fields: [String]
    /// The values the server last confirmed before this delta (empty for ``Kind/insertInsert``).
    public let base: [String: Value]
    /// The local current values.
    public let local: [String: Value]
    /// The server's values (empty when the server deleted the row).
    public let server: [String: Value]
    /// When the row was last edited on this device.
    public let localTimestamp: Date?
    /// When the server says the row last changed.
    public let serverTimestamp: Date?
}

/// What a custom resolver decides.
public enum Resolution: Sendable, Hashable {
    /// Take the server's side (for a server delete: remove the row).
    case server
    /// Keep the local side (for a local delete: keep it deleted; for a server delete: upload the
    /// row again as an insert).
    case local
    /// Keep the row with these current values for the conflicting fields (fields not listed
    /// take the server's value); the server's values become the originals.
    case merged([String: Value])
    /// Keep both and mark the row conflicted, held back until the app resolves it.
    case deferred

    /// Which side was taken, without merged values: what ``MergeAudit/resolution`` and
    /// ``MergeReport/ConflictRecord/resolution`` record.
    public var kind: Kind {
        switch self {
        case .server: .server
        case .local: .local
        case .merged: .merged
        case .deferred: .deferred
        }
    }

    /// How a conflict was settled, as recorded in a merge's audit and report.
    ///
    /// The raw values are what audit records hold in the log (and what the CLI prints): they
    /// must not change, or the audits of existing stores would no longer read.
    public enum Kind: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
        /// ``Resolution/server``.
        case server
        /// ``Resolution/local``.
        case local
        /// ``Resolution/merged(_:)``.
        case merged
        /// ``Resolution/deferred``: left for the app to resolve.
        case deferred

        /// The raw value: `server`, `local`, `merged` or `deferred`.
        public var description: String { rawValue }
    }
}

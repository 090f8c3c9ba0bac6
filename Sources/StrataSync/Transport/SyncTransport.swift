import Foundation
import Strata

/// How a client reaches its server. The transport is the app's (HTTP, WebSocket, …); Strata
/// ships `InMemorySyncServer` (in the `StrataTesting` product) for tests and examples.
public protocol SyncTransport: Sendable {
    /// The changes since `anchor` (`nil`: everything).
    func pull(since anchor: String?) async throws -> ServerDelta
    /// One page of a pull, and the cursor of the next: `sync` merges each page as it arrives, in
    /// its own transaction, so that memory is bounded by a page and a sync that stops resumes at
    /// the next page. The default answers the whole ``pull(since:)`` as one page.
    func pullPage(_ cursor: PullCursor) async throws -> PulledPage
    /// Uploads a batch and returns the server's answer. A batch may arrive more than once (after
    /// a lost response); the server recognises it by its id.
    func push(_ batch: Batch) async throws -> BatchAck
}

/// Thrown by a ``SyncTransport`` when the server can no longer serve this client incrementally:
/// the client must pull a full snapshot and reset its store (``SyncClient/reset(with:keepLocalChanges:)``).
///
/// `sync(with:)` does not retry it: retrying cannot help.
public struct ResetRequired: Error, Sendable, Hashable, CustomStringConvertible {
    /// Why the server wants a reset.
    public enum Reason: String, Sendable, Codable, Hashable {
        /// The server does not know this client (it was forgotten, or the server's data was
        /// replaced).
        case unknownClient
        /// The anchor the client pulls from is older than the server keeps changes for.
        case anchorExpired
    }

    /// Why the server wants a reset.
    public var reason: Reason
    /// The server's own words, for logs.
    public var message: String

    /// A reset request for `reason`, with the server's message.
    public init(_ reason: Reason, message: String = "") {
        self.reason = reason
        self.message = message
    }

    public var description: String {
        "the server asks for a client reset (\(reason.rawValue))" + (message.isEmpty ? "" : ": \(message)")
    }
}

/// Thrown by a ``SyncTransport``'s ``SyncTransport/push(_:)`` when the server refuses a batch as
/// a whole, for a reason that sending the same batch again cannot fix.
///
/// `sync(with:)` does not retry it; it settles it (see ``Reason``) and goes on with the sync.
public struct BatchRefused: Error, Sendable, Hashable, CustomStringConvertible {
    /// Why the server refused the batch.
    public enum Reason: String, Sendable, Codable, Hashable {
        /// The server holds another batch, with other changes, under this batch's id: the
        /// client's batch counter went back (a store restored from a backup, or a briefcase
        /// imported with its properties). Answering with the stored batch's acknowledgement
        /// would settle rows the server never saw. `sync(with:)` moves the counter past
        /// ``BatchRefused/highestBatchNumber`` and freezes the rows again under a new id.
        case idReused
        /// The batch is larger than the server takes. `sync(with:)` freezes its rows again into
        /// batches of at most half its size; a row refused alone is set aside
        /// (``SyncClient/rejectedRows()``) with the server's message.
        case tooLarge
        /// The server cannot take the batch and names no row (a payload it cannot read, a value
        /// its database refuses). `sync(with:)` sets every row of the batch aside with the
        /// server's message, so that the rest of the sync goes on; the app retries or discards
        /// them (``SyncClient/retryRejected(_:key:)``, ``SyncClient/discardRejected(_:key:)``).
        case invalid
    }

    /// Why the server refused the batch.
    public var reason: Reason
    /// The server's own words, for logs and for the rows it sets aside.
    public var message: String
    /// With ``Reason/idReused``: the highest batch number the server holds for this client, if
    /// it says. Without it the client cannot know which id is free, and `sync(with:)` throws.
    public var highestBatchNumber: UInt64?

    /// A refusal for `reason`, with the server's message.
    public init(_ reason: Reason, message: String = "", highestBatchNumber: UInt64? = nil) {
        self.reason = reason
        self.message = message
        self.highestBatchNumber = highestBatchNumber
    }

    public var description: String {
        "the server refused the batch (\(reason.rawValue))" + (message.isEmpty ? "" : ": \(message)")
    }
}

/// Where a sync stands, for a progress bar.
public struct SyncProgress: Sendable, Hashable {
    /// A step of a sync round.
    public enum Phase: String, Sendable {
        /// Fetching the delta since the stored anchor.
        case pull
        /// Merging it into the store.
        case merge
        /// Uploading batches and applying their acknowledgements.
        case push
    }
    /// Where a phase stands.
    public enum Status: String, Sendable {
        /// Under way; the counts say how far.
        case inProgress
        /// The pull or the merge finished.
        case ok
        /// A transport call failed; it is retried, or its error is thrown.
        case error
        /// Every batch was uploaded and acknowledged.
        case complete
    }

    /// The phase this report is about.
    public var phase: Phase
    /// Where the phase stands.
    public var status: Status
    /// Per table: rows to process in this phase, and rows processed so far.
    public var total: [String: Int] = [:]
    /// Per table: rows processed so far in this phase.
    public var processed: [String: Int] = [:]

    /// Rows still to process, per table.
    public var remaining: [String: Int] { total.mapValues { $0 }.merging(processed) { $0 - $1 } }
}

/// What ``SyncClient/sync(with:maxAttempts:backoff:maxBatchRows:maxBatchBytes:onReset:progress:)``
/// does when the transport throws ``ResetRequired``.
public enum ClientResetPolicy: Sendable, Hashable {
    /// Pull a full snapshot and reset, re-applying every unsynced local edit on top of it
    /// (``SyncClient/reset(with:keepLocalChanges:)`` with `keepLocalChanges: true`). The default:
    /// nothing the user did is lost.
    case keepLocalChanges
    /// Pull a full snapshot and reset, discarding unsynced local edits.
    case discardLocalChanges
    /// Do not reset: `sync` throws the ``ResetRequired`` error, for the app to decide.
    case fail
}

/// A client reset that ``SyncClient/sync(with:maxAttempts:backoff:maxBatchRows:maxBatchBytes:onReset:progress:)`` performed.
public struct ClientResetReport: Sendable {
    /// Why the server asked for it.
    public var reason: ResetRequired.Reason
    /// The server's message.
    public var message: String
    /// Whether unsynced local edits were re-applied (else discarded).
    public var keptLocalChanges: Bool
    /// What the reset changed (`rowsApplied`: rows whose state it set).
    public var merge: MergeReport
}

/// What a ``SyncClient/sync(with:maxAttempts:backoff:maxBatchRows:maxBatchBytes:onReset:progress:)`` call did.
public struct SyncReport: Sendable {
    /// What the pull's merge did (empty after a client reset: see ``reset``).
    public var merge = MergeReport()
    /// Batches uploaded and acknowledged.
    public var batches = 0
    /// What each acknowledgement did, in upload order.
    public var acks: [AckReport] = []
    /// Transport calls that failed and were tried again.
    public var retries = 0
    /// The client reset this sync performed because the server asked for one, if any. The
    /// snapshot replaced the pull: ``merge`` is then empty.
    public var reset: ClientResetReport?
}

extension SyncClient {
    /// One round of sync: pull the delta since the stored anchor and merge it, then upload the
    /// pending rows batch by batch and apply each acknowledgement.
    ///
    /// A failing transport call is retried up to `maxAttempts` times with exponential back-off,
    /// then the error is thrown. Nothing is lost when it is: a batch stays in flight, and the next
    /// call sends the very same batch first. Rows the server answers with a conflict or a retry
    /// wait for the next call (after the next pull).
    ///
    /// **Client reset.** When the transport throws ``ResetRequired`` (the server forgot this
    /// client, or the stored anchor is older than the changes it keeps), retrying cannot help, so
    /// it is not retried: `sync` pulls a full snapshot (`pull(since: nil)`), resets the store with
    /// it by `onReset` (``reset(with:keepLocalChanges:)``; any batch in flight is dropped, its
    /// rows stay pending), reports it in ``SyncReport/reset``, and goes on to upload. With
    /// ``ClientResetPolicy/fail`` the error is thrown instead and nothing is changed.
    ///
    /// **Refused batches.** When the transport throws ``BatchRefused``, sending the batch again
    /// cannot help, so it is not retried: for ``BatchRefused/Reason/idReused`` (the server holds
    /// another batch under this id) the batch is dropped, the batch counter moves past the
    /// server's highest number for this client, and the rows, still pending, go up again under a
    /// new id; for ``BatchRefused/Reason/tooLarge`` the rows go up again in batches of at most
    /// half the refused one's size (a refused row alone is set aside); for
    /// ``BatchRefused/Reason/invalid`` every row of the batch is set aside with the server's
    /// message (``rejectedRows()``), reported in ``SyncReport/acks``, and the sync goes on.
    ///
    /// - Parameters:
    ///   - transport: the server connection: ``SyncTransport/pull(since:)`` and ``SyncTransport/push(_:)``.
    ///   - maxAttempts: how many times a failing transport call is tried before its error is thrown.
    ///   - backoff: the wait before the first retry; it doubles with each further attempt.
    ///   - maxBatchRows: the most rows in one upload batch (default 500).
    ///   - maxBatchBytes: the most bytes one upload batch takes as ``WireFormat`` encodes it,
    ///     envelope included (default 1 MiB); a single larger row still goes, alone.
    ///   - onReset: what to do with unsynced local edits when the server asks for a client reset.
    ///   - progress: called as each phase advances (per phase and table: total, processed, remaining).
    /// - Throws: the transport's error after `maxAttempts`; ``ResetRequired`` with `.fail`, or
    ///   when the server asks again right after a reset; ``BatchRefused`` for a reused id when
    ///   the server does not say its highest batch number, or still refuses the batch after it
    ///   was renumbered three times; `StrataError` from merging or batching;
    ///   `StrataError` `invalidOperation`, before anything is pulled, when `maxBatchRows` or
    ///   `maxBatchBytes` is below 1.
    public func sync(
        with transport: some SyncTransport, maxAttempts: Int = 5, backoff: Duration = .milliseconds(50),
        maxBatchRows: Int = 500, maxBatchBytes: Int = 1 << 20, onReset: ClientResetPolicy = .keepLocalChanges,
        progress: (@Sendable (SyncProgress) -> Void)? = nil
    ) async throws -> SyncReport {
        try BatchingRules.checkLimits(maxRows: maxBatchRows, maxBytes: maxBatchBytes, ("maxBatchRows", "maxBatchBytes"))
        var report = SyncReport()
        func attempt<T>(_ phase: SyncProgress.Phase, _ body: () async throws -> T) async throws -> T {
            var delay = backoff
            for n in 1... {
                do {
                    return try await body()
                } catch {
                    // Asking again does not make the server remember this client, nor take a
                    // batch it refused.
                    guard n < maxAttempts, !(error is ResetRequired), !(error is BatchRefused) else {
                        progress?(SyncProgress(phase: phase, status: .error))
                        throw error
                    }
                    report.retries += 1
                    try await Task.sleep(for: delay)
                    delay *= 2
                }
            }
            fatalError("unreachable")
        }
        // Runs `body`; on ResetRequired, resets from a full snapshot (once) and answers nil.
        func resettingIfAsked<T>(_ body: () async throws -> T) async throws -> T? {
            do {
                return try await body()
            } catch let asked as ResetRequired {
                guard onReset != .fail, report.reset == nil else { throw asked }
                report.reset = try await streamReset(asked: asked, keepLocalChanges: onReset == .keepLocalChanges, fetch: fetchPage, progress: progress)
                return nil
            }
        }
        func fetchPage(_ cursor: PullCursor) async throws -> PulledPage {
            try await attempt(.pull) { try await transport.pullPage(cursor) }
        }

        // A client reset that stopped before its last page goes on first, whatever `onReset`
        // says now: the store holds part of the snapshot.
        if try await store.read({ try Self.resetProgress($0) }) != nil {
            report.reset = try await streamReset(asked: nil, keepLocalChanges: true, fetch: fetchPage, progress: progress)
        }

        var renumbered = 0
        // Lowered for the rest of the call when the server refuses a batch as too large.
        var byteLimit = maxBatchBytes
        // Sends a batch and returns the server's answer; nil when the batch was dropped instead
        // (by a reset, or by a refusal whose rows are frozen again: see `settle`).
        func upload(_ batch: Batch) async throws -> BatchAck? {
            do {
                return try await resettingIfAsked { try await attempt(.push) { try await transport.push(batch) } }
            } catch let refused as BatchRefused {
                // Moving past the server's highest number settles a reused id at once; a server
                // that keeps refusing the new ids would otherwise hold the sync in this loop.
                if refused.reason == .idReused {
                    renumbered += 1
                    guard renumbered <= 3 else { throw refused }
                }
                switch try settle(refused, of: batch) {
                case .refreeze(let limit):
                    if let limit { byteLimit = min(byteLimit, limit) }
                    return nil
                case .answer(let ack):
                    return ack
                }
            }
        }

        // A batch still in flight (its response was lost last time) goes first, so that the
        // pull sees the server with it applied.
        if let (batch, _) = try inFlightBatch() {
            if let ack = try await upload(batch) {
                report.acks.append(try acknowledge(ack))
                report.batches += 1
            }
        }

        if report.reset == nil {
            progress?(SyncProgress(phase: .pull, status: .inProgress))
            // Page by page, each merged as it arrives (`SyncClient+Pull.swift`).
            let merged = try await resettingIfAsked {
                try await pullAndMerge(transport, fetch: fetchPage, progress: progress)
            }
            if let merged {
                progress?(SyncProgress(phase: .pull, status: .ok))
                report.merge = merged
            }
        }

        var total: [String: Int] = [:]
        for row in try await store.read({ try $0.pendingRows() }) where !row.isConflicted { total[row.table, default: 0] += 1 }
        var processed: [String: Int] = [:]
        var skip = Set<RowID>()
        progress?(SyncProgress(phase: .push, status: .inProgress, total: total, processed: processed))
        while let batch = try nextBatch(maxRows: maxBatchRows, maxBytes: byteLimit, excluding: skip) {
            try markSent(batch)
            // A reset asked for during the upload, or a refusal that freezes the rows again: the
            // batch is dropped and its rows, still pending, go up in the batches that follow.
            guard let ack = try await upload(batch) else { continue }
            let applied = try acknowledge(ack)
            report.batches += 1
            report.acks.append(applied)
            for (change, result) in zip(batch.changes, ack.results) {
                processed[change.table, default: 0] += 1
                if result.status != .ok { skip.insert(Self.rowID(change.table, change.key)) }
            }
            progress?(SyncProgress(phase: .push, status: .inProgress, total: total, processed: processed))
        }
        progress?(SyncProgress(phase: .push, status: .complete, total: total, processed: processed))
        return report
    }
}

/// `localizedDescription` is the error's description: the reason and the server's words.
extension ResetRequired: LocalizedError {
    public var errorDescription: String? { description }
}

/// `localizedDescription` is the error's description: the reason and the server's words.
extension BatchRefused: LocalizedError {
    public var errorDescription: String? { description }
}


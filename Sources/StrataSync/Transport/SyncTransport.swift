import Foundation
import Strata

/// How a client reaches its server. The transport is the app's (HTTP, WebSocket, …); Strata
/// ships ``InMemorySyncServer`` for tests and examples.
public protocol SyncTransport: Sendable {
    /// The changes since `anchor` (`nil`: everything).
    func pull(since anchor: String?) async throws -> ServerDelta
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

    public init(_ reason: Reason, message: String = "") {
        self.reason = reason
        self.message = message
    }

    public var description: String {
        "the server asks for a client reset (\(reason.rawValue))" + (message.isEmpty ? "" : ": \(message)")
    }
}

/// Where a sync stands, for a progress bar.
public struct SyncProgress: Sendable, Hashable {
    public enum Phase: String, Sendable { case pull, merge, push }
    public enum Status: String, Sendable { case inProgress, ok, error, complete }

    public var phase: Phase
    public var status: Status
    /// Per table: rows to process in this phase, and rows processed so far.
    public var total: [String: Int] = [:]
    public var processed: [String: Int] = [:]

    /// Rows still to process, per table.
    public var remaining: [String: Int] { total.mapValues { $0 }.merging(processed) { $0 - $1 } }
}

/// What a ``SyncClient/sync(with:maxAttempts:backoff:progress:)`` call did.
public struct SyncReport: Sendable {
    public var merge = MergeReport()
    public var batches = 0
    public var acks: [AckReport] = []
    /// Transport calls that failed and were tried again.
    public var retries = 0
}

extension SyncClient {
    /// One round of sync: pull the delta since the stored anchor and merge it, then upload the
    /// pending rows batch by batch and apply each acknowledgement.
    ///
    /// A failing transport call is retried up to `maxAttempts` times with exponential back-off,
    /// then the error is thrown. Nothing is lost when it is: a batch stays in flight, and the next
    /// call sends the very same batch first. Rows the server answers with a conflict or a retry
    /// wait for the next call (after the next pull).
    public func sync(
        with transport: some SyncTransport, maxAttempts: Int = 5, backoff: Duration = .milliseconds(50),
        progress: (@Sendable (SyncProgress) -> Void)? = nil
    ) async throws -> SyncReport {
        var report = SyncReport()
        func attempt<T>(_ phase: SyncProgress.Phase, _ body: () async throws -> T) async throws -> T {
            var delay = backoff
            for n in 1... {
                do {
                    return try await body()
                } catch {
                    guard n < maxAttempts else {
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

        // A batch still in flight (its response was lost last time) goes first, so that the
        // pull sees the server with it applied.
        if let (batch, _) = try inFlightBatch() {
            let ack = try await attempt(.push) { try await transport.push(batch) }
            report.acks.append(try acknowledge(ack))
            report.batches += 1
        }

        progress?(SyncProgress(phase: .pull, status: .inProgress))
        let anchor = try self.anchor()
        let delta = try await attempt(.pull) { try await transport.pull(since: anchor) }
        progress?(SyncProgress(phase: .pull, status: .ok))

        var counts: [String: Int] = [:]
        for t in delta.tables { counts[t.table, default: 0] += t.upserts.count + t.deletes.count }
        progress?(SyncProgress(phase: .merge, status: .inProgress, total: counts))
        report.merge = try merge(delta)
        progress?(SyncProgress(phase: .merge, status: .ok, total: counts, processed: counts))

        var total: [String: Int] = [:]
        for row in try await store.read({ try $0.pendingRows() }) where !row.isConflicted { total[row.table, default: 0] += 1 }
        var processed: [String: Int] = [:]
        var skip = Set<String>()
        progress?(SyncProgress(phase: .push, status: .inProgress, total: total, processed: processed))
        while let batch = try nextBatch(maxRows: 500, maxBytes: 1 << 20, excluding: skip) {
            try markSent(batch)
            let ack = try await attempt(.push) { try await transport.push(batch) }
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

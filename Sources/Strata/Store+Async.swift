import Dispatch

extension Store {
    /// Runs `body` in a write transaction on a background thread and resumes the caller with the
    /// result, so async code never blocks its executor on LMDB's writer lock or on `fsync`.
    ///
    /// `body` itself stays synchronous — LMDB ties a write transaction to the thread that began it.
    /// The same rules as ``write(_:)`` apply: it may run more than once when the map grows.
    /// A write submitted before ``close()`` runs; one submitted after fails with `closed`.
    public func write<R: Sendable>(_ body: @escaping @Sendable (Transaction) throws -> R) async throws -> R {
        // Counted from the call, not from when the queue runs it: a close() meanwhile waits for it.
        try enterCall()
        return try await withCheckedThrowingContinuation { continuation in
            Store.writerQueue.async {
                defer { self.leaveCall() }
                continuation.resume(with: Result { try self.performWrite(body) })
            }
        }
    }

    /// Runs `body` with a snapshot on a background thread (see ``read(_:)``).
    public func read<R: Sendable>(_ body: @escaping @Sendable (Snapshot) throws -> R) async throws -> R {
        try enterCall()
        return try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async {
                defer { self.leaveCall() }
                continuation.resume(with: Result { try self.performRead(body) })
            }
        }
    }

    /// Async writes of all stores go through one serial queue: LMDB admits one writer per store
    /// anyway, and a serial queue keeps waiting writers from occupying many threads.
    private static let writerQueue = DispatchQueue(label: "strata.writer")
}

import Dispatch

extension Store {
    /// Runs `body` in a write transaction on a background thread and resumes the caller with the
    /// result, so async code never blocks its executor on LMDB's writer lock or on `fsync`.
    ///
    /// `body` itself stays synchronous — LMDB ties a write transaction to the thread that began it.
    /// The same rules as ``write(_:)`` apply: it may run more than once when the map grows.
    public func write<R: Sendable>(_ body: @escaping @Sendable (Transaction) throws -> R) async throws -> R {
        try await withCheckedThrowingContinuation { continuation in
            Store.writerQueue.async {
                continuation.resume(with: Result { try self.write(body) })
            }
        }
    }

    /// Runs `body` with a snapshot on a background thread (see ``read(_:)``).
    public func read<R: Sendable>(_ body: @escaping @Sendable (Snapshot) throws -> R) async throws -> R {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(with: Result { try self.read(body) })
            }
        }
    }

    /// Async writes of all stores go through one serial queue: LMDB admits one writer per store
    /// anyway, and a serial queue keeps waiting writers from occupying many threads.
    private static let writerQueue = DispatchQueue(label: "strata.writer")
}

import Dispatch
import Synchronization

extension Store {
    /// Runs `body` in a write transaction and resumes the caller once it is committed, without
    /// blocking a thread while it waits: the write joins the store's group commit (see
    /// ``write(_:)``), and runs on the thread of the group's leader.
    ///
    /// `body` itself stays synchronous — LMDB ties a write transaction to the thread that began it.
    /// The same rules as ``write(_:)`` apply: it may run more than once when the map grows.
    /// A write submitted before ``close()`` runs; one submitted after fails with `closed`. If the
    /// calling task is cancelled before `body` starts, `body` never runs and the call throws
    /// `CancellationError`.
    ///
    /// `body` does not escape: the call returns only after the closure has run (or never will).
    public func write<R: Sendable>(_ body: @Sendable (Transaction) throws -> R) async throws -> R {
        // Counted from the call, not from when the group runs it: a close() meanwhile waits for it.
        try enterCall()
        defer { leaveCall() }
        guard !core.isReadOnly else {
            throw StrataError(.io, "the store at '\(path)' is read-only: this process cannot write its files; nothing was changed")
        }
        try Task.checkCancellation()
        // The group's leader runs `body` on its own thread while this task waits, so the closure
        // is lent, not kept: `WriteRequest.finish()` drops it before the caller is resumed, which
        // is what `withoutActuallyEscaping` checks when this scope ends.
        return try await withoutActuallyEscaping(body) { body in
            try await submitWrite(body)
        }
    }

    private func submitWrite<R: Sendable>(_ body: @escaping @Sendable (Transaction) throws -> R) async throws -> R {
        let result = Locked<R?>(nil)
        let continuation = Locked<CheckedContinuation<R, any Error>?>(nil)
        // Made before the cancellation handler is installed, so that no cancellation can come
        // before there is a request to mark: a task cancelled already runs the handler at once.
        let request = WriteRequest(
            run: { tx in
                let value = try body(tx)
                result.withLock { $0 = value }
            },
            completion: { r in
                // Set before the request is submitted, so before this runs.
                let continuation = continuation.withLock { $0! }
                if let error = r.error {
                    continuation.resume(throwing: error)
                } else {
                    continuation.resume(returning: result.withLock { $0! })
                }
            })
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<R, any Error>) in
                continuation.withLock { $0 = c }
                core.writers.submit(request) { [self] group in commitGroup(group) }
            }
        } onCancel: {
            request.cancelled.store(true, ordering: .relaxed)
        }
    }

    /// Runs `body` with a snapshot on a background thread (see ``read(_:)``).
    ///
    /// `body` does not escape: the call returns only after the closure has run.
    public func read<R: Sendable>(_ body: @Sendable (Snapshot) throws -> R) async throws -> R {
        try enterCall()
        return try await withoutActuallyEscaping(body) { body in
            // The background thread reaches the closure only through `lent`, and lets go of it
            // before it resumes the caller: `withoutActuallyEscaping` checks, when this scope
            // ends, that nothing kept it.
            let lent = Locked<(@Sendable (Snapshot) throws -> R)?>(body)
            return try await withCheckedThrowingContinuation { continuation in
                DispatchQueue.global().async {
                    let result = Result { try self.performRead(lent.withLock { $0! }) }
                    lent.withLock { $0 = nil }
                    self.leaveCall()
                    continuation.resume(with: result)
                }
            }
        }
    }
}

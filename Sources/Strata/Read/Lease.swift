/// Whether the closure that lent a ``Transaction`` or a ``Snapshot`` is still running.
///
/// Both hold LMDB's transaction, which ends (and is freed) when their closure returns. Swift
/// cannot stop a caller from keeping them past that point (storing them in an outside variable),
/// so every access to their LMDB transaction and their catalog goes through ``check()``: a kept
/// transaction or snapshot throws instead of reading or writing freed memory.
final class Lease {
    enum Kind {
        case write, read
    }

    let kind: Kind
    private(set) var isActive = true

    init(_ kind: Kind) { self.kind = kind }

    /// Called once the lending closure has returned (or thrown); no access succeeds after it.
    func end() { isActive = false }

    /// Throws unless the lending closure is still running.
    @inline(__always)
    func check() throws(StrataError) {
        if !isActive { throw expired() }
    }

    private func expired() -> StrataError {
        switch kind {
        case .write:
            StrataError(.invalidOperation, "a Transaction was used after the write closure that lent it returned: LMDB's transaction has ended, so nothing was read or written; make every edit inside the closure passed to Store.write")
        case .read:
            StrataError(.invalidOperation, "a Snapshot was used after the closure that lent it returned: LMDB's transaction has ended, so nothing was read; read inside the closure passed to Store.read (or Transaction.snapshot)")
        }
    }
}

import Foundation

extension Store {
    /// The prefix of every scratch store's folder in the temporary directory:
    /// `strata-scratch-<pid>-<purpose>-<uuid>`, where `<pid>` is the process that owns it.
    package static let scratchPrefix = "strata-scratch-"

    /// A new, not yet existing folder path in the temporary directory for a scratch store
    /// (``verify(progress:)`` uses one; so do the `strata` command's `show --as-of`). Its name
    /// carries this process's id, so that a scratch store left behind by a process that crashed
    /// or was killed is removed by ``sweepScratchStores()``, which runs first.
    ///
    /// The caller removes the folder when done.
    package static func newScratchFolder(_ purpose: String) -> String {
        sweepScratchStores()
        let name = "\(scratchPrefix)\(getpid())-\(purpose)-\(UUID().uuidString)"
        return FileManager.default.temporaryDirectory.appendingPathComponent(name).path
    }

    /// Removes the scratch stores (see ``newScratchFolder(_:)``) in the temporary directory whose
    /// owner process is gone. Returns how many it removed.
    ///
    /// - Complexity: O(e) for e entries in the temporary directory.
    @discardableResult
    package static func sweepScratchStores() -> Int {
        let tmp = FileManager.default.temporaryDirectory
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: tmp.path) else { return 0 }
        var removed = 0
        for name in names where name.hasPrefix(scratchPrefix) {
            guard let pid = Int32(name.dropFirst(scratchPrefix.count).prefix { $0 != "-" }), pid > 0 else { continue }
            // kill(pid, 0) fails with ESRCH only when no such process exists (EPERM: it exists,
            // owned by someone else).
            guard kill(pid, 0) != 0 && errno == ESRCH else { continue }
            if (try? FileManager.default.removeItem(at: tmp.appendingPathComponent(name))) != nil { removed += 1 }
        }
        return removed
    }
}

import StrataLibc

/// `SIGXFSZ`: a write past the process's file size limit (`ulimit -f`, `RLIMIT_FSIZE`) kills
/// the process by default, instead of failing with `EFBIG` like a full disk does.
///
/// Strata's own file writers (briefcase export, ``Store/copy(to:compact:)``,
/// ``Store/reclaimSpace(at:)``) ignore the signal first, so that the limit reaches them as
/// `EFBIG` and they report ``StrataError/Code/diskFull``. A handler the app installed is left
/// in place (the write still fails with `EFBIG` once it returns); only the default action, which
/// kills the process, is replaced, and only once per process.
enum FileSizeSignal {
    private static let once: Void = {
        let previous = signal(SIGXFSZ, SIG_IGN)
        // Put back whatever the app chose; only the default (termination) is replaced.
        if unsafeBitCast(previous, to: Int.self) != unsafeBitCast(SIG_DFL, to: Int.self) {
            _ = signal(SIGXFSZ, previous)
        }
    }()

    /// Makes writes past the file size limit fail with `EFBIG` rather than kill the process.
    static func ignore() { once }
}

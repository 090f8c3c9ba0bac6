import Foundation

/// Resident memory of this process, for benchmarks: read from `/proc/self/status` on Linux.
///
/// Elsewhere (macOS) every figure is 0 and ``resetPeak()`` does nothing: Darwin has no per-phase
/// peak to reset (`getrusage`'s `ru_maxrss` only grows), so the benchmarks report no memory
/// there rather than a figure that means something else.
public enum ProcessMemory {
    /// Resets the peak resident size (VmHWM), so that a phase can measure its own peak.
    public static func resetPeak() {
        #if os(Linux)
        try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
        #endif
    }

    /// The peak resident size since the last reset, in bytes.
    public static var peak: Int { status("VmHWM") }
    /// The resident size now, in bytes.
    public static var resident: Int { status("VmRSS") }
    /// The anonymous (heap and stack, not file-backed) resident size now, in bytes.
    public static var anonymous: Int { status("RssAnon") }

    private static func status(_ field: String) -> Int {
        #if os(Linux)
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            return (line.split(separator: " ").compactMap { Int($0) }.first ?? 0) * 1024
        }
        #endif
        return 0
    }
}

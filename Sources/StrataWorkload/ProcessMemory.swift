import Foundation

/// Resident memory of this process, from `/proc` (Linux; zeros elsewhere), for benchmarks.
public enum ProcessMemory {
    /// Resets the peak resident size (VmHWM), so that a phase can measure its own peak.
    public static func resetPeak() {
        try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
    }

    /// The peak resident size since the last reset, in bytes.
    public static var peak: Int { status("VmHWM") }
    /// The resident size now, in bytes.
    public static var resident: Int { status("VmRSS") }
    /// The anonymous (heap and stack, not file-backed) resident size now, in bytes.
    public static var anonymous: Int { status("RssAnon") }

    private static func status(_ field: String) -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            return (line.split(separator: " ").compactMap { Int($0) }.first ?? 0) * 1024
        }
        return 0
    }
}

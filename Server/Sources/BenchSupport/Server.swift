import Foundation

/// A benchmark's failure, printed as one line.
public struct BenchError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// A `strata-server` process that a benchmark starts on a free loopback port, with helpers to
/// read the CPU time of processes and run programs.
public final class Server: @unchecked Sendable {   // set up in init, then only read
    public let binary: String
    public let process = Process()
    public var url: URL

    /// Starts `binary` on `databaseURL` with the tables file `tables`, and waits until it listens.
    public init(binary: String, databaseURL: String, tables: String) throws {
        self.binary = binary
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["--database-url", databaseURL, "--tables", tables, "--port", "0"]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        var seen = ""
        url = URL(string: "http://127.0.0.1")!
        while true {
            let chunk = out.fileHandleForReading.availableData
            if chunk.isEmpty { throw BenchError("strata-server did not start: \(seen)") }
            seen += String(decoding: chunk, as: UTF8.self)
            if let r = seen.range(of: "listening on "), let line = seen[r.upperBound...].split(separator: "\n").first, let u = URL(string: String(line)) {
                url = u
                break
            }
        }
    }

    /// Stops it (SIGTERM) and waits.
    public func stop() { process.terminate(); process.waitUntilExit() }

    /// User plus system CPU seconds of a process, from /proc.
    public static func cpuSeconds(pid: Int32) -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After the command: state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
        guard fields.count > 12, let u = Double(fields[11]), let s = Double(fields[12]) else { return 0 }
        return (u + s) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// The server's CPU seconds so far.
    public func cpuSeconds() -> Double { Self.cpuSeconds(pid: process.processIdentifier) }

    /// CPU seconds of every postgres process (backends come and go; this counts the live ones).
    public static func postgresCPUSeconds() -> Double {
        let pids = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap(Int32.init)
        return pids.reduce(0) { sum, pid in
            let comm = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)) ?? ""
            return comm.hasPrefix("postgres") ? sum + cpuSeconds(pid: pid) : sum
        }
    }

    /// This process's CPU seconds so far.
    public static func ownCPUSeconds() -> Double { cpuSeconds(pid: getpid()) }

    /// Runs a program; returns its standard output, or throws with its standard error.
    public static func run(_ path: String, _ args: [String]) throws -> String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path)
        p.arguments = args
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { throw BenchError("\(path) failed: \(String(decoding: e, as: UTF8.self))") }
        return String(decoding: o, as: UTF8.self)
    }
}

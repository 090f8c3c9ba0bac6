import Foundation
import Strata
import StrataLibc

/// How a child process ended and what it printed.
struct ChildOutcome {
    /// The exit status, or the signal number when ``signal`` is set.
    var status: Int32
    /// The signal that ended it (a trap, SIGBUS, SIGSEGV, SIGKILL), if one did.
    var signal: Int32?
    var out: String
    var err: String
    /// Whether the time limit ran out and the child was killed.
    var killed: Bool
}

/// Runs `executable` with `arguments` to its end, the one way the CLI tests run a process to its end.
///
/// Standard output and standard error are drained at once: reading one to its end before the
/// other would hang on a child that fills the second pipe meanwhile. With `killAfter`, the child
/// is SIGKILLed when it runs longer (a guard against a hang, never a speed check). With
/// `keepingOutput: false`, standard output goes to /dev/null.
func runProcess(
    _ executable: URL, _ arguments: [String], environment: [String: String] = [:],
    keepingOutput: Bool = true, killAfter limit: Double? = nil
) throws -> ChildOutcome {
    let process = Process()
    process.executableURL = executable
    process.arguments = arguments
    if !environment.isEmpty {
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    }
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = keepingOutput ? out : FileHandle.nullDevice
    process.standardError = err
    try process.run()
    let killed = Locked(false)
    let pid = process.processIdentifier
    let timer = DispatchWorkItem {
        killed.withLock { $0 = true }
        kill(pid, SIGKILL)
    }
    if let limit { DispatchQueue.global().asyncAfter(deadline: .now() + limit, execute: timer) }
    let errData = Locked(Data())
    let drained = DispatchGroup()
    DispatchQueue.global().async(group: drained) {
        let d = err.fileHandleForReading.readDataToEndOfFile()
        errData.withLock { $0 = d }
    }
    let o = keepingOutput ? out.fileHandleForReading.readDataToEndOfFile() : Data()
    drained.wait()
    process.waitUntilExit()
    timer.cancel()
    return ChildOutcome(
        status: process.terminationStatus,
        signal: process.terminationReason == .uncaughtSignal ? process.terminationStatus : nil,
        out: String(decoding: o, as: UTF8.self), err: String(decoding: errData.withLock { $0 }, as: UTF8.self),
        killed: killed.withLock { $0 })
}

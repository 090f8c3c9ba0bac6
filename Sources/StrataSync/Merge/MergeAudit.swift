@_spi(ValueCoding) import Strata

/// The audit record a merge writes with each server operation: what the server sent, what was
/// local, and what was chosen. Read it back from a `LogEntry` with ``init(_:)``.
public struct MergeAudit: Sendable, Hashable {
    /// The anchor of the delta that caused the operation.
    public var anchor: String
    /// The server's version of the row, if the delta gave one.
    public var serverVersion: String?
    /// The conflict found, if any.
    public var conflict: Conflict.Kind?
    /// How it was resolved, if there was a conflict.
    public var resolution: Resolution.Kind?
    /// The policy that resolved it, if there was a conflict.
    public var policy: ConflictPolicy.Kind?
    /// Every field decision.
    public var decisions: [FieldDecision]

    static let format: UInt8 = 1

    /// The encoding of `.null`: one byte, its tag.
    private static let encodedNull: UInt8 = {
        var b: [UInt8] = []
        ValueCoding.append(.null, to: &b)
        precondition(b.count == 1, "a null is one byte")
        return b[0]
    }()

    /// The audit of a merge operation, or `nil` when the entry carries none.
    public init?(_ entry: LogEntry) {
        guard let audit = try? MergeAudit(decoding: entry.annotation) else { return nil }
        self = audit
    }

    init(anchor: String, serverVersion: String?, conflict: Conflict.Kind?, resolution: Resolution.Kind?, policy: ConflictPolicy.Kind?, decisions: [FieldDecision]) {
        self.anchor = anchor
        self.serverVersion = serverVersion
        self.conflict = conflict
        self.resolution = resolution
        self.policy = policy
        self.decisions = decisions
    }

    var encoded: [UInt8] {
        Self.encode(anchor: anchor, serverVersion: serverVersion, conflict: conflict, resolution: resolution, policy: policy, decisions: decisions.count) { i, b in
            let d = decisions[i]
            Self.appendField(d.field, outcome: d.outcome.rawValue, to: &b)
            b.append(d.base == nil ? 0 : 1)
            if let base = d.base { ValueCoding.append(base, to: &b) }
            ValueCoding.append(d.local, to: &b)
            ValueCoding.append(d.server, to: &b)
        }
    }

    /// Appends a decision's field name and outcome (the start of a decision's encoding).
    static func appendField(_ field: String, outcome: UInt8, to b: inout [UInt8]) {
        ValueCoding.append(.string(field), to: &b)
        b.append(outcome)
    }

    /// The record's one encoder. `decision(i, &bytes)` appends decision `i`: its field name,
    /// outcome, whether it has a base, then the base (if any), local and server values, each in
    /// the store's value encoding. The merge on stored records appends them from the record's
    /// bytes without decoding them (`SyncClient.mergeOnRecord`).
    static func encode(
        anchor: String, serverVersion: String?, conflict: Conflict.Kind?, resolution: Resolution.Kind?, policy: ConflictPolicy.Kind?,
        decisions count: Int, _ decision: (Int, inout [UInt8]) -> Void
    ) -> [UInt8] {
        var b: [UInt8] = []
        // One allocation instead of one per doubling: most audits are a few dozen bytes.
        b.reserveCapacity(32 + anchor.utf8.count + (serverVersion?.utf8.count ?? 0) + count * 48)
        appendStart(anchor: encodedAnchor(anchor), serverVersion: serverVersion, conflict: conflict, resolution: resolution, policy: policy, decisions: count, to: &b)
        for i in 0..<count { decision(i, &b) }
        return b
    }

    /// The anchor as ``appendStart(anchor:serverVersion:conflict:resolution:policy:decisions:to:)``
    /// takes it: in the store's value encoding, made once per delta.
    static func encodedAnchor(_ anchor: String) -> [UInt8] {
        var b: [UInt8] = []
        ValueCoding.append(.string(anchor), to: &b)
        return b
    }

    /// Appends the record's start, up to its `count` decisions, which the caller appends next.
    static func appendStart(
        anchor: [UInt8], serverVersion: String?, conflict: Conflict.Kind?, resolution: Resolution.Kind?, policy: ConflictPolicy.Kind?,
        decisions count: Int, to b: inout [UInt8]
    ) {
        b.append(Self.format)
        b.append(contentsOf: anchor)
        // A null, what most audits hold here three times, is its one byte, appended as a byte:
        // a call to `ValueCoding.append` cost about 40 instructions each.
        if let serverVersion { ValueCoding.append(.string(serverVersion), to: &b) } else { b.append(encodedNull) }
        b.append(conflict?.rawValue ?? 0)
        // Stored as their raw strings, as before the enums: existing stores' audits keep reading.
        if let resolution { ValueCoding.append(.string(resolution.rawValue), to: &b) } else { b.append(encodedNull) }
        if let policy { ValueCoding.append(.string(policy.rawValue), to: &b) } else { b.append(encodedNull) }
        ValueCoding.appendVarint(UInt64(count), to: &b)
    }

    init(decoding b: [UInt8]) throws {
        func bad() -> StrataError { StrataError(.corruptRecord, "a merge audit record is damaged") }
        guard b.first == Self.format else { throw bad() }
        var i = 1
        func string() throws -> String? {
            switch try ValueCoding.readValue(b, at: &i) {
            case .null: return nil
            case .string(let s): return s
            default: throw bad()
            }
        }
        func byte() throws -> UInt8 {
            guard i < b.count else { throw bad() }
            defer { i += 1 }
            return b[i]
        }
        guard let anchor = try string() else { throw bad() }
        self.anchor = anchor
        serverVersion = try string()
        let c = try byte()
        conflict = c == 0 ? nil : Conflict.Kind(rawValue: c)
        // An unknown name is damage, not a newer vocabulary: no version of the audit wrote others.
        if let r = try string() {
            guard let kind = Resolution.Kind(rawValue: r) else { throw bad() }
            resolution = kind
        } else {
            resolution = nil
        }
        if let p = try string() {
            guard let kind = ConflictPolicy.Kind(rawValue: p) else { throw bad() }
            policy = kind
        } else {
            policy = nil
        }
        let n = try ValueCoding.readVarint(b, at: &i)
        guard n <= UInt64(b.count) else { throw bad() }
        var decisions: [FieldDecision] = []
        for _ in 0..<n {
            guard let field = try string(), let outcome = FieldDecision.Outcome(rawValue: try byte()) else { throw bad() }
            let base: Value? = try byte() == 1 ? try ValueCoding.readValue(b, at: &i) : nil
            let local = try ValueCoding.readValue(b, at: &i)
            let server = try ValueCoding.readValue(b, at: &i)
            decisions.append(FieldDecision(field: field, base: base, local: local, server: server, outcome: outcome))
        }
        guard i == b.count else { throw bad() }
        self.decisions = decisions
    }
}

import Strata

/// The reference workload ("tasks") of `Benchmarks/WORKLOAD.md`: one deterministic edit stream
/// that every benchmark and every peer is measured on.
///
/// The order of random draws is part of the specification; do not reorder anything here.
public struct ReferenceWorkload: Sendable {
    /// One edit of the stream.
    public enum Edit: Sendable {
        /// A full row with a new id.
        case insert(id: Int64, values: [Value])
        /// One or two columns (indexes into ``columns``) of a live row, with their new values.
        case update(id: Int64, columns: [Int], values: [Value])
        /// Delete a live row.
        case delete(id: Int64)
    }

    /// The non-key columns, in draw order.
    public static let columns = ["title", "priority", "done", "notes", "updated"]

    /// The `tasks` table.
    public static let schema = TableSchema.fixed("tasks", primaryKey: ["id"], fields: [
        .int("id"), .string("title"), .int("priority"), .int("done"), .string("notes"), .double("updated"),
    ])

    /// The seed the stream was generated from.
    public let seed: UInt64
    /// Rows 1…P, each the values of ``columns``.
    public let preload: [[Value]]
    /// The edits, in order.
    public let edits: [Edit]
    /// The ids of the rows alive after the last edit, in the generator's order.
    public let liveIDs: [Int64]

    /// Generates the stream. With the defaults (seed 42, 100,000 rows, 1,000,000 edits) it holds
    /// 700,509 updates, 199,461 inserts and 100,030 deletes, leaving 199,431 live rows.
    ///
    /// - Complexity: O(P + E).
    public init(seed: UInt64 = 42, preloadRows: Int = 100_000, edits editCount: Int = 1_000_000) {
        var rng = SplitMix64(seed: seed)
        var preload: [[Value]] = []
        preload.reserveCapacity(preloadRows)
        for _ in 0..<preloadRows { preload.append(Self.row(&rng)) }
        var live = (0..<Int64(preloadRows)).map { $0 + 1 }
        var nextID = Int64(preloadRows) + 1
        var edits: [Edit] = []
        edits.reserveCapacity(editCount)
        for _ in 0..<editCount {
            let u = rng.below(100)
            if (70..<90).contains(u) || live.isEmpty {
                edits.append(.insert(id: nextID, values: Self.row(&rng)))
                live.append(nextID)
                nextID += 1
            } else if u < 70 {
                let id = live[Int(rng.below(UInt64(live.count)))]
                let k = 1 + rng.below(2)
                let c1 = Int(rng.below(5))
                var columns = [c1]
                if k == 2 {
                    var c2 = Int(rng.below(4))
                    if c2 >= c1 { c2 += 1 }
                    columns.append(c2)
                }
                let values = columns.map { Self.value(column: $0, &rng) }
                edits.append(.update(id: id, columns: columns, values: values))
            } else {
                let idx = Int(rng.below(UInt64(live.count)))
                edits.append(.delete(id: live[idx]))
                live[idx] = live[live.count - 1]
                live.removeLast()
            }
        }
        self.seed = seed
        self.preload = preload
        self.edits = edits
        self.liveIDs = live
    }

    /// Counts of each kind of edit.
    public var counts: (updates: Int, inserts: Int, deletes: Int) {
        var c = (updates: 0, inserts: 0, deletes: 0)
        for e in edits {
            switch e {
            case .insert: c.inserts += 1
            case .update: c.updates += 1
            case .delete: c.deletes += 1
            }
        }
        return c
    }

    static let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -".utf8)

    static func text(_ length: Int, _ rng: inout SplitMix64) -> Value {
        var bytes = [UInt8](repeating: 0, count: length)
        for i in 0..<length { bytes[i] = alphabet[Int(rng.below(64))] }
        return .string(String(decoding: bytes, as: UTF8.self))
    }

    static func value(column: Int, _ rng: inout SplitMix64) -> Value {
        switch column {
        case 0: text(32 + Int(rng.below(17)), &rng)
        case 1: .int(Int64(rng.below(5)))
        case 2: .int(Int64(rng.below(2)))
        case 3: text(48 + Int(rng.below(25)), &rng)
        default: .double(Double(1_700_000_000_000 + rng.below(1_000_000_000)) / 1000.0)
        }
    }

    static func row(_ rng: inout SplitMix64) -> [Value] { (0..<5).map { value(column: $0, &rng) } }
}

/// splitmix64, as the workload specifies.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    /// The generator's state; each draw advances it.
    public var state: UInt64
    /// A generator starting from `seed`.
    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// `next() % n`, exactly as the workload specifies (not an unbiased range).
    public mutating func below(_ n: UInt64) -> UInt64 { next() % n }
}

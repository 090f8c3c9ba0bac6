import Foundation
import Strata
import StrataWorkload

/// Strata on the reference workload, with full durability.
public final class StrataPeer: Peer {
    public let name = "Strata"
    let folder: String
    let store: Store
    private var preloadFields: [FieldValues] = []
    private var edits: [StrataEdit] = []

    public init(folder: String, durability: Durability = .full) throws {
        self.folder = folder
        var options = StoreOptions()
        options.durability = durability
        options.initialMapSize = 1 << 30
        store = try Store(path: folder, options: options)
        try store.createTable(ReferenceWorkload.schema)
    }

    public func prepare(_ workload: ReferenceWorkload) {
        preloadFields = workload.strataPreload()
        edits = workload.strataEdits()
    }

    public func preload() throws {
        try store.write { tx in for f in preloadFields { try tx.insert("tasks", f) } }
    }

    public func markPreloadSynced() throws {
        try store.write { tx in for i in 1...preloadFields.count { try tx.acknowledge("tasks", key: RowKey(.int(Int64(i)))) } }
    }

    public func applyEdits(_ range: Range<Int>) throws {
        try store.write { tx in for e in edits[range] { try e.apply(in: tx) } }
    }

    /// The pending rows are already coalesced (first originals, last currents, insert+delete
    /// gone): encode them into one buffer.
    public func pendingPayload() throws -> Int {
        var buffer: [UInt8] = []
        try store.read { snap in
            for row in try snap.pendingRows("tasks") {
                buffer.append(UInt8(ascii: row.status == .inserted ? "i" : row.status == .deleted ? "d" : "u"))
                ValueCoding.append(row.key.values[0], to: &buffer)
                switch row.status {
                case .inserted: for f in ReferenceWorkload.columns { ValueCoding.append(row[f], to: &buffer) }
                case .deleted: for f in ReferenceWorkload.columns { ValueCoding.append(row.original(f), to: &buffer) }
                default:
                    for f in row.changedFields {
                        ValueCoding.append(.string(f), to: &buffer)
                        ValueCoding.append(row.original(f), to: &buffer)
                        ValueCoding.append(row[f], to: &buffer)
                    }
                }
            }
        }
        return buffer.count
    }

    public func rebuildAndCheck() throws -> Bool {
        try store.verify().isConsistent
    }

    public var sizeOnDisk: Int {
        (try? FileManager.default.attributesOfItem(atPath: folder + "/data.mdb")[.size] as? Int) ?? 0
    }
}

import Foundation
import LMDB

extension Transaction {
    /// Sets a named property of the store (`nil` removes it), in this transaction: it commits or
    /// rolls back with the edits. Sync code keeps its anchor here; apps may keep a data version.
    ///
    /// Properties are metadata, not rows: they are not logged and not part of the views.
    ///
    /// Names starting with `strata.` are reserved for Strata's own modules (the sync anchor,
    /// the batch in flight, the CLI's associations): read them, but do not write them.
    ///
    /// - Throws: ``StrataError`` `invalidOperation` for a name starting with `strata.`;
    ///   `invalidValue` for a NaN or infinite double or timestamp. Nothing is written then.
    public func setProperty(_ name: String, _ value: Value?) throws(StrataError) {
        guard !name.hasPrefix(Self.reservedPropertyPrefix) else {
            throw StrataError(.invalidOperation, "property '\(name)' cannot be set: names starting with '\(Self.reservedPropertyPrefix)' are reserved for Strata's own state (the sync anchor, the batch in flight); use a name of the app's own, such as 'app.\(name.dropFirst(Self.reservedPropertyPrefix.count))'")
        }
        try setStrataProperty(name, value)
    }

    /// The prefix of the property names that only Strata's own modules write.
    package static let reservedPropertyPrefix = "strata."

    /// Sets a property whatever its name, `strata.` names included: the entry point through
    /// which Strata's own modules (and a briefcase import restoring a store's properties) write
    /// their state. Same checks as ``setProperty(_:_:)`` otherwise.
    package func setStrataProperty(_ name: String, _ value: Value?) throws(StrataError) {
        if let value, case .double(let d) = value, !d.isFinite {
            throw StrataError(.invalidValue, "property '\(name)' cannot hold \(d): Strata stores only finite numbers and times")
        }
        if let value, case .timestamp(let t) = value, !t.timeIntervalSince1970.isFinite {
            throw StrataError(.invalidValue, "property '\(name)' cannot hold a timestamp of \(t.timeIntervalSince1970) seconds: Strata stores only finite numbers and times")
        }
        let key = Array(("p:" + name).utf8)
        let writer = try self.writer
        try lmdb { () throws(LMDBError) in
            if let value {
                try writer.put(key, value.encoded, in: databases.meta)
            } else {
                try writer.delete(key, in: databases.meta)
            }
        }
    }

    /// The named property as this transaction sees it.
    public func property(_ name: String) throws(StrataError) -> Value? {
        try snapshot.property(name)
    }
}

extension Snapshot {
    /// A named property of the store (see ``Transaction/setProperty(_:_:)``), or `nil`.
    public func property(_ name: String) throws(StrataError) -> Value? {
        guard let bytes = try txn.meta("p:" + name, in: databases) else { return nil }
        return try Value(decoding: bytes)
    }
}

extension Snapshot {
    /// Every named property of the store (see ``Transaction/setProperty(_:_:)``).
    ///
    /// - Complexity: O(p) for p properties.
    public func properties() throws(StrataError) -> [String: Value] {
        var out: [String: Value] = [:]
        let prefix = Array("p:".utf8)
        try txn.scan(databases.meta) { c in
            var e = try c.seek(atLeast: prefix)
            while let entry = e, entry.key.starts(with: prefix) {
                out[String(decoding: entry.key.dropFirst(prefix.count), as: UTF8.self)] = try Value(decoding: entry.value)
                e = try c.next()
            }
        }
        return out
    }
}

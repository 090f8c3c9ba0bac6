import Foundation
import Strata

/// Where a store keeps its associations: in its own metadata (not among the app's properties),
/// so that every ``SyncClient`` of the store orders uploads the same way without being told.
enum StoredAssociations {
    static let name = "sync.associations"
    /// Where `strata create` kept them before they had their own place: a store property.
    static let legacyProperty = "strata.cli.associations"

    static func encode(_ associations: [Association]) throws(StrataError) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        do { return Array(try encoder.encode(associations)) } catch {
            throw StrataError(.invalidValue, "the associations cannot be encoded: \(error)")
        }
    }

    static func decode(_ bytes: [UInt8], from place: String) throws(StrataError) -> [Association] {
        do { return try JSONDecoder().decode([Association].self, from: Data(bytes)) } catch {
            throw StrataError(.corruptRecord, "the store's associations (\(place)) are not readable: \(error)")
        }
    }
}

/// Storing the associations with the store.
extension Transaction {
    /// Stores `associations` with the store, replacing the ones stored before; a ``SyncClient``
    /// created without associations orders uploads by them. ``TablesFile/createTables(in:)``
    /// stores a tables file's associations this way.
    ///
    /// - Throws: `StrataError` when the store cannot be written.
    public func setAssociations(_ associations: [Association]) throws(StrataError) {
        try setLibraryValue(StoredAssociations.name, try StoredAssociations.encode(associations))
        try setStrataProperty(StoredAssociations.legacyProperty, nil)
    }

    /// The associations stored with the store, as this transaction sees them (see `Snapshot.associations()`).
    public func associations() throws(StrataError) -> [Association] {
        try snapshot.associations()
    }
}

/// Reading the associations stored with the store.
extension Snapshot {
    /// The associations stored with the store (`Transaction.setAssociations(_:)`,
    /// ``TablesFile/createTables(in:)``, `strata create`); empty when none were.
    ///
    /// - Throws: `StrataError` `corruptRecord` when the stored value is unreadable.
    public func associations() throws(StrataError) -> [Association] {
        if let bytes = try libraryValue(StoredAssociations.name) {
            return try StoredAssociations.decode(bytes, from: "the store's metadata")
        }
        // A store made by an earlier `strata create`.
        guard let stored = try property(StoredAssociations.legacyProperty) else { return [] }
        guard let text = stored.stringValue else {
            throw StrataError(.corruptRecord, "the store's associations (property \(StoredAssociations.legacyProperty)) are not readable: \(stored)")
        }
        return try StoredAssociations.decode(Array(text.utf8), from: "property \(StoredAssociations.legacyProperty)")
    }
}

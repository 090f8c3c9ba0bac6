import LMDB

// What Strata's modules keep in a store for themselves (a migrator's applied steps, a sync
// client's associations): one value per name, in the store's `meta` database beside the
// catalog, not among the app's properties, so an app neither lists nor overwrites it. It
// commits or rolls back with the transaction, like a property, and salvage keeps it.

extension Transaction {
    /// Sets (or, with `nil`, removes) the library value `name`, in this transaction.
    package func setLibraryValue(_ name: String, _ bytes: [UInt8]?) throws(StrataError) {
        let key = Array((MetaKey.libraryPrefix + name).utf8)
        let writer = try self.writer
        try lmdb { () throws(LMDBError) in
            if let bytes { try writer.put(key, bytes, in: databases.meta) } else { try writer.delete(key, in: databases.meta) }
        }
    }

    /// The library value `name` as this transaction sees it.
    package func libraryValue(_ name: String) throws(StrataError) -> [UInt8]? {
        try snapshot.libraryValue(name)
    }
}

extension Snapshot {
    /// The library value `name`, or `nil`.
    package func libraryValue(_ name: String) throws(StrataError) -> [UInt8]? {
        try txn.meta(MetaKey.libraryPrefix + name, in: databases).map { Array($0) }
    }
}

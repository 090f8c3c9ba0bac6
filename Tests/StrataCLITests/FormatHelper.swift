import LMDB
@testable import Strata

/// Marks the store at `path` as written by a newer Strata.
func raiseFormatVersion(_ path: String) throws {
    let store = try Store(path: path)
    try store.env.write { try $0.setMeta(MetaKey.format, Store.formatVersion + 1, in: store.databases) }
}

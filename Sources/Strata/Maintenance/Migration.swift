import LMDB

/// Upgrades a store written by an older Strata to ``Store/formatVersion``, in the write
/// transaction that opens it: either the whole upgrade commits or the store stays as it was.
///
/// One step per format, applied in order. Each says what changed:
///
/// | from | to | change |
/// |---|---|---|
/// | 1 | 2 | compaction: the `base` database (rows as of the horizon) and the `horizon` meta key. A format-1 store has neither; an empty `base` and a missing horizon (0) describe it exactly, so nothing is rewritten. |
/// | 2 | 3 | conflict entries (field state 2, operation format 2): a deferred conflict records its conflicting fields and the server's values for them. Format-2 records are valid format-3 records without conflict entries, so nothing is rewritten; a row a format-2 store left conflicted does not record its fields: ``Row/conflictingFields`` says what format 2 reported (its changed fields), and `SyncClient` takes them from the merge's audit record in the log; the next merge or resolve of the row records them. |
/// | 3 | 4 | the views are checkpointed apart from the log: the `viewsLSN` meta key, set to the log's end. |
/// | 4 | 5 | checksums: operations are written in operation format 3, with a CRC-32C. The operations already in the log (formats 1 and 2) are not rewritten and stay valid without one; the `checksumsFrom` meta key, set to the LSN after the last operation, says from where on every operation must carry one. |
/// | 5 | 6 | the compact log (operation format 4): what a transaction's operations share (its id, time and schema version) is written once, in its first operation, and a transaction id is the LSN of that operation. The operations already in the log keep their format (each carries its own transaction header) and are not rewritten; transaction ids go on increasing. |
/// | 6 | 7 | the LSN under the checksum (operation format 5): a record's checksum also covers the LSN it is stored under, its key. The operations already in the log keep their format (3 or 4, checksums of their content only) and are not resealed; the `lsnCoveredFrom` meta key, set to the LSN after the last operation, says from where on every operation's checksum must cover its LSN. |
///
/// Operation records keep their own format byte (``RecordFormat``), checked as each is read,
/// so a step that changes the record format need not rewrite the log (4 → 5, 5 → 6 and 6 → 7
/// do not).
///
/// 6 → 7 does not reseal the format-3 and format-4 records in place, though a reseal keeps
/// their size: it would vouch for each key as found, a damaged one included, and LMDB copies
/// every page it writes, so it would rewrite the whole log in the transaction that opens the
/// store. docs/damaged-stores.md says what the counter leaves uncovered.
enum Migration {
    static func upgrade(from version: UInt64, _ txn: LMDB.WriteTransaction, _ databases: StoreDatabases, path: String) throws(StrataError) {
        var v = version
        while v < Store.formatVersion {
            switch v {
            case 1:
                // `StoreDatabases.open` created `base` in this transaction; no horizon means 0.
                break
            case 2:
                // Operation format 1 is still read; conflicted rows without conflict entries
                // are read as format 2 described them (`Row.conflictingFields`).
                break
            case 3:
                // Format 3 kept the views in the same transaction as the log.
                try txn.setMeta(MetaKey.viewsLSN, try txn.lastLSN(in: databases), in: databases)
            case 4:
                // Older operations keep their format and carry no checksum; every new one does.
                let last = try txn.lastLSN(in: databases)
                guard last < Counter.limit else {
                    throw StrataError(.corruptRecord, "the store at '\(path)' has a last LSN of \(last), out of range; it cannot be migrated")
                }
                try txn.setMeta(MetaKey.checksumsFrom, last + 1, in: databases)
            case 5:
                // Older operations carry their own transaction headers; new ones are format 4.
                break
            case 6:
                // Older operations keep checksums of their content only; every new one's covers its LSN.
                let last = try txn.lastLSN(in: databases)
                guard last < Counter.limit else {
                    throw StrataError(.corruptRecord, "the store at '\(path)' has a last LSN of \(last), out of range; it cannot be migrated")
                }
                try txn.setMeta(MetaKey.lsnCoveredFrom, last + 1, in: databases)
            default:
                throw StrataError(.formatVersion, "the store at '\(path)' has format \(v), which no version of Strata wrote; it cannot be migrated")
            }
            v += 1
        }
        try txn.setMeta(MetaKey.format, v, in: databases)
    }
}

import CLMDB

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An error returned by LMDB, with its numeric code and LMDB's own description.
///
/// `MDB_NOTFOUND` is never thrown: lookups that find nothing return `nil` instead.
public struct LMDBError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The raw code returned by the `mdb_*` call (an LMDB code such as `MDB_MAP_FULL`, or an `errno`).
    public let code: Int32
    /// The operation that failed, for example `"mdb_put"`.
    public let operation: String
    /// The named database involved, when the wrapper knows it (see ``valueOutsideFile``).
    public let database: String?

    /// An error with the code an `mdb_*` call returned, the name of that call, and the database involved.
    public init(code: Int32, operation: String, database: String? = nil) {
        self.code = code
        self.operation = operation
        self.database = database
    }

    /// LMDB's description of ``code``.
    public var message: String {
        if code == Self.valueOutsideFile {
            return "a key or value lent by LMDB reaches outside the data file (the file is damaged)"
        }
        return String(cString: mdb_strerror(code))
    }

    public var description: String {
        let db = database.map { " in database \($0)" } ?? ""
        return "\(operation)\(db) failed: \(message) (\(code))"
    }

    /// Not an LMDB code but the wrapper's own: a key or value that LMDB lent lies outside the
    /// mapped data file, or reaches past its end. LMDB keeps no checksums, so this is how a
    /// damaged page shows itself before it can fault (SIGBUS) the reader. Chosen below LMDB's
    /// own range (`MDB_KEYEXIST` … `MDB_LAST_ERRCODE`, -30799 … -30780).
    public static let valueOutsideFile: Int32 = -30_900

    /// The map is full; ``Environment`` grows the map and retries, so callers never see this.
    public static let mapFull = MDB_MAP_FULL
    /// A key passed with `noOverwrite` already exists.
    public static let keyExists = MDB_KEYEXIST
    /// Another process grew the map.
    public static let mapResized = MDB_MAP_RESIZED
    /// A lookup found nothing (`MDB_NOTFOUND`); thrown only where "nothing" cannot be `nil`,
    /// such as opening a named database that does not exist without creating it.
    public static let notFound = MDB_NOTFOUND
    /// The file is not an LMDB data file (`MDB_INVALID`): its header lacks LMDB's magic number.
    public static let invalid = MDB_INVALID
    /// The file is an LMDB data file of another format version (`MDB_VERSION_MISMATCH`).
    public static let versionMismatch = MDB_VERSION_MISMATCH
    /// Whether this error is how LMDB reports a damaged file: a page number past the end of
    /// the file (`MDB_PAGE_NOTFOUND`), a page of the wrong kind (`MDB_CORRUPTED`), a database
    /// record of the wrong shape (`MDB_INCOMPATIBLE`), or a value outside the file
    /// (``valueOutsideFile``).
    public var isDamage: Bool {
        [MDB_PAGE_NOTFOUND, MDB_CORRUPTED, MDB_INCOMPATIBLE, LMDBError.valueOutsideFile].contains(code)
    }
    /// The ``Environment`` was closed (``Environment/close()``); `EBADF`, as for a closed file.
    public static let closed = EBADF

    /// Whether this error is `MDB_KEYEXIST`.
    public var isKeyExists: Bool { code == MDB_KEYEXIST }
}

/// Turns an `mdb_*` return code into a thrown ``LMDBError``.
@inline(__always)
@usableFromInline
func check(_ rc: Int32, _ operation: @autoclosure () -> String) throws(LMDBError) {
    if rc != 0 { throw LMDBError(code: rc, operation: operation()) }
}

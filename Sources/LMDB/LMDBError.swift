import CLMDB
import StrataLibc

/// An error returned by LMDB, with its numeric code and LMDB's own description.
///
/// `MDB_NOTFOUND` is never thrown: lookups that find nothing return `nil` instead.
public struct LMDBError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The raw code returned by the `mdb_*` call (an LMDB code such as `MDB_MAP_FULL`, or an
    /// `errno`); ``resultCode`` is the same as a value to match.
    public let code: Int32
    /// The operation that failed, for example `"mdb_put"`.
    public let operation: String
    /// The named database involved, when the wrapper knows it (see ``ResultCode/valueOutsideFile``).
    public let database: String?

    /// An error with the code an `mdb_*` call returned, the name of that call, and the database involved.
    public init(code: Int32, operation: String, database: String? = nil) {
        self.code = code
        self.operation = operation
        self.database = database
    }

    /// An error of kind `resultCode` from `operation` on `database`.
    public init(_ resultCode: ResultCode, operation: String, database: String? = nil) {
        self.init(code: resultCode.rawValue, operation: operation, database: database)
    }

    /// LMDB's description of ``code``.
    public var message: String {
        if resultCode == .valueOutsideFile {
            return "a key or value lent by LMDB reaches outside the data file (the file is damaged)"
        }
        return String(cString: mdb_strerror(code))
    }

    public var description: String {
        let db = database.map { " in database \($0)" } ?? ""
        return "\(operation)\(db) failed: \(message) (\(code))"
    }

    /// What went wrong, as a value to compare or match (see ``ResultCode``).
    public var resultCode: ResultCode { ResultCode(rawValue: code) }

    /// Whether this error is how LMDB reports a damaged file: a page number past the end of
    /// the file (``ResultCode/pageNotFound``), a page of the wrong kind
    /// (``ResultCode/corrupted``), a database record of the wrong shape
    /// (``ResultCode/incompatible``), or a value outside the file
    /// (``ResultCode/valueOutsideFile``).
    public var isDamage: Bool {
        [.pageNotFound, .corrupted, .incompatible, .valueOutsideFile].contains(resultCode)
    }

    /// Whether this error is ``ResultCode/keyExists``.
    public var isKeyExists: Bool { resultCode == .keyExists }

    /// The kind of an ``LMDBError``: one of LMDB's result codes (`MDB_KEYEXIST` …
    /// `MDB_BAD_DBI`), the wrapper's own ``valueOutsideFile``, or an `errno` value that LMDB
    /// passed on from the system (``diskFull``, ``ioError``, …).
    ///
    /// Compare it, switch over it, or match an error against it in a `catch`:
    ///
    /// ```swift
    /// do {
    ///     try txn.put(key, value, in: db, flags: .noOverwrite)
    /// } catch LMDBError.ResultCode.keyExists {
    ///     // the key was there already
    /// } catch let error as LMDBError where error.resultCode == .mapFull {
    ///     // …
    /// }
    /// ```
    public struct ResultCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        /// The number an `mdb_*` call returned (negative for LMDB's codes, an `errno` otherwise).
        public let rawValue: Int32

        /// The code `rawValue`.
        public init(rawValue: Int32) { self.rawValue = rawValue }

        /// A key passed with `noOverwrite` already exists (`MDB_KEYEXIST`).
        public static let keyExists = ResultCode(rawValue: MDB_KEYEXIST)
        /// Nothing was found (`MDB_NOTFOUND`); thrown only where "nothing" cannot be `nil`,
        /// such as opening a named database that does not exist without creating it.
        public static let notFound = ResultCode(rawValue: MDB_NOTFOUND)
        /// A page number past the end of the file (`MDB_PAGE_NOTFOUND`): the file is damaged.
        public static let pageNotFound = ResultCode(rawValue: MDB_PAGE_NOTFOUND)
        /// A page of the wrong kind (`MDB_CORRUPTED`): the file is damaged.
        public static let corrupted = ResultCode(rawValue: MDB_CORRUPTED)
        /// A fatal error earlier left the environment unusable (`MDB_PANIC`).
        public static let panic = ResultCode(rawValue: MDB_PANIC)
        /// The file is an LMDB data file of another format version (`MDB_VERSION_MISMATCH`).
        public static let versionMismatch = ResultCode(rawValue: MDB_VERSION_MISMATCH)
        /// The file is not an LMDB data file: its header lacks LMDB's magic number (`MDB_INVALID`).
        public static let invalid = ResultCode(rawValue: MDB_INVALID)
        /// The map is full (`MDB_MAP_FULL`); ``Environment`` grows the map and retries, so
        /// callers never see it.
        public static let mapFull = ResultCode(rawValue: MDB_MAP_FULL)
        /// No more named databases can be opened (`MDB_DBS_FULL`).
        public static let databasesFull = ResultCode(rawValue: MDB_DBS_FULL)
        /// Every reader slot is taken (`MDB_READERS_FULL`).
        public static let readersFull = ResultCode(rawValue: MDB_READERS_FULL)
        /// The thread-local storage keys ran out (`MDB_TLS_FULL`).
        public static let threadStorageFull = ResultCode(rawValue: MDB_TLS_FULL)
        /// The write transaction has too many dirty pages (`MDB_TXN_FULL`).
        public static let transactionFull = ResultCode(rawValue: MDB_TXN_FULL)
        /// The cursor stack is too deep (`MDB_CURSOR_FULL`): a damaged or very deep tree.
        public static let cursorFull = ResultCode(rawValue: MDB_CURSOR_FULL)
        /// A page has no room left (`MDB_PAGE_FULL`).
        public static let pageFull = ResultCode(rawValue: MDB_PAGE_FULL)
        /// Another process grew the map beyond this one's (`MDB_MAP_RESIZED`).
        public static let mapResized = ResultCode(rawValue: MDB_MAP_RESIZED)
        /// A database was opened with flags that do not match it (`MDB_INCOMPATIBLE`); in a
        /// file that should hold it, a sign of damage.
        public static let incompatible = ResultCode(rawValue: MDB_INCOMPATIBLE)
        /// A reader slot was used wrongly (`MDB_BAD_RSLOT`).
        public static let badReaderSlot = ResultCode(rawValue: MDB_BAD_RSLOT)
        /// A transaction that failed or ended was used again (`MDB_BAD_TXN`).
        public static let badTransaction = ResultCode(rawValue: MDB_BAD_TXN)
        /// A key or value of a size LMDB does not take, such as a key over 511 bytes
        /// (`MDB_BAD_VALSIZE`).
        public static let badValueSize = ResultCode(rawValue: MDB_BAD_VALSIZE)
        /// A database handle that is not valid here (`MDB_BAD_DBI`).
        public static let badDatabase = ResultCode(rawValue: MDB_BAD_DBI)

        /// Not an LMDB code but the wrapper's own: a key or value that LMDB lent lies outside the
        /// mapped data file, or reaches past its end. LMDB keeps no checksums, so this is how a
        /// damaged page shows itself before it can fault (SIGBUS) the reader. Chosen below LMDB's
        /// own range (`MDB_KEYEXIST` … `MDB_LAST_ERRCODE`, -30799 … -30780).
        public static let valueOutsideFile = ResultCode(rawValue: -30_900)
        /// The ``Environment`` was closed (``Environment/close()``): `EBADF`, as for a closed file.
        public static let closed = ResultCode(rawValue: EBADF)
        /// No space left on the device (`ENOSPC`).
        public static let diskFull = ResultCode(rawValue: ENOSPC)
        /// The file would outgrow the process's file size limit or the file system's largest
        /// file (`EFBIG`).
        public static let fileTooLarge = ResultCode(rawValue: EFBIG)
        /// The user's disk quota is used up (`EDQUOT`).
        public static let quotaExceeded = ResultCode(rawValue: EDQUOT)
        /// The device failed to read or write (`EIO`).
        public static let ioError = ResultCode(rawValue: EIO)
        /// The files may not be opened as asked (`EACCES`).
        public static let accessDenied = ResultCode(rawValue: EACCES)
        /// The file system is mounted read-only (`EROFS`).
        public static let readOnlyFileSystem = ResultCode(rawValue: EROFS)

        private static let names: [Int32: String] = [
            MDB_KEYEXIST: "keyExists", MDB_NOTFOUND: "notFound", MDB_PAGE_NOTFOUND: "pageNotFound",
            MDB_CORRUPTED: "corrupted", MDB_PANIC: "panic", MDB_VERSION_MISMATCH: "versionMismatch",
            MDB_INVALID: "invalid", MDB_MAP_FULL: "mapFull", MDB_DBS_FULL: "databasesFull",
            MDB_READERS_FULL: "readersFull", MDB_TLS_FULL: "threadStorageFull", MDB_TXN_FULL: "transactionFull",
            MDB_CURSOR_FULL: "cursorFull", MDB_PAGE_FULL: "pageFull", MDB_MAP_RESIZED: "mapResized",
            MDB_INCOMPATIBLE: "incompatible", MDB_BAD_RSLOT: "badReaderSlot", MDB_BAD_TXN: "badTransaction",
            MDB_BAD_VALSIZE: "badValueSize", MDB_BAD_DBI: "badDatabase", -30_900: "valueOutsideFile",
            EBADF: "closed", ENOSPC: "diskFull", EFBIG: "fileTooLarge", EDQUOT: "quotaExceeded",
            EIO: "ioError", EACCES: "accessDenied", EROFS: "readOnlyFileSystem",
        ]

        /// The constant's name (`keyExists`), or `code N` for a code without one.
        public var description: String { Self.names[rawValue] ?? "code \(rawValue)" }

        /// Whether `error` is an ``LMDBError`` of this code: `catch LMDBError.ResultCode.keyExists`.
        public static func ~= (pattern: ResultCode, error: any Error) -> Bool {
            (error as? LMDBError)?.resultCode == pattern
        }
    }
}

/// Turns an `mdb_*` return code into a thrown ``LMDBError``.
@inline(__always)
@usableFromInline
func check(_ rc: Int32, _ operation: @autoclosure () -> String) throws(LMDBError) {
    if rc != 0 { throw LMDBError(code: rc, operation: operation()) }
}

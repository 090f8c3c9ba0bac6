import Foundation
import LMDB

/// The one error type of Strata: a stable ``code`` to switch on, a ``message`` that says what was
/// wrong and what to do, and the underlying ``cause`` when there is one.
///
/// Bad input never changes the store: every edit is validated before anything is written, and a
/// failed write transaction is rolled back as a whole.
///
/// ```swift
/// do {
///     try store.write { try $0.insert("tasks", ["id": 1, "title": "Buy milk"]) }
/// } catch let error as StrataError where error.code == .duplicateKey {
///     // the row exists already
/// }
/// ```
public struct StrataError: Error, Sendable, CustomStringConvertible {
    /// A stable identifier of the kind of error.
    ///
    /// New codes may be added in any release, so a `switch` over codes needs a `default`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Kind: String, Sendable {
            case tableNotFound, tableExists, invalidSchema
            case fieldNotFound, typeMismatch, missingField, nullNotAllowed, invalidKey
            case duplicateKey, rowNotFound, invalidOperation
            case corruptRecord, formatVersion, storage, io, malformedInput, dataVersionMismatch
            case compacted, diskFull, busy, closed, invalidValue, notAStore, corruptStore
        }
        fileprivate let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// No table of that name in the catalog.
        public static let tableNotFound = Code(.tableNotFound)
        /// A table of that name exists with a different schema.
        public static let tableExists = Code(.tableExists)
        /// A table definition is not valid (duplicate fields, bad primary key, …).
        public static let invalidSchema = Code(.invalidSchema)
        /// A field name that a fixed-schema table does not have.
        public static let fieldNotFound = Code(.fieldNotFound)
        /// A value of the wrong type for its field.
        public static let typeMismatch = Code(.typeMismatch)
        /// A required field (or a primary key field) was not given.
        public static let missingField = Code(.missingField)
        /// `null` for a field that is not nullable.
        public static let nullNotAllowed = Code(.nullNotAllowed)
        /// A row key with the wrong number or types of components, or too long.
        public static let invalidKey = Code(.invalidKey)
        /// An insert of a key that already has a live row.
        public static let duplicateKey = Code(.duplicateKey)
        /// No live row with that key.
        public static let rowNotFound = Code(.rowNotFound)
        /// An operation that does not apply to the row in its current state, or an argument out
        /// of its range (a negative query limit, a page or batch size below 1).
        public static let invalidOperation = Code(.invalidOperation)
        /// A stored record could not be decoded.
        public static let corruptRecord = Code(.corruptRecord)
        /// The store was written by a newer (or unknown) format version.
        public static let formatVersion = Code(.formatVersion)
        /// LMDB reported an error; ``StrataError/cause`` holds the `LMDBError` (the `LMDB` module).
        public static let storage = Code(.storage)
        /// A file could not be read or written.
        public static let io = Code(.io)
        /// A payload from outside (a delta, an acknowledgement, a file) could not be decoded.
        public static let malformedInput = Code(.malformedInput)
        /// A briefcase holds data of another data version than the app expects: discard it and
        /// fetch the data again.
        public static let dataVersionMismatch = Code(.dataVersionMismatch)
        /// The request reaches before the compaction horizon: those operations were folded into
        /// the base snapshot (see ``Store/compact(retaining:)``).
        public static let compacted = Code(.compacted)
        /// The disk (or the process's file size limit) is full: the write was rolled back and the
        /// store is unchanged. Free space and retry.
        public static let diskFull = Code(.diskFull)
        /// The store is in use (open in this or another process) and the request needs it closed.
        public static let busy = Code(.busy)
        /// The ``Store`` was closed (``Store/close()``): open the folder again for a new one.
        public static let closed = Code(.closed)
        /// A value the store does not hold: a double or a timestamp that is NaN or infinite, or a
        /// value that would make an index or named-view entry longer than LMDB's key limit.
        public static let invalidValue = Code(.invalidValue)
        /// The folder holds a `data.mdb` that is not a Strata store: an empty file, another
        /// program's LMDB database, a file whose header is damaged. It was refused and left
        /// untouched; Strata creates a store only where no `data.mdb` exists.
        public static let notAStore = Code(.notAStore)
        /// The store's file is damaged: its LMDB pages do not hold together (a page number
        /// outside the file, a node outside its page, keys out of order, a loop, …), found by the
        /// page check that runs before LMDB reads the file (``StoreOptions/checkAtOpen``,
        /// ``Store/check(at:options:)``). LMDB never read it, so nothing crashed and nothing was
        /// written; the message names the damage. Recover what is readable into a new folder
        /// with ``Store/salvage(from:into:)`` (`strata salvage`).
        public static let corruptStore = Code(.corruptStore)

        public var description: String { kind.rawValue }
    }

    /// What kind of error this is.
    public let code: Code
    /// What went wrong, in a sentence that names the table, field or key involved.
    public let message: String
    /// The underlying error, such as an `LMDBError`.
    public let cause: (any Error & Sendable)?

    /// An error of kind `code`, with a message that says what was wrong and the error that caused it, if any.
    public init(_ code: Code, _ message: String, cause: (any Error & Sendable)? = nil) {
        self.code = code
        self.message = message
        self.cause = cause
    }

    public var description: String {
        if let cause { "\(message) (\(code); cause: \(cause))" } else { "\(message) (\(code))" }
    }

    static func storage(_ error: LMDBError) -> StrataError {
        // A write that could not extend the file: no space left, or over RLIMIT_FSIZE / the
        // file system's largest file. LMDB has rolled the transaction back.
        if [.diskFull, .fileTooLarge, .quotaExceeded].contains(error.resultCode) {
            return StrataError(.diskFull, "the disk is full (\(error.message)): the write was rolled back and the store is unchanged; free space and retry", cause: error)
        }
        if error.resultCode == .closed {
            return StrataError(.closed, "the store was closed; open it again with Store(path:)", cause: error)
        }
        if error.resultCode == .valueOutsideFile {
            return StrataError(.corruptRecord, "the store's file is damaged: a record of the database \(error.database ?? "main") reaches outside the data file; run `strata salvage` to recover what is readable", cause: error)
        }
        return StrataError(.storage, "the storage engine failed: \(error.description)", cause: error)
    }
}

/// Runs `body`, turning an ``LMDBError`` into a ``StrataError`` of code `storage`.
@inline(__always)
func lmdb<R>(_ body: () throws(LMDBError) -> R) throws(StrataError) -> R {
    do { return try body() } catch { throw StrataError.storage(error) }
}

extension StrataError {
    /// `error` as a `StrataError`, wrapped once: a `StrataError` as it is, an `LMDBError` as
    /// ``Code/storage`` (or what ``storage(_:)`` makes of it), a file system error as ``Code/io``,
    /// a coding error as ``Code/malformedInput``. Anything else is not thrown by Strata's own code;
    /// it becomes ``Code/storage`` with the error as its cause.
    package init(wrapping error: any Error) {
        switch error {
        case let e as StrataError:
            self = e
        case let e as LMDBError:
            self = .storage(e)
        case let e as CocoaError:
            self.init(.io, e.localizedDescription, cause: e)
        case let e as POSIXError:
            self.init(.io, e.localizedDescription, cause: e)
        case let e as DecodingError:
            self.init(.malformedInput, "\(e)", cause: e)
        case let e as EncodingError:
            self.init(.malformedInput, "\(e)", cause: e)
        default:
            self.init(.storage, "unexpected error: \(error)", cause: error)
        }
    }
}

/// Runs `body`, whose callees throw untyped, and throws what it threw as a ``StrataError``
/// (``StrataError/init(wrapping:)``): the adapter between Strata's internals and its public
/// API, which throws `StrataError` and nothing else.
@inline(__always)
package func strataErrors<R>(_ body: () throws -> R) throws(StrataError) -> R {
    do { return try body() } catch { throw StrataError(wrapping: error) }
}

/// An alert shows `localizedDescription`: it is the error's message, which says what was wrong
/// and what to do.
extension StrataError: LocalizedError {
    public var errorDescription: String? { message }
}


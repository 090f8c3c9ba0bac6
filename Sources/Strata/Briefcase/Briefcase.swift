import Foundation
import LMDB

/// What a briefcase file holds.
public struct BriefcaseInfo: Sendable, Hashable, Codable {
    /// The version of the data, set by the app; an app that expects another version discards
    /// the briefcase and fetches the data again.
    public var dataVersion: String?
    /// Free-form properties the app stored with the briefcase.
    public var properties: [String: String]
    /// The tables it holds, with their schemas.
    public var tables: [TableSchema]
    /// Every field name of each table, in the store's order (a property bag's fields included).
    public var fieldNames: [String: [String]]
    /// How many rows it holds, over all its tables.
    public var rowCount: Int
    /// When it was exported.
    public var createdAt: Date
    /// The client id of the store it was exported from.
    public var sourceClientID: String
    /// The exporting store's named properties (``Snapshot/properties()``) — among them a sync
    /// client's anchor — which ``Store/importBriefcase(from:expectingDataVersion:restoringProperties:)``
    /// restores when asked. `nil` in briefcases written before properties were carried.
    public var storeProperties: [String: Value]?
}

/// A briefcase: a snapshot of tables — current values, originals and pending state — in one
/// file, to keep data offline, hand it to another device, or seed a store.
///
/// The file is `STRATABC`, a format byte, a JSON header (``BriefcaseInfo``), the rows (binary:
/// table, key values, flags, and per field name, original and current value, and from format 2
/// a byte that is 1 for a field in conflict), and a 64-bit FNV-1a checksum of everything before
/// it, so a truncated or damaged file is detected before anything is imported. Format 1 is still
/// read.
enum BriefcaseFormat {
    static let magic = Array("STRATABC".utf8)
    static let version: UInt8 = 2

    struct Entry {
        var table: Int
        var key: RowKey
        var state: RowState
    }

    static func encode(_ info: BriefcaseInfo, _ entries: [Entry]) throws -> [UInt8] {
        var w = ByteWriter(capacity: 1 << 16)
        w.append(magic)
        w.append(version)
        let header = Array(try JSONEncoder().encode(info))
        w.appendVarint(UInt64(header.count))
        w.append(header)
        for e in entries {
            w.appendVarint(UInt64(e.table))
            w.appendVarint(UInt64(e.key.values.count))
            for v in e.key.values { w.appendValue(v) }
            var flags: UInt8 = 0
            if e.state.isInserted { flags |= 1 }
            if e.state.isDeleted { flags |= 2 }
            if e.state.isConflicted { flags |= 4 }
            w.append(flags)
            w.appendVarint(UInt64(e.state.fields.count))
            for (name, f) in e.state.fields.sorted(by: { $0.key < $1.key }) {
                w.appendValue(.string(name))
                w.appendValue(f.original)
                w.appendValue(f.current)
                w.append(f.isInConflict ? 1 : 0)
            }
        }
        var d = Digest()
        w.withUnsafeBytes { d.add($0) }
        w.appendLittleEndian(d.value)
        return w.bytes
    }

    static func decode(_ bytes: [UInt8], path: String) throws(StrataError) -> (BriefcaseInfo, [Entry]) {
        func damaged(_ why: String) -> StrataError {
            StrataError(.malformedInput, "the briefcase '\(path)' is damaged or truncated (\(why)); nothing was imported")
        }
        guard bytes.count >= magic.count + 9, Array(bytes.prefix(magic.count)) == magic else {
            throw damaged("not a Strata briefcase")
        }
        let body = bytes.count - 8
        var d = Digest()
        withBytes(Array(bytes[..<body])) { d.add($0) }
        let stored = withBytes(Array(bytes[body...])) { b in b.loadUnaligned(as: UInt64.self) }
        guard UInt64(littleEndian: stored) == d.value else { throw damaged("checksum mismatch") }
        return try withBytes(Array(bytes[..<body])) { (b) throws(StrataError) in
          do throws(StrataError) {
            var r = ByteReader(b, offset: magic.count)
            let format = try r.byte()
            if format > version {
                throw StrataError(.formatVersion, "the briefcase '\(path)' has format \(format), newer than this Strata reads (\(version)); nothing was imported")
            }
            guard format >= 1 else { throw damaged("format \(format), which no Strata writes") }
            let n = Int(clamping: try r.varint())
            let info: BriefcaseInfo
            do { info = try JSONDecoder().decode(BriefcaseInfo.self, from: Data(try r.bytes(n))) } catch { throw damaged("unreadable header") }
            var entries: [Entry] = []
            while !r.isAtEnd {
                let table = Int(clamping: try r.varint())
                guard table < info.tables.count else { throw damaged("a row names table #\(table)") }
                let keyCount = Int(clamping: try r.varint())
                guard keyCount < 64 else { throw damaged("a key of \(keyCount) values") }
                var key: [Value] = []
                for _ in 0..<keyCount { key.append(try r.value()) }
                let flags = try r.byte()
                // The checksum is no proof of origin (anyone can recompute it): only the row
                // states Strata stores are taken. Inserted and deleted together would make a row
                // hidden like a delete yet uploaded as an insert.
                func refused(_ why: String) -> StrataError {
                    damaged("row \(RowKey(key)) of table '\(info.tables[table].name)' \(why)")
                }
                guard flags & ~7 == 0 else { throw refused("has unknown flags 0x\(String(flags, radix: 16))") }
                guard flags & 3 != 3 else { throw refused("is marked both inserted and deleted") }
                let fieldCount = Int(clamping: try r.varint())
                guard fieldCount <= r.remaining else { throw damaged("a row of \(fieldCount) fields") }
                var fields: [String: RowState.Field] = [:]
                for _ in 0..<fieldCount {
                    guard case .string(let name) = try r.value() else { throw damaged("a field without a name") }
                    let original = try r.value(), current = try r.value()
                    let mark = format >= 2 ? try r.byte() : 0
                    guard mark <= 1 else { throw damaged("a field mark \(mark)") }
                    // Only a merge marks fields in conflict, and it marks the row too.
                    guard mark == 0 || flags & 4 != 0 else { throw refused("marks field '\(name)' in conflict but is not in conflict") }
                    // A row holds each name once, and one of two that Swift's `==` calls equal
                    // (the dictionary would keep one of them silently).
                    if let i = fields.index(forKey: name) {
                        let held = fields[i].key
                        throw refused(held.sameBytes(name) ? "gives field '\(name)' twice" : "gives fields '\(held)' (\(held.codePoints)) and '\(name)' (\(name.codePoints)), which differ only in Unicode form; a row holds one of two such names")
                    }
                    fields[name] = RowState.Field(original: original, current: current, isInConflict: mark == 1)
                }
                entries.append(Entry(table: table, key: RowKey(key), state: RowState(fields: fields, isInserted: flags & 1 != 0, isDeleted: flags & 2 != 0, isConflicted: flags & 4 != 0)))
            }
            guard entries.count == info.rowCount else { throw damaged("\(entries.count) rows where the header says \(info.rowCount)") }
            return (info, entries)
          } catch {
            // A value that does not decode: the file's fault, not a damaged store.
            throw error.code == .corruptRecord ? damaged("a value that does not decode: \(error.message)") : error
          }
        }
    }
}

extension Store {
    /// Writes `tables` (all tables when `nil`) — current values, originals and pending state,
    /// conflicts included — and the store's named properties into a briefcase file at `path`,
    /// from one consistent snapshot.
    ///
    /// - Complexity: O(n) for the rows exported.
    @discardableResult
    public func exportBriefcase(to path: String, tables: [String]? = nil, dataVersion: String? = nil, properties: [String: String] = [:]) throws(StrataError) -> BriefcaseInfo {
        return try strataErrors {
            let (info, entries) = try read { snap in
                let schemas = try (tables ?? snap.tables.map(\.name)).map { try snap.schema($0) }
                var fieldNames: [String: [String]] = [:]
                for s in schemas { fieldNames[s.name] = try snap.fieldNames(s.name) }
                var entries: [BriefcaseFormat.Entry] = []
                for (i, s) in schemas.enumerated() {
                    for row in try snap.rows(s.name, includingDeleted: true) {
                        entries.append(.init(table: i, key: row.key, state: RowState(row)))
                    }
                }
                let info = BriefcaseInfo(
                    dataVersion: dataVersion, properties: properties, tables: schemas, fieldNames: fieldNames, rowCount: entries.count,
                    createdAt: Date(), sourceClientID: clientID, storeProperties: try snap.properties()
                )
                return (info, entries)
            }
            let bytes = try BriefcaseFormat.encode(info, entries)
            try writeFileAtomically(bytes, to: path, what: "the briefcase")
            return info
        }
    }

    /// Reads and checks a briefcase file without importing it.
    public static func briefcaseInfo(at path: String) throws(StrataError) -> BriefcaseInfo {
        try BriefcaseFormat.decode(try readFile(path), path: path).0
    }

    /// Imports a briefcase: each of its tables is created if missing, and its rows replace that
    /// table's rows — values, originals and pending state as exported — in one transaction that
    /// logs an `imported` operation per changed row.
    ///
    /// With `restoringProperties`, the store's named properties become the briefcase's (those
    /// it lacks are removed), in the same transaction: a sync client's anchor comes back, so the
    /// next pull continues from where the exporting store was instead of fetching everything. Use
    /// it to restore a store from its own briefcase; it makes no sense for a briefcase holding only
    /// some of the tables the anchor covers. Without it, properties are left as they are.
    ///
    /// A unique index of the store is checked once on the imported rows, not row by row: a value
    /// may pass from a row the briefcase lacks to one it holds, and rows may swap values.
    ///
    /// - Throws: ``StrataError`` `dataVersionMismatch` when `expectingDataVersion` is given and
    ///   differs (discard the briefcase and fetch the data again); `malformedInput` for a damaged
    ///   or truncated file; `tableExists` when a table exists with another schema;
    ///   `duplicateKey` when two of the imported rows hold the same values in a unique index.
    ///   Nothing is imported then.
    @discardableResult
    public func importBriefcase(from path: String, expectingDataVersion: String? = nil, restoringProperties: Bool = false) throws(StrataError) -> BriefcaseInfo {
        return try strataErrors {
            let (info, entries) = try BriefcaseFormat.decode(try Store.readFile(path), path: path)
            if let expected = expectingDataVersion, info.dataVersion != expected {
                throw StrataError(.dataVersionMismatch, "the briefcase '\(path)' holds data version \(info.dataVersion.map { "'\($0)'" } ?? "none"), the app expects '\(expected)'; discard it and fetch the data again")
            }
            do {
                try importRows(info, entries, from: path, restoringProperties: restoringProperties)
            } catch let e as StrataError {
                // The transaction rolled back: say so, with what was wrong.
                throw StrataError(e.code, "\(e.message); nothing was imported from the briefcase '\(path)'", cause: e.cause)
            }
            return info
        }
    }

    private func importRows(_ info: BriefcaseInfo, _ entries: [BriefcaseFormat.Entry], from path: String, restoringProperties: Bool) throws {
        try write { tx in
            for schema in info.tables {
                try tx.createTable(schema)
                // A property bag's fields keep the order they had in the exporting store.
                try tx.registerFields(schema.name, info.fieldNames[schema.name] ?? [])
            }
            // The rows replace each table's as a whole: a unique value may pass from a row
            // removed below to one written before, or two rows may swap theirs. Uniqueness is
            // checked once, on the result.
            try tx.deferringUniqueness(of: info.tables.map(\.name)) {
                // The rows kept, by encoded key: the file may give a key in another type than the
                // store holds it (an int for a double key field), and it names the same row.
                var keep: [String: Set<[UInt8]>] = [:]
                var k = ByteWriter(capacity: 64)
                for e in entries {
                    let table = info.tables[e.table].name
                    try tx.catalog.table(named: table).encodeKey(e.key, into: &k)
                    // Strata writes each row once; a second copy would silently replace the first.
                    guard keep[table, default: []].insert(k.bytes).inserted else {
                        throw StrataError(.malformedInput, "the briefcase gives row \(e.key) of table '\(table)' twice")
                    }
                    try tx.setRowState(table, key: e.key, e.state, kind: .imported, origin: .local)
                }
                for schema in info.tables {
                    let t = try tx.catalog.table(named: schema.name)
                    var gone: [RowKey] = []
                    try tx.snapshot.scanTable(t, in: tx.databases.rows) { key, _ in
                        if !(keep[schema.name]?.contains(Array(key)) ?? false) { gone.append(try t.decodeKey(key)) }
                        return true
                    }
                    for key in gone { try tx.setRowState(schema.name, key: key, nil, kind: .imported, origin: .local) }
                }
            }
            if restoringProperties {
                guard let carried = info.storeProperties else {
                    throw StrataError(.invalidOperation, "the briefcase '\(path)' carries no store properties (it was written before they were); import it without restoringProperties")
                }
                // The store's own state (`strata.` names, reserved for apps) comes back too.
                for name in try tx.snapshot.properties().keys where carried[name] == nil { try tx.setStrataProperty(name, nil) }
                for (name, value) in carried { try tx.setStrataProperty(name, value) }
            }
        }
    }

    static func readFile(_ path: String) throws(StrataError) -> [UInt8] {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw StrataError(.io, "cannot read the briefcase '\(path)'")
        }
        return Array(data)
    }
}

/// Writes `bytes` to a temporary file beside `path`, syncs it and renames it over `path`, so a
/// failure leaves whatever was at `path` before. A full disk or the process's file size limit
/// (`EFBIG`, with ``FileSizeSignal`` ignoring SIGXFSZ) is ``StrataError/Code/diskFull``.
func writeFileAtomically(_ bytes: [UInt8], to path: String, what: String) throws(StrataError) {
    FileSizeSignal.ignore()
    // The file is written beside `path` and renamed over it: over a device, a FIFO, a socket or
    // a symbolic link that would replace the thing itself with a regular file (`/dev/stdout`
    // became one, run as root). Only a regular file or a new path is written.
    var st = stat()
    if lstat(path, &st) == 0, st.st_mode & S_IFMT != S_IFREG {
        let kind = switch st.st_mode & S_IFMT {
        case S_IFLNK: "a symbolic link"
        case S_IFDIR: "a folder"
        case S_IFCHR, S_IFBLK: "a device"
        case S_IFIFO: "a FIFO"
        case S_IFSOCK: "a socket"
        default: "not a regular file"
        }
        throw StrataError(.invalidOperation, "cannot write \(what) to '\(path)': it is \(kind); give the path of a regular file, or a new one")
    }
    let temporary = path + ".strata-tmp"
    func failure(_ error: Int32, _ action: String) -> StrataError {
        if error == ENOSPC || error == EFBIG || error == EDQUOT {
            return StrataError(.diskFull, "cannot write \(what) '\(path)': the disk is full (\(String(cString: strerror(error)))); nothing was written")
        }
        return StrataError(.io, "cannot \(action) \(what) '\(path)': \(String(cString: strerror(error)))")
    }
    let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw failure(errno, "create") }
    var done = 0
    var error: Int32 = 0
    bytes.withUnsafeBytes { b in
        while done < b.count {
            let n = write(fd, b.baseAddress! + done, b.count - done)
            if n < 0 {
                if errno == EINTR { continue }
                error = errno
                return
            }
            done += n
        }
    }
    if error == 0, fsync(fd) != 0 { error = errno }
    close(fd)
    if error == 0, rename(temporary, path) != 0 { error = errno }
    if error != 0 {
        unlink(temporary)
        throw failure(error, "write")
    }
}

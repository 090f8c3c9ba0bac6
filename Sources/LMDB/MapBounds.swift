import CLMDB
import StrataLibc
import Synchronization

/// Where an environment's memory map lies and how much of it the data file backs, so that every
/// key and value LMDB lends can be checked before anyone reads it.
///
/// LMDB trusts its file: a damaged length can make a value reach past the end of `data.mdb`,
/// and reading the mapped pages past the end of a file is a SIGBUS, not an error. The check is
/// two comparisons per `get` or cursor step; the file's size is cached and re-read (`fstat`)
/// only when a value seems to reach past it, which is enough because the file only grows while
/// an environment is open.
///
/// `mdb_env_info` reports the map's address only for `MDB_FIXEDMAP`, so the address is found
/// once per mapping in `/proc/self/maps` (the mapping of `data.mdb`'s inode at offset 0). Where
/// that is not available (not Linux), the check is off and values are trusted as before.
final class MapBounds: @unchecked Sendable {
    // @unchecked: `base` and `mapSize` change only in `locate()`, which runs at open and while
    // `Environment` holds its resize lock exclusively (no transaction alive, so no reader of
    // them); `fileSize` is atomic because concurrent readers refresh it.
    private(set) var base: UInt = 0
    private(set) var mapSize: UInt = 0
    private let fd: Int32
    private let env: OpaquePointer
    private let fileSize = Atomic<Int>(0)

    init(env: OpaquePointer) {
        var fd: Int32 = -1
        if mdb_env_get_fd(env, &fd) != 0 { fd = -1 }
        self.fd = fd
        self.env = env
        locate()
    }

    /// Finds the map again: at open, and after `mdb_env_set_mapsize` moved it.
    func locate() {
        base = 0
        mapSize = 0
        guard fd >= 0, let size = currentFileSize() else { return }
        fileSize.store(size, ordering: .relaxed)
        #if os(Linux)
        var st = stat()
        guard fstat(fd, &st) == 0, let maps = fopen("/proc/self/maps", "r") else { return }
        defer { fclose(maps) }
        var candidates: [(start: UInt, size: UInt)] = []
        var line = [CChar](repeating: 0, count: 4096)
        while fgets(&line, Int32(line.count), maps) != nil {
            // "start-end perms offset dev inode path"
            let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let fields = text.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 6, UInt64(fields[4]) == UInt64(st.st_ino), UInt64(fields[2], radix: 16) == 0,
                  text.hasSuffix("/data.mdb\n") || text.hasSuffix("/data.mdb")
            else { continue }
            let range = fields[0].split(separator: "-")
            guard range.count == 2, let start = UInt(range[0], radix: 16), let end = UInt(range[1], radix: 16), end > start else { continue }
            candidates.append((start, end - start))
        }
        // The file can be mapped more than once in a process (another environment on it): take
        // the mapping that holds memory this environment lends; unsure, leave the check off.
        var chosen = candidates.count == 1 ? candidates.first : nil
        if candidates.count > 1, let p = firstLentPointer() {
            chosen = candidates.first { p >= $0.start && p - $0.start < $0.size }
        }
        if let chosen {
            base = chosen.start
            mapSize = chosen.size
        }
        #endif
    }

    /// The address of the main database's first key, read in a throw-away read transaction:
    /// a pointer into this environment's own map.
    private func firstLentPointer() -> UInt? {
        var txn: OpaquePointer?
        guard mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &txn) == 0, let txn else { return nil }
        defer { mdb_txn_abort(txn) }
        var cursor: OpaquePointer?
        // dbi 1 is LMDB's main database, open in every transaction.
        guard mdb_cursor_open(txn, 1, &cursor) == 0, let cursor else { return nil }
        defer { mdb_cursor_close(cursor) }
        var k = MDB_val()
        var v = MDB_val()
        guard mdb_cursor_get(cursor, &k, &v, MDB_FIRST) == 0, let data = k.mv_data else { return nil }
        return UInt(bitPattern: data)
    }

    private func currentFileSize() -> Int? {
        var st = stat()
        guard fstat(fd, &st) == 0 else { return nil }
        return Int(st.st_size)
    }

    /// Whether `count` bytes at `pointer` may be read.
    ///
    /// Inside the map they must end within the file. Outside it they are accepted only from a
    /// write transaction, whose dirty pages live on the heap until commit.
    func admits(_ pointer: UnsafeMutableRawPointer?, _ count: Int, writing: Bool) -> Bool {
        guard base != 0, count > 0 else { return true }
        guard let pointer else { return false }
        let p = UInt(bitPattern: pointer)
        guard p >= base, p - base < mapSize else { return writing }
        let (end, overflow) = (p - base).addingReportingOverflow(UInt(count))
        guard !overflow, end <= mapSize else { return false }
        if end <= UInt(fileSize.load(ordering: .relaxed)) { return true }
        // Another transaction may have grown the file since the size was cached.
        guard let size = currentFileSize() else { return false }
        fileSize.store(size, ordering: .relaxed)
        return end <= UInt(size)
    }
}

/// What a transaction needs to check the memory LMDB lends it.
package struct LentMemory {
    let bounds: MapBounds?
    /// Whether the transaction writes (and may lend heap-allocated dirty pages).
    let writing: Bool

    /// Checks a key and value LMDB just lent for `operation` on `db`.
    func check(_ key: MDB_val, _ value: MDB_val, _ operation: String, _ db: Database) throws(LMDBError) {
        guard let bounds else { return }
        if !bounds.admits(key.mv_data, key.mv_size, writing: writing) || !bounds.admits(value.mv_data, value.mv_size, writing: writing) {
            throw LMDBError(.valueOutsideFile, operation: operation, database: db.name)
        }
    }
}

import StrataLibc

/// LMDB 0.9's on-disk layout (mdb.c, `MDB_page`, `MDB_node`, `MDB_db`, `MDB_meta`; 64-bit,
/// little-endian): what ``PageValidator`` reads, with the numbers named as mdb.c names them.
enum PageLayout {
    /// `PAGEHDRSZ`: `mp_pgno` (8), `mp_pad` (2), `mp_flags` (2), `mp_lower`/`mp_upper` (2 + 2)
    /// or, on an overflow page, `mp_pages` (4).
    static let headerSize = 16
    /// `NODESIZE`: `mn_lo`, `mn_hi`, `mn_flags`, `mn_ksize`, 2 bytes each.
    static let nodeHeaderSize = 8
    /// `sizeof(MDB_db)`: `md_pad` u32, `md_flags` u16, `md_depth` u16, then five u64 (branch,
    /// leaf and overflow pages, entries, root).
    static let databaseRecordSize = 48
    /// `MDB_MAXKEYSIZE` of a non-MDB_DEVEL build; also the largest duplicate of a DUPSORT database.
    static let maxKeySize = 511
    /// `CURSOR_STACK`: LMDB cannot descend deeper than this.
    static let maxDepth = 32
    /// `P_INVALID`: the root of an empty tree.
    static let invalidPage = UInt64.max
    static let magic: UInt32 = 0xBEEF_C0DE
    static let dataVersion: UInt32 = 1
    /// `MAX_PAGESIZE` without MDB_DEVEL (`mp_upper` is 16 bits wide).
    static let maxPageSize = 0x8000
    static let minPageSize = 512

    // Page flags (`mp_flags`).
    static let branch: UInt16 = 0x01, leaf: UInt16 = 0x02, overflow: UInt16 = 0x04, meta: UInt16 = 0x08
    static let dirty: UInt16 = 0x10, leaf2: UInt16 = 0x20, subPage: UInt16 = 0x40
    static let loose: UInt16 = 0x4000, keep: UInt16 = 0x8000

    // Node flags (`mn_flags`, leaf nodes only).
    static let bigData: UInt16 = 0x01, subData: UInt16 = 0x02, dupData: UInt16 = 0x04

    // Database flags (`md_flags`, lmdb.h).
    static let reverseKey: UInt16 = 0x02, dupSort: UInt16 = 0x04, integerKey: UInt16 = 0x08
    static let dupFixed: UInt16 = 0x10, integerDup: UInt16 = 0x20, reverseDup: UInt16 = 0x40

    // The meta page: `MDB_meta` follows the page header.
    static let metaMagic = 16, metaVersion = 20, metaMapSize = 32
    static let metaFreeRecord = 40, metaMainRecord = 88, metaLastPage = 136, metaTxnID = 144
    static let metaEnd = 152
}

/// The bytes of a data file, every read bounds-checked: a read that would leave them returns 0
/// (callers check ranges first; this is the net under them, so that a mistake can never fault).
struct FileBytes {
    let base: UnsafeRawPointer?
    let count: Int

    @inline(__always) func u16(_ offset: Int) -> UInt16 {
        guard let base, offset >= 0, offset <= count &- 2 else { return 0 }
        return UInt16(littleEndian: base.loadUnaligned(fromByteOffset: offset, as: UInt16.self))
    }

    @inline(__always) func u32(_ offset: Int) -> UInt32 {
        guard let base, offset >= 0, offset <= count &- 4 else { return 0 }
        return UInt32(littleEndian: base.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
    }

    @inline(__always) func u64(_ offset: Int) -> UInt64 {
        guard let base, offset >= 0, offset <= count &- 8 else { return 0 }
        return UInt64(littleEndian: base.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
    }

    /// Whether `offset ..< offset + length` lies within the bytes.
    @inline(__always) func contains(_ offset: Int, _ length: Int) -> Bool {
        offset >= 0 && length >= 0 && offset <= count && length <= count &- offset
    }

    /// The record (`MDB_db`) at `offset`, which must hold 48 bytes.
    func databaseRecord(at offset: Int) -> DatabaseRecord {
        DatabaseRecord(
            pad: u32(offset), flags: u16(offset + 4), depth: u16(offset + 6),
            branchPages: u64(offset + 8), leafPages: u64(offset + 16), overflowPages: u64(offset + 24),
            entries: u64(offset + 32), root: u64(offset + 40)
        )
    }
}

/// An `MDB_db` as stored: in a meta page (the free list and the main database), as the value of
/// a named database's entry in the main database, or as a DUPSORT key's sub-database.
struct DatabaseRecord {
    var pad: UInt32
    var flags: UInt16
    var depth: UInt16
    var branchPages: UInt64
    var leafPages: UInt64
    var overflowPages: UInt64
    var entries: UInt64
    var root: UInt64
}

/// A key in the file: where it starts and how long it is.
struct KeyRef {
    var offset: Int
    var count: Int
}

/// The order of a database's keys (or of a DUPSORT database's duplicates), as mdb.c's
/// `mdb_default_cmp` picks it from the flags. Custom comparators (`mdb_set_compare`) are not
/// known to the file, so a database that uses one cannot be checked for order.
enum KeyOrder {
    /// `mdb_cmp_memn`: bytes compared as unsigned, a prefix first.
    case bytes
    /// `mdb_cmp_memnr` (REVERSEKEY), and `mdb_cmp_cint`/`mdb_cmp_int` (INTEGERKEY, INTEGERDUP):
    /// on a little-endian machine, an unsigned integer compared 16 bits at a time from the most
    /// significant end is its bytes compared from the last one.
    case reverseBytes

    static func keys(_ flags: UInt16) -> KeyOrder {
        flags & (PageLayout.reverseKey | PageLayout.integerKey) != 0 ? .reverseBytes : .bytes
    }

    static func duplicates(_ flags: UInt16) -> KeyOrder {
        flags & (PageLayout.reverseDup | PageLayout.integerDup) != 0 ? .reverseBytes : .bytes
    }

    /// Negative, zero or positive as `a` sorts before, with or after `b`. Both lie in `file`.
    @inline(__always) func compare(_ a: KeyRef, _ b: KeyRef, in file: FileBytes) -> Int {
        guard let base = file.base, file.contains(a.offset, a.count), file.contains(b.offset, b.count) else { return 0 }
        let shorter = min(a.count, b.count)
        switch self {
        case .bytes:
            if shorter > 0 {
                let d = memcmp(base + a.offset, base + b.offset, shorter)
                if d != 0 { return Int(d) }
            }
        case .reverseBytes:
            var i = 1
            while i <= shorter {
                let x = base.load(fromByteOffset: a.offset + a.count - i, as: UInt8.self)
                let y = base.load(fromByteOffset: b.offset + b.count - i, as: UInt8.self)
                if x != y { return x < y ? -1 : 1 }
                i += 1
            }
        }
        return a.count == b.count ? 0 : (a.count < b.count ? -1 : 1)
    }
}

/// One bit per page.
struct PageBits {
    private var words: [UInt64]
    let count: UInt64

    init(count: UInt64) {
        self.count = count
        words = Array(repeating: 0, count: Int((count + 63) / 64))
    }

    /// Sets the bit of `page` (which must be below ``count``); returns whether it was set before.
    @inline(__always) mutating func insert(_ page: UInt64) -> Bool {
        let w = Int(page >> 6), bit = UInt64(1) << (page & 63)
        let was = words[w] & bit != 0
        words[w] |= bit
        return was
    }

    @inline(__always) func contains(_ page: UInt64) -> Bool {
        page < count && words[Int(page >> 6)] & (UInt64(1) << (page & 63)) != 0
    }

    var setCount: Int { words.reduce(0) { $0 + $1.nonzeroBitCount } }
}

import Foundation

/// A new field value of an edit: its field id and where its encoding sits in the values buffer.
struct NewValue {
    var id: Int
    var range: Range<Int>
}

/// The rules of local edits: given a row's state and an edit, which field entries and which
/// flags the operation records. This file is the only place that decides what an edit means;
/// applying the result (``RowFold``) is mechanical.
///
/// Per field, a row keeps its *original* (the value the server last confirmed) and its *current*
/// value. The rules, for a row the server knows:
///
/// | edit | effect on the field | row flags |
/// |---|---|---|
/// | update to the current value | nothing (no operation is logged) | — |
/// | update of a clean field | dirty: original kept, current = new | — |
/// | update of a dirty field back to its original | clean again | — |
/// | update of a dirty field to another value | dirty: original kept, current = new | — |
/// | delete | every dirty field returns to its original | + deleted |
/// | revert field | a dirty field returns to its original | — |
/// | revert row | every dirty field returns to its original | − deleted, − conflicted |
/// | acknowledge (server accepted the row) | every dirty field becomes clean at its current value | − inserted; a deleted row is removed |
///
/// For a row inserted locally (not yet on the server) there are no originals: updates set the
/// current value, a delete removes the row entirely (nothing to upload), and reverting the row
/// removes it too.
///
/// Inserting a key whose row is deleted locally (but not yet uploaded) revives the row: each
/// field is compared with the server's value, so the server later receives an update, not a
/// delete followed by an insert.
///
/// A field a merge left in conflict (a conflict entry, see `Records.swift`) keeps its mark and
/// its server value through every edit above: the edit changes its current value only, so the
/// app still sees, and resolves, the conflict. Reverting the row is the exception: it drops the
/// conflict with the local changes, as ``SyncClient``'s `.server` choice would.
///
/// Every function appends the operation's field entries (in field-id order) to `op` and returns
/// the row's flags after the operation. Values are compared as canonical encodings, byte for byte.
enum EditRules {
    /// The encoding of `null`.
    nonisolated(unsafe) static let null: UnsafeRawBufferPointer = {
        let p = UnsafeMutableRawBufferPointer.allocate(byteCount: 1, alignment: 1)
        p[0] = ValueTag.null
        return UnsafeRawBufferPointer(p)
    }()

    @inline(__always)
    static func same(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        a.count == b.count && (a.count == 0 || memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0)
    }

    @inline(__always)
    static func isNull(_ v: UnsafeRawBufferPointer) -> Bool { v.count == 1 && v[0] == ValueTag.null }

    /// Insert of a key with no row (`old == nil`) or with a locally deleted row.
    static func insert(old stored: StoredRow?, values: UnsafeRawBufferPointer, new: [NewValue], into op: inout ByteWriter) throws(StrataError) -> RowFlags {
        guard let stored else {
            for n in new {
                let v = UnsafeRawBufferPointer(rebasing: values[n.range])
                if !isNull(v) { op.appendCleanEntry(n.id, v) }
            }
            return [.inserted]
        }
        // Revival of a locally deleted row: the tombstone holds the server's values.
        let old = stored.bytes
        let h = stored.header
        var r = ByteReader(old, offset: h.entriesStart)
        var e = try r.nextEntry()
        var i = 0
        while e != nil || i < new.count {
            let serverValue: UnsafeRawBufferPointer
            let newValue: UnsafeRawBufferPointer
            let id: Int
            var storedDirty = false
            var inConflict = false
            if let x = e, i == new.count || x.id < new[i].id {
                id = x.id
                serverValue = UnsafeRawBufferPointer(rebasing: old[x.original])
                newValue = null
                storedDirty = x.isDirty
                inConflict = x.isConflict
                e = try r.nextEntry()
            } else if let x = e, x.id == new[i].id {
                id = x.id
                serverValue = UnsafeRawBufferPointer(rebasing: old[x.original])
                newValue = UnsafeRawBufferPointer(rebasing: values[new[i].range])
                storedDirty = x.isDirty
                inConflict = x.isConflict
                e = try r.nextEntry()
                i += 1
            } else {
                id = new[i].id
                serverValue = null
                newValue = UnsafeRawBufferPointer(rebasing: values[new[i].range])
                i += 1
            }
            if inConflict {
                op.appendConflictEntry(id, server: serverValue, current: newValue)
            } else if same(serverValue, newValue) {
                if storedDirty { op.appendCleanEntry(id, newValue) }
            } else {
                op.appendDirtyEntry(id, original: serverValue, current: newValue)
            }
        }
        return h.flags.subtracting(.deleted)
    }

    /// Update of the given fields of a live row.
    static func update(old stored: StoredRow, values: UnsafeRawBufferPointer, new: [NewValue], into op: inout ByteWriter) throws(StrataError) -> RowFlags {
        let old = stored.bytes
        let h = stored.header
        let inserted = h.flags.contains(.inserted)
        var r = ByteReader(old, offset: h.entriesStart)
        var e = try r.nextEntry()
        for n in new {
            while let x = e, x.id < n.id { e = try r.nextEntry() }
            let v = UnsafeRawBufferPointer(rebasing: values[n.range])
            var current = null
            var original = null
            var inConflict = false
            if let x = e, x.id == n.id {
                current = UnsafeRawBufferPointer(rebasing: old[x.current])
                original = UnsafeRawBufferPointer(rebasing: old[x.original])
                inConflict = x.isConflict
            }
            if same(v, current) { continue }
            if inConflict {
                op.appendConflictEntry(n.id, server: original, current: v)
            } else if inserted || same(v, original) {
                op.appendCleanEntry(n.id, v)
            } else {
                op.appendDirtyEntry(n.id, original: original, current: v)
            }
        }
        return h.flags
    }

    /// Delete of a live row.
    static func delete(old stored: StoredRow, into op: inout ByteWriter) throws(StrataError) -> RowFlags {
        let old = stored.bytes
        let h = stored.header
        if h.flags.contains(.inserted) { return [.gone] }
        try revertDirtyFields(old, from: h.entriesStart, into: &op)
        return h.flags.union(.deleted)
    }

    /// Revert of one field of a row the server knows.
    static func revertField(old stored: StoredRow, field: Int, into op: inout ByteWriter) throws(StrataError) -> RowFlags {
        let old = stored.bytes
        let h = stored.header
        var r = ByteReader(old, offset: h.entriesStart)
        while let x = try r.nextEntry(), x.id <= field {
            if x.id == field && x.isDirty {
                let o = UnsafeRawBufferPointer(rebasing: old[x.original])
                if x.isConflict { op.appendConflictEntry(x.id, server: o, current: o) } else { op.appendCleanEntry(x.id, o) }
            }
        }
        return h.flags
    }

    /// Revert of a whole row to the server's values.
    static func revertRow(old stored: StoredRow, into op: inout ByteWriter) throws(StrataError) -> RowFlags {
        let old = stored.bytes
        let h = stored.header
        if h.flags.contains(.inserted) { return [.gone] }
        try revertDirtyFields(old, from: h.entriesStart, into: &op, keepingConflicts: false)
        return h.flags.subtracting([.deleted, .conflicted])
    }

    /// The server accepted the row as it is now: current values become the originals, a local
    /// insert becomes a server row, a local delete removes the row. A conflict flag stays.
    static func acknowledge(old stored: StoredRow, into op: inout ByteWriter) throws(StrataError) -> RowFlags {
        let old = stored.bytes
        let h = stored.header
        if h.flags.contains(.deleted) { return [.gone] }
        var r = ByteReader(old, offset: h.entriesStart)
        while let x = try r.nextEntry() {
            guard x.isDirty else { continue }
            let c = UnsafeRawBufferPointer(rebasing: old[x.current])
            if x.isConflict { op.appendConflictEntry(x.id, server: c, current: c) } else { op.appendCleanEntry(x.id, c) }
        }
        return h.flags.subtracting(.inserted)
    }

    /// Returns every dirty field to its original. Fields in conflict keep their mark, unless
    /// `keepingConflicts` is false: then every conflict entry becomes a clean one.
    private static func revertDirtyFields(_ old: UnsafeRawBufferPointer, from start: Int, into op: inout ByteWriter, keepingConflicts: Bool = true) throws(StrataError) {
        var r = ByteReader(old, offset: start)
        while let x = try r.nextEntry() {
            let o = UnsafeRawBufferPointer(rebasing: old[x.original])
            if x.isConflict && keepingConflicts {
                if x.isDirty { op.appendConflictEntry(x.id, server: o, current: o) }
            } else if x.isDirty || x.isConflict {
                op.appendCleanEntry(x.id, o)
            }
        }
    }
}

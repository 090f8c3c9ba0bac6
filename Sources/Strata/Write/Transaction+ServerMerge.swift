// The server merge: values a server sent, merged into a stored row in one read and one write
// (``Transaction/mergeServerValues(_:key:_:kind:newRows:decide:annotation:)``), with the types
// its caller decides and reads the outcome through. The merge rules stay with the caller
// (StrataSync); this file only applies its decisions.
extension Transaction {
    /// What a merge does to one field of a stored row, as decided by the caller of
    /// ``mergeServerValues(_:key:_:kind:decide:annotation:)``.
    package enum ServerFieldAction: Sendable, Hashable {
        /// The field stays as stored.
        case keep
        /// The field becomes clean at the server's value.
        case takeServer
        /// The server's value becomes the original; the local current value stays, pending.
        case rebase
        /// As `rebase`, and the field (and so the row) is marked in conflict.
        case conflict
    }

    /// How the three values of one field compare, for the caller's decision.
    package struct ServerFieldSides: Sendable, Hashable {
        /// The current value differs from the original: the device changed the field.
        package let localChanged: Bool
        /// The server's value differs from the original: the server changed the field.
        package let serverChanged: Bool
        /// The server's value equals the current value.
        package let serverIsLocal: Bool
        /// The store holds no row under the key: the server's row is new to the device.
        package var isNewRow = false
    }

    /// One field the caller's decision asked to record, with the caller's tag.
    package struct ServerFieldDecision: Sendable, Hashable {
        package let field: String
        /// What was done (`keep` when the decided action changed nothing).
        package let action: ServerFieldAction
        /// The caller's own code for the decision (never 0).
        package let tag: UInt8
    }

    /// The recorded decisions of a merge on a stored record with their values, in the store's
    /// value encoding (as the record holds them): what the `annotation` of
    /// ``mergeServerValues(_:key:_:kind:decide:annotation:)`` reads. The bytes are lent: valid
    /// only during that call.
    package struct ServerFieldValues {
        package let decisions: [ServerFieldDecision]
        fileprivate let record: UnsafeRawBufferPointer
        fileprivate let values: UnsafeRawBufferPointer
        fileprivate let ranges: [(base: Range<Int>?, local: Range<Int>?, server: Range<Int>)]

        /// The original (server-confirmed) value of decision `i` before the merge.
        package func base(_ i: Int) -> UnsafeRawBufferPointer { ranges[i].base.map { UnsafeRawBufferPointer(rebasing: record[$0]) } ?? EditRules.null }
        /// The current value of decision `i` before the merge.
        package func local(_ i: Int) -> UnsafeRawBufferPointer { ranges[i].local.map { UnsafeRawBufferPointer(rebasing: record[$0]) } ?? EditRules.null }
        /// The value the server sent for decision `i`, as the store holds it (an int for a
        /// double field converted).
        package func server(_ i: Int) -> UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: values[ranges[i].server]) }

        /// Decision `i`'s three values, decoded.
        package func decoded(_ i: Int) throws(StrataError) -> (base: Value, local: Value, server: Value) {
            var b = ByteReader(base(i))
            var l = ByteReader(local(i))
            var s = ByteReader(server(i))
            return (try b.value(), try l.value(), try s.value())
        }
    }

    /// What ``mergeServerValues(_:key:_:kind:decide:annotation:)`` did.
    package enum ServerMergeResult: Sendable, Hashable {
        /// Nothing was written: the row does not exist, is inserted, deleted or conflicted, a
        /// value names a field the table does not have yet, a decision was `nil`, or a required
        /// field would end up null. The caller merges the row as a ``RowState`` and writes with
        /// ``setRowState(_:key:_:kind:origin:annotation:)``.
        case needsMerge
        /// The decisions the caller asked to record, in field order; `logged` says whether an
        /// operation was written (some field changed).
        case merged([ServerFieldDecision], logged: Bool)
    }

    /// Merges values the server sent into a live server row (not inserted, deleted or
    /// conflicted; its fields may be pending) on the stored record, in one operation of origin
    /// `server`, without building a ``Row`` or a ``RowState``. With `newRows`, a key the store
    /// holds no row under takes the same path (its sides say ``ServerFieldSides/isNewRow``),
    /// when the values name every declared field: one the server leaves out takes its default,
    /// which the caller fills in.
    ///
    /// This is the common case of merging a server delta, done with one read and one write.
    /// The merge rules stay with the caller: `decide` is called once per field the server sent
    /// (key fields skipped; a field the server left out stays as stored) with how its original,
    /// current and server values compare, and returns what happens to the field and a tag to
    /// record it under (0: nothing to record), or `nil` to leave the whole row to the caller.
    /// `annotation` is called once, only when some field changes, with the recorded
    /// decisions and their values as the record holds them (lent for the call); the bytes it
    /// appends to the array it is given (empty, lent for the call) are stored with the operation.
    ///
    /// Values are compared by their canonical encoding, as edits compare them.
    ///
    /// - Throws: ``StrataError`` `tableNotFound`, `invalidKey`, `fieldNotFound` (a name the table
    ///   has in another Unicode form), `typeMismatch`, `nullNotAllowed` (a null for a required
    ///   field of a row with nothing pending), `invalidValue` (an index or
    ///   named-view entry over LMDB's key limit); whatever `annotation` throws. On a throw
    ///   nothing is written.
    package func mergeServerValues(
        _ table: String, key: RowKey, _ values: [String: Value], kind: LogEntry.Kind, newRows: Bool = false,
        decide: (ServerFieldSides) -> (action: ServerFieldAction, tag: UInt8)?,
        annotation: (ServerFieldValues, inout [UInt8]) throws -> Void
    ) throws -> ServerMergeResult {
        let ref = try tableRef(named: table)
        // The table lent from its box for the whole merge, not copied (see `TableRef.info`).
        return try mergeServerValues(&ref.info, ref, key: key, values, kind: kind, newRows: newRows, decide: decide, annotation: annotation)
    }

    /// The merge, on the table `t` (`ref.info`, lent `inout` and never changed).
    private func mergeServerValues(
        _ t: inout TableInfo, _ ref: TableRef, key: RowKey, _ values: [String: Value], kind: LogEntry.Kind, newRows: Bool,
        decide: (ServerFieldSides) -> (action: ServerFieldAction, tag: UInt8)?,
        annotation: (ServerFieldValues, inout [UInt8]) throws -> Void
    ) throws -> ServerMergeResult {
        try encodeKey(key, t, oneIntKey: ref.oneIntKey)
        let stored = try storedRow()
        guard stored != nil || newRows else { return .needsMerge }
        let isNewRow = stored == nil
        let old = stored?.bytes ?? UnsafeRawBufferPointer(start: nil, count: 0)
        guard stored?.flags.isEmpty ?? true else { return .needsMerge }
        // A row with pending fields admits a null for a required field (it may stay an
        // original); whether the field ends up null is checked below, after the decisions.
        // The entries are kept for the pass below: parsed once, not twice. They are written
        // over the last row's, not into an emptied array (`removeAll(keepingCapacity:)` costs
        // about 70 instructions), as `decided` is below: `entryCount` of them are this row's.
        var hasPending = false
        var entryCount = 0
        var scan = stored?.entries ?? ByteReader(old)
        while let x = try scan.nextEntry() {
            if x.isConflict { return .needsMerge }
            if x.isDirty { hasPending = true }
            if entryCount < storedEntries.count { storedEntries[entryCount] = x } else { storedEntries.append(x) }
            entryCount += 1
        }
        valBuf.reset()
        newValues.removeAll(keepingCapacity: true)
        // Every name is resolved before a refused value counts: a field the table lacks leaves
        // the row to the caller, which refuses it, whatever else is wrong with the row. One pass
        // over the dictionary (its iteration costs about 200 instructions a row): the first
        // refusal is held until every name has resolved.
        // The ids named are kept only for a new row, the one reader below.
        if isNewRow { fieldIDs.removeAll(keepingCapacity: true) }
        var refusal: StrataError? = nil
        for (name, value) in values {
            guard let id = t.fieldID(name) else {
                // A name the table has in another Unicode form is refused here, before a merge
                // on `[String: Value]` could take it for the table's form.
                if let twin = t.twin(of: name) { throw StrataError(.fieldNotFound, RowRule.twinMessage(table: t.name, name, twin)) }
                return .needsMerge
            }
            if isNewRow { fieldIDs.append(id) }
            if refusal != nil || t.isKeyField(id) { continue }
            do {
                let v = ref.admitsAsIs(value, field: id) ? value : try t.admit(value, field: id, name: name, nullable: hasPending ? true : nil)
                let start = valBuf.count
                valBuf.appendValue(v)
                newValues.append(NewValue(id: id, range: start..<valBuf.count))
            } catch {
                refusal = error
            }
        }
        if isNewRow {
            for (id, def) in t.definitions.enumerated() where def != nil && !t.isKeyField(id) && !t.dropped.contains(id) {
                if !fieldIDs.contains(id) { return .needsMerge }
            }
        }
        if let refusal { throw refusal }
        sortNewValues()
        // One pass over the stored entries and the server's values, both in field id order.
        var decidedCount = 0  // of `decided`, this row's
        // Which fields hold a value after the merge: a row that would leave a required field
        // null is left to the caller (it may take a default, or be refused with the row's
        // context). Only declared fields (ids below `definitions.count`) can be required.
        if valued.count == t.definitions.count {
            // One uniqueness check and a fill, not one check per element.
            valued.withUnsafeMutableBufferPointer { $0.update(repeating: false) }
        } else {
            valued = Array(repeating: false, count: t.definitions.count)
        }
        // A new row comes into being, whatever its fields hold.
        var changed = isNewRow
        var j = 0  // the next of `storedEntries`
        var i = 0
        while j < entryCount || i < newValues.count {
            if j < entryCount, i == newValues.count || storedEntries[j].id < newValues[i].id {
                let x = storedEntries[j]
                if x.id < valued.count, !EditRules.same(UnsafeRawBufferPointer(rebasing: old[x.current]), EditRules.null) { valued[x.id] = true }
                j += 1
                continue
            }
            let n = newValues[i]
            i += 1
            var stored: FieldEntry? = nil
            if j < entryCount, storedEntries[j].id == n.id {
                stored = storedEntries[j]
                j += 1
            }
            let base = stored.map { UnsafeRawBufferPointer(rebasing: old[$0.original]) } ?? EditRules.null
            let local = stored.map { UnsafeRawBufferPointer(rebasing: old[$0.current]) } ?? EditRules.null
            let sides = valBuf.withUnsafeBytes { v in
                let server = UnsafeRawBufferPointer(rebasing: v[n.range])
                var sides = ServerFieldSides(localChanged: stored?.isDirty ?? false, serverChanged: !EditRules.same(server, base), serverIsLocal: EditRules.same(server, local))
                sides.isNewRow = isNewRow
                return sides
            }
            guard let decision = decide(sides) else { return .needsMerge }
            let tag = decision.tag
            var action = decision.action
            // Rebased onto its current value, or "in conflict" with a server that agrees, a
            // field is simply clean at that value.
            if action != .keep && sides.serverIsLocal { action = .takeServer }
            let endsNull = action == .takeServer
                ? valBuf.withUnsafeBytes { v in EditRules.same(UnsafeRawBufferPointer(rebasing: v[n.range]), EditRules.null) }
                : EditRules.same(local, EditRules.null)
            if !endsNull && n.id < valued.count { valued[n.id] = true }
            // `takeServer` of the value already held clean, or `rebase` onto the original the
            // field already has, changes nothing.
            let changes = switch action {
            case .keep: false
            case .takeServer: sides.localChanged || sides.serverChanged
            case .rebase: sides.serverChanged
            case .conflict: true
            }
            changed = changed || changes
            if tag != 0 || changes {
                let d = (id: n.id, base: stored?.original, local: stored?.current, new: n.range, action: changes ? action : .keep, tag: tag)
                if decidedCount < decided.count { decided[decidedCount] = d } else { decided.append(d) }
                decidedCount += 1
            }
        }
        for fid in ref.requiredFieldIDs where !valued[fid] { return .needsMerge }
        // Into the transaction's buffers, kept from row to row: two arrays fewer to allocate per
        // row. The result lends them to the caller; a caller that kept one past the next merge
        // would only make the next row copy it.
        var decisions = serverDecisions
        var ranges = serverRanges
        serverDecisions = []
        serverRanges = []
        // Written over the last row's when there are as many (most rows), else emptied and
        // filled: emptying the two arrays costs about 140 instructions.
        var recorded = 0
        for d in decided[..<decidedCount] where d.tag != 0 { recorded += 1 }
        let inPlace = decisions.count == recorded && ranges.count == recorded
        if !inPlace {
            decisions.removeAll(keepingCapacity: true)
            ranges.removeAll(keepingCapacity: true)
        }
        var k = 0
        for d in decided[..<decidedCount] where d.tag != 0 {
            let decision = ServerFieldDecision(field: t.fieldNames[d.id], action: d.action, tag: d.tag)
            if inPlace {
                decisions[k] = decision
                ranges[k] = (d.base, d.local, d.new)
            } else {
                decisions.append(decision)
                ranges.append((d.base, d.local, d.new))
            }
            k += 1
        }
        defer {
            serverDecisions = decisions
            serverRanges = ranges
        }
        guard changed else { return .merged(decisions, logged: false) }
        // Written into the transaction's buffer, kept from row to row, as the decisions are.
        var audit = annotationBuf
        annotationBuf = []
        audit.removeAll(keepingCapacity: true)
        defer { annotationBuf = audit }
        try valBuf.withUnsafeBytes { v in
            try annotation(ServerFieldValues(decisions: decisions, record: old, values: v, ranges: ranges), &audit)
        }
        // The scan above found whether the row is pending: flags it has none, so a dirty field
        // is what would make it so (`StoredRow.isPending`), and the fold need not scan again.
        assert((try? stored.map { (row) throws(StrataError) in try row.isPending } ?? false) == hasPending, "the scan and StoredRow.isPending disagree")
        try logEdit(kind, t, origin: .server, annotation: audit, old: stored, oldIsPending: hasPending) { (op) throws(StrataError) in
            var flags: RowFlags = []
            valBuf.withUnsafeBytes { v in
                for d in decided[..<decidedCount] {
                    let server = UnsafeRawBufferPointer(rebasing: v[d.new])
                    let local = d.local.map { UnsafeRawBufferPointer(rebasing: old[$0]) } ?? EditRules.null
                    switch d.action {
                    case .keep: break
                    case .takeServer: op.appendCleanEntry(d.id, server)
                    case .rebase: op.appendDirtyEntry(d.id, original: server, current: local)
                    case .conflict:
                        op.appendConflictEntry(d.id, server: server, current: local)
                        flags.insert(.conflicted)
                    }
                }
            }
            return flags
        }
        return .merged(decisions, logged: true)
    }
}

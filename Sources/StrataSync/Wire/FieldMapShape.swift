import Foundation
import Strata

/// What the wire codec keeps from one field map to the next within a document, so that maps
/// naming the same fields in the same order (the rows of a pull page, the changes of a batch)
/// are made without making or hashing their names again.
///
/// A map whose names have, place by place, the bytes of the last map's names is made as a copy
/// of that map with its values replaced through the indices kept: a dictionary's copy keeps its
/// layout, so its indices stay valid and no name is hashed. Any other map is made the ordinary
/// way, with its duplicate check, and becomes the shape for the next one. Bytes decide, so a
/// name in another Unicode form is another name.
struct FieldMapShape {
    /// The last map's names, by place, as bytes (to compare) and as text (to hand out).
    private var names: [(bytes: [UInt8], text: String)] = []
    /// The last map made, and where each of its names is in it, by place.
    private var map: [String: Value] = [:]
    private var indices: [Dictionary<String, Value>.Index] = []
    /// The map being read: its names and values, by place, in the first `count` elements
    /// (overwritten from one map to the next: emptying the arrays for each map costs more).
    private var texts: [String] = []
    private var values: [Value] = []
    private var count = 0
    /// Whether every name of the map being read so far is the last map's at its place.
    private var matching = true

    /// Maps of more names than this are never kept as a shape.
    private static let maxNames = 64

    /// Starts a map.
    mutating func begin() {
        count = 0
        matching = true
    }

    /// The next name of the map, from its bytes.
    mutating func name(_ bytes: UnsafeRawBufferPointer) -> String {
        let place = count
        let text: String
        if matching, place < names.count, Self.same(bytes, names[place].bytes) {
            text = names[place].text
        } else {
            matching = false
            text = String(decoding: bytes, as: UTF8.self)
        }
        if place < texts.count { texts[place] = text } else { texts.append(text) }
        return text
    }

    /// The value of the name given last.
    mutating func value(_ v: Value) {
        if count < values.count { values[count] = v } else { values.append(v) }
        count += 1
    }

    /// The map read since ``begin()``.
    ///
    /// - Throws: the duplicate name, as `duplicate` words it, when the map names a field twice.
    mutating func finish(duplicate: (String, String) -> WireCodecError) throws(WireCodecError) -> [String: Value] {
        if matching, count == names.count, indices.count == names.count {
            var out = map
            for place in indices.indices { out.values[indices[place]] = values[place] }
            map = out
            return out
        }
        let texts = self.texts.prefix(count)
        var out: [String: Value] = Dictionary(minimumCapacity: count)
        for (name, v) in zip(texts, values) where out.updateValue(v, forKey: name) != nil {
            // `updateValue` keeps the key first read: the name's other Unicode form, if not the
            // same bytes.
            throw duplicate(name, out[out.index(forKey: name)!].key)
        }
        if count <= Self.maxNames {
            names = texts.map { (bytes: Array($0.utf8), text: $0) }
            indices = texts.map { out.index(forKey: $0)! }
            map = out
        } else {
            names = []
            indices = []
            map = [:]
        }
        return out
    }

    private static func same(_ a: UnsafeRawBufferPointer, _ b: [UInt8]) -> Bool {
        b.withUnsafeBytes { b in a.count == b.count && (a.isEmpty || memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0) }
    }
}

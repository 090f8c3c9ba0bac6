import Foundation
import Strata
import StrataSync
import Testing

/// Decode and encode speed of a 10,000-row delta page, the codec against `JSONDecoder` and
/// `JSONEncoder`. A measurement, not a test: it prints and asserts nothing but agreement, and runs
/// only when asked, in a release build:
///
///     swift build -c release --build-tests -Xswiftc -enable-testing
///     STRATA_WIRE_MEASURE=1 swift test -c release --skip-build --filter WireCodecMeasurement
@Suite(.enabled(if: ProcessInfo.processInfo.environment["STRATA_WIRE_MEASURE"] != nil))
struct WireCodecMeasurement {
    /// A page of `rows` task rows, as a server sends them.
    static func page(rows: Int) -> ServerDelta {
        var upserts: [ServerRow] = []
        for i in 0..<rows {
            var fields: [String: Value] = [:]
            fields["id"] = .int(Int64(i))
            fields["title"] = .string("Task number \(i): buy oat milk")
            fields["done"] = .bool(i % 3 == 0)
            fields["priority"] = .int(Int64(i % 5))
            fields["notes"] = i % 4 == 0 ? .null : .string("Notes for task \(i), with a / and an é")
            fields["updated"] = .timestamp(Date(timeIntervalSince1970: 1_763_700_000.5 + Double(i)))
            fields["estimate"] = .double(Double(i) / 8)
            upserts.append(ServerRow(fields, version: "v\(i)", timestamp: Date(timeIntervalSince1970: 1_763_700_000 + Double(i))))
        }
        return ServerDelta(since: "v41", anchor: "v42", tables: [TableDelta("tasks", upserts: upserts, deletes: [8, 9])])
    }

    static func time(_ runs: Int, _ body: () throws -> Void) rethrows -> Duration {
        var best = Duration.seconds(1_000)
        for _ in 0..<runs {
            let start = ContinuousClock.now
            try body()
            best = min(best, ContinuousClock.now - start)
        }
        return best
    }

    @Test func decodeAndEncodeSpeedOfADeltaPage() throws {
        let rows = 10_000
        let delta = Self.page(rows: rows)
        let data = try WireFormat.encodeWithFoundation(delta)
        let mb = Double(data.count) / 1_000_000
        #expect(try WireFormat.decode(ServerDelta.self, from: data) == WireFormat.decodeWithFoundation(ServerDelta.self, from: data))

        func report(_ what: String, _ d: Duration) {
            let s = Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
            print("WireCodecMeasurement: \(what): \(String(format: "%.1f", mb / s)) MB/s, \(String(format: "%.2f", s / Double(rows) * 1e6)) µs/row (\(String(format: "%.1f", s * 1000)) ms for \(rows) rows, \(data.count) bytes)")
        }
        if ProcessInfo.processInfo.environment["STRATA_WIRE_MEASURE"] == "codec" {  // for a profiler
            report("decode, codec", try Self.time(100) { _ = try WireFormat.decode(ServerDelta.self, from: data) })
            return
        }
        report("decode, codec", try Self.time(10) { _ = try WireFormat.decode(ServerDelta.self, from: data) })
        report("decode, codec from borrowed bytes", try Self.time(10) { _ = try data.withUnsafeBytes { try WireCodec.decodeServerDelta($0) } })
        report("decode, JSONDecoder", try Self.time(3) { _ = try WireFormat.decodeWithFoundation(ServerDelta.self, from: data) })
        report("encode, codec", try Self.time(10) { _ = try WireFormat.encode(delta) })
        report("encode, JSONEncoder", try Self.time(3) { _ = try WireFormat.encodeWithFoundation(delta) })
    }
}

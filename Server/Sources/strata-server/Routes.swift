import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import PostgresNIO
import Strata
import StrataSync

/// The HTTP side: every handler answers JSON, and every refusal is a 4xx with
/// `{"error": <code>, "message": <what was wrong>}` that changes nothing (a 409 `batchIDReused`
/// adds `highestBatchNumber`).
///
/// - `GET /v1/health`: 200 when PostgreSQL answers, else 503.
/// - `GET /v1/changes?since=<anchor>&limit=<n>[&until=<v>]`: a page of changes as a
///   `ServerDelta`. Headers: `Strata-More: true` when more pages follow (ask again with the page's
///   anchor as `since` and the same `until`), `Strata-Until` (the version the pull runs up to).
///   Without `since`: a snapshot page; the next one is asked with `until` and the `Strata-After`
///   header as `after` (see ``Cursor``).
/// - `POST /v1/batches`: a `Batch`; answers its `BatchAck`.
struct Routes: Sendable {
    let db: Database
    let maxBody: Int
    let maxLimit = 10_000

    func build() -> Router<BasicRequestContext> {
        let router = Router()
        router.get("/v1/health") { _, _ in await respond { try await health() } }
        router.get("/v1/changes") { request, _ in await respond { try await changes(request) } }
        router.post("/v1/batches") { request, _ in await respond { try await push(request) } }
        return router
    }

    private func health() async throws -> Response {
        _ = try await db.client.query("SELECT 1", logger: db.logger).collect()
        return json(200, Data(#"{"status":"ok"}"#.utf8))
    }

    /// The client id of the request's bearer token; 401 without a valid one.
    private func authenticate(_ request: Request) async throws -> String {
        guard let header = request.headers[.authorization], header.hasPrefix("Bearer "), header.count > 7 else {
            throw RequestError(401, "unauthorized", "send 'Authorization: Bearer <token>' (make one with `strata-server token create`)")
        }
        guard let client = try await db.clientID(token: String(header.dropFirst(7))) else {
            throw RequestError(401, "unauthorized", "the bearer token is not one this server issued")
        }
        return client
    }

    private func changes(_ request: Request) async throws -> Response {
        _ = try await authenticate(request)
        let q = request.uri.queryParameters
        var limit = 1000
        if let l = q["limit"] {
            guard let n = Int(l), n > 0, n <= maxLimit else { throw RequestError.bad("limit must be a whole number from 1 to \(maxLimit), not '\(l)'") }
            limit = n
        }
        let since = q["since"].map(String.init)
        var after: (String, String)?
        if let cursor = q["after"] {
            after = try Cursor.decode(String(cursor))
        } else if let t = q["afterTable"], let k = q["afterKey"] {
            after = (String(t), String(k))
        }
        let page = try await db.changes(since: since, until: q["until"].map(String.init), after: after, limit: limit)
        var response = json(200, Data(page.body))
        response.headers[Self.more] = page.more ? "true" : "false"
        response.headers[Self.until] = String(page.until)
        if page.more, let (t, k) = page.after {
            response.headers[Self.after] = try Cursor.encode(t, k)
            // The headers clients before `Strata-After` read, sent where they arrive intact.
            if t.allSatisfy(\.isASCII) && k.allSatisfy(\.isASCII) {
                response.headers[Self.afterTable] = t
                response.headers[Self.afterKey] = k
            }
        }
        return response
    }

    static let more = HTTPField.Name("Strata-More")!
    static let until = HTTPField.Name("Strata-Until")!
    static let after = HTTPField.Name("Strata-After")!
    static let afterTable = HTTPField.Name("Strata-After-Table")!
    static let afterKey = HTTPField.Name("Strata-After-Key")!

    /// Where the next snapshot page starts: the table and the key (as stored) of the last row
    /// sent, as the JSON array `[table, key]` in base64url without padding. Table names and keys
    /// may be any Unicode; an HTTP header carries ASCII safely (URLSession on Apple's platforms
    /// reads header values as Latin-1, which mangled a raw UTF-8 key), and base64url also
    /// passes through a query string as it is.
    enum Cursor {
        static func encode(_ table: String, _ key: String) throws -> String {
            try JSONEncoder().encode([table, key]).base64EncodedString()
                .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
        }

        static func decode(_ text: String) throws(RequestError) -> (String, String) {
            var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
            guard let data = Data(base64Encoded: base64), let pair = try? JSONDecoder().decode([String].self, from: data), pair.count == 2 else {
                throw .bad("'after' is not a cursor this server hands out (the Strata-After header)")
            }
            return (pair[0], pair[1])
        }
    }

    private func push(_ request: Request) async throws -> Response {
        let client = try await authenticate(request)
        let body: ByteBuffer
        do {
            body = try await request.body.collect(upTo: maxBody)
        } catch {
            throw RequestError(413, "tooLarge", "the batch is larger than the server takes (\(maxBody) bytes); send smaller batches")
        }
        let batch: Batch
        do {
            batch = try WireFormat.decode(Batch.self, from: Data(body.readableBytesView))
        } catch {
            throw RequestError.bad(error.message)
        }
        guard batch.clientID == client else {
            throw RequestError(403, "forbidden", "this token belongs to client '\(client)', not '\(batch.clientID)'")
        }
        return json(200, try await db.apply(batch))
    }

    private func json(_ status: Int, _ data: Data) -> Response {
        Response(
            status: .init(code: status), headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// Runs a handler; a refusal or a failure becomes a JSON error response.
    private func respond(_ body: () async throws -> Response) async -> Response {
        do {
            return try await body()
        } catch let e as RequestError {
            return failure(e.status, e.code, e.message, highestBatchNumber: e.highestBatchNumber)
        } catch let e as PSQLError {
            db.logger.error("PostgreSQL: \(String(reflecting: e))")
            // Data exceptions (class 22: a value PostgreSQL cannot take) and program limits
            // (class 54: a row or an index entry too large) fail the same way every time: the
            // request is refused for good, so that a client does not retry it. Everything else
            // (connections, shutdowns, resources) may pass.
            if let state = e.serverInfo?[.sqlState], state.hasPrefix("22") || state.hasPrefix("54") {
                return failure(400, "badRequest", "PostgreSQL refused the request (SQLSTATE \(state)): \(e.serverInfo?[.message] ?? "")")
            }
            return failure(503, "unavailable", "the database is unavailable (\(e.code)); try again")
        } catch {
            db.logger.error("\(String(reflecting: error))")
            return failure(500, "internal", "\(error)")
        }
    }

    /// An error body: `{"error": <code>, "message": <text>}`, and `highestBatchNumber` when given.
    private struct Failure: Encodable {
        var error: String
        var message: String
        var highestBatchNumber: UInt64?
    }

    private func failure(_ status: Int, _ code: String, _ message: String, highestBatchNumber: UInt64? = nil) -> Response {
        let body = try? WireFormat.encoder.encode(Failure(error: code, message: message, highestBatchNumber: highestBatchNumber))
        return json(status, body ?? Data())
    }
}

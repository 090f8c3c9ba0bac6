import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Strata

/// A ``SyncTransport`` that talks to a Strata sync server (`strata-server`, or any server that
/// speaks the same protocol) over HTTP, with Foundation's `URLSession`: apps add no dependency.
///
/// ```swift
/// let transport = HTTPSyncTransport(server: URL(string: "http://127.0.0.1:8080")!, token: token)
/// let report = try await SyncClient(store: store).sync(with: transport)
/// ```
///
/// The protocol:
/// - `GET /v1/changes?since=<anchor>&limit=<n>` answers a ``ServerDelta`` page; the header
///   `Strata-More: true` says more follow. ``pullPage(_:)`` fetches one page and says where the
///   next starts; ``pull(since:)`` pages through them (within `maxPages`) and returns them as one
///   delta.
/// - `POST /v1/batches` takes a ``Batch`` and answers its ``BatchAck``.
/// - Every request carries `Authorization: Bearer <token>`.
///
/// Errors say what happened: a server that cannot be reached or times out, or a 5xx, is
/// `StrataError` `io` (worth retrying); a refused token (401) or another client's id (403) is
/// `invalidOperation`; a pull the server finds malformed (400) or an answer that is not the wire
/// format is `malformedInput`. A 410 (the server no longer knows the client, or its anchor
/// expired) is ``ResetRequired``. A push the server refuses as a whole is ``BatchRefused``: a
/// 409 (it applied another batch under this id) is ``BatchRefused/Reason/idReused``, with the
/// server's highest batch number for this client; a 413 (over its body limit)
/// ``BatchRefused/Reason/tooLarge``; a 400 (a batch it cannot take, naming no row)
/// ``BatchRefused/Reason/invalid``.
public struct HTTPSyncTransport: SyncTransport {
    /// The server's base URL, such as `http://127.0.0.1:8080`.
    public let server: URL
    /// The bearer token that stands for this client (`strata-server token create`).
    public let token: String
    /// Rows per page of a pull.
    public let pageSize: Int
    /// Rows per page unless told otherwise: 5,000 rows, about 1.5 MB of JSON for rows of a few
    /// short fields, held while the page merges (and one more while the next arrives). Fewer,
    /// larger pages cost fewer requests and commits: a first sync on this machine took 1.4× as
    /// long with 1,000 (`strata-sync-bench`).
    public static let defaultPageSize = 5000
    /// The most pages one pull fetches; a pull that would need more throws, rather than loop.
    public let maxPages: Int
    private let session: URLSession

    /// - Parameters:
    ///   - server: the server's base URL, such as `http://127.0.0.1:8080`.
    ///   - token: the bearer token that stands for this client (`strata-server token create`).
    ///   - timeout: seconds a request may take before it fails with `io`.
    ///   - pageSize: rows per page of a pull; 1 or more, else ``pull(since:)`` throws.
    ///   - maxPages: the most pages one pull fetches; a pull that would need more throws. 1 or
    ///     more, else ``pull(since:)`` throws.
    public init(server: URL, token: String, timeout: TimeInterval = 30, pageSize: Int = defaultPageSize, maxPages: Int = 10_000) {
        // Checked by `pull`, which throws: this initializer does not, and trapping on an
        // argument would take the app down instead of reporting it.
        self.server = server
        self.token = token
        self.pageSize = pageSize
        self.maxPages = maxPages
        let config = URLSessionConfiguration.ephemeral
        config.timeoutIntervalForRequest = timeout
        config.timeoutIntervalForResource = timeout
        config.requestCachePolicy = .reloadIgnoringLocalCacheData
        session = URLSession(configuration: config)
    }

    /// Pulls every change since `anchor` (`nil`: a snapshot of every table), page by page, as one
    /// delta. (`sync` merges page by page instead: ``pullPage(_:)``.)
    ///
    /// - Throws: ``ResetRequired``, or `StrataError` as described on the type;
    ///   `StrataError` `invalidOperation`, before any request, when ``pageSize`` or ``maxPages``
    ///   is below 1.
    /// - Complexity: one request per `pageSize` rows.
    public func pull(since anchor: String?) async throws -> ServerDelta {
        var combined: ServerDelta?
        var cursor = PullCursor(since: anchor)
        for _ in 0..<max(maxPages, 1) {
            let page = try await pullPage(cursor)
            combined = combined.map { Self.append(page.delta, to: $0) } ?? page.delta
            guard let next = page.next else { return combined! }
            cursor = next
        }
        throw StrataError(.io, "the pull from \(server) needs more than \(maxPages) pages of \(pageSize) rows; raise maxPages or pageSize")
    }

    /// Fetches one page of changes (`GET /v1/changes`) and the cursor of the next.
    ///
    /// - Throws: ``ResetRequired``, or `StrataError` as described on the type;
    ///   `StrataError` `invalidOperation`, before any request, when ``pageSize`` or ``maxPages``
    ///   is below 1.
    /// - Complexity: one request of up to `pageSize` rows.
    public func pullPage(_ cursor: PullCursor) async throws -> PulledPage {
        guard pageSize > 0, maxPages > 0 else {
            throw StrataError(.invalidOperation, "HTTPSyncTransport was made with pageSize \(pageSize) and maxPages \(maxPages); both must be 1 or more")
        }
        var query: [URLQueryItem] = []
        if let since = cursor.since { query.append(URLQueryItem(name: "since", value: cursor.after ?? since)) }
        if let until = cursor.until { query.append(URLQueryItem(name: "until", value: until)) }
        if cursor.isSnapshot, let after = cursor.after { query.append(URLQueryItem(name: "after", value: after)) }
        query.append(URLQueryItem(name: "limit", value: String(pageSize)))
        let (data, headers) = try await send("GET", "v1/changes", query: query)
        let page: ServerDelta
        do { page = try WireFormat.decode(ServerDelta.self, from: data) } catch {
            throw StrataError(.malformedInput, "the sync server's changes are not a valid delta: \(error.message)", cause: error)
        }
        guard headers["Strata-More"] == "true" else { return PulledPage(delta: page, next: nil) }
        guard let until = headers["Strata-Until"] else {
            throw StrataError(.malformedInput, "the sync server says more changes follow but not up to which version (Strata-Until)")
        }
        if !cursor.isSnapshot {
            return PulledPage(delta: page, next: PullCursor(since: cursor.since, until: until, after: page.anchor))
        }
        // Opaque, and ASCII: sent back as it came.
        guard let after = headers["Strata-After"] else {
            throw StrataError(.malformedInput, "the sync server says more snapshot pages follow but not where they start (Strata-After)")
        }
        return PulledPage(delta: page, next: PullCursor(since: nil, until: until, after: after))
    }

    /// Appends a later page: its rows after the earlier pages' rows, table by table, and its
    /// anchor. (The server sends each row at most once per pull.)
    static func append(_ page: ServerDelta, to delta: ServerDelta) -> ServerDelta {
        var out = delta
        out.anchor = page.anchor
        for t in page.tables {
            if let i = out.tables.firstIndex(where: { $0.table == t.table }) {
                out.tables[i].upserts += t.upserts
                out.tables[i].deletes += t.deletes
            } else {
                out.tables.append(t)
            }
        }
        return out
    }

    /// Uploads a batch and returns the server's acknowledgement.
    ///
    /// - Throws: `StrataError` as described on the type.
    public func push(_ batch: Batch) async throws -> BatchAck {
        let (data, _) = try await send("POST", "v1/batches", body: try WireFormat.encode(batch), pushing: true)
        let ack: BatchAck
        do { ack = try WireFormat.decode(BatchAck.self, from: data) } catch {
            throw StrataError(.malformedInput, "the sync server's answer to batch \(batch.id) is not a valid acknowledgement: \(error.message)", cause: error)
        }
        guard ack.batchID == batch.id, ack.results.count == batch.changes.count else {
            throw StrataError(.malformedInput, "the sync server answered batch \(batch.id) with the acknowledgement of \(ack.batchID) (\(ack.results.count) results for \(batch.changes.count) changes)")
        }
        return ack
    }

    /// Whether the server and its database answer (`GET /v1/health`).
    public func health() async throws {
        _ = try await send("GET", "v1/health")
    }

    /// The server's JSON error body: `{"error": <code>, "message": <text>}`, and with a 409 to a
    /// push, `highestBatchNumber`.
    private struct ErrorBody: Decodable {
        var error: String
        var message: String
        var highestBatchNumber: UInt64?
    }

    /// Sends a request; with `pushing`, a refusal of the batch it carries is ``BatchRefused``.
    private func send(_ method: String, _ path: String, query: [URLQueryItem] = [], body: Data? = nil, pushing: Bool = false) async throws -> (Data, [String: String]) {
        var components = URLComponents(url: server.appendingPathComponent(path), resolvingAgainstBaseURL: false)!
        if !query.isEmpty { components.queryItems = query }
        // URLComponents leaves '+' as is, which a server reads as a space.
        components.percentEncodedQuery = components.percentEncodedQuery?.replacingOccurrences(of: "+", with: "%2B")
        guard let url = components.url else { throw StrataError(.invalidOperation, "cannot form a request URL from \(server)") }
        var request = URLRequest(url: url)
        request.httpMethod = method
        request.httpBody = body
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        if body != nil { request.setValue("application/json", forHTTPHeaderField: "Content-Type") }
        let data: Data
        let response: URLResponse
        do {
            (data, response) = try await session.data(for: request)
        } catch {
            throw StrataError(.io, "cannot reach the sync server at \(server) (\(method) /\(path)): \(error.localizedDescription)", cause: error)
        }
        guard let http = response as? HTTPURLResponse else {
            throw StrataError(.io, "the sync server at \(server) did not answer over HTTP")
        }
        var headers: [String: String] = [:]
        for (k, v) in http.allHeaderFields {
            if let k = k as? String, let v = v as? String { headers[Self.canonical(k)] = v }
        }
        if (200..<300).contains(http.statusCode) { return (data, headers) }
        let detail = (try? JSONDecoder().decode(ErrorBody.self, from: data)) ?? ErrorBody(error: "", message: String(decoding: data.prefix(500), as: UTF8.self))
        let what = "the sync server refused \(method) /\(path) (\(http.statusCode)): \(detail.message)"
        switch http.statusCode {
        case 410: throw ResetRequired(detail.error == "anchorExpired" ? .anchorExpired : .unknownClient, message: detail.message)
        case 409 where pushing: throw BatchRefused(.idReused, message: detail.message, highestBatchNumber: detail.highestBatchNumber)
        case 413 where pushing: throw BatchRefused(.tooLarge, message: detail.message)
        case 400 where pushing: throw BatchRefused(.invalid, message: detail.message)
        case 401, 403: throw StrataError(.invalidOperation, what)
        case 400..<500: throw StrataError(.malformedInput, what)
        default: throw StrataError(.io, what)
        }
    }

    /// Header names as `Strata-More`, whatever case the server or Foundation gave them.
    private static func canonical(_ name: String) -> String {
        name.split(separator: "-").map { $0.prefix(1).uppercased() + $0.dropFirst().lowercased() }.joined(separator: "-")
    }
}

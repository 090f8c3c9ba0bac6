import Foundation
import Strata
import StrataSync

/// The tables the server keeps: the tables file, read and checked by StrataSync's `TablesFile`,
/// the one loader the CLI and apps use too (its format is in docs/server.md).
typealias TableConfig = TablesFile

extension TablesFile {
    /// Reads and checks the tables file at `path`; a problem is a fatal start-up error.
    static func load(path: String) throws -> TablesFile {
        do {
            return try TablesFile(contentsOf: URL(fileURLWithPath: path))
        } catch {
            throw ServerError(error.message)
        }
    }
}

/// A fatal configuration or start-up problem, printed as one line.
struct ServerError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A request the server refuses, with the HTTP status and a message for the client.
struct RequestError: Error {
    var status: Int
    var code: String
    var message: String
    /// With a 409 `batchIDReused`: the highest batch number stored for the client.
    var highestBatchNumber: UInt64?
    init(_ status: Int, _ code: String, _ message: String) {
        self.status = status
        self.code = code
        self.message = message
    }
    static func bad(_ message: String) -> RequestError { RequestError(400, "badRequest", message) }
}

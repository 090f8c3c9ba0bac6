import ArgumentParser
import Foundation
import Hummingbird
import Logging
import NIOCore
import PostgresNIO
import Strata
import StrataSync

/// `strata-server`: the reference sync server, and its admin commands.
@main
struct ServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "strata-server",
        abstract: "Strata's reference sync server: the JSON wire format over HTTP, with PostgreSQL as the truth.",
        subcommands: [Serve.self, Token.self, Prune.self],
        defaultSubcommand: Serve.self
    )
}

/// Where PostgreSQL is: `--database-url`, else `STRATA_DATABASE_URL`.
struct DatabaseOptions: ParsableArguments {
    @Option(help: "PostgreSQL URL, postgres://user:password@host:port/database (default: $STRATA_DATABASE_URL).")
    var databaseURL: String?

    var url: String {
        get throws {
            guard let url = databaseURL ?? ProcessInfo.processInfo.environment["STRATA_DATABASE_URL"] else {
                throw ValidationError("give --database-url or set STRATA_DATABASE_URL")
            }
            return url
        }
    }

    /// Runs `body` with a connected pool and the schema in place; the pool stops afterwards.
    func withDatabase<R: Sendable>(tables: TableConfig, _ body: @Sendable (Database) async throws -> R) async throws -> R {
        // Logs go to standard error; standard output carries only what scripts read.
        LoggingSystem.bootstrap(StreamLogHandler.standardError)
        var logger = Logger(label: "strata-server")
        logger.logLevel = ProcessInfo.processInfo.environment["LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:)) ?? .notice
        let config = try Database.configuration(url: try url)
        let client = PostgresClient(configuration: config.pool, backgroundLogger: logger)
        let db = Database(client: client, tables: tables, logger: logger)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            try await db.migrate(over: config.connection)
            return try await body(db)
        }
    }
}

extension ServerCommand {
    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Serve clients (the default command).")

        @OptionGroup var database: DatabaseOptions
        @Option(help: "The tables file (JSON; default: $STRATA_TABLES).")
        var tables: String?
        @Option(help: "Address to listen on (default: $STRATA_HOST, else 127.0.0.1).")
        var host: String?
        @Option(help: "Port to listen on; 0 picks a free one (default: $STRATA_PORT, else 8080).")
        var port: Int?
        @Option(help: "Largest request body accepted, in bytes.")
        var maxBody = 16 << 20

        func run() async throws {
            keepHeap()
            let env = ProcessInfo.processInfo.environment
            guard let path = tables ?? env["STRATA_TABLES"] else { throw ValidationError("give --tables or set STRATA_TABLES") }
            let config = try TableConfig.load(path: path)
            let host = self.host ?? env["STRATA_HOST"] ?? "127.0.0.1"
            guard let port = self.port ?? env["STRATA_PORT"].flatMap(Int.init) ?? 8080 as Int?, (0...65535).contains(port) else {
                throw ValidationError("the port must be from 0 to 65535")
            }
            let maxBody = self.maxBody
            try await database.withDatabase(tables: config) { db in
                let app = Application(
                    router: Routes(db: db, maxBody: maxBody).build(),
                    configuration: .init(address: .hostname(host, port: port), serverName: "strata-server"),
                    onServerRunning: { channel in
                        // Tests and scripts wait for this line (and read the port from it).
                        // Written unbuffered, so that a reader of a pipe sees it at once.
                        FileHandle.standardOutput.write(Data("strata-server listening on http://\(host):\(channel.localAddress?.port ?? port)\n".utf8))
                    },
                    logger: db.logger
                )
                try await app.runService()
            }
        }
    }

    struct Token: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Manage bearer tokens.", subcommands: [Create.self])

        struct Create: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Make a token for a client id and print it (only its hash is stored).")
            @OptionGroup var database: DatabaseOptions
            @Option(name: .customLong("client-id"), help: "The client id a token stands for (a store's client id, as `strata info` shows it); repeat it for several tokens, printed one a line.")
            var clientIDs: [String] = []
            @Option(help: "A store on this machine whose client id the token stands for (instead of --client-id).")
            var store: String?

            func validate() throws {
                guard clientIDs.isEmpty != (store == nil) else { throw ValidationError("give either --client-id or --store") }
            }

            func run() async throws {
                var ids = clientIDs
                if let store {
                    var options = StoreOptions()
                    options.createIfMissing = false
                    ids = [try Store(path: store, options: options).clientID]
                }
                let clients = ids
                let tokens = try await database.withDatabase(tables: TableConfig(tables: [])) { db in
                    var out: [String] = []
                    for id in clients { out.append(try await db.createToken(clientID: id)) }
                    return out
                }
                print(tokens.joined(separator: "\n"))
            }
        }
    }

    struct Prune: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove tombstones up to a version; clients behind it are told to reset.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Remove tombstones with this version or lower.")
        var through: Int64

        func run() async throws {
            let v = through
            let gone = try await database.withDatabase(tables: TableConfig(tables: [])) { try await $0.prune(through: v) }
            print("removed \(gone) tombstones; anchors older than \(v) now get anchorExpired")
        }
    }
}

/// Keeps the freed heap for the next request (glibc only).
///
/// With glibc's defaults, the memory a pull page or a batch frees is trimmed back to the system
/// as soon as it is freed and faulted in again, zeroed, by the next request: under load that was
/// about 4% of the server's CPU (`perf`, 2026-11-28), and fixed thresholds saved about 5% of its
/// CPU per row served. The server keeps up to 64 MiB free per heap instead.
private func keepHeap() {
    #if canImport(Glibc)
    _ = mallopt(-1, 64 << 20)   // M_TRIM_THRESHOLD: trim only past 64 MiB free
    _ = mallopt(-3, 32 << 20)   // M_MMAP_THRESHOLD: a fixed one, so the trim threshold stays
    #endif
}

#if canImport(Glibc)
/// glibc's `mallopt` (`malloc.h`), which Swift's Glibc module does not declare.
@_silgen_name("mallopt") private func mallopt(_ parameter: Int32, _ value: Int32) -> Int32
#endif

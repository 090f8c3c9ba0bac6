// swift-tools-version: 6.2
import PackageDescription

// The reference sync server, in its own package so that Strata's library users never build
// SwiftNIO. It shares the wire types with the client through the root package (`StrataSync`).
let package = Package(
    name: "StrataServer",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "strata-server", targets: ["strata-server"]),
        .executable(name: "strata-server-load", targets: ["strata-server-load"]),
        .executable(name: "strata-sync-bench", targets: ["strata-sync-bench"]),
    ],
    dependencies: [
        // Named, because a path dependency is otherwise known by its folder name, which differs per checkout.
        .package(name: "Strata", path: ".."),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: []),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        // Already in the build through PostgresNIO: the SHA-256 of each batch, in the process.
        .package(url: "https://github.com/apple/swift-crypto", "3.12.3"..<"5.0.0"),
    ],
    targets: [
        .executableTarget(
            name: "strata-server",
            dependencies: [
                .product(name: "StrataSync", package: "Strata"),
                .product(name: "Strata", package: "Strata"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // What the benchmarks share: starting the server, reading processes' CPU time.
        .target(name: "BenchSupport"),
        // The load benchmark: many HTTP clients pushing and pulling (a benchmark, not a test).
        .executableTarget(
            name: "strata-server-load",
            dependencies: [
                "BenchSupport",
                .product(name: "StrataSync", package: "Strata"),
                .product(name: "Strata", package: "Strata"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // The first-sync benchmark: a new store syncing N rows from the server, with the limits
        // (PostgreSQL alone, the server alone, the merge alone) measured in the same run.
        .executableTarget(
            name: "strata-sync-bench",
            dependencies: [
                "BenchSupport",
                .product(name: "StrataSync", package: "Strata"),
                .product(name: "Strata", package: "Strata"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // Runs the built `strata-server` (and the root package's `strata`) against a real
        // PostgreSQL named by STRATA_TEST_PG_URL.
        .testTarget(
            name: "StrataServerTests",
            dependencies: [
                "strata-server",
                .product(name: "StrataSync", package: "Strata"),
                .product(name: "Strata", package: "Strata"),
                // InMemorySyncServer, for the test that holds it to strata-server's answers.
                .product(name: "StrataTesting", package: "Strata"),
            ]
        ),
    ]
)

for target in package.targets {
    var settings = target.swiftSettings ?? []
    settings.append(.swiftLanguageMode(.v6))
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    settings.append(.enableUpcomingFeature("MemberImportVisibility"))
    target.swiftSettings = settings
}

// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "Strata",
    // Minimum versions on Apple platforms only (macOS 15 for Synchronization's Mutex); Linux needs
    // none. iOS is not supported: CLMDB takes LMDB from the system through pkg-config, which iOS
    // does not have. SwiftPM cannot mark a platform unsupported, so an iOS build fails at lmdb.h.
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Strata", targets: ["Strata"]),
        .library(name: "LMDB", targets: ["LMDB"]),
        .library(name: "StrataSync", targets: ["StrataSync"]),
        .library(name: "StrataWorkload", targets: ["StrataWorkload"]),
        // Test doubles for apps' tests: an in-process sync server, temporary stores.
        .library(name: "StrataTesting", targets: ["StrataTesting"]),
        .executable(name: "strata", targets: ["StrataCLI"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        // `swift package generate-documentation` (.ci/docs); a command plugin, never linked.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // The system's LMDB (Debian's liblmdb-dev, Homebrew's lmdb), found through pkg-config; the
        // shim only includes <lmdb.h>.
        .systemLibrary(
            name: "CLMDB",
            pkgConfig: "lmdb",
            providers: [.apt(["liblmdb-dev"]), .brew(["lmdb"])]
        ),
        // The platform's C library (Glibc, Musl or Darwin) under one name, for the files that call
        // POSIX directly; no product names it.
        .target(name: "StrataLibc"),
        .target(name: "LMDB", dependencies: ["CLMDB", "StrataLibc"]),
        // CRC-32C with the processor's instruction, for the log's record checksums (C: Swift
        // cannot emit it portably); Strata falls back to its own table-driven loop without it.
        .target(name: "CStrataCRC"),
        .target(name: "Strata", dependencies: ["LMDB", "CStrataCRC", "StrataLibc"]),
        // Server deltas, three-way merge and conflict policies (and later batching).
        .target(
            name: "StrataSync",
            dependencies: ["Strata"],
            // The wire format's JSON Schema and example documents, for server developers.
            exclude: ["Wire/strata-wire.schema.json", "Wire/examples"]
        ),
        // The reference workload of Benchmarks/WORKLOAD.md, shared by `strata bench` and Benchmarks/.
        .target(name: "StrataWorkload", dependencies: ["Strata"]),
        // Test doubles, kept out of the modules an app ships: InMemorySyncServer, temporary stores.
        .target(name: "StrataTesting", dependencies: ["Strata", "StrataSync"]),
        .executableTarget(
            name: "StrataCLI",
            dependencies: [
                "LMDB",
                "Strata",
                "StrataSync",
                "StrataWorkload",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // Writes until killed; the crash tests run it and SIGKILL it at random moments.
        .executableTarget(name: "strata-crash-helper", dependencies: ["Strata", "StrataSync"], path: "Tests/CrashHelper"),
        .testTarget(name: "LMDBTests", dependencies: ["LMDB"]),
        // Fixtures: stores written by earlier formats, opened in place by the migration tests.
        .testTarget(name: "StrataTests", dependencies: ["Strata", "LMDB", "StrataWorkload"], exclude: ["Fixtures"]),
        // Fixtures: a format-2 store holding deferred conflicts, for the 2 → 3 migration test.
        .testTarget(name: "StrataSyncTests", dependencies: ["StrataSync", "Strata", "StrataWorkload", "LMDB", "StrataTesting"], exclude: ["Fixtures"]),
        // Runs the built `strata` executable; the dependency makes `swift test` build it first.
        .testTarget(name: "StrataCLITests", dependencies: ["StrataCLI", "strata-crash-helper", "Strata", "StrataSync", "LMDB", "StrataLibc"]),
    ]
)

// Strict settings for every Swift target, in one place.
for target in package.targets where target.type != .system && target.name != "CStrataCRC" {
    var settings = target.swiftSettings ?? []
    settings.append(.swiftLanguageMode(.v6))
    // Require `any` for existential types (SE-0335).
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    // A file sees only the modules it imports itself (SE-0444).
    settings.append(.enableUpcomingFeature("MemberImportVisibility"))
    target.swiftSettings = settings
}

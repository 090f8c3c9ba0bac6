// swift-tools-version: 6.1
import PackageDescription

// Benchmarks live in their own package so that Strata's users never build package-benchmark.
let package = Package(
    name: "StrataBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        // Named, because a path dependency is otherwise known by its folder name, which differs per checkout.
        .package(name: "Strata", path: "../"),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        // Debian's libsqlite3, with the session extension's declarations switched on.
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // Strata and the SQLite peers behind one interface, run on the reference workload.
        .target(
            name: "Peers",
            dependencies: [
                "CSQLite",
                .product(name: "Strata", package: "Strata"),
                .product(name: "StrataSync", package: "Strata"),
                .product(name: "StrataWorkload", package: "Strata"),
                // The raw-LMDB peer: the engine's own limit.
                .product(name: "LMDB", package: "Strata"),
            ]
        ),
        // `swift run -c release compare`: every phase, Strata against the peers, in one run.
        .executableTarget(name: "compare", dependencies: ["Peers"]),
        // `swift run -c release profile <phase> <folder>`: one phase of Strata's side alone, for a profiler.
        .executableTarget(name: "profile", dependencies: ["Peers"]),
        // package-benchmark: throughput and allocation counts, with thresholds kept in Thresholds/.
        .executableTarget(
            name: "StrataBenchmarks",
            dependencies: [
                "Peers",
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "Strata", package: "Strata"),
                .product(name: "StrataWorkload", package: "Strata"),
            ],
            path: "Benchmarks/StrataBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
    ]
)

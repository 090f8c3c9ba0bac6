// swift-tools-version: 6.1
import PackageDescription

// What the page check costs at open (docs/damaged-stores.md): a store of a given size, opened
// with each `OpenCheck`, and `Store.check` quick and full. Its own package, so that building it
// builds only Strata (in release), not package-benchmark.
//   swift run -c release --package-path Benchmarks/OpenCheck open-check 100 300
let package = Package(
    name: "OpenCheck",
    platforms: [.macOS(.v15)],
    dependencies: [.package(name: "Strata", path: "../..")],
    targets: [
        .executableTarget(name: "open-check", dependencies: [.product(name: "Strata", package: "Strata")], swiftSettings: [.swiftLanguageMode(.v6)]),
    ]
)

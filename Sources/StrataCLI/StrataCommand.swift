import ArgumentParser
import Strata

@main
struct StrataCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "strata",
        abstract: "Inspect, debug and demonstrate Strata stores.",
        version: "0.1.0",
        subcommands: [DemoCommand.self, BenchCommand.self]
    )
}

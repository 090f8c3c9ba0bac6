import ArgumentParser
import Strata

@main
struct StrataCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "strata",
        abstract: "Inspect, debug and demonstrate Strata stores.",
        discussion: """
            Exit status: 0 on success, 1 when verify finds differences, 2 for an error (a path \
            that is not a store, an unknown table or key, a malformed file, …), 64 for bad arguments.
            """,
        version: "0.1.0",
        subcommands: [
            DemoCommand.self, InfoCommand.self, ShowCommand.self, LogCommand.self, HistoryCommand.self,
            PendingCommand.self, ConflictsCommand.self, MergeCommand.self, CompactCommand.self, RebuildCommand.self,
            VerifyCommand.self, ReplayCommand.self, ExportCommand.self, ImportCommand.self, CopyCommand.self,
            BenchCommand.self, CreateCommand.self, SyncCommand.self,
        ]
    )
}

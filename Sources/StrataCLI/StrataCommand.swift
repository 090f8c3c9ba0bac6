import ArgumentParser
import Foundation
import Strata

@main
struct StrataCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "strata",
        abstract: "Inspect, debug and demonstrate Strata stores.",
        discussion: """
            Exit status: 0 on success, 1 when verify finds differences, 2 for an error (a path \
            that is not a store, an unknown table or key, a malformed file, …), 3 when the store's \
            file is damaged (every command that opens a store checks its pages first, before LMDB \
            reads them; --no-check skips that), 64 for bad arguments.
            """,
        version: Store.libraryVersion,
        subcommands: [
            DemoCommand.self, InfoCommand.self, ShowCommand.self, LogCommand.self, HistoryCommand.self,
            PendingCommand.self, ConflictsCommand.self, ResolveCommand.self, MergeCommand.self, CompactCommand.self, RebuildCommand.self,
            VerifyCommand.self, CheckCommand.self, SalvageCommand.self, ReplayCommand.self, ExportCommand.self, ImportCommand.self, CopyCommand.self,
            BenchCommand.self, CreateCommand.self, SyncCommand.self,
        ]
    )

    /// Ignores SIGXFSZ before anything runs: past a file size limit (`ulimit -f`) every write then
    /// fails with `EFBIG`, which each command reports as a full disk, instead of the signal
    /// killing the process halfway through a file.
    static func main() async {
        signal(SIGXFSZ, SIG_IGN)
        await main(nil)
    }
}

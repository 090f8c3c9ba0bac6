import ArgumentParser
import Foundation
import Strata

/// `strata salvage`: the log of a damaged store, read page by page, into a new store.
struct SalvageCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "salvage",
        abstract: "Recover the readable operations of a damaged store into a new store, and say what was lost.",
        discussion: """
            Reads the damaged store's file page by page without LMDB, skips pages that do not \
            parse, keeps every log record that decodes as an operation, writes them in LSN order \
            into a new store with the damaged one's schema, client id and properties, and rebuilds \
            the views. Pending local edits that survive stay pending. The report lists the LSN \
            ranges lost and the rows whose history has a gap. The damaged store is only read.
            Example:
              strata check store || strata salvage store store-recovered
            """
    )
    @Argument(help: "The damaged store's folder (only read).") var damaged: String
    @Argument(help: "A new folder for the recovered store.") var destination: String
    @OptionGroup var output: OutputOptions

    struct Report: Encodable {
        var recoveredOperations: Int
        var firstLSN: UInt64?
        var lastLSN: UInt64?
        var lostRanges: [[UInt64]]
        var rowsWithGaps: [String]
        var pendingRows: Int
        var unreadablePages: Int
        var pages: Int
        var horizon: UInt64
        var metaIncomplete: Bool
    }

    func run() throws {
        try reportingErrors {
            try Store.refuseEmptyDataFile(in: damaged)
            let report = try Store.salvage(from: damaged, into: destination)
            if output.json {
                try printJSON(Report(
                    recoveredOperations: report.recoveredOperations, firstLSN: report.recoveredRange?.lowerBound,
                    lastLSN: report.recoveredRange?.upperBound, lostRanges: report.lostRanges.map { [$0.lowerBound, $0.upperBound] },
                    rowsWithGaps: report.rowsWithGaps.map(\.description), pendingRows: report.pendingRows,
                    unreadablePages: report.unreadablePages, pages: report.pages, horizon: report.horizon,
                    metaIncomplete: report.metaIncomplete))
            } else {
                print(report)
            }
        }
    }
}

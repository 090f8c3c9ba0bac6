import ArgumentParser
import Foundation
import Strata

struct ExportCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Export tables — values, originals and pending state — to a briefcase file.",
        discussion: "Example:\n  strata export store snapshot.briefcase --table tasks --data-version 7"
    )
    @OptionGroup var target: StoreArgument
    @Argument(help: "The briefcase file to write.") var file: String
    @Option(name: .customLong("table"), help: "A table to export (repeatable; default: all).") var tables: [String] = []
    @Option(help: "The data version to record; an import can require it.") var dataVersion: String?
    @OptionGroup var output: OutputOptions

    func run() throws {
        try reportingErrors {
            try refuseInsideAStore(file, what: "briefcase")
            let info = try target.open().exportBriefcase(to: file, tables: tables.isEmpty ? nil : tables, dataVersion: dataVersion)
            if output.json { return try printJSON(info) }
            print("exported \(info.rowCount) rows of \(info.tables.map(\.name).joined(separator: ", ")) to \(file)")
        }
    }
}

struct ImportCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Import a briefcase: its tables replace the store's tables of the same names.",
        discussion: "Example:\n  strata import store snapshot.briefcase --expect-data-version 7\n  strata import new-store snapshot.briefcase --create"
    )
    @OptionGroup var target: StoreArgument
    @Argument(help: "The briefcase file.") var file: String
    @Option(help: "Refuse the briefcase unless it holds this data version.") var expectDataVersion: String?
    @Flag(help: "Create the store if the folder holds none.") var create = false

    func run() throws {
        try reportingErrors {
            var options = target.options
            options.createIfMissing = create
            let folderExisted = FileManager.default.fileExists(atPath: target.store)
            let storeExisted = FileManager.default.fileExists(atPath: target.store + "/data.mdb")
            let info: BriefcaseInfo
            do {
                let store = try Store(path: target.store, options: options)
                defer { store.close() }
                info = try store.importBriefcase(from: file, expectingDataVersion: expectDataVersion)
            } catch {
                // A store created for this import goes again: a second try must not find it.
                if !storeExisted { removeCreatedStore(target.store, folderExisted: folderExisted) }
                throw error
            }
            print("imported \(info.rowCount) rows of \(info.tables.map(\.name).joined(separator: ", "))")
        }
    }
}

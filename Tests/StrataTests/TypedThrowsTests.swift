import Foundation
import Strata
import Testing

/// The public API throws `StrataError` itself: after `do throws(StrataError)` a `catch` reads
/// `error.code` with no cast (this file would not compile otherwise), and a cause from below — a file system error, the storage
/// engine — arrives wrapped once, with its code.
@Suite struct TypedThrowsTests {
    @Test func errorsNeedNoCast() throws {
        try withStore { store, path in
            try store.createTable(.fixed("t", primaryKey: ["id"], fields: [.int("id"), .string("s")]))
            let snap = { (s: Snapshot) throws(StrataError) -> Row? in try s.row("missing", key: 1) }
            do {
                _ = try store.read { s in try snap(s) }
                Issue.record("a read of a missing table succeeded")
            } catch let error as StrataError {
                #expect(error.code == .tableNotFound)
            }
            do throws(StrataError) {
                try store.createTable(.fixed("t", primaryKey: ["id"], fields: [.int("id")]))
                Issue.record("a second table 't' with another schema was created")
            } catch {
                #expect(error.code == .tableExists && error.message.contains("'t'"))
            }
            do throws(StrataError) {
                try store.copy(to: path + "/no-such-folder")  // the folder must exist
                Issue.record("a copy into a missing folder succeeded")
            } catch {
                #expect(error.code == .io && error.message.contains("must exist"), "\(error)")
            }
            do throws(StrataError) {
                try store.copy(to: path)  // the store's own folder holds a data.mdb
                Issue.record("a copy over the store's own file succeeded")
            } catch {
                #expect(error.code == .io && error.message.contains("already holds"), "\(error)")
            }
            #expect(try store.read { try $0.tables.map(\.name) } == ["t"])
        }
    }

    /// A file in place of the folder: opening fails with `io` and the system's reason as the
    /// message, not with a Foundation error.
    @Test func aFileSystemCauseIsWrappedOnce() throws {
        try withTemporaryFolder { folder in
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            let file = folder + "/plain-file"
            #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
            do throws(StrataError) {
                _ = try Store(path: file + "/store")
                Issue.record("a store was opened under a plain file")
            } catch {
                #expect(error.code == .io, "\(error)")
                #expect(!(error.cause is StrataError), "a StrataError wrapped in another: \(error)")
            }
        }
    }
}

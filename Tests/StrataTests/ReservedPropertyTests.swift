import Foundation
import Strata
import Testing

/// Property names starting with `strata.` are Strata's own (the sync anchor, the batch in
/// flight): an app that wrote one could break a sync in ways no check would catch.
@Suite struct ReservedPropertyTests {
    @Test func anAppCannotSetAStrataProperty() throws {
        try withStore { store, _ in
            try store.write { tx in
                try tx.setProperty("app.version", 3)
                try tx.setStrataProperty("strata.sync.anchor", "7")
            }
            let before = try store.read { try $0.properties() }
            for name in ["strata.sync.anchor", "strata.sync.batch.inflight", "strata.anything", "strata."] {
                for value in ["x", nil] as [Value?] {
                    let e = #expect(throws: StrataError.self) { try store.write { try $0.setProperty(name, value) } }
                    #expect(e?.code == .invalidOperation, "\(name): \(String(describing: e))")
                    #expect(e?.message.contains("'\(name)'") == true && e?.message.contains("reserved") == true, "\(String(describing: e))")
                }
            }
            // Nothing was written, the edits of the transaction that tried included.
            #expect(throws: StrataError.self) {
                try store.write { tx in
                    try tx.setProperty("app.version", 4)
                    try tx.setProperty("strata.sync.anchor", nil)
                }
            }
            #expect(try store.read { try $0.properties() } == before)
            // Names that only look alike are the app's.
            try store.write { tx in
                for name in ["strata", "Strata.x", "app.strata.x", " strata.x"] { try tx.setProperty(name, 1) }
            }
            #expect(try store.read { try $0.properties() }.count == before.count + 4)
        }
    }
}

import Foundation
import Strata
import Testing

/// An alert shows `localizedDescription`: for a `StrataError` it is the message, not Foundation's
/// "The operation could not be completed. (Strata.StrataError error 1.)".
@Suite struct ErrorDescriptionTests {
    @Test func aStrataErrorDescribesItselfWithItsMessage() throws {
        try withStore { store, _ in
            do {
                try store.write { try $0.insert("nope", ["id": 1]) }
                Issue.record("an insert into a missing table succeeded")
            } catch {
                let message = try #require(error as? StrataError).message
                #expect(error.localizedDescription == message)
                #expect(message.contains("nope"))
            }
        }
    }
}

import StrataWorkload
import Testing

@Suite struct WorkloadTests {
    @Test func generatorMatchesTheSpecifiedCounts() {
        let w = ReferenceWorkload(seed: 42, preloadRows: 100_000, edits: 1_000_000)
        let c = w.counts
        #expect(c.updates == 700_509)
        #expect(c.inserts == 199_461)
        #expect(c.deletes == 100_030)
        #expect(w.liveIDs.count == 199_431)
    }
}

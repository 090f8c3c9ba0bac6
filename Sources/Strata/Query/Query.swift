/// A query over one table: a condition, an order and a limit.
///
/// ```swift
/// let open = Query("tasks", where: .equals("done", false), orderBy: [.ascending("priority")], limit: 20)
/// let rows = try store.read { try $0.rows(open) }
/// ```
public struct Query: Sendable, Hashable, Codable {
    /// One field of the sort order.
    public struct SortKey: Sendable, Hashable, Codable {
        /// The field to sort by.
        public var field: String
        /// Whether larger values come first.
        public var descending: Bool
        /// Sorts by `field`, smaller values first (in ``Value/order(_:_:)``).
        public static func ascending(_ field: String) -> SortKey { SortKey(field: field, descending: false) }
        /// Sorts by `field`, larger values first.
        public static func descending(_ field: String) -> SortKey { SortKey(field: field, descending: true) }
    }

    /// The table the query reads.
    public var table: String
    /// The condition a row must satisfy; `nil` selects every row.
    public var filter: Condition?
    /// Rows are ordered by these fields, then by primary key (so every order is total).
    public var orderBy: [SortKey]
    /// The most rows to return; `nil` for all. ``Snapshot/count(_:)`` ignores it.
    public var limit: Int?

    /// A query of `table`: the rows that satisfy `filter`, in the order of `orderBy` (then by primary key), at most `limit` of them.
    public init(_ table: String, where filter: Condition? = nil, orderBy: [SortKey] = [], limit: Int? = nil) {
        self.table = table
        self.filter = filter
        self.orderBy = orderBy
        self.limit = limit
    }
}

/// Where a page ended: the next page starts right after this row in the query's order.
public struct PageToken: Sendable, Hashable, Codable {
    /// The sort values of the last row of the page.
    public let sortValues: [Value]
    /// Its primary key.
    public let key: RowKey
}

/// One page of a query's rows.
public struct Page: Sendable, Hashable {
    /// The page's rows, in the query's order.
    public let rows: [Row]
    /// Where to continue; `nil` after the last page.
    public let next: PageToken?
}

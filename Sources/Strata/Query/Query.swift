/// A query over one table: a condition, an order and a limit.
///
/// ```swift
/// let open = Query("tasks", where: .equals("done", false), orderBy: [.ascending("priority")], limit: 20)
/// let rows = try store.read { try $0.rows(open) }
/// ```
public struct Query: Sendable, Hashable, Codable {
    /// One field of the sort order.
    public struct SortKey: Sendable, Hashable, Codable {
        public var field: String
        public var descending: Bool
        public static func ascending(_ field: String) -> SortKey { SortKey(field: field, descending: false) }
        public static func descending(_ field: String) -> SortKey { SortKey(field: field, descending: true) }
    }

    public var table: String
    public var filter: Condition?
    /// Rows are ordered by these fields, then by primary key (so every order is total).
    public var orderBy: [SortKey]
    public var limit: Int?

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
    public let rows: [Row]
    /// Where to continue; `nil` after the last page.
    public let next: PageToken?
}

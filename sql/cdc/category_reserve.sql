-- MIN and MAX over an updating (CDC) input, per category.
--
-- auctions_cdc carries updates and deletes that deliberately hit the row holding the
-- category's MIN or MAX. A running max cannot "forget" a deleted value, so over an updating
-- input MIN/MAX keep a (category, value) -> count multiset and recompute the extreme from
-- it (strategy `multiset` in `octo explain category_reserve`).

CREATE STREAMING TABLE category_reserve AS
SELECT
    category,
    COUNT(*)         AS auctions,
    MIN(reserve)     AS min_reserve,
    MAX(reserve)     AS max_reserve,
    MIN(initial_bid) AS min_initial_bid,
    MAX(initial_bid) AS max_initial_bid
FROM auctions_cdc
GROUP BY category;

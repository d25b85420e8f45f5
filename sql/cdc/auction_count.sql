-- A global aggregate (no GROUP BY) over the CDC feed: always exactly one row.
--
-- Creates add to the totals, deletes subtract, and an update retracts the old image and
-- inserts the new one, so the row is a `u` event in every batch that changes it.

CREATE STREAMING TABLE auction_count AS
SELECT
    COUNT(*)                      AS auctions,
    COUNT(DISTINCT category)      AS categories,
    SUM(reserve)                  AS total_reserve,
    ROUND(AVG(initial_bid), 1)    AS avg_initial_bid
FROM auctions_cdc;

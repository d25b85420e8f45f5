-- How many auctions have N bids: an aggregate over another aggregate's changelog.
--
-- auction_stats is an *updating* input: when auction 1003 goes from 4 to 5 bids, this table
-- receives a retraction of (1003, 4 bids) and an insertion of (1003, 5 bids), so the bucket
-- "4 bids" shrinks while "5 bids" grows. Plain Spark streaming cannot chain aggregations
-- like this (update mode cannot feed a second aggregation); here it is one more table.

CREATE STREAMING TABLE bid_histogram AS
SELECT
    bids,
    COUNT(*)       AS auctions,
    MAX(top_price) AS best_top_price
FROM auction_stats
GROUP BY bids;

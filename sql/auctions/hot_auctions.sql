-- The three auctions with the most bids, kept current as bids arrive (top-N over an
-- aggregate). When an auction overtakes one of the three, the changelog deletes the one that
-- drops out and inserts the newcomer.

CREATE STREAMING TABLE hot_auctions AS
SELECT auction, bids, top_price
FROM auction_stats
ORDER BY bids DESC, auction
LIMIT 3;

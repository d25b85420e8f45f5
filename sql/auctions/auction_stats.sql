-- Per-auction bid statistics: a keyed aggregate over an append-only input.
--
-- Every batch of bids updates the rows of the auctions it touches, so the changelog holds
-- `c` events for auctions seen for the first time and `u` events (before -> after) for the
-- others. MAX over append-only input is kept as a running value (see `octo explain`).

CREATE STREAMING TABLE auction_stats AS
SELECT
    auction,
    COUNT(*)                  AS bids,
    MAX(price)                AS top_price,
    ROUND(AVG(price), 2)      AS avg_price
FROM bids
GROUP BY auction;

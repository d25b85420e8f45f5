-- Nexmark q4 (average price per category): the highest bid of each auction that met its
-- reserve, averaged per category.
--
-- An aggregate over an aggregate over a join: bids joined with auctions on the auction id
-- (only bids at or above the reserve), MAX per auction, then AVG per category. Every new
-- top bid updates its auction's maximum, which flows on as an update of its category's
-- average. Spark's own streaming engine rejects this query (aggregations chained after a
-- stream-stream join).

CREATE STREAMING TABLE category_prices AS
SELECT category, ROUND(AVG(final), 2) AS avg_final, COUNT(*) AS auctions
FROM (
    SELECT a.id, a.category, MAX(b.price) AS final
    FROM auctions a
    JOIN bids b ON a.id = b.auction AND b.price >= a.reserve
    GROUP BY a.id, a.category
) closed
GROUP BY category;

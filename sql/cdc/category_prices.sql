-- Nexmark q4 (average price per category): the highest bid of each auction that met its
-- reserve, averaged per category.
--
-- An aggregate over a join over an aggregate's input: bids (append-only) joined with the
-- mutable auctions table on the auction id, MAX per auction, then AVG per category. A
-- reserve raised by a CDC update removes bids from the join and lowers the auction's
-- maximum, which flows on as an update of its category's average. Spark's own streaming
-- engine rejects this query (a join of an updating input, then two aggregations).

CREATE STREAMING TABLE category_prices AS
SELECT category, ROUND(AVG(final), 2) AS avg_final, COUNT(*) AS auctions
FROM (
    SELECT a.id, a.category, MAX(b.price) AS final
    FROM auctions_cdc a
    JOIN bids b ON a.id = b.auction AND b.price >= a.reserve
    GROUP BY a.id, a.category
) closed
GROUP BY category;

-- Per-channel activity: COUNT(DISTINCT), CASE expressions and a CTE.
--
-- COUNT(DISTINCT bidder) keeps a (channel, bidder) -> count multiset as operator state.
-- CASE is used both before aggregation (classify each bid) and after it (label each channel
-- from its aggregates); any Spark SQL scalar expression works in either place. A channel's
-- tier can flip from batch to batch: watch for `u` events that change only `tier`.

CREATE STREAMING TABLE channel_stats AS
WITH classified AS (
    SELECT
        channel,
        bidder,
        CASE WHEN price >= 2000 THEN 1 ELSE 0 END AS is_big
    FROM bids
)
SELECT
    channel,
    COUNT(*)                                  AS bids,
    COUNT(DISTINCT bidder)                    AS bidders,
    SUM(is_big)                               AS big_bids,
    ROUND(100 * SUM(is_big) / COUNT(*), 1)    AS big_pct,
    CASE
        WHEN SUM(is_big) * 100 >= 12 * COUNT(*) THEN 'premium'
        ELSE 'standard'
    END                                       AS tier
FROM classified
GROUP BY channel;

-- Bids per channel and minute: a tumbling window, emitted once per window when it closes.
--
-- TUMBLE adds window_start and window_end to every bid (one-minute windows aligned to the
-- epoch). With EMIT ON WINDOW CLOSE a window's row is written once, as a `c` event, in the
-- batch whose watermark (the latest date_time read minus 30 seconds, see sources.sql)
-- passes window_end; the table is append-only, and a closed window's state is dropped.
-- Without the clause the table would be updated (u events) as each window fills.

CREATE STREAMING TABLE bids_per_minute AS
SELECT
    window_start,
    window_end,
    channel,
    COUNT(*)    AS bids,
    MAX(price)  AS top_price
FROM TUMBLE(bids, date_time, INTERVAL '1' MINUTE)
GROUP BY window_start, window_end, channel
EMIT ON WINDOW CLOSE;

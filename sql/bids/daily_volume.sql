-- Bid volume per day and channel: a table partitioned by event time.
--
-- partition_by names the result column that decides a row's partition (here the bid's
-- UTC day); Dagster shows the table with daily partitions from partition_start. A normal
-- materialization is a catch-up run; materializing (backfilling) a range of days also
-- recomputes those days from every bids file the table has read and publishes what changed
-- as ordinary change events: a file corrected in place after it was read is picked up.
-- `octo backfill daily_volume --from 2024-01-01 --to 2024-01-02` does the same from a shell.

CREATE STREAMING TABLE daily_volume WITH (
    partition_by = 'day',
    partitions = 'daily',
    partition_start = '2024-01-01'
) AS
SELECT
    CAST(date_time AS DATE)  AS day,
    channel,
    COUNT(*)                 AS bids,
    SUM(price)               AS volume,
    MAX(price)               AS top_price
FROM bids
GROUP BY CAST(date_time AS DATE), channel;

-- A view plus a stateless streaming table: filter and projection only.
--
-- CREATE VIEW is inlined where it is used (not materialized). whale_bids keeps no operator
-- state: each bid over the threshold is projected and appended as a `c` event. The result
-- has no primary key (a bag of rows), so it never emits `u` events.

CREATE VIEW big_bids AS
SELECT auction, bidder, price, channel, date_time
FROM bids
WHERE price >= 2000;

CREATE STREAMING TABLE whale_bids AS
SELECT
    auction,
    bidder,
    price,
    upper(channel)                    AS channel,
    date_format(date_time, 'HH:mm:ss') AS at
FROM big_bids
WHERE price >= 50000;

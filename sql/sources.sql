-- The demo's inputs, written by `octo demo` (connectors/generators/nexmark.py) under data/.
-- Paths are relative to the project directory.
--
-- bids, auctions, persons: append-only JSON-lines files (each file is read once).
-- auctions_cdc: a Debezium change feed of a mutable auctions table (c/u/d/r events), so
--               everything computed from it must handle updates and deletes (retractions).

-- bids declares its event time: a bid more than 30 seconds older than the latest one read
-- is late (a dead letter), and windows over date_time close as the watermark passes them.
CREATE SOURCE bids (
    auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP,
    WATERMARK FOR date_time AS date_time - INTERVAL '30' SECOND
) WITH (connector = 'files', path = 'data/bids', format = 'json');

CREATE SOURCE auctions (
    id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT,
    date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT
) WITH (connector = 'files', path = 'data/auctions', format = 'json');

CREATE SOURCE persons (
    id BIGINT, name STRING, email STRING, city STRING, state STRING, date_time TIMESTAMP
) WITH (connector = 'files', path = 'data/persons', format = 'json');

CREATE SOURCE auctions_cdc (
    id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT,
    date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT
) WITH (connector = 'files', path = 'data/auctions_cdc', format = 'debezium-json',
        primary_key = 'id');

-- Nexmark q3 (local item suggestion): who sells in category 10 from the Pacific Northwest.
--
-- A join of the mutable auctions table (Debezium CDC) with the persons stream. When an
-- auction moves out of category 10, is deleted, or its seller changes, the changelog
-- retracts the joined row; a new matching auction or person inserts one. The WHERE
-- conditions on one side are applied before the join, so only matching rows are kept in
-- the join's state (see `octo explain local_sellers`).

CREATE STREAMING TABLE local_sellers AS
SELECT p.name, p.city, p.state, a.id AS auction, a.item_name
FROM auctions_cdc a
JOIN persons p ON a.seller = p.id
WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA');

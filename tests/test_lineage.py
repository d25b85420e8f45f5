"""Column lineage and output types read off compiled plans (pure: no Spark)."""
from __future__ import annotations

import pytest

from octo_platform.frontend.binder import build_catalog
from octo_platform.frontend.parser import parse_sql
from octo_platform.logical.lineage import column_lineage, column_types
from octo_platform.sqltext import referenced_columns

SOURCES = """
CREATE SOURCE orders (id BIGINT, customer BIGINT, amount DOUBLE, qty INT, note STRING,
                      at TIMESTAMP)
WITH (connector = 'files', path = 'o', format = 'json');
CREATE SOURCE customers (id BIGINT, name STRING, region STRING)
WITH (connector = 'files', path = 'c', format = 'debezium-json', primary_key = 'id');
"""


def plan_of(sql: str, table: str = "t"):
    catalog = build_catalog(parse_sql(SOURCES + sql))
    return catalog.table(table).plan, catalog


def lineage(sql: str, table: str = "t") -> dict[str, set[tuple[str, str]]]:
    plan, _ = plan_of(sql, table)
    return {c: set(o) for c, o in column_lineage(plan).items()}


def test_projection_through_view_and_cte():
    got = lineage("""
        CREATE VIEW big AS SELECT id, amount * qty AS total, note FROM orders WHERE qty > 1;
        CREATE STREAMING TABLE t AS
        WITH x AS (SELECT id, total, upper(note) AS loud FROM big)
        SELECT id AS order_id, total + 1 AS total, concat(loud, '`qty`') AS label FROM x;
    """)
    assert got == {
        "order_id": {("orders", "id")},
        "total": {("orders", "amount"), ("orders", "qty")},
        "label": {("orders", "note")},  # a backticked name inside a string is no column
    }


def test_aggregates_and_having():
    got = lineage("""
        CREATE STREAMING TABLE t AS
        SELECT customer, COUNT(*) AS n, SUM(amount) AS spent, MAX(at) AS last,
               COUNT(DISTINCT note) AS notes, ROUND(AVG(amount) / COUNT(*), 2) AS per
        FROM orders GROUP BY customer HAVING SUM(qty) > 2;
    """)
    assert got == {
        "customer": {("orders", "customer")},
        "n": set(),  # COUNT(*) reads no column
        "spent": {("orders", "amount")},
        "last": {("orders", "at")},
        "notes": {("orders", "note")},
        "per": {("orders", "amount")},
    }


def test_join_semi_join_and_aggregate_over_table():
    got = lineage("""
        CREATE STREAMING TABLE j AS
        SELECT c.name, o.amount, c.id AS cid FROM orders o JOIN customers c ON o.customer = c.id
        WHERE c.region = 'EU';
        CREATE STREAMING TABLE t AS
        SELECT name, SUM(amount) AS spent FROM j
        WHERE cid IN (SELECT customer FROM orders WHERE qty > 3) GROUP BY name;
    """)
    # the semi join's subquery and the filter decide which rows, not the values
    assert got == {"name": {("j", "name")}, "spent": {("j", "amount")}}
    outer = lineage("""
        CREATE STREAMING TABLE t AS
        SELECT c.name, o.amount, c.id AS cid, coalesce(c.region, o.note) AS r
        FROM orders o LEFT JOIN customers c ON o.customer = c.id AND o.qty > 1;
    """)
    assert outer == {"name": {("customers", "name")}, "amount": {("orders", "amount")},
                     "cid": {("customers", "id")},
                     "r": {("customers", "region"), ("orders", "note")}}


def test_union_and_top_n_rank():
    got = lineage("""
        CREATE STREAMING TABLE t AS
        SELECT * FROM (
            SELECT id, customer, ROW_NUMBER() OVER (PARTITION BY customer ORDER BY amount DESC)
                AS rn FROM orders
        ) WHERE rn <= 2
        UNION ALL
        SELECT id, id AS customer, 1 AS rn FROM customers;
    """)
    assert got == {
        "id": {("orders", "id"), ("customers", "id")},
        "customer": {("orders", "customer"), ("customers", "id")},
        "rn": {("orders", "customer"), ("orders", "amount")},
    }


def test_types_where_the_plan_knows_them():
    plan, catalog = plan_of("""
        CREATE STREAMING TABLE a AS
        SELECT customer, COUNT(*) AS n, SUM(qty) AS q, SUM(amount) AS s, AVG(qty) AS avg_q,
               MIN(note) AS first_note, ROUND(AVG(amount), 2) AS avg_amount,
               CAST(SUM(qty) AS STRING) AS q_text, CAST(MAX(qty) AS INT) + 1 AS next_q,
               upper(MIN(note)) AS loud
        FROM orders GROUP BY customer;
        CREATE STREAMING TABLE t AS SELECT customer, n FROM a ORDER BY n DESC LIMIT 3;
    """, "a")
    types = column_types(plan)
    assert types == {"customer": "BIGINT", "n": "BIGINT", "q": "BIGINT", "s": "DOUBLE",
                     "avg_q": "DOUBLE", "first_note": "STRING", "avg_amount": "DOUBLE",
                     "q_text": "STRING", "next_q": None, "loud": None}
    downstream = catalog.table("t").plan
    assert column_types(downstream) == {"customer": None, "n": None}  # nobody told it
    assert column_types(downstream, table_types=lambda name: {"a": types}[name]) == {
        "customer": "BIGINT", "n": "BIGINT"}


@pytest.mark.parametrize("sql,refs", [
    ("`a` + `b`", {"a", "b"}),
    ("concat(`x`, 'it''s `not` a column')", {"x"}),
    ("`we``ird` = 1", {"we`ird"}),
    (None, set()),
])
def test_referenced_columns(sql, refs):
    assert referenced_columns(sql) == refs

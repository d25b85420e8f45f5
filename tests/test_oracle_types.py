"""Randomized oracle test for the value types beyond numbers and strings: DECIMAL money
columns (sums, averages, extremes and distinct values of decimals, exact), and nested types
(STRUCT and ARRAY columns as group keys, join keys and values).

One Debezium input (inserts, updates that move rows between keys, deletes) in rounds of
files, each round a separate run split into random micro-batches, on every path; after each
run every replayed changelog must equal Spark's batch result of the same SQL.
"""
from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest

from octo_platform.project import load_project
from tests.oracle import PATHS, RandomInput, check_rounds

MONEY = {
    "money": """SELECT k, SUM(m) AS s, AVG(m) AS a, MIN(m) AS mn, MAX(m) AS mx,
        COUNT(m) AS c, COUNT(DISTINCT m) AS dm FROM src GROUP BY k""",
    "money_all": "SELECT SUM(m) AS s, AVG(m) AS a, MAX(m) - MIN(m) AS spread FROM src",
    "money_join": """SELECT x.id, y.id AS yid, x.m + y.m AS both FROM src x JOIN src y
        ON x.m = y.m AND x.id < y.id""",
    "top_money": """SELECT k, id, m, rn FROM (SELECT k, id, m, ROW_NUMBER() OVER (
        PARTITION BY k ORDER BY m DESC, id) AS rn FROM src) t WHERE rn <= 2""",
}
NESTED = {
    "by_struct": "SELECT p, COUNT(*) AS n, SUM(m) AS s FROM src GROUP BY p",
    "by_array": "SELECT tags, COUNT(*) AS n, MAX(m) AS top FROM src GROUP BY tags",
    "struct_join": """SELECT x.id, y.id AS yid, y.tags FROM src x JOIN src y
        ON x.p = y.p AND x.id < y.id""",
    "top_tags": """SELECT k, id, tags, rn FROM (SELECT k, id, tags, ROW_NUMBER() OVER (
        PARTITION BY k ORDER BY id DESC) AS rn FROM src) t WHERE rn <= 2""",
}


class TypedInput(RandomInput):
    """Random rows ``(id, k, m, p, tags)``: ``m`` a DECIMAL(15,2) of few distinct values
    (ties for MIN/MAX and DISTINCT), ``p`` a small STRUCT, ``tags`` a short ARRAY; NULLs
    in each. ``nested=False``: ``(id, k, m)`` only."""

    DDL = (("id", "BIGINT"), ("k", "BIGINT"), ("m", "DECIMAL(15,2)"),
           ("p", "STRUCT<a: INT, b: STRING>"), ("tags", "ARRAY<STRING>"))

    def __init__(self, seed: int, nested: bool) -> None:
        super().__init__(seed, True)
        self.nested = nested
        if not nested:
            self.DDL = self.DDL[:3]

    def row(self) -> dict[str, Any]:
        r = self.rng
        self.next_id += 1
        got = {"id": self.next_id, "k": r.randint(0, 6),
               "m": None if r.random() < 0.1 else Decimal(r.randint(-50, 300)) / 4}
        if self.nested:
            got["p"] = None if r.random() < 0.1 else {"a": r.randint(0, 2),
                                                       "b": r.choice(["x", "y", None])}
            got["tags"] = None if r.random() < 0.1 else r.choice([[], ["a"], ["a", "b"],
                                                                  ["b", None]])
        return got


def run_oracle(spark, tmp_path, path: str, tables: dict[str, str], nested: bool) -> None:
    seed = 20261202
    rng = random.Random(seed)
    feed = TypedInput(seed, nested)
    sql = "\n".join([
        f"CREATE SOURCE src ({feed.ddl()}) WITH (connector = 'files', path = 'data/src', "
        f"format = 'debezium-json', max_files_per_batch = '{rng.randint(1, 2)}', "
        "primary_key = 'id');",
        *[f"CREATE STREAMING TABLE {name} AS {sql};" for name, sql in tables.items()]])
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    project = load_project(tmp_path)
    check_rounds(spark, tmp_path, sql, project, tables, {"src": feed}, rng, path, rounds=3,
                 lines=(5, 20))


@pytest.mark.parametrize("path", PATHS)
def test_decimals_match_batch_sql(spark, tmp_path, path):
    run_oracle(spark, tmp_path, path, MONEY, nested=False)


def test_nested_types_match_batch_sql(spark, tmp_path):
    """On the Spark path only: the driver path reads no input of nested types."""
    run_oracle(spark, tmp_path, "spark", NESTED, nested=True)

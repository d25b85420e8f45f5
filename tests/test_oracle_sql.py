"""Randomized oracle test for the planner's rewrites of everyday SQL (issue 22): comma
joins with their equalities in WHERE, cross joins, set operations and DISTINCT aggregates
(subqueries: ``test_oracle_subqueries``).

Inputs as in ``test_oracle_joins``: ``a_cdc``/``b_cdc`` (Debezium inserts, updates,
deletes) and ``c_app`` (append-only). Few rows, a few rounds (each a restart from Delta
state, split into random micro-batches); after every round each replayed changelog must
equal Spark's batch result of the same SQL over all input so far.
"""
from __future__ import annotations

import random

import pytest

from octo_platform.project import load_project
from tests import oracle
from tests.oracle import RandomInput

TABLES = {
    # comma joins: WHERE equalities become keys (a join order other than FROM's), the rest
    # residuals and filters; a true cross join of two filtered inputs; a grouped comma join;
    # a LEFT JOIN after a comma
    "comma3": """SELECT a.id AS aid, b.id AS bid, c.id AS cid FROM c_app c, a_cdc a, b_cdc b
        WHERE a.k = b.k AND c.g = b.g AND a.v < c.v AND b.d > 2""",
    "cross": """SELECT a.id AS aid, b.id AS bid, a.v + b.v AS s FROM a_cdc a CROSS JOIN c_app b
        WHERE a.v > 80 AND b.v > 80""",
    "comma_agg": """SELECT a.g, COUNT(*) AS n, SUM(b.v) AS s FROM a_cdc a, b_cdc b
        WHERE a.k = b.k AND a.g = b.g GROUP BY a.g""",
    "comma_left": """SELECT a.id AS aid, b.id AS bid, c.id AS cid FROM a_cdc a, b_cdc b
        LEFT JOIN c_app c ON c.k = b.k AND c.v > b.v WHERE a.id = b.k""",
    # a RIGHT / FULL JOIN after a comma: the comma binds looser (a times b RIGHT JOIN c)
    "comma_right": """SELECT a.id AS aid, b.id AS bid, c.id AS cid FROM a_cdc a, b_cdc b
        RIGHT JOIN c_app c ON c.k = b.k AND b.v > 50 WHERE a.id = c.k""",
    "comma_full": """SELECT c.id AS cid, a.id AS aid, b.id AS bid FROM c_app c, a_cdc a
        FULL JOIN b_cdc b ON a.k = b.k AND b.g = 'a' WHERE c.v > 95""",
    # outer joins without an equality (on the constant key, the condition per pair)
    "left_lt": """SELECT a.id AS aid, c.id AS cid FROM a_cdc a
        LEFT JOIN c_app c ON c.v > a.v + 70""",
    "full_lt": """SELECT a.id AS aid, b.id AS bid FROM a_cdc a
        FULL JOIN b_cdc b ON a.v < b.v - 80 AND a.g = 'a'""",
    # set operations over updating inputs (NULLs equal: g has some)
    "except_all": "SELECT k, g FROM a_cdc EXCEPT ALL SELECT k, g FROM b_cdc",
    "except": "SELECT k FROM a_cdc EXCEPT SELECT k FROM c_app WHERE v > 50",
    "intersect_all": """SELECT g, k % 3 AS m FROM a_cdc INTERSECT ALL
        SELECT g, k % 3 FROM b_cdc""",
    "intersect": "SELECT g FROM a_cdc INTERSECT SELECT g FROM c_app",
    "union": "SELECT k FROM a_cdc WHERE v > 50 UNION SELECT k FROM b_cdc",
    # a derived table's column alias list (TPC-H q13); a join key in every branch of an OR
    # (q19: factored out, an equi-join), one branch with its sides the other way round
    "derived_alias": """SELECT n, COUNT(*) AS c FROM (SELECT a.id, COUNT(b.id)
        FROM a_cdc a LEFT JOIN b_cdc b ON a.k = b.k AND b.g <> 'a' GROUP BY a.id)
        AS t (aid, n) GROUP BY n""",
    "or_key": """SELECT a.g, SUM(a.v + b.v) AS s FROM a_cdc a, c_app b
        WHERE (a.k = b.k AND a.g = 'a' AND b.v > 50) OR (b.k = a.k AND b.v < 30)
        GROUP BY a.g""",
    # JOIN ... USING: each column once, first in SELECT * (inner: the left's, full: the
    # first not NULL)
    "using_inner": """SELECT * FROM (SELECT k, id AS aid, v FROM a_cdc) a
        JOIN (SELECT k, id AS bid, g FROM b_cdc) b USING (k)""",
    "using_left2": """SELECT * FROM (SELECT k, g, id FROM a_cdc) x
        LEFT JOIN (SELECT k, g, v FROM c_app) y USING (k, g)""",
    "using_full": """SELECT k, a.id AS aid, b.id AS bid, a.k AS ak FROM a_cdc a
        FULL JOIN b_cdc b USING (k)""",
    "using_chain": """SELECT * FROM (SELECT k, id AS aid FROM a_cdc) a
        JOIN (SELECT k, id AS bid FROM b_cdc) b USING (k)
        LEFT JOIN (SELECT k, v FROM c_app WHERE v > 50) c USING (k)""",
    # SUM / AVG (DISTINCT) beside other aggregates; a global one (COUNT over no rows is 0)
    "sum_distinct": """SELECT g, SUM(DISTINCT k) AS sk, AVG(DISTINCT k) AS ak,
        COUNT(DISTINCT k) AS ck, COUNT(*) AS n, AVG(d) AS ad, MIN(v) AS mv
        FROM a_cdc GROUP BY g""",
    "sum_distinct_global": """SELECT SUM(DISTINCT v) AS s, COUNT(v) AS n FROM b_cdc
        WHERE v > 90""",
    # DISTINCT aggregates of different arguments: a GROUP BY per argument, joined on the
    # GROUP BY columns (g has NULLs)
    "distinct_two": """SELECT g, SUM(DISTINCT k) AS sk, COUNT(DISTINCT v) AS cv,
        AVG(DISTINCT v % 7) AS av, COUNT(*) AS n FROM a_cdc GROUP BY g""",
    "distinct_two_global": """SELECT SUM(DISTINCT k) AS sk, AVG(DISTINCT v) AS av
        FROM b_cdc WHERE v > 80""",
}


def project_sql(rng: random.Random, tables: dict[str, str]) -> str:
    ddl = RandomInput(0, False).ddl()
    parts = []
    for name, fmt in (("a_cdc", "debezium-json"), ("b_cdc", "debezium-json"),
                      ("c_app", "json")):
        pk = ", primary_key = 'id'" if name.endswith("cdc") else ""
        parts.append(f"CREATE SOURCE {name} ({ddl}) WITH (connector = 'files', "
                     f"path = 'data/{name}', format = '{fmt}', "
                     f"max_files_per_batch = '{rng.randint(1, 2)}'{pk});")
    parts += [f"CREATE STREAMING TABLE {name} AS {sql};" for name, sql in tables.items()]
    return "\n".join(parts)


# The runs take turns between the driver path and Spark jobs (state written by one read by
# the other): both places in one test, at a third of the time of all three PATHS.
@pytest.mark.parametrize("path", ["mixed"])
def test_sql_breadth_matches_batch_sql(spark, tmp_path, path):
    check_rounds(spark, tmp_path, TABLES, seed=20261126, path=path)


def check_rounds(spark, tmp_path, tables: dict[str, str], seed: int, path: str,
                 rounds: int = 3) -> None:
    """``rounds`` runs over random input on ``path`` (see ``tests.oracle.PATHS``); after
    each, every table equals its batch SQL."""
    rng = random.Random(seed)
    sql = project_sql(rng, tables)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    project = load_project(tmp_path)
    feeds = {name: RandomInput(seed + i, name.endswith("cdc"))
             for i, name in enumerate(("a_cdc", "b_cdc", "c_app"))}
    oracle.check_rounds(spark, tmp_path, sql, project, tables, feeds, rng, path, rounds,
                        lines=(3, 10))

"""Randomized oracle test for subqueries (issue 22): scalar subqueries (uncorrelated, and
correlated by equality), and IN / EXISTS / NOT IN / NOT EXISTS anywhere a boolean may stand
(mark joins), over the inputs of ``test_oracle_sql``.
"""
from __future__ import annotations

import pytest

from tests.test_oracle_sql import check_rounds

TABLES = {
    # scalar subqueries: uncorrelated in CASE, WHERE, HAVING and an aggregate's argument;
    # correlated by equality (COUNT over no rows is 0; AVG NULL)
    "scalar_case": """SELECT id, CASE WHEN v > (SELECT AVG(v) FROM b_cdc) THEN 1 ELSE 0 END
        AS hi FROM a_cdc""",
    "scalar_where": "SELECT id, v FROM a_cdc WHERE v > (SELECT MAX(v) FROM c_app WHERE k = 3)",
    "scalar_having": """SELECT g, COUNT(*) AS n FROM a_cdc GROUP BY g
        HAVING COUNT(*) >= (SELECT COUNT(*) FROM b_cdc) / 4""",
    "scalar_in_agg": """SELECT g, SUM(CASE WHEN v > (SELECT AVG(v) FROM c_app) THEN 1 ELSE 0
        END) AS n FROM a_cdc GROUP BY g""",
    # (correlated in HAVING: Spark, the oracle, refuses one beside the aggregates)
    "corr_having": """SELECT a.k, COUNT(*) AS n FROM a_cdc a GROUP BY a.k
        HAVING COUNT(*) >= (SELECT COUNT(*) FROM c_app c WHERE c.k < a.k) / 5
        OR COUNT(*) > (SELECT COUNT(*) FROM b_cdc b WHERE b.k = a.k)""",
    "corr_count": """SELECT a.id, (SELECT COUNT(*) FROM b_cdc b WHERE b.k = a.k AND b.v > 50)
        AS n FROM a_cdc a""",
    "corr_avg": """SELECT a.id, a.k FROM a_cdc a
        WHERE a.v > (SELECT AVG(b.v) FROM b_cdc b WHERE b.g = a.g)""",
    # correlated by an inequality (sqllogictest's rank shape), and by both kinds, in a CASE
    "corr_rank": """SELECT a.id, (SELECT COUNT(*) FROM a_cdc AS x WHERE x.v < a.v) AS r
        FROM a_cdc a""",
    "corr_rank_join": """SELECT a.id, b.id AS bid, (SELECT COUNT(*) FROM c_app x
        WHERE x.v < b.v) AS r FROM a_cdc a, b_cdc b WHERE a.k = b.k""",
    # two inequalities over a column with NULLs, beside an EXISTS (sqllogictest's select2
    # shape: the COUNT's non-nullable column padded by the outer join in the driver)
    "corr_two_ineq": """SELECT a.id, (SELECT COUNT(*) FROM a_cdc AS x WHERE x.v > a.v
        AND x.k < a.k) AS n, a.v - a.k AS dv FROM a_cdc a
        WHERE a.v > a.k AND EXISTS (SELECT 1 FROM a_cdc AS x WHERE x.d < a.d)""",
    "corr_mixed": """SELECT a.id, CASE WHEN (SELECT MAX(b.v) FROM b_cdc b WHERE b.k = a.k
        AND b.d > a.d) > 50 THEN 'hi' ELSE 'lo' END AS c FROM a_cdc a""",
    # a correlated aggregate in the WHERE of an aggregate (TPC-H q17); an IN subquery that
    # groups, in the WHERE of an aggregate (q18)
    "corr_under_agg": """SELECT SUM(a.v) AS s, COUNT(*) AS n FROM a_cdc a, c_app c
        WHERE a.k = c.k AND a.v < (SELECT AVG(x.v) FROM b_cdc x WHERE x.k = a.k)""",
    "in_grouped": """SELECT a.g, SUM(a.v) AS s FROM a_cdc a
        WHERE a.k IN (SELECT k FROM b_cdc GROUP BY k HAVING SUM(v) > 100) GROUP BY a.g""",
    # correlated, one row per row: grouped by the correlation's inner column (NULL where no
    # group matches, COUNT too), the first row by an ORDER BY (a top-1 per key)
    "corr_grouped_first": """SELECT a.id, (SELECT COUNT(*) FROM b_cdc b WHERE b.k = a.k
        GROUP BY b.k) AS n, (SELECT b.v FROM b_cdc b WHERE b.k = a.k ORDER BY b.id DESC
        LIMIT 1) AS last_v FROM a_cdc a""",
    # EXISTS over groups: HAVING decides (a semi join with the keys of the groups it keeps,
    # a mark); a GROUP BY without HAVING has a row where its input has one
    "exists_having": """SELECT a.id FROM a_cdc a WHERE EXISTS (SELECT b.k FROM b_cdc b
        WHERE b.k = a.k GROUP BY b.k HAVING SUM(b.v) > 60)""",
    "exists_having_value": """SELECT a.id, NOT EXISTS (SELECT 1 FROM b_cdc b
        WHERE b.g = a.g GROUP BY b.k HAVING COUNT(*) > 1) AS e FROM a_cdc a
        WHERE EXISTS (SELECT MAX(b.v) FROM b_cdc b WHERE b.k = a.k GROUP BY b.g)""",
    # EXISTS over a global aggregate: one row whatever the input (TRUE), as a condition
    # and as a value
    "exists_agg": """SELECT a.id, NOT EXISTS (SELECT COUNT(*) FROM c_app c WHERE c.k = a.k)
        AS e FROM a_cdc a WHERE EXISTS (SELECT MAX(b.v) FROM b_cdc b WHERE b.k = a.k + 1)""",
    # x <op> ANY / ALL (subquery) with SQL's NULLs (v has NULLs; Spark, which does not
    # parse these, gets the standard's definition over the rows: ``oracle._quantified``)
    "all_where": """SELECT id, v FROM a_cdc WHERE v > ALL (SELECT v FROM b_cdc WHERE g = 'a')
        OR k <= ANY (SELECT k FROM c_app WHERE v > 95)""",
    "any_all_values": """SELECT id, v < ANY (SELECT v FROM c_app WHERE k = 3) AS lt_any,
        k = ANY (SELECT v % 13 FROM b_cdc) AS eq_any, k <> ALL (SELECT v % 13 FROM b_cdc)
        AS ne_all, v >= ALL (SELECT v FROM b_cdc WHERE k = 2) AS ge_all,
        k <> ANY (SELECT k FROM c_app WHERE v > 90) AS ne_any,
        v = ALL (SELECT v FROM c_app WHERE v > 97) AS eq_all FROM a_cdc""",
    # correlated ANY / ALL / IN as values: the subquery's row counts, least and greatest
    # value per row as correlated aggregates (by equality, by an inequality)
    "all_corr": """SELECT a.id, a.v FROM a_cdc a
        WHERE a.v > ALL (SELECT b.v FROM b_cdc b WHERE b.k = a.k)""",
    "any_corr_lt": """SELECT a.id, a.v <= ANY (SELECT c.v FROM c_app c WHERE c.k < a.k - 5)
        AS x, a.d = ANY (SELECT b.d FROM b_cdc b WHERE b.g = a.g) AS y FROM a_cdc a""",
    "in_corr_or": """SELECT a.id, a.k NOT IN (SELECT b.v % 13 FROM b_cdc b WHERE b.g = a.g)
        AS ni FROM a_cdc a WHERE a.v > 90 OR a.d IN (SELECT b.d FROM b_cdc b
        WHERE b.k = a.k)""",
    # IN / EXISTS / ANY in HAVING and beside the aggregates of a GROUP BY: a SELECT over
    # the GROUP BY
    "having_in": """SELECT g, COUNT(*) AS n FROM a_cdc GROUP BY g
        HAVING g IN (SELECT g FROM b_cdc WHERE v > 50) OR COUNT(*) > 6""",
    "having_exists": """SELECT a.k, SUM(a.v) AS s FROM a_cdc a GROUP BY a.k
        HAVING EXISTS (SELECT 1 FROM b_cdc b WHERE b.k = a.k AND b.v > 50)""",
    "agg_beside": """SELECT k % 4 AS m, COUNT(*) AS n, k % 4 IN (SELECT k FROM c_app
        WHERE v > 50) AS e FROM a_cdc GROUP BY k % 4""",
    "agg_beside_all": """SELECT a.k, MAX(a.v) AS top, a.k * 10 >= ALL (SELECT b.v
        FROM b_cdc b WHERE b.g = 'a') AS ge FROM a_cdc a GROUP BY a.k""",
    # IN / EXISTS under OR and in SELECT (NOT IN with its NULLs: v % 13 is NULL at times);
    # EXISTS without an equality to the outer query (a semi / anti join on the constant key)
    "in_or": "SELECT id FROM a_cdc WHERE v > 90 OR k IN (SELECT k FROM b_cdc WHERE v > 50)",
    "not_in": "SELECT id, k NOT IN (SELECT v % 13 FROM b_cdc) AS ni FROM a_cdc",
    "exists_or": """SELECT a.id FROM a_cdc a WHERE a.v < 10
        OR EXISTS (SELECT 1 FROM b_cdc b WHERE b.k = a.k AND b.g = 'a')""",
    "exists_const": "SELECT id FROM a_cdc WHERE EXISTS (SELECT 1 FROM c_app WHERE v > 95)",
    "not_exists_lt": """SELECT id FROM a_cdc a
        WHERE NOT EXISTS (SELECT 1 FROM c_app c WHERE c.v > a.v + 60)""",
    "exists_lt_or": """SELECT id FROM a_cdc a WHERE a.g = 'b'
        OR EXISTS (SELECT 1 FROM c_app c WHERE c.k = a.k AND c.v > a.v)""",
}


@pytest.mark.parametrize("path", ["mixed"])  # driver and Spark by turns
def test_subqueries_match_batch_sql(spark, tmp_path, path):
    check_rounds(spark, tmp_path, TABLES, seed=20261127, path=path, rounds=2)

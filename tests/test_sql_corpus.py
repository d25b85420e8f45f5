"""A corpus of everyday SQL in the style of SQLite's sqllogictest (select1-5, random
aggregates), each declared as a streaming table over updating and append-only sources: what
the planner accepts, what it refuses and with which message. Planning only (no Spark);
that the accepted shapes are maintained exactly is for the oracle tests
(``test_oracle_sql``, ``test_oracle_subqueries``)."""
from __future__ import annotations

import random

import pytest

from octo_platform.errors import OctoError
from octo_platform.frontend.binder import build_catalog
from octo_platform.frontend.parser import parse_sql
from octo_platform.logical.plan import Join

SOURCES = "\n".join(
    ["CREATE SOURCE t1 (a INT, b INT, c INT, d INT, e INT) WITH (connector = 'files', "
     "path = 't1', format = 'debezium-json', primary_key = 'a');"]
    + [f"CREATE SOURCE s{i} (a{i} INT, b{i} INT, c{i} INT, d{i} INT, e{i} INT, x{i} STRING) "
       f"WITH (connector = 'files', path = 's{i}', format = 'json');" for i in range(1, 9)]
    + [f"CREATE SOURCE {t} (col0 INT, col1 INT, col2 INT) WITH (connector = 'files', "
       f"path = '{t}', format = 'debezium-json', primary_key = 'col0');"
       for t in ("tab0", "tab1", "tab2")])

ACCEPTED = """
SELECT CASE WHEN c>(SELECT avg(c) FROM t1) THEN a*2 ELSE b*10 END FROM t1
SELECT a+b*2+c*3+d*4+e*5, (a+b+c+d+e)/5 FROM t1
SELECT a+b*2+c*3, CASE WHEN a<b-3 THEN 111 WHEN a<=b THEN 222 ELSE 444 END, abs(b-c) FROM t1 WHERE (e>c OR e<d) AND d>e AND EXISTS(SELECT 1 FROM t1 AS x WHERE x.b<t1.b)
SELECT (SELECT count(*) FROM t1 AS x WHERE x.b<t1.b), a+b*2+c*3+d*4, abs(a) FROM t1 WHERE c BETWEEN b-2 AND d+2
SELECT d-e, (SELECT count(*) FROM t1 AS x WHERE x.c>t1.c AND x.d<t1.d), c-d FROM t1 WHERE b>c
SELECT a, (SELECT count(*) FROM t1 AS x WHERE x.b<t1.b) FROM t1 WHERE a IS NULL OR (e>a AND e<b)
SELECT CASE a+1 WHEN b THEN 111 WHEN c THEN 222 ELSE 444 END FROM t1 WHERE NOT EXISTS(SELECT 1 FROM t1 AS x WHERE x.c>t1.c AND x.d<t1.d) OR c>d
SELECT c, d-e, CASE WHEN a<b-3 THEN 111 ELSE 444 END FROM t1 WHERE coalesce(a,b,c,d,e)<>0
SELECT a+b*2 FROM t1 WHERE (a>b-2 AND a<b+2) OR c>d OR EXISTS(SELECT 1 FROM t1 AS x WHERE x.b<t1.b)
SELECT (SELECT count(*) FROM t1 AS x WHERE x.c>t1.c AND x.d<t1.d), a-b, CASE WHEN c>(SELECT avg(c) FROM t1) THEN a*2 ELSE b*10 END FROM t1
SELECT (a+b+c+d+e)/5, (SELECT count(*) FROM t1 AS x WHERE x.b<t1.b) FROM t1 WHERE EXISTS(SELECT 1 FROM t1 AS x WHERE x.b<t1.b) AND c>d
SELECT x1, x2 FROM s1, s2 WHERE a1=b2
SELECT e1, d2, c3 FROM s1, s2, s3 WHERE a3 = b2 AND b1 = c3 AND d1 > 5
SELECT x1, x2, x3, x4, x5, x6, x7, x8 FROM s1, s2, s3, s4, s5, s6, s7, s8 WHERE a1=b2 AND a2=b3 AND a3=b4 AND a4=b5 AND a5=b6 AND a6=b7 AND a7=b8 AND c1 > 2
SELECT x3, x7, x1 FROM s7, s3, s1, s5 WHERE b3=a7 AND a1=c5 AND e5 = d7 AND (a1 > 3 OR b3 < 2)
SELECT count(*) FROM s1, s2 WHERE a1 < b2
SELECT x1, x2 FROM s1 JOIN s2 ON a1=b2 AND c1 < c2, s3 WHERE d3 = e2
SELECT ALL + COUNT( * ) * - 64 FROM tab0 AS cor0 WHERE NOT col1 IS NULL
SELECT DISTINCT - 35 / + col2 FROM tab1
SELECT SUM( DISTINCT col1 ) FROM tab2 WHERE NOT col0 BETWEEN NULL AND col1
SELECT - col2 + - col0 AS col1 FROM tab0 WHERE NOT + col2 IN ( col1 )
SELECT MAX( cor0.col0 ) FROM tab1 AS cor0 CROSS JOIN tab0 AS cor1
SELECT col1 FROM tab0 EXCEPT SELECT col1 FROM tab1
SELECT col1 FROM tab0 EXCEPT ALL SELECT col1 FROM tab1
SELECT col0 FROM tab0 WHERE col1 IN (SELECT col1 FROM tab1) OR col2 > 5
SELECT 1 FROM tab0 WHERE EXISTS (SELECT * FROM tab1)
SELECT ( SELECT MAX(col1) FROM tab2 ) FROM tab0
SELECT - ( - COUNT ( * ) ) FROM tab2 AS cor0 CROSS JOIN tab1 AS cor1 WHERE NOT NULL IS NULL
SELECT cor0.col2 * - cor1.col0 FROM tab0 AS cor0 JOIN tab1 cor1 ON NULL IS NULL
SELECT DISTINCT col1 FROM tab0 UNION SELECT col2 FROM tab1
SELECT AVG(DISTINCT col0) FROM tab1 GROUP BY col1 HAVING NOT ( NOT - col1 IS NOT NULL )
SELECT col1, COUNT(*) FROM tab0 GROUP BY col1 HAVING COUNT(*) > (SELECT COUNT(*) FROM tab1)
SELECT col0 FROM tab0 INTERSECT SELECT col1 FROM tab1
SELECT col0 FROM tab0 INTERSECT ALL SELECT col1 FROM tab1
SELECT col0 FROM tab0 WHERE col1 NOT IN (SELECT col2 FROM tab1)
SELECT col0, col1 NOT IN (SELECT col2 FROM tab1 WHERE col2 > 3) FROM tab0
WITH x AS (SELECT col0, SUM(col1) AS s FROM tab0 GROUP BY col0) SELECT x.col0, x.s, t.col2 FROM x, tab1 t WHERE x.col0 = t.col0
SELECT col0 FROM tab0 AS t WHERE col2 > (SELECT AVG(col2) FROM tab0 AS u WHERE u.col1 = t.col1)
SELECT cor0.col0, SUM(DISTINCT cor1.col1), COUNT(*) FROM tab0 cor0, tab1 cor1 WHERE cor0.col1 = cor1.col2 GROUP BY cor0.col0
SELECT * FROM tab0 WHERE col0 IN (SELECT col1 FROM tab1 WHERE col2 IN (SELECT col0 FROM tab2))
SELECT col0 FROM tab0 WHERE (SELECT COUNT(*) FROM tab1 WHERE tab1.col1 = tab0.col1) > 1 OR col2 IS NULL
SELECT DISTINCT cor0.col1 FROM tab0 cor0, tab1 cor1, tab2 cor2 WHERE cor0.col0 = cor1.col1 AND cor2.col2 = cor1.col2
SELECT col0, col1 FROM tab0 UNION ALL SELECT col0, col1 FROM tab1 EXCEPT SELECT col1, col2 FROM tab2
SELECT col0 FROM tab0 t WHERE EXISTS (SELECT 1 FROM tab1 u WHERE u.col0 > t.col0)
SELECT SUM(col0) FROM tab0 WHERE col1 NOT IN (SELECT col2 FROM tab1) AND col0 IN (SELECT col0 FROM tab2)
SELECT col1, COUNT(*) FROM tab0 t GROUP BY col1 HAVING COUNT(*) > (SELECT COUNT(*) FROM tab1 u WHERE u.col2 = t.col1)
SELECT col1, (SELECT MAX(u.col0) FROM tab1 u WHERE u.col2 < t.col1), SUM(col2) FROM tab0 t GROUP BY col1
SELECT cor0.col1 FROM tab0 cor0 LEFT JOIN tab1 cor1 ON cor0.col2 > cor1.col2
SELECT x1, (SELECT count(*) FROM s2 WHERE b2 < a1) FROM s1, s3 WHERE a1 = a3
SELECT col0 FROM tab0 WHERE col1 > ALL (SELECT col1 FROM tab1)
SELECT col0, col1 = ANY (SELECT col1 FROM tab1) AS e FROM tab0
SELECT col0 FROM tab0 t WHERE col1 > ALL (SELECT u.col1 FROM tab1 u WHERE u.col0 = t.col0)
SELECT SUM(DISTINCT col1), COUNT(DISTINCT col2) FROM tab0
SELECT cor0.col1 FROM tab0 cor0, tab1 b RIGHT JOIN tab2 c ON b.col0 = c.col0
SELECT col0 FROM tab0 t WHERE col1 > 2 OR col2 IN (SELECT u.col1 FROM tab1 u WHERE u.col0 = t.col0)
SELECT col1, COUNT(*) FROM tab0 GROUP BY col1 HAVING col1 IN (SELECT col2 FROM tab1) OR COUNT(*) > 2
SELECT col1, COUNT(*), EXISTS (SELECT 1 FROM tab1 u WHERE u.col0 = t.col1) FROM tab0 t GROUP BY col1
SELECT t.col0, (SELECT SUM(u.col2) FROM tab1 u WHERE u.col0 = t.col1 GROUP BY u.col0) FROM tab0 t
SELECT t.col0, (SELECT u.col2 FROM tab1 u WHERE u.col0 = t.col1 ORDER BY u.col1 DESC LIMIT 1) FROM tab0 t
SELECT a.col0 FROM tab0 a WHERE EXISTS (SELECT b.col1 FROM tab1 b WHERE b.col0 = a.col1 GROUP BY b.col1 HAVING SUM(b.col2) > 10)
SELECT a.col0 FROM tab0 a WHERE NOT EXISTS (SELECT DISTINCT max(b.col1) FROM tab1 b WHERE b.col0 = a.col1 GROUP BY b.col2)
""".strip().splitlines()

REFUSED = {
    # a streaming table's columns need distinct names
    "SELECT ALL * FROM tab1, tab2 AS cor0 WHERE NOT NULL IS NOT NULL":
        "duplicate output column 'col0'",
    "SELECT (SELECT col1 FROM tab1) FROM tab0": "must return at most one row",
    "SELECT t.col0, (SELECT COUNT(*) FROM tab1 u WHERE u.col0 = t.col1 GROUP BY u.col2) "
    "FROM tab0 t": "may GROUP BY only inner columns it compares with outer ones",
    "SELECT col1, COUNT(*) FROM tab0 t GROUP BY col1 HAVING EXISTS (SELECT 1 FROM tab1 u "
    "WHERE u.col0 = t.col2)": "column 't.col2' must appear in GROUP BY",
    "SELECT col0 FROM tab0 t WHERE col1 > (SELECT u.col1 FROM tab1 u WHERE u.col0 = t.col0)":
        "a correlated scalar subquery must be an aggregate",
    "SELECT col1 FROM tab0 t GROUP BY col1 HAVING COUNT(*) > (SELECT COUNT(*) FROM tab1 u "
    "WHERE u.col2 = t.col0)": "may compare inner columns only with GROUP BY columns",
}


def plan(query: str):
    sql = f"{SOURCES}\nCREATE STREAMING TABLE q AS {query};"
    return build_catalog(parse_sql(sql, path="corpus.sql")).table("q").plan


@pytest.mark.parametrize("query", ACCEPTED, ids=range(len(ACCEPTED)))
def test_accepted(query):
    plan(query)


@pytest.mark.parametrize("query,message", REFUSED.items(), ids=range(len(REFUSED)))
def test_refused(query, message):
    with pytest.raises(OctoError) as err:
        plan(query)
    assert message in str(err.value)


def joins(node):
    if isinstance(node, Join):
        yield node
    for child in node.inputs:
        yield from joins(child)


@pytest.mark.parametrize("seed", range(40))
def test_comma_joins_become_equi_joins(seed):
    """Random comma joins of 2-8 inputs in random FROM order, connected by equalities in
    WHERE (a random tree of them, plus extra ones and other conditions): no cross join
    is left; inputs the equalities do not connect are cross-joined, once per extra group."""
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    tables = rng.sample(range(1, 9), n)
    groups = rng.randint(1, 2) if n > 2 else 1
    conds = []
    for i in range(1, n):
        if groups == 2 and i == n // 2:
            continue  # two groups: no equality joins the halves
        j = rng.randrange(i) if groups == 1 or i < n // 2 else rng.randrange(n // 2, i)
        a, b = tables[i], tables[j]
        conds.append(f"{rng.choice('abcde')}{a} = {rng.choice('abcde')}{b}")
    for _ in range(rng.randint(0, 2)):
        a, b = rng.sample(tables, 2)
        conds.append(f"c{a} < d{b}")
    rng.shuffle(conds)
    order = tables[:]
    rng.shuffle(order)
    query = (f"SELECT {', '.join(f'x{t}' for t in tables)} FROM "
             f"{', '.join(f's{t}' for t in order)}" +
             (f" WHERE {' AND '.join(conds)}" if conds else ""))
    crosses = [j for j in joins(plan(query)) if j.cross]
    assert len(crosses) == groups - 1, query

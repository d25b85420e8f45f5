"""Randomized oracle test for joins, semi/anti joins and top-N over updating inputs.

Two inputs per side, ``*_app`` (append-only JSON) and ``*_cdc`` (Debezium inserts, updates
that move rows between join keys, deletes), so every join type runs with each side
append-only and updating. Rounds of random files are separate runs (restarts from Delta
state), split into random micro-batches; after every run each replayed changelog must equal
Spark's batch result of the same SQL over all input so far.
"""
from __future__ import annotations

import random

import pytest

from octo_platform.project import load_project
from tests.oracle import PATHS, RandomInput, check_rounds

A = "a.id AS aid, b.id AS bid"
TABLES = {
    # every join type with each side append-only and updating; some with residual conditions
    "inner_aa": f"SELECT {A}, a.k, a.v + b.v AS s FROM a_app a JOIN b_app b ON a.k = b.k",
    "inner_uu": f"SELECT {A}, a.v, b.v AS bv FROM a_cdc a JOIN b_cdc b ON a.k = b.k AND a.v < b.v",
    "inner_au": f"SELECT {A}, a.g FROM a_app a JOIN b_cdc b ON a.k = b.k AND a.g = b.g",
    "left_au": f"SELECT {A}, a.g, b.v FROM a_app a LEFT JOIN b_cdc b ON a.k = b.k",
    "left_ua": f"SELECT {A}, a.v FROM a_cdc a LEFT JOIN b_app b ON a.k = b.k AND b.v > a.v",
    "right_au": f"SELECT {A}, b.g FROM a_app a RIGHT JOIN b_cdc b ON b.k = a.k",
    "right_ua": f"SELECT {A} FROM a_cdc a RIGHT OUTER JOIN b_app b ON a.k = b.k AND a.g <> b.g",
    "full_uu": f"SELECT {A}, coalesce(a.k, b.k) AS k FROM a_cdc a FULL JOIN b_cdc b ON a.k = b.k",
    "full_ua": f"SELECT {A} FROM a_cdc a FULL OUTER JOIN b_app b ON a.k = b.k AND a.v < b.v",
    # semi / anti joins
    "semi_in": "SELECT id, k FROM a_cdc WHERE k IN (SELECT k FROM b_cdc WHERE v > 50)",
    "semi_exists": """SELECT id, v FROM a_cdc a
        WHERE EXISTS (SELECT 1 FROM b_app b WHERE b.k = a.k AND b.v > a.v)""",
    "anti": """SELECT id, g FROM a_app a WHERE a.v > 10
        AND NOT EXISTS (SELECT 1 FROM b_cdc b WHERE b.k = a.k AND b.g = a.g)""",
    # multi-way join, self-join, join + aggregate chains (Nexmark q3 / q4 shapes)
    "three_way": """SELECT a.id AS aid, b.id AS bid, c.id AS cid FROM a_cdc a
        JOIN b_cdc b ON a.k = b.k LEFT JOIN b_app c ON c.k = b.k AND c.g = a.g""",
    "self": "SELECT x.id, y.id AS yid FROM a_cdc x JOIN a_cdc y ON x.k = y.k AND x.id < y.id",
    "q3": """SELECT b.g AS name, a.id FROM a_cdc a JOIN b_cdc b ON a.k = b.id % 13
        WHERE a.g = 'a' AND b.g IN ('b', 'c')""",
    "q4": """SELECT q.g, AVG(q.top) AS avg_top, COUNT(*) AS n FROM (
        SELECT a.id, a.g, MAX(b.v) AS top FROM a_cdc a JOIN b_app b
        ON a.k = b.k AND b.v >= a.v GROUP BY a.id, a.g) q GROUP BY q.g""",
    "agg_join": """SELECT s.k, s.n, a.id FROM (SELECT k, COUNT(*) AS n FROM b_cdc GROUP BY k) s
        JOIN a_app a ON a.k = s.k""",
    # top-N
    "top_group": """SELECT k, id, v, rn FROM (SELECT k, id, v,
        ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC, id) AS rn FROM a_cdc) t
        WHERE rn <= 2""",
    "top_group_app": """SELECT * FROM (SELECT g, id, d, ROW_NUMBER() OVER (PARTITION BY g
        ORDER BY d, id) AS r FROM a_app) t WHERE r < 3""",
    "top_global": "SELECT id, v FROM a_cdc ORDER BY v DESC, id LIMIT 5",
    "top_agg": "SELECT g, COUNT(*) AS n FROM a_cdc GROUP BY g ORDER BY n DESC, g LIMIT 2",
}


def project_sql(rng: random.Random) -> str:
    ddl = RandomInput(0, False).ddl()
    parts = []
    for side in "ab":
        for kind, fmt in (("app", "json"), ("cdc", "debezium-json")):
            pk = ", primary_key = 'id'" if kind == "cdc" else ""
            parts.append(f"CREATE SOURCE {side}_{kind} ({ddl}) WITH (connector = 'files', "
                         f"path = 'data/{side}_{kind}', format = '{fmt}', "
                         f"max_files_per_batch = '{rng.randint(1, 2)}'{pk});")
    parts += [f"CREATE STREAMING TABLE {name} AS {sql};" for name, sql in TABLES.items()]
    return "\n".join(parts)


@pytest.mark.parametrize("path", PATHS)
def test_joins_and_top_n_match_batch_sql(spark, tmp_path, path):
    seed = 20261123
    rng = random.Random(seed)
    sql = project_sql(rng)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    project = load_project(tmp_path)
    feeds = {f"{side}_{kind}": RandomInput(seed + i, kind == "cdc")
             for i, (side, kind) in enumerate((s, k) for s in "ab" for k in ("app", "cdc"))}
    check_rounds(spark, tmp_path, sql, project, TABLES, feeds, rng, path, 3, lines=(3, 12))

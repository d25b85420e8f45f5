"""Randomized oracle test for every operator, over append-only and Debezium input.

Random input arrives in rounds of files; every round is a separate run (a restart that
resumes from Delta state) and ``max_files_per_batch`` splits rounds into random
micro-batches. After each run, every table's replayed changelog must equal the same SELECT
evaluated by Spark as a batch query over all input so far, and the current-state table
must equal the replay.
"""
from __future__ import annotations

import random

import pytest

from octo_platform.project import load_project
from octo_platform.runtime import inputs, pipeline
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import (
    PATHS,
    RandomInput,
    check_paths,
    check_tables,
    driver_rows,
    write_lines,
)

TABLES = {
    # stateless: filter + projection with scalar expressions
    "t_project": """SELECT id, k, v * 2 AS v2, CASE WHEN v > 50 THEN 'hi' ELSE 'lo' END AS band,
        upper(coalesce(g, 'none')) AS ug, CAST(d AS INT) AS di, concat(g, '-', k) AS gk
        FROM src WHERE v IS NULL OR v % 3 <> 0""",
    "t_union": "SELECT k, g FROM src WHERE k < 6 UNION ALL SELECT k, g FROM src2",
    "t_distinct": "SELECT DISTINCT g, v % 5 AS m FROM src",
    "t_cte": """WITH t AS (SELECT g, v FROM src WHERE v > 10)
        SELECT g, cnt FROM (SELECT g, COUNT(*) AS cnt FROM t GROUP BY g) s WHERE cnt > 1""",
    "t_view": "SELECT k, SUM(v) AS s FROM big GROUP BY k",
    "t_aggs": """SELECT g, COUNT(*) AS n, COUNT(v) AS nv, SUM(v) AS s, AVG(v) AS a, MIN(v) AS mn,
        MAX(v) AS mx, COUNT(DISTINCT k) AS dk, SUM(d) AS sd, MAX(d) - MIN(d) AS spread
        FROM src GROUP BY g""",
    "t_having": "SELECT k % 4 AS b, COUNT(*) AS n FROM src GROUP BY k % 4 HAVING COUNT(*) > 3",
    "t_global": """SELECT COUNT(*) AS n, SUM(v) AS s, MIN(v) AS mn, MAX(v) AS mx, AVG(d) AS a
        FROM src""",
    "t_nested": """SELECT n, COUNT(*) AS groups, MIN(top) AS low FROM
        (SELECT k, COUNT(*) AS n, MAX(v) AS top FROM src GROUP BY k) per_k GROUP BY n""",
    "t_per_k": "SELECT k, COUNT(*) AS n, MAX(v) AS top FROM src GROUP BY k",
    "t_chained": "SELECT n, COUNT(*) AS ks, MAX(top) AS top FROM t_per_k GROUP BY n",
    "t_chained_rows": "SELECT k, top FROM t_per_k WHERE n > 2",
}


def project_sql(debezium: bool, max_files: int) -> str:
    fmt = "debezium-json" if debezium else "json"
    ddl = RandomInput(0, debezium).ddl()
    pk = ", primary_key = 'id'" if debezium else ""
    parts = [
        f"CREATE SOURCE src ({ddl}) WITH (connector = 'files', path = 'data/src', "
        f"format = '{fmt}', max_files_per_batch = '{max_files}'{pk});",
        f"CREATE SOURCE src2 ({ddl}) WITH (connector = 'files', path = 'data/src2', "
        f"format = 'json');",
        "CREATE VIEW big AS SELECT * FROM src WHERE v > 20;",
    ]
    parts += [f"CREATE STREAMING TABLE {name} AS {sql};" for name, sql in TABLES.items()]
    return "\n".join(parts)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("debezium", [False, True], ids=["append-only", "debezium"])
def test_every_operator_matches_batch_sql(spark, tmp_path, monkeypatch, debezium, path):
    if debezium:  # also cover the large-batch path: every bucket read and rewritten
        monkeypatch.setattr(inputs, "ALL_BUCKETS_BYTES", 0)
    else:  # and vacuuming state / compacting the batch log between batches
        monkeypatch.setattr(pipeline, "MAINTENANCE_EVERY", 2)
    seed = 20261122 + int(debezium)
    rng = random.Random(seed)
    sql = project_sql(debezium, max_files=rng.randint(1, 2))
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    project = load_project(tmp_path)
    keyed = {n: project.table(n).physical.pk is not None for n in TABLES}
    src, src2 = RandomInput(seed, debezium), RandomInput(seed + 7, False)
    src2.next_id = 10_000
    dead = 0
    for round_no in range(3):
        for f in range(rng.randint(1, 3)):
            bad = rng.choice([0, 0, 1, 2])
            dead += bad
            write_lines(tmp_path / "data" / "src", f"r{round_no}-{f}.json",
                        src.lines(rng.randint(5, 25), bad=bad))
        write_lines(tmp_path / "data" / "src2", f"r{round_no}.json", src2.lines(rng.randint(0, 5)))
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=4, progress=None, driver_rows=driver_rows(path, round_no)), until_idle=True)
        assert report.batches, "every round has new input"
        check_paths(report, project, path, round_no)
        relations = {"src": src.relation(), "src2": src2.relation()}
        check_tables(spark, tmp_path / "warehouse", sql, relations, keyed, round_no)
    assert dead_letter_count(tmp_path, "t_project") == dead


def dead_letter_count(project, table: str) -> int:
    from deltalake import DeltaTable

    path = project / "warehouse" / "_dead_letters" / table
    return len(DeltaTable(str(path)).to_pyarrow_table()) if path.exists() else 0

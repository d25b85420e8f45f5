"""Window functions (TUMBLE, HOP) in FROM, over append-only and updating input with late
records: after every run (a restart), each table's replayed changelog equals the same
SELECT run by Spark as a batch query over the records that were not late, its windows
computed by Spark's own ``window()`` (``tests/oracle.spark_sql``)."""
from __future__ import annotations

import random

import pytest

from octo_platform.errors import SqlError
from octo_platform.frontend.binder import build_catalog
from octo_platform.frontend.parser import parse_sql
from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import check_tables
from tests.timed import TimedSource, late_dead_letters, source_sql, write_round

TUMBLE = "TUMBLE(clicks, ts, INTERVAL '1' MINUTE)"
TABLES = {
    "w_tumble": f"""SELECT window_start, window_end, user_id, COUNT(*) AS n, SUM(amount) AS s
        FROM {TUMBLE} GROUP BY window_start, window_end, user_id""",
    "w_hop": """SELECT h.window_start, h.window_end, MAX(amount) AS top, COUNT(*) AS n
        FROM HOP(clicks, ts, INTERVAL '30' SECOND, INTERVAL '2' MINUTE) AS h
        GROUP BY h.window_start, h.window_end HAVING COUNT(*) > 1""",
    "w_flink": """SELECT window_start, COUNT(DISTINCT user_id) AS users, MIN(amount) AS low
        FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '90' SECONDS))
        GROUP BY window_start""",
    "w_top2": f"""SELECT window_start, user_id, s FROM (
        SELECT window_start, user_id, s, ROW_NUMBER() OVER (
            PARTITION BY window_start ORDER BY s DESC, user_id) AS rn
        FROM (SELECT window_start, user_id, SUM(amount) AS s FROM {TUMBLE}
              GROUP BY window_start, user_id) per_user) ranked WHERE rn <= 2""",
    "w_join": f"""SELECT a.window_start, a.n, b.top FROM
        (SELECT window_start, COUNT(*) AS n FROM {TUMBLE} GROUP BY window_start) a JOIN
        (SELECT window_start, MAX(amount) AS top FROM {TUMBLE} WHERE user_id < 3
         GROUP BY window_start) b ON a.window_start = b.window_start""",
    "w_rows": """SELECT id, amount, window_start FROM
        HOP(clicks, ts, INTERVAL '20' SECOND, INTERVAL '1' MINUTE) WHERE amount > 2""",
}


def project_sql(debezium: bool, max_files: int) -> str:
    return "\n".join([source_sql(debezium, max_files),
                      *(f"CREATE STREAMING TABLE {n} AS {q};" for n, q in TABLES.items())])


@pytest.mark.parametrize("debezium", [False, True], ids=["append-only", "debezium"])
def test_windows_match_batch_sql(spark, tmp_path, debezium):
    seed = 20261126 + int(debezium)
    rng = random.Random(seed)
    max_files = rng.randint(1, 2)
    sql = project_sql(debezium, max_files)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "windows.sql").write_text(sql)
    project = load_project(tmp_path)
    keyed = {n: project.table(n).physical.pk is not None for n in TABLES}
    assert keyed["w_tumble"] and keyed["w_hop"]
    src = TimedSource(seed, debezium)
    for round_no in range(3):
        write_round(src, rng, tmp_path / "data" / "clicks", round_no, max_files)
        run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                   until_idle=True)
        check_tables(spark, tmp_path / "warehouse", sql, {"clicks": src.relation()}, keyed,
                     round_no)
        late, _ = late_dead_letters(tmp_path / "warehouse", "w_tumble")
        assert late == src.late
    assert src.late, "the generator made late records"


def test_window_plans_show_the_window():
    text = source_sql(False, 1) + (
        "\nCREATE STREAMING TABLE t AS SELECT window_start, COUNT(*) AS n FROM "
        "HOP(clicks, ts, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE) GROUP BY window_start;")
    table = build_catalog(parse_sql(text)).table("t")
    from octo_platform.logical.plan import explain

    assert "Window HOP(`ts`, slide 1 MINUTE, size 5 MINUTE)" in explain(table.plan)


@pytest.mark.parametrize("from_, message", [
    ("TUMBLE(clicks, ts)", "TUMBLE takes (relation, time column, size)"),
    ("TUMBLE(nope, ts, INTERVAL '1' MINUTE)", "unknown source, view or table 'nope'"),
    ("TUMBLE(clicks, tx, INTERVAL '1' MINUTE)", "TUMBLE: clicks has no column 'tx'"),
    ("TUMBLE(clicks, amount, INTERVAL '1' MINUTE)", "must be a TIMESTAMP (it is BIGINT)"),
    ("TUMBLE(clicks, ts, INTERVAL '1' MONTH)", "expected a positive interval"),
    ("HOP(clicks, ts, INTERVAL '5' MINUTE, INTERVAL '1' MINUTE)", "the slide"),
])
def test_window_errors_point_at_the_sql(from_, message):
    text = source_sql(False, 1) + (
        f"\nCREATE STREAMING TABLE t AS\nSELECT COUNT(*) AS n FROM {from_};")
    with pytest.raises(SqlError) as err:
        build_catalog(parse_sql(text, path="w.sql"))
    assert message in str(err.value)
    assert str(err.value).startswith("w.sql:5:")

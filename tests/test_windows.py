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
from tests.timed import (
    TimedSource,
    assert_error_at,
    late_dead_letters,
    source_sql,
    timed_oracle,
    write_round,
)

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


@pytest.mark.parametrize("debezium", [False, True], ids=["append-only", "debezium"])
def test_windows_match_batch_sql(spark, tmp_path, debezium):
    def late_ones(src, round_no, report, no_time) -> None:
        late, _ = late_dead_letters(tmp_path / "warehouse", "w_tumble")
        assert late == src.late

    src = timed_oracle(spark, tmp_path, TABLES, 20261126 + int(debezium), debezium,
                       each_round=late_ones)
    project = load_project(tmp_path)
    assert project.table("w_tumble").physical.pk and project.table("w_hop").physical.pk
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


CLOSING = {
    "e_tumble": f"""SELECT window_start, window_end, user_id, COUNT(*) AS n, MAX(amount) AS top,
        COUNT(DISTINCT amount) AS amounts FROM {TUMBLE}
        GROUP BY window_start, window_end, user_id EMIT ON WINDOW CLOSE""",
    "e_hop": """SELECT window_end, SUM(amount) AS s FROM
        HOP(clicks, ts, INTERVAL '30' SECOND, INTERVAL '90' SECOND)
        GROUP BY window_end HAVING COUNT(*) > 2 EMIT ON WINDOW CLOSE""",
    "e_session": """SELECT window_end, user_id, COUNT(*) AS n FROM
        SESSION(clicks, ts, INTERVAL '20' SECOND) GROUP BY window_end, user_id
        EMIT ON WINDOW CLOSE""",
}


def assert_closed_windows(spark, tmp_path, project, sql, src, name, round_no) -> dict:
    """An EMIT ON WINDOW CLOSE table's replay is exactly the batch result of the windows
    the watermark has closed, from ``c`` events only; returns that result."""
    from tests.oracle import batch_result, changelog_events, replay

    end = project.table(name).definition.columns.index("window_end")
    closed = {row: n for row, n in batch_result(
        spark, sql, {"clicks": src.relation()}, name).items() if row[end] <= src.watermark}
    assert replay(tmp_path / "warehouse", name) == closed, (round_no, name)
    assert {e["op"] for e in changelog_events(tmp_path / "warehouse", name)} <= {"c"}
    return closed


def test_emit_on_window_close(spark, tmp_path):
    """After every run, each table holds exactly the batch result of the windows the
    watermark has closed, written once each as inserts (closed in the batch that moved
    the watermark past their end)."""
    closed: dict[str, dict] = {}

    def windows_closed(src, sql, project, round_no) -> None:
        assert all(project.table(n).definition.plan.mode == "append-only" for n in CLOSING)
        for name in CLOSING:
            closed[name] = assert_closed_windows(spark, tmp_path, project, sql, src, name,
                                                 round_no)

    timed_oracle(spark, tmp_path, CLOSING, 20261127, False, check=windows_closed)
    assert closed[list(CLOSING)[-1]], "windows closed"


def test_closed_windows_leave_the_state(spark, tmp_path):
    """200 one-minute windows stream through; the aggregate's state (rows in its Delta
    table at each committed batch, by the version the batch log records) stays bounded
    by the windows open at a time, not by all windows seen."""
    import json as js
    from datetime import timedelta

    from deltalake import DeltaTable

    from tests.oracle import write_lines
    from tests.timed import START

    sql = source_sql(False, 1) + f"""
CREATE STREAMING TABLE per_minute AS SELECT window_start, user_id, COUNT(*) AS n
FROM {TUMBLE} GROUP BY window_start, user_id;"""
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "state.sql").write_text(sql)
    for f in range(20):  # each file: 10 minutes, a click every 20 s per user (3 users)
        lines = [js.dumps({"id": f * 1000 + i, "user_id": i % 3, "amount": 1,
                           "ts": (START + timedelta(seconds=20 * (i // 3) + 600 * f))
                           .isoformat()}) for i in range(90)]
        write_lines(tmp_path / "data" / "clicks", f"f{f:02d}.json", lines)
    run = run_tables(spark, tmp_path, options=default_options(buckets=2, progress=None),
                     until_idle=True)
    assert len(run.batches) == 20
    log = DeltaTable(str(tmp_path / "warehouse" / "_octo" / "per_minute" / "log"))
    commits = [js.loads(r["payload"]) for r in sorted(
        log.to_pyarrow_table().to_pylist(), key=lambda r: r["batch_id"])
        if r["kind"] == "commit"]
    state = tmp_path / "warehouse" / "_octo" / "per_minute" / "state" / "agg3"
    sizes = [DeltaTable(str(state), version=c["versions"]["state/agg3"]).to_pyarrow_table()
             .num_rows for c in commits]
    # 600 groups in all (200 windows x 3 users); a batch adds 30 and a window stays open
    # for the 30 s watermark delay, so the state holds a few batches' groups at most.
    print("state rows after each batch:", sizes)
    assert max(sizes) <= 150, sizes
    current = DeltaTable(str(tmp_path / "warehouse" / "_current" / "per_minute"))
    assert current.to_pyarrow_table().num_rows == 600  # closed windows stay in the result


@pytest.mark.parametrize("query, message", [
    ("SELECT user_id, COUNT(*) AS n FROM clicks GROUP BY user_id",
     "needs a query that ends in a GROUP BY window_start or window_end"),
    (f"SELECT window_start, user_id FROM {TUMBLE}",
     "needs a query that ends in a GROUP BY window_start or window_end"),
    ("SELECT window_start, COUNT(*) AS n FROM TUMBLE(cdc, ts, INTERVAL '1' MINUTE) "
     "GROUP BY window_start", "needs an append-only input to the windowed GROUP BY"),
    ("SELECT window_start, COUNT(*) AS n FROM TUMBLE(plain, ts, INTERVAL '1' MINUTE) "
     "GROUP BY window_start", "declare WATERMARK FOR ts on source plain"),
])
def test_emit_on_window_close_errors_point_at_the_clause(query, message):
    assert_error_at([f"CREATE STREAMING TABLE t AS {query}\n  EMIT ON WINDOW CLOSE;"],
                    "EMIT ON", message)


SESSIONS = {
    "s_user": """SELECT window_start, window_end, user_id, COUNT(*) AS n, SUM(amount) AS s
        FROM SESSION(clicks, ts, INTERVAL '20' SECOND)
        GROUP BY window_start, window_end, user_id""",
    "s_all": """SELECT window_start, window_end, COUNT(*) AS n, MAX(amount) AS top
        FROM TABLE(SESSION(TABLE clicks, DESCRIPTOR(ts), INTERVAL '6' SECONDS))
        GROUP BY window_start, window_end HAVING COUNT(*) > 1""",
}


@pytest.mark.parametrize("debezium", [False, True], ids=["append-only", "debezium"])
def test_session_windows_match_batch_sql(spark, tmp_path, debezium):
    """Sessions grow, merge and (over a CDC feed) split as rows come, go and move; the
    replay equals Spark's own ``session_window`` over the rows that were not late."""
    timed_oracle(spark, tmp_path, SESSIONS, 20261128 + int(debezium), debezium)


OVER = {
    "o_user": """SELECT id, user_id, ts, amount,
        SUM(amount) OVER (PARTITION BY user_id ORDER BY ts
                          RANGE BETWEEN INTERVAL '30' SECOND PRECEDING AND CURRENT ROW) AS s30,
        COUNT(*) OVER (PARTITION BY user_id ORDER BY ts
                       RANGE BETWEEN INTERVAL '30' SECOND PRECEDING AND CURRENT ROW) AS n30,
        MAX(amount) OVER (PARTITION BY user_id ORDER BY ts
                          RANGE BETWEEN INTERVAL '30' SECOND PRECEDING AND CURRENT ROW) AS m30
        FROM clicks""",
    "o_all": """SELECT id, AVG(amount) OVER (ORDER BY ts
        RANGE BETWEEN INTERVAL '10' SECOND PRECEDING AND CURRENT ROW) AS a10
        FROM clicks WHERE amount > 1""",
}


@pytest.mark.parametrize("debezium", [False, True], ids=["append-only", "debezium"])
def test_sliding_over_windows_match_batch_sql(spark, tmp_path, debezium):
    """Per row, aggregates over its partition's last 30 s (peers included): rows out of
    order, updates and deletes change their successors' values; equal to Spark's own
    window functions over the rows that were not late."""
    timed_oracle(spark, tmp_path, OVER, 20261129 + int(debezium), debezium)


CHAINED = {
    "per_min": f"""SELECT window_start, window_end, user_id, COUNT(*) AS n FROM {TUMBLE}
        GROUP BY window_start, window_end, user_id""",
    "per_5min": """SELECT window_start, window_end, SUM(n) AS total
        FROM TUMBLE(minutes, minute_end, INTERVAL '5' MINUTE)
        GROUP BY window_start, window_end EMIT ON WINDOW CLOSE""",
    "busiest": """SELECT window_end, MAX(n) AS top FROM per_min GROUP BY window_end
        EMIT ON WINDOW CLOSE""",
}


def test_a_table_over_a_windowed_table_inherits_its_watermark(spark, tmp_path):
    """per_min (updating) passes its watermark on through window_end: tables over it close
    their windows by it, and hold exactly the batch result of the windows it closed."""
    seed = 20261130
    rng = random.Random(seed)
    tables = [f"CREATE STREAMING TABLE {n} AS {q};" for n, q in CHAINED.items()]
    sql = "\n".join([source_sql(False, 2), tables[0], "CREATE VIEW minutes AS SELECT "
                     "window_end AS minute_end, user_id, n FROM per_min;", *tables[1:]])
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "chain.sql").write_text(sql)
    project = load_project(tmp_path)
    assert project.table("per_min").definition.event_time == "window_end"
    src = TimedSource(seed, False)
    for round_no in range(3):
        write_round(src, rng, tmp_path / "data" / "clicks", round_no, 2)
        run = run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                         until_idle=True)
        marks = {b.table: b.watermark for b in run.batches}
        assert marks["per_5min"] == marks["busiest"] == marks["per_min"]
        for name in ("per_5min", "busiest"):
            closed = assert_closed_windows(spark, tmp_path, project, sql, src, name, round_no)
    assert closed


@pytest.mark.parametrize("path", ["spark", "driver"])
def test_a_parquet_sources_watermark_comes_from_its_footers(spark, tmp_path, monkeypatch, path):
    """On the Spark path a batch that closes windows needs its new watermark before it runs:
    for Parquet files whose columns have exactly their declared types it is read from the
    footers (no job), otherwise from the rows. On the driver path a batch of such files
    whose event times are all present and on time is marked in Arrow, with no Spark call
    (``driver_inputs.on_time``); Spark marks the others. Either way the windows closed are
    those Spark's batch query closes: with NULL event times, a late row, a file whose column
    needs a cast, and a round with none of these."""
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from octo_platform.runtime import driver_inputs

    marked: list[int] = []  # the rounds whose records Spark marked on the driver path
    spark_marks = driver_inputs.mark_late
    monkeypatch.setattr(driver_inputs, "mark_late",
                        lambda *a: marked.append(r) or spark_marks(*a))
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "goals.sql").write_text("""
CREATE SOURCE goals (team BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
WITH (connector = 'files', path = 'data/goals', format = 'parquet');
CREATE STREAMING TABLE per_minute AS SELECT window_start, window_end, team, COUNT(*) AS n
FROM TUMBLE(goals, ts, INTERVAL '1' MINUTE) GROUP BY window_start, window_end, team
EMIT ON WINDOW CLOSE;""")
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    rng = random.Random(7)
    good: list[tuple[int, datetime]] = []
    mark = None  # the watermark (the latest good event time - 5 s)
    # (earliest and latest second, the team column's type, whether a file has a NULL time)
    rounds = [(0, 150, pa.int64(), True), (100, 300, pa.int64(), False),
              (280, 420, pa.int32(), True), (420, 500, pa.int64(), False)]
    files = tmp_path / "data" / "goals"
    files.mkdir(parents=True)
    for r, (lo, hi, team_type, nulls) in enumerate(rounds):
        for f in range(2):
            times = [start + timedelta(seconds=rng.uniform(lo, hi)) for _ in range(40)]
            teams = [rng.randint(0, 3) for _ in times]
            if f == 0 and nulls:
                times[0] = None  # no event time: a dead letter
            if r == 1 and f == 1:
                times[1] = start + timedelta(seconds=5)  # below the watermark: late
            pq.write_table(pa.table({"team": pa.array(teams, team_type), "ts": pa.array(
                times, pa.timestamp("us", tz="UTC"))}), files / f"r{r}-{f}.parquet")
            good += [(t, ts) for t, ts in zip(teams, times)
                     if ts is not None and (mark is None or ts >= mark)]
        mark = max(ts for _, ts in good) - timedelta(seconds=5)
        report = run_tables(spark, tmp_path, until_idle=True, options=default_options(
            buckets=2, progress=None, driver_rows=0 if path == "spark" else 10**9))
        assert [b.path for b in report.batches] == [path]
        want: dict[tuple, int] = {}
        for team, ts in good:
            begin = ts.replace(second=0, microsecond=0)
            if begin + timedelta(minutes=1) <= mark:
                want[(begin, team)] = want.get((begin, team), 0) + 1
        rows = DeltaTable(str(tmp_path / "warehouse" / "_current" / "per_minute"))
        got = {(row["window_start"], row["team"]): row["n"]
               for row in rows.to_pyarrow_table().to_pylist()}
        assert got == want, r
    # round 2's files need a cast: Spark parses them, and marks them with the parse
    assert marked == ([] if path == "spark" else [0, 1, 2])

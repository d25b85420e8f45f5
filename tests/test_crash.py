"""Exactly-once under SIGKILL: runs killed at random moments, then resumed, must leave the
same changelog, current state and dead letters as one uninterrupted run (an aggregate, an
aggregate of it and an outer join of the input with the first aggregate)."""
from __future__ import annotations

import os
import random
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import RandomInput, batch_results, current, norm, replay, write_lines
from tests.processes import mid_run, octo_run, run_killing

# Waits on other processes most of the time: runs beside the rest (tests/suite.py).
pytestmark = pytest.mark.processes

SQL = """
CREATE SOURCE src ({ddl}) WITH (connector = 'files', path = 'data/src', format = '{fmt}',
    max_files_per_batch = '1');
CREATE STREAMING TABLE per_k AS SELECT k, COUNT(*) AS n, SUM(v) AS s, MAX(v) AS top
    FROM src GROUP BY k;
CREATE STREAMING TABLE histogram AS SELECT n, COUNT(*) AS ks, MIN(top) AS low
    FROM per_k GROUP BY n;
CREATE STREAMING TABLE enriched AS SELECT s.id, s.v, p.n FROM src s
    LEFT JOIN per_k p ON s.k = p.k AND p.n > 2;
"""
TABLES = ("per_k", "histogram", "enriched")


def events(warehouse: Path, table: str) -> Counter:
    rows = DeltaTable(str(warehouse / table)).to_pyarrow_table().to_pylist()
    return Counter((r["op"], norm(r["before"]), norm(r["after"]), r["source"]["batch_id"])
                   for r in rows)


def dead_letters(warehouse: Path, table: str) -> Counter:
    path = warehouse / "_dead_letters" / table
    if not path.exists():
        return Counter()
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return Counter((r["raw"], r["batch_id"]) for r in rows)


def make_project(root: Path, debezium: bool, files: int = 8) -> RandomInput:
    fmt = "debezium-json" if debezium else "json"
    src = RandomInput(99, debezium)
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "t.sql").write_text(SQL.format(ddl=src.ddl(), fmt=fmt))
    for i in range(files):
        write_lines(root / "data" / "src", f"f{i:02d}.json", src.lines(30, bad=i % 3 == 0))
    return src


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_sigkill_at_random_moments_loses_and_doubles_nothing(spark, tmp_path, path):
    """On the driver path (small batches), and on the Spark path (``--driver-rows 0``: its
    tasks write the GROUP BYs' tables and keep their buckets on this machine)."""
    crashed, reference = tmp_path / "crashed", tmp_path / "reference"
    # The Spark path's runs are slower to start and its batches slower: four files (a
    # batch each) and two kills there (three kills over eight files took 148 s in a suite
    # run beside the other part, against 62 s on the driver path). The driver path's
    # batches take tens of milliseconds once a run has started (a restart's first one too,
    # from the machine's state cache): sixteen files, and a kill soon after a batch line,
    # or a run ends (and is killed as it exits) before the moment comes.
    driver = path == "driver"
    src = make_project(crashed, debezium=True, files=16 if driver else 4)
    shutil.copytree(crashed, reference)
    run_tables(spark, reference, options=default_options(buckets=8, progress=None), until_idle=True)

    rng = random.Random(7)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    cmd = octo_run(crashed) + (["--driver-rows", "0"] if path == "spark" else [])

    log = tmp_path / "runs.log"
    until = mid_run(log, rng, batches=(1, 3), delay=0.3 if driver else 1.0)
    most = 3 if driver else 2
    kills = run_killing(cmd, log, until=until, kills=most, attempts=most + 2, env=env)
    assert kills >= 2, "the test must actually kill runs mid-way"

    for table in TABLES:
        assert events(crashed / "warehouse", table) == events(reference / "warehouse", table)
        assert current(crashed / "warehouse", table) == current(reference / "warehouse", table)
        assert dead_letters(crashed / "warehouse", table) == \
            dead_letters(reference / "warehouse", table)
    sql = (crashed / "sql" / "t.sql").read_text()
    want = batch_results(spark, sql, {"src": src.relation()}, TABLES)
    for table in TABLES:
        assert replay(crashed / "warehouse", table) == want[table]


def test_a_stalled_query_is_restarted_and_resumes_exactly_once(spark, tmp_path, monkeypatch):
    """The runner's watchdog: a table's catch-up that stops making progress is replaced by a
    new one, which resumes from the batch log (the stall is simulated once the first batch
    is done; stopping the stalled catch-up waits for the batch it may have in flight)."""
    from octo_platform.runtime import runner

    src = RandomInput(5, debezium=True)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(SQL.format(ddl=src.ddl(), fmt="debezium-json"))
    for i in range(3):
        write_lines(tmp_path / "data" / "src", f"f{i}.json", src.lines(20))
    stalls = []

    def stalled(self) -> bool:
        if not stalls and self.report.batches:
            stalls.append(self.pipeline.name)
            return True
        return False

    monkeypatch.setattr(runner._Query, "stalled", stalled)
    said: list[str] = []
    run_tables(spark, tmp_path, options=default_options(progress=said.append), until_idle=True)
    assert len(stalls) == 1 and any("restarting it (it resumes exactly once)" in m for m in said)
    sql = (tmp_path / "sql" / "t.sql").read_text()
    want = batch_results(spark, sql, {"src": src.relation()}, TABLES)
    for table in TABLES:
        assert replay(tmp_path / "warehouse", table) == want[table]
    assert {b for *_, b in events(tmp_path / "warehouse", "per_k")} == {0, 1, 2}  # per file


TIMED_SQL = """
CREATE STREAMING TABLE per_minute AS SELECT window_start, window_end, user_id, COUNT(*) AS n
    FROM TUMBLE(clicks, ts, INTERVAL '1' MINUTE) GROUP BY window_start, window_end, user_id
    EMIT ON WINDOW CLOSE;
CREATE STREAMING TABLE sessions AS SELECT window_start, window_end, user_id, SUM(amount) AS s
    FROM SESSION(clicks, ts, INTERVAL '20' SECOND) GROUP BY window_start, window_end, user_id;
CREATE STREAMING TABLE recent AS SELECT id, SUM(amount) OVER (PARTITION BY user_id ORDER BY ts
    RANGE BETWEEN INTERVAL '30' SECOND PRECEDING AND CURRENT ROW) AS s30 FROM clicks;
"""


def test_sigkill_with_event_time_loses_and_doubles_nothing(spark, tmp_path):
    """Watermarks, late records, closing windows, sessions and sliding windows: runs killed
    at random moments leave what one uninterrupted run leaves (a resumed batch uses the
    watermark its predecessor committed)."""
    from tests.timed import TimedSource, source_sql

    crashed, reference = tmp_path / "crashed", tmp_path / "reference"
    (crashed / "sql").mkdir(parents=True)
    (crashed / "sql" / "t.sql").write_text(source_sql(False, 1) + TIMED_SQL)
    src = TimedSource(31, debezium=False)
    for i in range(6):
        (lines,) = src.batch(1)
        write_lines(crashed / "data" / "clicks", f"f{i:02d}.json", lines)
    assert src.late, "some records are late"
    shutil.copytree(crashed, reference)
    run_tables(spark, reference, options=default_options(progress=None), until_idle=True)

    rng = random.Random(11)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    cmd = octo_run(crashed)

    log = tmp_path / "runs.log"
    until = mid_run(log, rng, batches=(1, 3), delay=1.0)
    kills = run_killing(cmd, log, until=until, kills=2, attempts=4, env=env)
    assert kills >= 1, "the test must actually kill runs mid-way"
    for table in ("per_minute", "sessions", "recent"):
        assert events(crashed / "warehouse", table) == events(reference / "warehouse", table)
        assert current(crashed / "warehouse", table) == current(reference / "warehouse", table)
        assert dead_letters(crashed / "warehouse", table) == \
            dead_letters(reference / "warehouse", table)

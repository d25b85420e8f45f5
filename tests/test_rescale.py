"""``octo rescale``: a table's state moved to another number of buckets, exactly once.

Tables with every kind of bucketed state (a join's sides, GROUP BY logs and value
multisets, a top-N's partitions, a global aggregate, the current state) run in rounds
against the batch oracle, on both paths, with rescales between the rounds: each rescale
leaves every table equal to its batch SQL, files every row of its state in a bucket of the
new count, and is kept by later runs. A rescale that dies between two of its commits leaves
the old layout in force (the log pins it) and the next run finishes it before its batch;
one SIGKILLed at random moments is finished by the next rescale or run.
"""
from __future__ import annotations

import os
import random
import re
import sys
import time
from pathlib import Path

import pytest

from octo_platform.project import load_project
from octo_platform.runtime.offsets import BatchLog
from octo_platform.runtime.recompute import rescale
from octo_platform.runtime.rescale import RESCALE
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_environment, default_options
from tests.oracle import RandomInput, check_tables, write_lines
from tests.processes import octo_run, run_killing

TABLES = {
    "by_count": """SELECT n, COUNT(*) AS keys, SUM(total) AS total, MAX(top) AS top FROM (
        SELECT b.k, COUNT(*) AS n, SUM(b.v + i.v) AS total, MAX(i.d) AS top
        FROM bids b JOIN items i ON b.k = i.k GROUP BY b.k) per_key GROUP BY n""",
    "top2": """SELECT k, id, v, rn FROM (SELECT k, id, v,
        ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC, id) AS rn FROM items) t
        WHERE rn <= 2""",
    "totals": "SELECT COUNT(*) AS n, SUM(v) AS s, MAX(d) AS d FROM items",
}


def _project(root: Path, seed: int) -> tuple[str, dict[str, RandomInput]]:
    feeds = {"bids": RandomInput(seed, debezium=False),
             "items": RandomInput(seed + 1, debezium=True)}
    sql = "\n".join([
        f"CREATE SOURCE bids ({feeds['bids'].ddl()}) WITH (connector = 'files', "
        "path = 'data/bids', format = 'json');",
        f"CREATE SOURCE items ({feeds['items'].ddl()}) WITH (connector = 'files', "
        "path = 'data/items', format = 'debezium-json', primary_key = 'id');",
        *[f"CREATE STREAMING TABLE {name} AS {q};" for name, q in TABLES.items()]])
    (root / "sql").mkdir()
    (root / "sql" / "p.sql").write_text(sql)
    return sql, feeds


def _feed(root: Path, feeds: dict[str, RandomInput], rng: random.Random, round_no: int) -> None:
    for name, feed in feeds.items():
        write_lines(root / "data" / name, f"r{round_no}.json", feed.lines(rng.randint(15, 30)))


def _check(spark, root: Path, sql: str, feeds: dict[str, RandomInput], round_no: int) -> None:
    project = load_project(root)
    keyed = {n: project.table(n).physical.pk is not None for n in TABLES}
    check_tables(spark, root / "warehouse", sql, {n: f.relation() for n, f in feeds.items()},
                 keyed, round_no)


def _buckets_filed(root: Path, table: str) -> set[int]:
    """The buckets of every file in the table's state and current-state folders that the
    latest Delta versions hold."""
    from deltalake import DeltaTable

    wh = root / "warehouse"
    found = set()
    for path in [wh / "_current" / table, *(wh / "_octo" / table / "state").glob("*")]:
        for f in DeltaTable(str(path)).file_uris():
            found.add(int(re.search(r"_bucket=(\d+)", f).group(1)))
    return found


def _log(root: Path, table: str) -> BatchLog:
    return BatchLog(default_environment().store, str(root / "warehouse" / "_octo" / table /
                                                     "log"))


def test_a_rescale_keeps_every_table_equal_to_its_batch_sql(spark, tmp_path, monkeypatch):
    seed = 20261202
    rng = random.Random(seed)
    sql, feeds = _project(tmp_path, seed)
    quiet = dict(progress=None)
    for round_no, (driver_rows, buckets) in enumerate(((10**9, 3), (0, 5), (10**9, 2))):
        _feed(tmp_path, feeds, rng, round_no)
        run_tables(spark, tmp_path, options=default_options(driver_rows=driver_rows, **quiet))
        _check(spark, tmp_path, sql, feeds, round_no)
        for name in TABLES:
            before = _log(tmp_path, name).last_committed
            stats = rescale(spark, tmp_path, name, buckets, options=default_options(**quiet))
            assert stats is not None and stats.batch == before + 1
            log = _log(tmp_path, name)
            assert log.commit_payload(stats.batch)[RESCALE][1] == buckets
            assert log.commit_payload(stats.batch)["fingerprint"].endswith(f"-b{buckets}")
            assert _buckets_filed(tmp_path, name) <= set(range(buckets)), name
        _check(spark, tmp_path, sql, feeds, round_no)  # no row changed
        assert rescale(spark, tmp_path, "top2", buckets, options=default_options(**quiet)) \
            is None  # as many as it has: nothing to do

    # A rescale that dies after its first table's commit: the log still pins the old layout;
    # the next run finishes the rescale, then runs its batch.
    from state.delta import DeltaStore

    commit, calls = DeltaStore.commit, []

    def dies_after_one(self, path, *args, **kwargs):
        if "/state/" in path or "/_current/" in path:
            calls.append(path)
            if len(calls) > 1:
                raise OSError("killed")
        return commit(self, path, *args, **kwargs)

    monkeypatch.setattr(DeltaStore, "commit", dies_after_one)
    with pytest.raises(OSError, match="killed"):
        rescale(spark, tmp_path, "by_count", 4, options=default_options(**quiet))
    monkeypatch.setattr(DeltaStore, "commit", commit)
    log = _log(tmp_path, "by_count")
    assert log.pending()[1] == {RESCALE: 4}
    assert log.commit_payload(log.last_committed)["fingerprint"].endswith("-b2")
    _check(spark, tmp_path, sql, feeds, 2)
    _feed(tmp_path, feeds, rng, 3)
    report = run_tables(spark, tmp_path, options=default_options(driver_rows=0, **quiet))
    assert any(b.path == "rescale" for b in report.batches)
    _check(spark, tmp_path, sql, feeds, 3)
    assert _buckets_filed(tmp_path, "by_count") <= set(range(4))
    assert _log(tmp_path, "by_count").commit_payload(
        _log(tmp_path, "by_count").last_committed)["fingerprint"].endswith("-b4")


@pytest.mark.processes
def test_a_rescale_killed_at_random_moments_is_finished_by_the_next(spark, tmp_path):
    seed = 20261203
    rng = random.Random(seed)
    sql, feeds = _project(tmp_path, seed)
    _feed(tmp_path, feeds, rng, 0)
    log = tmp_path / "octo.log"
    env = {"PYSPARK_PYTHON": sys.executable, **os.environ}
    run_tables(spark, tmp_path, options=default_options(driver_rows=0, progress=None))
    cmd = [sys.executable, "-m", "octo_platform.cli", "rescale", "by_count", "--buckets", "3",
           "--project", str(tmp_path), *octo_run(tmp_path)[-2:]]

    def mid_rescale(proc):  # a random moment after it began rewriting
        log.touch()
        wanted = log.read_text().count("rescaling from") + 1
        while log.read_text().count("rescaling from") < wanted and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 3.0))

    kills = run_killing(cmd, log, until=mid_rescale, kills=2, attempts=4, env=env)
    assert kills >= 1, log.read_text()[-3000:]
    last = _log(tmp_path, "by_count")
    assert last.pending() is None
    assert last.commit_payload(last.last_committed)["fingerprint"].endswith("-b3")
    assert _buckets_filed(tmp_path, "by_count") <= set(range(3))
    _feed(tmp_path, feeds, rng, 1)
    run_tables(spark, tmp_path, options=default_options(progress=None))
    _check(spark, tmp_path, sql, feeds, 1)

"""Backfills and full refreshes against a from-scratch run over the same input.

History is corrected in place (a day's file rewritten after it was read: a value changed, a
row dropped, a row added) so the streaming run cannot see it; a backfill of that day must
leave the partitioned table, and a table downstream of it, exactly as a from-scratch run.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from octo_platform.errors import RunError, SqlError
from octo_platform.project import load_project
from octo_platform.runtime.options import RunOptions
from octo_platform.runtime.publish import RECOMPUTED
from octo_platform.runtime.recompute import backfill
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_environment, default_options
from tests.oracle import (
    batch_result,
    changelog_events,
    check_changelog,
    current,
    norm,
    replay,
    write_lines,
)

SQL = """
CREATE SOURCE ev (id BIGINT, ts TIMESTAMP, k STRING, v BIGINT) WITH (connector = 'files',
    path = 'data/ev', format = 'json', max_files_per_batch = '2');
CREATE STREAMING TABLE daily WITH (partition_by = 'day', partition_start = '2026-11-01') AS
    SELECT CAST(ts AS DATE) AS day, k, COUNT(*) AS n, SUM(v) AS s
    FROM ev GROUP BY CAST(ts AS DATE), k;
CREATE STREAMING TABLE per_k AS SELECT k, SUM(s) AS total, COUNT(*) AS days
    FROM daily GROUP BY k;
CREATE STREAMING TABLE big WITH (partition_by = 'ts', partitions = 'hourly',
    partition_start = '2026-11-01 00:00') AS
    SELECT e.id, e.ts, e.v, d.n FROM ev e JOIN daily d
    ON CAST(e.ts AS DATE) = d.day AND e.k = d.k WHERE e.v > 3;
"""
TABLES = {"daily": True, "per_k": True, "big": False}


def rows_of(day: int, n: int, seed: int) -> list[dict]:
    return [{"id": day * 100 + i, "ts": f"2026-11-{day:02d} {(i * 5) % 24:02d}:{i % 60:02d}:00",
             "k": "abc"[(i + seed) % 3], "v": (i * 7 + seed) % 10} for i in range(n)]


def write_day(root: Path, day: int, rows: list[dict]) -> None:
    write_lines(root / "data" / "ev", f"day{day:02d}.json", [json.dumps(r) for r in rows])


def relation(root: Path) -> list[dict]:
    out = []
    for f in sorted((root / "data" / "ev").glob("*.json")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            out.append({**r, "ts": datetime.fromisoformat(r["ts"])})
    return out


def check_like_scratch(spark, root: Path) -> None:
    """Every table equals its SQL run as a batch over the input as it is now."""
    files = sorted((root / "sql").rglob("*.sql"), key=lambda f: (len(f.parts), f))
    sql = "\n".join(f.read_text() for f in files)  # sql/t.sql first: the others read it
    for name, pk in TABLES.items():
        expected = batch_result(spark, sql, {"ev": relation(root)}, name)
        assert replay(root / "warehouse", name) == expected, name
        assert current(root / "warehouse", name) == expected, name
        check_changelog(root / "warehouse", name, pk=pk)


def version(root: Path, table: str) -> int:
    return DeltaTable(str(root / "warehouse" / table)).version()


@pytest.fixture()
def project(tmp_path):
    root = tmp_path / "p"
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "t.sql").write_text(SQL)
    for day in (1, 2, 3):
        write_day(root, day, rows_of(day, 12, seed=day))
    return root


def test_backfill_publishes_corrections_downstream_and_equals_scratch(spark, project,
                                                                       capsys):
    run_tables(spark, project, options=default_options(progress=None), until_idle=True)
    day2 = rows_of(2, 12, seed=2)
    day2[0]["v"] += 5  # a corrected value
    del day2[3]  # a row withdrawn
    day2.append({"id": 299, "ts": "2026-11-02 23:59:00", "k": "a", "v": 9})  # a late row
    write_day(project, 2, day2)  # rewritten in place: the stream has read this file already
    write_day(project, 4, rows_of(4, 6, seed=4))  # not read yet: a backfill leaves it alone
    part = load_project(project).table("daily").definition.partitioning
    before = version(project, "daily")

    with pytest.raises(RunError, match=r"outside that range: 2026-11-02 \(\d+ rows\)"):
        backfill(spark, project, "daily", options=default_options(progress=None),
                 window=part.window("2026-11-01", "2026-11-01"))
    assert version(project, "daily") == before, "a refused backfill writes nothing"

    report = backfill(spark, project, "daily", options=default_options(progress=None),
                      window=part.window("2026-11-02", "2026-11-03"))
    assert report.partitions == ["2026-11-02"]
    assert report.batch is not None and report.batch.events.get("u", 0) > 0
    last = changelog_events(project / "warehouse", "daily")[-1]
    assert {e["after"]["day"].isoformat() for e in changelog_events(project / "warehouse",
            "daily") if e["source"]["batch_id"] == last["source"]["batch_id"]} == {"2026-11-02"}

    # Downstream tables read the correction batch like any other: per_k gets `u` events.
    per_k_batches = len({e["source"]["batch_id"]
                         for e in changelog_events(project / "warehouse", "per_k")})
    run_tables(spark, project, options=default_options(progress=None), until_idle=True)
    newest = max(e["source"]["batch_id"] for e in changelog_events(project / "warehouse",
                                                                     "per_k"))
    assert newest >= per_k_batches
    assert Counter(e["op"] for e in changelog_events(project / "warehouse", "per_k")
                   if e["source"]["batch_id"] >= per_k_batches)["u"] > 0

    # The join kept its state from the recomputation: a backfill of all of `big` finds the
    # corrected day through `daily`'s changelog and publishes the difference.
    report = backfill(spark, project, "big", options=default_options(progress=None))
    assert report.what == "all"
    check_like_scratch(spark, project)

    # Nothing left to correct: a second backfill (from the command line) publishes nothing.
    from octo_platform.cli import main

    before = version(project, "daily")
    assert main(["backfill", "daily", "--from", "2026-11-01", "--to", "2026-11-04",
                 "--project", str(project)]) == 0
    assert "recomputed 2026-11-01 .. 2026-11-04: 12 rows, nothing differs" in \
        capsys.readouterr().out
    assert version(project, "daily") == before


class _CrashOnce:
    """A store whose first commit of a changelog in a recomputing batch dies mid-way (its
    data files are written, the commit is not)."""

    def __init__(self, store, path: str) -> None:
        self.store, self.path, self.crashed = store, path, False

    def __getattr__(self, name):
        return getattr(self.store, name)

    def commit(self, path, files, **kw):
        if path == self.path and not self.crashed:
            self.crashed = True
            raise KeyboardInterrupt("killed while publishing")
        return self.store.commit(path, files, **kw)


def test_crash_while_publishing_is_finished_by_the_next_run(spark, project, tmp_path,
                                                             capsys):
    from octo_platform.cli import main

    run_tables(spark, project, options=default_options(progress=None), until_idle=True)
    write_day(project, 1, rows_of(1, 10, seed=7))  # day 1 corrected in place
    env = default_environment()
    env = dataclasses.replace(
        env, store=_CrashOnce(env.store, str(project / "warehouse" / "daily")))
    with pytest.raises(KeyboardInterrupt):
        backfill(spark, project, "daily", options=RunOptions(env, progress=None))
    log = DeltaTable(str(project / "warehouse" / "_octo" / "daily" / "log")).to_pyarrow_table()
    intents = [json.loads(p) for p in log.column("payload").to_pylist()]
    assert any(RECOMPUTED in p for p in intents), "the intent was logged before publishing"

    # An ordinary run finds the pending intent and finishes it exactly once.
    run_tables(spark, project, options=default_options(progress=None), until_idle=True)
    # big read day 1 before the correction
    backfill(spark, project, "big", options=default_options(progress=None))
    check_like_scratch(spark, project)
    recomputed = [e for e in changelog_events(project / "warehouse", "daily")
                  if e["source"]["batch_id"] == max(
                      e["source"]["batch_id"] for e in changelog_events(project / "warehouse",
                                                                         "daily"))]
    assert recomputed, "the correction batch was published"

    # Full refresh of `daily` rebuilds it and everything downstream: the same changelogs as a
    # from-scratch run over the same files.
    scratch = tmp_path / "scratch"
    shutil.copytree(project / "sql", scratch / "sql")
    shutil.copytree(project / "data", scratch / "data")
    run_tables(spark, scratch, options=default_options(progress=None), until_idle=True)
    assert main(["refresh", "daily", "--project", str(project)]) == 0
    out = capsys.readouterr().out
    assert all(f"reset {t}: its next run rebuilds it" in out for t in ("daily", "per_k", "big"))
    for name in TABLES:
        got = Counter((e["op"], norm(e["before"]), norm(e["after"]), e["source"]["batch_id"])
                      for e in changelog_events(project / "warehouse", name))
        want = Counter((e["op"], norm(e["before"]), norm(e["after"]), e["source"]["batch_id"])
                       for e in changelog_events(scratch / "warehouse", name))
        assert got == want, name
        assert current(project / "warehouse", name) == current(scratch / "warehouse", name)


@pytest.mark.parametrize("options, message", [
    ("partition_by = 'nope', partition_start = '2026-11-01'",
     "partition_by column 'nope' is not one of"),
    ("partition_by = 'day'", "partition_by needs partition_start"),
    ("partition_by = 'day', partitions = 'weekly', partition_start = '2026-11-01'",
     "option 'partitions' must be one of hourly, daily, monthly"),
    ("partition_by = 'day', partition_start = 'soon'", "is not a date or timestamp"),
    ("partitions = 'daily'", "option 'partitions' needs partition_by"),
    ("partition_by = 'day', partitions = 'monthly', partition_start = '2026-11-02'",
     "is not the start of a monthly partition"),
])
def test_partition_options_are_checked(tmp_path, options, message):
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(
        "CREATE SOURCE ev (ts TIMESTAMP) WITH (connector = 'files', path = 'd', "
        f"format = 'json');\nCREATE STREAMING TABLE t WITH ({options}) AS\n"
        "SELECT CAST(ts AS DATE) AS day, COUNT(*) AS n FROM ev GROUP BY CAST(ts AS DATE);\n")
    with pytest.raises(SqlError, match=message) as err:
        load_project(tmp_path).table("t")
    assert "t.sql:2" in str(err.value)


def test_partition_keys_follow_dagster(tmp_path):
    from octo_platform.partitions import Partitioning

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    daily = Partitioning("day", "daily", start)
    assert daily.window("2026-11-02", "2026-11-03") == (
        datetime(2026, 11, 2, tzinfo=timezone.utc), datetime(2026, 11, 4, tzinfo=timezone.utc))
    monthly = Partitioning("m", "monthly", start)
    assert monthly.window("2026-12-01", "2026-12-01")[1] == datetime(2027, 1, 1,
                                                                    tzinfo=timezone.utc)
    assert monthly.describe(*monthly.window("2026-02-01", "2026-03-01")) == \
        "2026-02-01 .. 2026-03-01"
    hourly = Partitioning("ts", "hourly", start)
    assert hourly.key_of(datetime(2026, 11, 2, 13, 45, tzinfo=timezone.utc)) == \
        "2026-11-02-13:00"
    with pytest.raises(ValueError, match="before the first partition"):
        daily.window("2025-12-31", "2026-01-02")
    with pytest.raises(ValueError, match="is not a daily partition key"):
        daily.window("yesterday", "2026-01-02")


# -- in Dagster --------------------------------------------------------------------------------
def test_partitions_dagster_cannot_run_are_refused(project):
    from octo_platform.errors import CatalogError
    from orchestration.definitions import build_definitions

    with pytest.raises(CatalogError, match="'big' declares partitions and reads the "
                                           "partitioned table 'daily'"):
        build_definitions(project)
    (project / "sql" / "t.sql").write_text(SQL.replace("CREATE STREAMING TABLE big WITH (",
                                                       "CREATE STREAMING TABLE big2 WITH (")
                                              .replace("JOIN daily d", "JOIN per_k d")
                                              .replace("d.n FROM", "d.days FROM")
                                              .replace("CAST(e.ts AS DATE) = d.day AND ", ""))
    with pytest.raises(CatalogError, match="tables daily and big2 declare different partitions"):
        build_definitions(project)


def test_dagster_partitions_backfill_full_refresh_and_rescale(spark, project):
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.resources import SparkResource, WarehouseResource

    head, big = SQL.split("CREATE STREAMING TABLE big")
    (project / "sql" / "t.sql").write_text(head)
    (project / "sql" / "joined").mkdir()
    big = big[big.index(") AS") + 1:]  # unpartitioned: it reads the partitioned `daily`
    (project / "sql" / "joined" / "big.sql").write_text("CREATE STREAMING TABLE big" + big)
    defs = build_definitions(project, resources={
        "spark": SparkResource(), "warehouse": WarehouseResource(path=str(project / "warehouse"))})
    graph = defs.resolve_asset_graph()
    daily = graph.get(dg.AssetKey("daily"))
    assert isinstance(daily.partitions_def, dg.DailyPartitionsDefinition)
    assert daily.partitions_def.get_first_partition_key() == "2026-11-01"
    assert daily.backfill_policy == dg.BackfillPolicy.single_run()
    assert graph.get(dg.AssetKey("big")).partitions_def is None
    assert graph.get(dg.AssetKey("per_k")).partitions_def is None
    instance = dg.DagsterInstance.ephemeral()
    catch_up = defs.resolve_job_def("catch_up_default")

    # A run without partitions is a plain catch-up.
    assert catch_up.execute_in_process(instance=instance).success
    day2 = rows_of(2, 12, seed=2)
    day2[1]["v"] += 4
    write_day(project, 2, day2)  # corrected in place after it was read

    # A backfill of two days is one run (single-run policy: a partition range), which
    # materializes both partitions; downstream, per_k sees the correction as updates.
    run = defs.resolve_job_def("catch_up_default").execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey("daily")],
        tags={"dagster/asset_partition_range_start": "2026-11-02",
              "dagster/asset_partition_range_end": "2026-11-03"})
    assert run.success
    mats = run.asset_materializations_for_node("daily")
    assert sorted(m.partition for m in mats) == ["2026-11-02", "2026-11-03"]
    meta = {k: v.value for k, v in mats[0].metadata.items()}
    assert meta["backfill"] == "2026-11-02 .. 2026-11-03"
    assert meta["backfill_partitions_changed"] == "2026-11-02"
    assert meta["backfill_rows_changed"] == 2 and meta["events_u"] == 1
    down = catch_up.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("per_k")])
    (mat,) = down.asset_materializations_for_node("per_k")
    assert mat.metadata["events_u"].value == 1
    defs.resolve_job_def("catch_up_joined").execute_in_process(instance=instance)
    # big joined day 2's rows before the fix
    backfill(spark, project, "big", options=default_options(progress=None))
    check_like_scratch(spark, project)

    # Full refresh of daily: daily, per_k and big rebuilt from all input, one run.
    write_day(project, 3, rows_of(3, 8, seed=5))  # corrected in place: only a rebuild sees it
    refresh_run = defs.resolve_job_def("full_refresh_daily").execute_in_process(
        instance=instance)
    assert refresh_run.success
    rebuilt = {e.asset_key.to_user_string()
               for e in refresh_run.get_asset_materialization_events()}
    assert rebuilt == {"daily", "per_k", "big"}
    check_like_scratch(spark, project)
    assert {e["source"]["batch_id"] for e in changelog_events(project / "warehouse", "daily")} \
        == {0, 1}, "rebuilt: the changelog restarts at batch 0 (2 files per batch)"

    # Rescale job: per_k's state moved to 3 buckets as a batch that changes no row.
    rescaled = defs.resolve_job_def("rescale_per_k").execute_in_process(
        instance=instance, run_config={"ops": {"rescale_per_k_op": {"config": {"buckets": 3}}}})
    assert rescaled.success
    (obs,) = [e for e in rescaled.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert obs.asset_key == dg.AssetKey("per_k")
    check_like_scratch(spark, project)
    current = DeltaTable(str(project / "warehouse" / "_current" / "per_k"))
    assert {int(p["_bucket"]) for p in current.partitions()} <= {0, 1, 2}


def test_cli_backfill_errors(project, capsys):
    from octo_platform.cli import main

    args = ["--project", str(project)]
    assert main(["backfill", "per_k", "--from", "2026-11-03", *args]) == 2
    assert "declares no partitions" in capsys.readouterr().err
    assert main(["backfill", "daily", "--from", "yesterday", *args]) == 2
    assert "'yesterday' is not a daily partition key" in capsys.readouterr().err
    assert main(["backfill", "daily", "--from", "2026-11-03", "--to", "2026-11-02", *args]) == 2
    assert "comes before" in capsys.readouterr().err
    assert main(["refresh", "nope", *args]) == 2

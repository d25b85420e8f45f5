"""Scheduled restarts and monitoring: the schedules and the backlog sensor evaluated tick by
tick (``evaluate_tick``) over a tiny project, and a continuous run that stops at its deadline.
(A run SIGKILLed mid-run and retried by the real daemon: tests/test_webserver.py.)"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.runtime.status import table_status
from octo_platform.wiring import default_options
from orchestration.automation import CATCH_UP_CRON, CONTINUOUS_MINUTES, RESTART_CRON
from orchestration.definitions import build_definitions
from orchestration.resources import SparkResource, WarehouseResource
from tests.oracle import RandomInput, batch_results, current, replay, write_lines

# Waits on other processes most of the time: runs beside the rest (tests/suite.py).
pytestmark = pytest.mark.processes

SQL = """\
CREATE SOURCE events (id BIGINT, k BIGINT, g STRING, v BIGINT, d DOUBLE)
WITH (connector = 'files', path = 'data/events', format = 'json', max_files_per_batch = '1');
"""
PER_KEY = "CREATE STREAMING TABLE per_key AS\n" \
          "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k;\n"
BY_COUNT = "CREATE STREAMING TABLE by_count AS\n" \
           "SELECT n, COUNT(*) AS keys, MAX(total) AS top FROM per_key GROUP BY n;\n"
TABLES = ("per_key", "by_count")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    sql = tmp_path / "sql"
    (sql / "stats").mkdir(parents=True)
    (sql / "sources.sql").write_text(SQL)
    (sql / "stats" / "tables.sql").write_text(PER_KEY + BY_COUNT)
    return tmp_path


def resources(root: Path) -> dict:
    return {"spark": SparkResource(), "warehouse": WarehouseResource(path=str(root / "wh"))}


def check_oracle(spark, root: Path, data: RandomInput) -> None:
    want = batch_results(spark, SQL + PER_KEY + BY_COUNT, {"events": data.relation()}, TABLES)
    for table in TABLES:
        assert replay(root / "wh", table) == want[table], table
        assert current(root / "wh", table) == want[table], table


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:  # schedules and the sensor read runs through its ref
        yield inst


# -- schedules -----------------------------------------------------------------------------------
def test_schedules_restart_continuous_jobs_and_catch_up(project: Path):
    defs = build_definitions(project, resources=resources(project))
    repo = defs.get_repository_def()
    assert {j.name for j in repo.get_all_jobs()} >= {
        "continuous_stats", "catch_up_stats", "full_refresh_per_key", "full_refresh_by_count"}
    restart = repo.get_schedule_def("restart_stats")
    catch_up = repo.get_schedule_def("catch_up_stats_schedule")
    assert restart.cron_schedule == RESTART_CRON and catch_up.cron_schedule == CATCH_UP_CRON
    assert restart.default_status == catch_up.default_status == dg.DefaultScheduleStatus.STOPPED
    assert repo.get_sensor_def("octo_backlog_sensor").default_status == \
        dg.DefaultSensorStatus.STOPPED
    assert set(repo.get_job("catch_up_stats").asset_layer.selected_asset_keys) == {
        dg.AssetKey("per_key"), dg.AssetKey("by_count")}

    with dg.instance_for_test() as instance:  # schedules read runs through the instance's ref
        data = restart.evaluate_tick(dg.build_schedule_context(instance=instance))
        (req,) = data.run_requests
        minutes = req.run_config["ops"]["run_continuously_stats"]["config"]["minutes"]
        assert minutes == CONTINUOUS_MINUTES < 60  # stops before the next hourly restart
        (req,) = catch_up.evaluate_tick(dg.build_schedule_context(instance=instance)).run_requests
        assert req.tags["octo/trigger"] == "schedule"

        # while the group's continuous run is in progress, neither schedule starts another run
        instance.add_run(dg.DagsterRun(job_name="continuous_stats",
                                       status=dg.DagsterRunStatus.STARTED))
        for schedule in (restart, catch_up):
            data = schedule.evaluate_tick(dg.build_schedule_context(instance=instance))
            assert not data.run_requests and "continuous_stats" in data.skip_message


# -- the backlog sensor ----------------------------------------------------------------------
def test_sensor_requests_catch_up_only_for_new_input(spark, project: Path, instance):
    res = resources(project)
    defs = build_definitions(project, resources=res)
    sensor = defs.get_repository_def().get_sensor_def("octo_backlog_sensor")
    data = RandomInput(seed=11, debezium=False)
    cursor = None

    def tick():
        nonlocal cursor
        ctx = dg.build_sensor_context(instance=instance, cursor=cursor,
                                      resources={"warehouse": res["warehouse"]}, definitions=defs)
        out = sensor.evaluate_tick(ctx)
        cursor = out.cursor
        obs = {e.asset_key.to_user_string(): {k: v.value for k, v in e.metadata.items()}
               for e in out.asset_events}
        return out, obs

    (project / "data" / "events").mkdir(parents=True)
    out, obs = tick()
    assert not out.run_requests and out.skip_message == "no input waiting"
    assert obs["per_key"]["backlog"] == 0 and obs["per_key"]["last_batch"] == -1

    write_lines(project / "data" / "events", "f1.json", data.lines(20))
    out, obs = tick()
    (req,) = out.run_requests  # the table with new input, and the table downstream of it
    assert req.asset_selection == [dg.AssetKey("per_key"), dg.AssetKey("by_count")]
    assert req.job_name == "catch_up_stats"  # one request per group, with the group's job
    assert obs["per_key"]["backlog"] == 1
    assert obs["per_key"]["backlog_by_input"] == {"source:events": 1}
    first_key = req.run_key

    out, obs = tick()  # the same backlog does not trigger twice
    assert not out.run_requests and "already requested" in out.skip_message
    assert obs == {}  # nothing changed: no new observation

    run_tables(spark, project,  # the catch-up
               options=default_options(warehouse=str(project / "wh"), progress=None),
               names=[k.to_user_string() for k in req.asset_selection])
    out, obs = tick()
    assert not out.run_requests and out.skip_message == "no input waiting"
    assert obs["per_key"]["backlog"] == 0 and obs["per_key"]["last_batch"] == 0
    assert 0 <= obs["per_key"]["last_commit_age_s"] < 120

    # while the group runs continuously, its tables are left to that run
    running = dg.DagsterRun(job_name="continuous_stats", status=dg.DagsterRunStatus.STARTED)
    instance.add_run(running)
    write_lines(project / "data" / "events", "f2.json", data.lines(10))
    out, obs = tick()
    assert not out.run_requests and "running continuously: by_count, per_key" in out.skip_message
    assert obs["per_key"]["backlog"] == 1  # the lag view still reports
    out, obs = tick()
    assert not out.run_requests and obs == {}
    instance.report_run_failed(running)  # the continuous run ends
    assert not instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))

    out, _ = tick()  # it left f2 waiting (here: it never ran): now the sensor takes it
    (req,) = out.run_requests
    assert req.run_key != first_key
    assert [k.to_user_string() for k in req.asset_selection] == ["per_key", "by_count"]


# -- continuous mode ---------------------------------------------------------------------------
def test_continuous_run_stops_cleanly_at_its_deadline(spark, project: Path):
    res = resources(project)
    defs = build_definitions(project, resources=res)
    job = defs.get_job_def("continuous_stats")
    data = RandomInput(seed=5, debezium=False)
    write_lines(project / "data" / "events", "f1.json", data.lines(20))
    prj = load_project(project)
    wh = project / "wh"

    def more_input() -> None:
        """More input while the run is going (once its first batch is in: setting a
        streaming query up takes seconds on a busy machine), for the running queries."""
        options = default_options(warehouse=str(wh))
        until = time.monotonic() + 25
        while time.monotonic() < until and table_status(prj, "per_key",
                                                        options=options).last_batch < 0:
            time.sleep(0.5)
        write_lines(project / "data" / "events", "f2.json", data.lines(15, bad=1))

    late = threading.Thread(target=more_input)
    late.start()
    instance = dg.DagsterInstance.ephemeral()
    started = time.monotonic()
    result = job.execute_in_process(
        run_config={"ops": {"run_continuously_stats": {"config": {"minutes": 0.5}}}},
        resources=res, instance=instance)
    late.join()
    assert result.success
    assert 29 <= time.monotonic() - started < 120
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any(line.startswith("[per_key] batch 0: 20 rows in") for line in logs)
    assert any("deadline reached" in line for line in logs)
    mats = {m.asset_key.to_user_string(): {k: v.value for k, v in m.metadata.items()}
            for m in result.asset_materializations_for_node("run_continuously_stats")}
    pk = mats["per_key"]
    assert pk["last_batch"] == pk["batches"] - 1 >= 0
    assert pk["rows_in"] == 20 + 15 * (pk["batches"] - 1)  # f2 too if it came in time
    summary = result.output_for_node("run_continuously_stats")
    assert summary is None

    for table in TABLES:  # stopped between batches: nothing half-done
        status = table_status(prj, table, options=default_options(warehouse=str(wh)))
        assert status.pending_batch is None
        # On a busy machine a downstream table's query may not get to its first batch
        # within the 30 s (queries are set up one at a time): then it has no table yet.
        if status.last_batch >= 0:
            assert replay(wh, table) == current(wh, table)
    # the next run (locks released) resumes where the continuous run stopped, exactly once
    run_tables(spark, prj, options=default_options(warehouse=str(wh), progress=None),
               until_idle=True)
    check_oracle(spark, project, data)
    for table in TABLES:
        assert table_status(prj, table, options=default_options(warehouse=str(wh))).backlog == {
            "per_key": {"source:events": 0}, "by_count": {"table:per_key": 0}}[table]

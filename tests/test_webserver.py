"""Smoke test of the real `dagster dev`: webserver + daemon + code server on a free loopback
port serving a tiny project; the asset graph read and a materialization launched through
GraphQL (queued, dequeued by the daemon, run by a run worker with its own Spark JVM), then a
partition backfill launched like the UI's dialog (the daemon turns it into one run: the
single-run policy), then a run whose worker is SIGKILLed mid-run and retried by the daemon
(run retries in dagster.yaml), resuming exactly once; then every process of the tree stopped
by id."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.oracle import changelog_events, replay, write_lines
from tests.processes import session_pids, start_session, stop_session

# Waits on other processes most of the time: runs beside the rest (tests/suite.py).
pytestmark = pytest.mark.processes

REPO_ROOT = Path(__file__).resolve().parents[1]

SOURCES = """\
CREATE SOURCE events (id BIGINT, k BIGINT, v BIGINT, ts TIMESTAMP)
WITH (connector = 'files', path = 'data/events', format = 'json');
"""
PER_KEY = """\
-- Per-key totals.
CREATE STREAMING TABLE per_key AS
SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k;
"""
BY_COUNT = """\
-- How many keys have n events.
CREATE STREAMING TABLE by_count AS
SELECT n, COUNT(*) AS keys FROM per_key GROUP BY n;
"""
DAILY = """\
CREATE STREAMING TABLE daily WITH (partition_by = 'day', partition_start = '2026-11-01') AS
SELECT CAST(ts AS DATE) AS day, COUNT(*) AS n FROM events GROUP BY CAST(ts AS DATE);
"""
CLICKS = """\
CREATE SOURCE clicks (u BIGINT, n BIGINT)
WITH (connector = 'files', path = 'data/clicks', format = 'json', max_files_per_batch = '1');
CREATE STREAMING TABLE per_user AS SELECT u, COUNT(*) AS clicks, SUM(n) AS total
FROM clicks GROUP BY u;
"""
# One batch each: the run is killed after its first. Enough that it cannot finish the rest
# (~0.1 s a batch on the driver path) while the test sees the first in the event log and
# kills it (0.3-1 s): with 6 it once committed all six first, and its retry had none to do.
CLICK_FILES = 40
ROWS = [{"id": i, "k": i % 3, "v": i, "ts": f"2026-11-0{1 + i % 2} 12:00:00"}
        for i in range(10)]  # k=0: 4 rows, k=1, k=2: 3 rows; 5 rows on each of two days

ASSET_GRAPH = """
query { assetNodes { assetKey { path } dependencyKeys { path } groupName isMaterializable
                     jobNames } }
"""
LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message stack }
    ... on Error { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
RUN = """
query Run($id: ID!) {
  runOrError(runId: $id) {
    __typename
    ... on Run { status stepKeysToExecute }
    ... on PythonError { message }
  }
}
"""
EVENTS = """
query Logs($id: ID!) {
  logsForRun(runId: $id) {
    __typename
    ... on EventConnection { events { __typename ... on MessageEvent { message } } }
  }
}
"""
MATERIALIZATIONS = """
query { assetNodes(assetKeys: [{path: ["per_key"]}, {path: ["by_count"]}]) {
  assetKey { path }
  assetMaterializations(limit: 1) { runId metadataEntries {
    label ... on IntMetadataEntry { intValue } } } } }
"""
BACKFILL = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""
BACKFILL_STATUS = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { status runs(limit: 10) { runId status tags { key value } } }
    ... on PythonError { message }
  }
}
"""
PARTITIONS = """
query { assetNodes(assetKeys: [{path: ["daily"]}]) {
  isPartitioned partitionDefinition { description }
  assetMaterializations(limit: 10) { partition runId } } }
"""
RETRIES = """
query Retries($parent: String!) {
  runsOrError(filter: {tags: [{key: "dagster/parent_run_id", value: $parent}]}) {
    ... on Runs { results { runId status } } } }
"""
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(url: str, query: str, variables: dict | None = None, timeout: float = 30) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"{url}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.load(response)
    assert not answer.get("errors"), answer["errors"]
    return answer["data"]


def wait_for_server(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> dict:
    """The webserver answers and its code location has loaded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"dagster dev exited ({proc.returncode}):\n{tail(log)}"
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as response:
                info = json.load(response)
            status = graphql(url, "query { workspaceOrError { ... on Workspace { "
                                  "locationEntries { name loadStatus locationOrLoadError { "
                                  "__typename ... on PythonError { message } } } } } }")
            entries = status["workspaceOrError"]["locationEntries"]
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                errors = [e["locationOrLoadError"] for e in entries
                          if e["locationOrLoadError"]["__typename"] == "PythonError"]
                assert not errors, errors
                return info
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"dagster dev not ready after {timeout}s:\n{tail(log)}")


def run_messages(url: str, run_id: str) -> list[str]:
    return [e.get("message") or "" for e in
            graphql(url, EVENTS, {"id": run_id})["logsForRun"]["events"]]


def wait_for_retry(url: str, run_id: str, log: Path, timeout: float = 120) -> str:
    """The id of the run the daemon launched to retry ``run_id``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in graphql(url, RETRIES, {"parent": run_id})["runsOrError"]["results"]:
            return run["runId"]
        time.sleep(1)
    pytest.fail(f"no retry of {run_id} after {timeout}s:\n{tail(log)}")


def wait_for_run(url: str, run_id: str, log: Path, timeout: float = 150) -> list[str]:
    """Wait for a run to end (~60 s on 2 busy cores: most of it the JVM); its messages."""
    deadline = time.monotonic() + timeout
    while True:
        run = graphql(url, RUN, {"id": run_id})["runOrError"]
        assert run["__typename"] == "Run", run
        if run["status"] in TERMINAL or time.monotonic() > deadline:
            break
        time.sleep(1)
    messages = run_messages(url, run_id)
    assert run["status"] == "SUCCESS", (run, messages[-30:], tail(log))
    return messages


def tail(log: Path, n: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:]) if log.exists() else ""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "sql" / "stats").mkdir(parents=True)
    (root / "sql" / "sources.sql").write_text(SOURCES)
    (root / "sql" / "stats" / "per_key.sql").write_text(PER_KEY)
    # a great-expectations check, run by the run worker (a `python -c` process)
    (root / "sql" / "stats" / "per_key.expectations.json").write_text(json.dumps([
        {"expectation_type": "expect_column_values_to_be_between",
         "kwargs": {"column": "n", "min_value": 1}}]))
    (root / "sql" / "stats" / "by_count.sql").write_text(BY_COUNT)
    (root / "sql" / "daily").mkdir()
    (root / "sql" / "daily" / "daily.sql").write_text(DAILY)
    (root / "sql" / "clicks").mkdir()
    (root / "sql" / "clicks" / "clicks.sql").write_text(CLICKS)
    for f in range(CLICK_FILES):
        write_lines(root / "data" / "clicks", f"c{f}.json",
                    [json.dumps({"u": (f + i) % 4, "n": f * 10 + i}) for i in range(5)])
    write_lines(root / "data" / "events", "f1.json", [json.dumps(r) for r in ROWS])
    return root


def test_dagster_dev_serves_the_graph_and_materializes_through_graphql(tmp_path, project):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    warehouse = tmp_path / "warehouse"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ,
           "DAGSTER_HOME": str(home), "OCTO_PROJECT": str(project),
           "OCTO_WAREHOUSE": str(warehouse), "OCTO_SPARK_MASTER": "local[1]",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    log = tmp_path / "dagster_dev.log"
    with open(log, "wb") as out:
        proc = start_session(
            [sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port),
             "-w", str(REPO_ROOT / "workspace.yaml")],
            cwd=str(tmp_path), env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    ready = ran = lingered = float("nan")
    try:
        # ~15 s on a quiet machine; a clean-clone suite on a loaded one (load 5) once took
        # more than 90 s before the webserver answered (readiness, not a timed check)
        info = wait_for_server(url, proc, log, timeout=240)
        ready = time.monotonic() - t0
        assert "dagster_webserver_version" in info

        # -- the asset graph, as the UI reads it -----------------------------------------
        nodes = {"/".join(n["assetKey"]["path"]): n
                 for n in graphql(url, ASSET_GRAPH)["assetNodes"]}
        assert set(nodes) == {"events", "per_key", "by_count", "daily", "clicks", "per_user"}
        deps = {k: {"/".join(d["path"]) for d in n["dependencyKeys"]} for k, n in nodes.items()}
        assert deps == {"events": set(), "per_key": {"events"}, "by_count": {"per_key"},
                        "daily": {"events"}, "clicks": set(), "per_user": {"clicks"}}
        assert {k: n["isMaterializable"] for k, n in nodes.items()} == {
            "events": False, "per_key": True, "by_count": True, "daily": True,
            "clicks": False, "per_user": True}
        assert nodes["per_key"]["groupName"] == nodes["by_count"]["groupName"] == "stats"
        assert "__ASSET_JOB" in nodes["per_key"]["jobNames"]

        # -- a materialization of both tables, launched like the UI's button -------------
        params = {"selector": {"repositoryLocationName": "octo",
                               "repositoryName": "__repository__", "jobName": "__ASSET_JOB",
                               "assetSelection": [{"path": ["per_key"]},
                                                  {"path": ["by_count"]}]},
                  "runConfigData": {}}
        launched = graphql(url, LAUNCH, {"params": params})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]

        messages = wait_for_run(url, run_id, log)
        ran = time.monotonic() - t0 - ready
        assert any(m.startswith("[per_key] batch 0: 10 rows in") for m in messages), messages
        assert any(m.startswith("[by_count] batch 0:") for m in messages), messages
        assert "Asset check 'expectations' on 'per_key' passed." in messages, messages

        # -- the run worker exits when its run is done, and its Spark JVM with it ---------
        def jvms() -> set[int]:
            found = set()
            for pid in session_pids(proc.pid):
                try:
                    if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "java":
                        found.add(pid)
                except OSError:  # exited meanwhile
                    pass
            return found

        gone = time.monotonic() + 60
        while jvms() and time.monotonic() < gone:
            time.sleep(0.5)
        lingered = time.monotonic() - t0 - ready - ran
        assert not jvms(), f"a Spark JVM outlived its run by {lingered:.0f}s"

        # -- what the asset page shows: the materialization and its metadata -------------
        latest = {}
        for node in graphql(url, MATERIALIZATIONS)["assetNodes"]:
            (mat,) = node["assetMaterializations"]
            assert mat["runId"] == run_id
            latest[node["assetKey"]["path"][0]] = {
                e["label"]: e.get("intValue") for e in mat["metadataEntries"]}
        assert latest["per_key"]["rows_in"] == 10 and latest["per_key"]["batches"] == 1
        assert latest["per_key"]["dagster/row_count"] == 3
        assert latest["by_count"]["rows_in"] == 3 and latest["by_count"]["events_c"] == 2

        # -- a backfill of two partitions of `daily`, as the UI's partition dialog sends it ---
        (node,) = graphql(url, PARTITIONS)["assetNodes"]
        assert node["isPartitioned"] and "Daily" in node["partitionDefinition"]["description"]
        launched = graphql(url, BACKFILL, {"params": {
            "assetSelection": [{"path": ["daily"]}],
            "partitionNames": ["2026-11-01", "2026-11-02"]}})["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]

        def backfill_runs(done: bool) -> tuple[dict, list[dict]]:
            """The backfill and its runs, once they ended (``done``: and the daemon, which
            looks every 30 s, marked the backfill itself as finished)."""
            deadline = time.monotonic() + 180
            while True:  # the daemon submits the backfill's run(s); the run worker runs them
                backfill = graphql(url, BACKFILL_STATUS, {"id": backfill_id})[
                    "partitionBackfillOrError"]
                runs = backfill.get("runs") or []
                if (runs and all(r["status"] in TERMINAL for r in runs)
                        and (not done or backfill["status"] != "REQUESTED")) \
                        or time.monotonic() > deadline:
                    return backfill, runs
                time.sleep(1)

        backfill, runs = backfill_runs(done=False)
        assert len(runs) == 1, (backfill, tail(log))  # single-run policy: one run, a range
        tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
        assert (tags["dagster/asset_partition_range_start"],
                tags["dagster/asset_partition_range_end"]) == ("2026-11-01", "2026-11-02")
        wait_for_run(url, runs[0]["runId"], log)
        (node,) = graphql(url, PARTITIONS)["assetNodes"]
        assert sorted(m["partition"] for m in node["assetMaterializations"]) == [
            "2026-11-01", "2026-11-02"]

        # -- a run whose worker is SIGKILLed after its first batch, retried by the daemon ---
        gone = time.monotonic() + 60  # the backfill run's JVM has exited
        while jvms() and time.monotonic() < gone:
            time.sleep(0.5)
        params["selector"]["assetSelection"] = [{"path": ["per_user"]}]
        launched = graphql(url, LAUNCH, {"params": params})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        killed_id = launched["run"]["runId"]
        deadline = time.monotonic() + 150
        while not any(m.startswith("[per_user] batch 0:") for m in run_messages(url, killed_id)):
            assert time.monotonic() < deadline, tail(log)
            time.sleep(0.3)
        (jvm,) = jvms()
        # the JVM's parent (after the name in its stat: state, ppid, pgrp, ...) is the run
        # worker, a process the code server spawned
        worker = int(Path(f"/proc/{jvm}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert worker != proc.pid and "spawn_main" in Path(f"/proc/{worker}/cmdline").read_text()
        for pid in (worker, jvm):  # the run worker and its Spark driver, at once
            os.kill(pid, signal.SIGKILL)
        retry = wait_for_retry(url, killed_id, log)
        assert graphql(url, RUN, {"id": killed_id})["runOrError"]["status"] == "FAILURE"
        messages = wait_for_run(url, retry, log)
        assert not any(m.startswith("[per_user] batch 0:") for m in messages), \
            "a committed batch is not redone"
        assert any(m.startswith(f"[per_user] batch {CLICK_FILES - 1}:") for m in messages), \
            ("the retry ran no last batch: was the run killed after it?",
             [m for m in run_messages(url, killed_id) if m.startswith("[per_user] batch")])
        # meanwhile the daemon marked the backfill finished, its one run still its only one
        backfill, runs = backfill_runs(done=True)
        assert backfill["status"] == "COMPLETED_SUCCESS" and len(runs) == 1, backfill
    finally:
        t1 = time.monotonic()
        stopped = stop_session(proc)
        print(f"dagster dev: ready after {ready:.0f}s, run {ran:.0f}s, JVM exit +{lingered:.0f}s,"
              f" stopped in {time.monotonic() - t1:.0f}s: {stopped}")

    assert stopped["survivors"] == [], (stopped, tail(log))

    # -- the run wrote the changelogs (read after shutdown: nothing holds them) ----------
    assert len(changelog_events(warehouse, "per_key")) == 3
    assert replay(warehouse, "per_key") == Counter({(0, 4, 18): 1, (1, 3, 12): 1,
                                                    (2, 3, 15): 1})
    assert replay(warehouse, "by_count") == Counter({(4, 1): 1, (3, 2): 1})
    assert {(str(day), n) for (day, n) in replay(warehouse, "daily")} == {
        ("2026-11-01", 5), ("2026-11-02", 5)}
    # killed and retried: every file counted once (a doubled batch would double a user's
    # clicks; a lost one would miss them), one batch per file
    expected: Counter = Counter()
    for f in range(CLICK_FILES):
        for i in range(5):
            expected[(f + i) % 4] += 1
    totals = {u: sum(f * 10 + i for f in range(CLICK_FILES) for i in range(5) if (f + i) % 4 == u)
              for u in range(4)}
    assert replay(warehouse, "per_user") == Counter({(u, expected[u], totals[u]): 1
                                                     for u in range(4)})
    assert {e["source"]["batch_id"] for e in changelog_events(warehouse, "per_user")} == \
        set(range(CLICK_FILES))


def test_stop_session_escalates_by_process_id(tmp_path):
    """What the smoke test relies on when a graceful stop fails: a leader and a child that
    ignore SIGINT and SIGTERM are still stopped, one SIGKILL per process id."""
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if sys.argv[1:] != ['child']:\n"
        "    subprocess.Popen([sys.executable, __file__, 'child'])\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n")
    proc = start_session([sys.executable, str(script)], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    deadline = time.monotonic() + 10
    while len(session_pids(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = session_pids(proc.pid)
    assert len(pids) == 2
    stopped = stop_session(proc, grace=1, term=1)
    assert stopped["SIGINT"] == stopped["SIGTERM"] == sorted(pids)
    assert stopped["SIGKILL"] == stopped["survivors"] == []
    assert session_pids(proc.pid, pids) == set()
    proc.stdout.close()

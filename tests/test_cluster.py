"""A real Spark standalone cluster: ``octo run --master spark://...`` against a master and a
worker started from the pip-installed pyspark as separate processes on loopback.

A streaming table with a join and an aggregate over an aggregate, over an append-only and a
Debezium source, runs in rounds of input files, each round a separate ``octo run
--until-idle`` (a new application on the cluster that resumes from the warehouse); after each
round its replayed changelog must equal the same SQL run as a Spark batch query, and the
worker's logs must show that the application's tasks ran in its executor.
"""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from octo_platform.project import load_project
from octo_platform.runtime.class_archive import quick_start_conf
from octo_platform.runtime.session import QUICK_START_CONF
from tests.oracle import RandomInput, check_tables, write_lines

# Waits on other processes most of the time: runs beside the rest (tests/suite.py).
pytestmark = pytest.mark.processes
from tests.processes import start_session, stop_session

BIN = Path(sys.executable).parent  # the venv's bin: spark-class (pip pyspark) and octo
START_TIMEOUT = 120.0  # master and worker up (≈10 s on an idle 2-core machine)
RUN_TIMEOUT = 420  # one octo run on the cluster (≈40 s idle; far more under load)
ROUNDS = 2  # each a new application that resumes from the warehouse
# Short-lived JVMs: the JIT's first tier only (as the local test session does); on a busy
# 2-core machine this is CPU the test does not spend. The driver maps the class archive too
# (its classes; the executors' class path differs).
QUICK_JVM = QUICK_START_CONF["spark.driver.extraJavaOptions"]

# A join and an aggregate over an aggregate in one table: one streaming query per application.
SQL = f"""CREATE SOURCE bids ({RandomInput(0, False).ddl()})
WITH (connector = 'files', path = 'data/bids', format = 'json');
CREATE SOURCE items ({RandomInput(0, True).ddl()})
WITH (connector = 'files', path = 'data/items', format = 'debezium-json', primary_key = 'id');
CREATE STREAMING TABLE by_count AS SELECT n, COUNT(*) AS keys, SUM(total) AS total,
    MAX(top) AS top FROM (
        SELECT b.k, COUNT(*) AS n, SUM(b.v + i.v) AS total, MAX(i.d) AS top
        FROM bids b JOIN items i ON b.k = i.k GROUP BY b.k) per_key
    GROUP BY n;
"""


@dataclass
class Cluster:
    url: str
    logs: Path
    work: Path  # the worker's directory: one folder per application it ran executors for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_line(proc: subprocess.Popen, log: Path, text: str, what: str) -> None:
    """Wait until ``text`` appears in ``log``; fail with the log's tail if the process dies
    or ``START_TIMEOUT`` passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            state = f"exited {proc.returncode}" if proc.poll() is not None else \
                f"not ready after {START_TIMEOUT:.0f} s"
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"Spark {what} {state} (waiting for {text!r}); {log}:\n{tail}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    """A standalone master and one worker (1 core, 2g), each a JVM in its own process
    session; stopped (with the executors and Python workers they started) even if the test
    fails."""
    root = tmp_path_factory.mktemp("cluster")
    work = root / "work"
    port = _free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_DAEMON_MEMORY": "512m", "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM,
           # no REST submission server: it would take the fixed port 6066
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    env.pop("SPARK_CONF_DIR", None)
    spark_class = str(BIN / "spark-class")
    procs = []
    try:
        for name, argv, ready in (
                ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                            "--port", str(port), "--webui-port", str(_free_port())],
                 "I have been elected leader"),
                ("worker", ["org.apache.spark.deploy.worker.Worker",
                            f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--cores", "1",
                            "--memory", "2g", "--webui-port", str(_free_port()),
                            "--work-dir", str(work)],
                 "Successfully registered with master")):
            log = root / f"{name}.log"
            with log.open("w") as out:
                procs.append(start_session([spark_class, *argv], env=env, stdout=out,
                                           stderr=subprocess.STDOUT))
            _wait_for_line(procs[-1], log, ready, name)
        yield Cluster(url=f"spark://127.0.0.1:{port}", logs=root, work=work)
    finally:
        for proc in reversed(procs):  # the worker first: it takes its executors with it
            report = stop_session(proc, grace=5, term=10)
            assert not report["survivors"], report


def test_join_and_nested_aggregate_on_a_standalone_cluster(cluster, spark, tmp_path):
    seed = 20261124
    rng = random.Random(seed)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "p.sql").write_text(SQL)
    project = load_project(tmp_path)
    keyed = {"by_count": project.table("by_count").physical.pk is not None}
    feeds = {"bids": RandomInput(seed, debezium=False),
             "items": RandomInput(seed + 1, debezium=True)}
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env.pop("SPARK_CONF_DIR", None)
    (driver_jvm,) = quick_start_conf().items()  # QUICK_JVM and the class archive
    for round_no in range(ROUNDS):
        for name, feed in feeds.items():
            write_lines(tmp_path / "data" / name, f"r{round_no}.json",
                        feed.lines(rng.randint(8, 15), bad=round_no % 2))
        started = time.monotonic()
        # Even rounds run their batches as Spark jobs on the cluster (--driver-rows 0), odd
        # ones in the driver (small batches), each path reading the state the other wrote.
        res = subprocess.run(
            [str(BIN / "octo"), "run", "--all", "--until-idle", "--master", cluster.url,
             "--driver-rows", "0" if round_no % 2 == 0 else "10000",
             "--project", str(tmp_path), "--conf", "spark.sql.shuffle.partitions=2",
             "--conf", "=".join(driver_jvm),
             "--conf", f"spark.executor.extraJavaOptions={QUICK_JVM}"],
            env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert res.returncode == 0, f"round {round_no}:\n{res.stdout}\n{res.stderr[-4000:]}"
        print(f"round {round_no}: octo run on the cluster took "
              f"{time.monotonic() - started:.1f} s")
        assert "[by_count] batch" in res.stdout, res.stdout
        assert ("driver path" if round_no % 2 else "spark path") in res.stdout, res.stdout
        inputs = {name: feed.relation() for name, feed in feeds.items()}
        check_tables(spark, tmp_path / "warehouse", SQL, inputs, keyed, round_no)
    # Every round was an application of the cluster; those of the Spark path ran their
    # tasks in an executor of the worker.
    apps = sorted(cluster.work.iterdir())
    assert len(apps) == ROUNDS, apps
    for app in apps[::2]:
        logs = "".join(p.read_text(errors="replace") for p in app.glob("*/stderr"))
        assert "Running task" in logs, f"{app}: no task ran on the cluster's executor"

"""A real Spark cluster with object storage: ``octo run --master spark://...`` against a
standalone master and two workers (one core each) started from the pip-installed pyspark as
separate processes on loopback, with the warehouse and the sources in an S3 object store on
loopback (moto's server; ``tests/object_store.py``): Spark reads the sources through S3A,
delta-rs writes and commits the tables.

A streaming table with a join and an aggregate over an aggregate, over an append-only and a
Debezium source, runs in rounds of input files, each round a separate ``octo run
--until-idle`` (a new application on the cluster that resumes from the warehouse); after each
round its replayed changelog must equal the same SQL run as a Spark batch query. The first
round's tasks must run on both workers; in the last, one worker is SIGKILLed while its
executor runs a task of the batch, which the other worker finishes: nothing lost or doubled.
"""
from __future__ import annotations

import os
import random
import signal
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
from tests.object_store import ObjectStore, object_store, put_text
from tests.oracle import RandomInput, check_tables
from tests.processes import start_session, stop_session

# Waits on other processes most of the time: runs beside the rest (tests/suite.py).
pytestmark = pytest.mark.processes

BIN = Path(sys.executable).parent  # the venv's bin: spark-class (pip pyspark) and octo
START_TIMEOUT = 120.0  # master and workers up (≈10 s on an idle 2-core machine)
RUN_TIMEOUT = 420  # one octo run on the cluster (≈40 s idle; far more under load)
WORKERS = 2
# Each round a new application that resumes from the warehouse: the Spark path, the driver
# path, the Spark path with a worker killed in the middle of its batch.
PATHS = ("spark", "driver", "spark")
# Short-lived JVMs: the JIT's first tier only (as the local test session does); on a busy
# 2-core machine this is CPU the test does not spend. The driver maps the class archive too
# (its classes; the executors' class path differs).
QUICK_JVM = QUICK_START_CONF["spark.driver.extraJavaOptions"]

# A join and an aggregate over an aggregate in one table: one streaming query per application.
SQL = """CREATE SOURCE bids ({bids})
WITH (connector = 'files', path = '{data}/bids', format = 'json');
CREATE SOURCE items ({items})
WITH (connector = 'files', path = '{data}/items', format = 'debezium-json', primary_key = 'id');
CREATE STREAMING TABLE by_count AS SELECT n, COUNT(*) AS keys, SUM(total) AS total,
    MAX(top) AS top FROM (
        SELECT b.k, COUNT(*) AS n, SUM(b.v + i.v) AS total, MAX(i.d) AS top
        FROM bids b JOIN items i ON b.k = i.k GROUP BY b.k) per_key
    GROUP BY n;
"""


@dataclass
class Cluster:
    url: str
    store: ObjectStore
    env: dict[str, str]  # what octo runs with: the object store's variables among them
    workers: list[subprocess.Popen]
    work: list[Path]  # each worker's directory: one folder per application it ran


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
    """An object store, a standalone master and two workers (1 core, 2g each), each a JVM
    in its own process session, each worker with its own state cache (as on two machines);
    stopped (with the executors and Python workers they started) even if the test fails.
    This process reads the store too (the oracle), through the same variables."""
    root = tmp_path_factory.mktemp("cluster")
    with object_store(root / "moto.log") as store, pytest.MonkeyPatch.context() as mp:
        for key, value in store.env.items():
            mp.setenv(key, value)
        port = _free_port()
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        env.pop("SPARK_CONF_DIR", None)
        daemon = {**env, "SPARK_DAEMON_MEMORY": "512m", "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM,
                  # no REST submission server: it would take the fixed port 6066
                  "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        spark_class = str(BIN / "spark-class")
        procs, work = [], [root / f"work-{i}" for i in range(WORKERS)]
        try:
            master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                      "--port", str(port), "--webui-port", str(_free_port())]
            starts = [("master", master, "I have been elected leader", daemon)]
            for i in range(WORKERS):
                starts.append((f"worker-{i}", [
                    "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                    "--host", "127.0.0.1", "--cores", "1", "--memory", "2g",
                    "--webui-port", str(_free_port()), "--work-dir", str(work[i])],
                    "Successfully registered with master",
                    {**daemon, "OCTO_STATE_CACHE": str(root / f"cache-{i}")}))
            for name, argv, ready, penv in starts:
                log = root / f"{name}.log"
                with log.open("w") as out:
                    procs.append(start_session([spark_class, *argv], env=penv, stdout=out,
                                               stderr=subprocess.STDOUT))
                _wait_for_line(procs[-1], log, ready, name)
            yield Cluster(url=f"spark://127.0.0.1:{port}", store=store, env=env,
                          workers=procs[1:], work=work)
        finally:
            for proc in reversed(procs):  # workers first: they take their executors along
                report = stop_session(proc, grace=5, term=10)
                assert not report["survivors"], report


def _ran_tasks(work: Path) -> bool:
    """Whether an executor of the worker with directory ``work`` ran a task (any
    application)."""
    return any("Running task" in p.read_text(errors="replace")
               for p in work.glob("*/*/stderr"))


def test_join_and_nested_aggregate_on_a_cluster_with_object_storage(cluster, spark,
                                                                     tmp_path):
    seed = 20261202
    rng = random.Random(seed)
    feeds = {"bids": RandomInput(seed, debezium=False),
             "items": RandomInput(seed + 1, debezium=True)}
    data, warehouse = cluster.store.uri("data"), cluster.store.uri("warehouse")
    sql = SQL.format(bids=feeds["bids"].ddl(), items=feeds["items"].ddl(), data=data)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "p.sql").write_text(sql)
    project = load_project(tmp_path)
    keyed = {"by_count": project.table("by_count").physical.pk is not None}
    (driver_jvm,) = quick_start_conf().items()  # QUICK_JVM and the class archive
    for round_no, path in enumerate(PATHS):
        for name, feed in feeds.items():
            put_text(f"{data}/{name}/r{round_no}.json",
                     "".join(line + "\n" for line in feed.lines(rng.randint(8, 15),
                                                                 bad=round_no % 2)))
        started = time.monotonic()
        run = subprocess.Popen(
            [str(BIN / "octo"), "run", "--all", "--until-idle", "--master", cluster.url,
             "--driver-rows", "0" if path == "spark" else "10000",
             "--project", str(tmp_path), "--warehouse", warehouse,
             "--conf", "spark.sql.shuffle.partitions=2",
             # the first batch's tasks wait for both workers' executors
             "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
             "--conf", "=".join(driver_jvm),
             "--conf", f"spark.executor.extraJavaOptions={QUICK_JVM}"],
            env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killed = round_no == len(PATHS) - 1 and _kill_a_worker_mid_batch(cluster, run)
        out, err = run.communicate(timeout=RUN_TIMEOUT)
        assert run.returncode == 0, f"round {round_no}:\n{out}\n{err[-4000:]}"
        print(f"round {round_no} ({path} path{', a worker killed' if killed else ''}): "
              f"{time.monotonic() - started:.1f} s\n{out}")
        assert f"{path} path" in out, out
        inputs = {name: feed.relation() for name, feed in feeds.items()}
        check_tables(spark, warehouse, sql, inputs, keyed, round_no)
        if round_no == 0:  # the Spark path ran tasks on both machines
            assert all(_ran_tasks(w) for w in cluster.work), cluster.work
    assert killed, "the last batch ended before a worker could be killed in its middle"


def _kill_a_worker_mid_batch(cluster: Cluster, run: subprocess.Popen) -> bool:
    """SIGKILL the first worker whose executor runs a task of ``run``'s application (the
    worker, its executor and their Python workers: one process group); whether ``run`` was
    still going then."""
    before = [{p.parent.parent.name for p in w.glob("*/*/stderr")} for w in cluster.work]
    deadline = time.monotonic() + RUN_TIMEOUT
    while run.poll() is None and time.monotonic() < deadline:
        for i, work in enumerate(cluster.work):
            for log in work.glob("*/*/stderr"):
                if log.parent.parent.name not in before[i] and \
                        "Running task" in log.read_text(errors="replace"):
                    os.killpg(cluster.workers[i].pid, signal.SIGKILL)
                    return run.poll() is None
        time.sleep(0.1)
    return False

"""Robust under load: transient Spark failures are retried inside a run, exactly once.

A batch is a deterministic function of its logged inputs, so the runner retries a batch that
fails for a reason of Spark's machinery, and replaces a streaming query that dies outside a
batch (its Python source runner failed to start, connect back or stay alive). These tests
make such failures happen for real — a saturated CPU, killed Python workers, cancelled Spark
jobs — and check the run finishes and every changelog equals the oracle's.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from py4j.protocol import Py4JNetworkError
from pyspark.errors import (
    AnalysisException,
    IllegalArgumentException,
    PythonException,
    StreamingQueryException,
)

from octo_platform.errors import PlanError, RunError
from octo_platform.project import load_project
from octo_platform.runtime import pipeline, runner
from octo_platform.runtime.runner import run_tables, transient
from octo_platform.wiring import default_options
from tests import test_crash
from tests.oracle import RandomInput, check_tables, write_lines

# The crash test's project (an aggregate, an aggregate of it, a join with it) over JSON.
SQL = test_crash.SQL.replace("{fmt}", "json")
TABLES = test_crash.TABLES
# Under load: an aggregate and a filter side by side, then an aggregate of the aggregate.
LOAD_SQL = """
CREATE SOURCE src ({ddl}) WITH (connector = 'files', path = 'data/src', format = 'json',
    max_files_per_batch = '1');
CREATE STREAMING TABLE per_k AS SELECT k, COUNT(*) AS n, SUM(v) AS s, MAX(v) AS top
    FROM src GROUP BY k;
CREATE STREAMING TABLE big_v AS SELECT id, k, v FROM src WHERE v > 50;
CREATE STREAMING TABLE histogram AS SELECT n, COUNT(*) AS ks, MIN(top) AS low
    FROM per_k GROUP BY n;
"""
RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


def make_project(root: Path, files: int, *, seed: int,
                 sql: str = SQL) -> tuple[RandomInput, str]:
    src = RandomInput(seed, debezium=False)
    sql = sql.format(ddl=src.ddl())
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "t.sql").write_text(sql)
    add_files(root, src, files, prefix="a")
    return src, sql


def add_files(root: Path, src: RandomInput, files: int, *, prefix: str) -> None:
    for i in range(files):
        write_lines(root / "data" / "src", f"{prefix}{i:02d}.json", src.lines(15, bad=i % 2))


def check(spark, root: Path, src: RandomInput, sql: str,
          tables: tuple[str, ...] = TABLES) -> None:
    """Every table's changelog replays to the batch SQL result (nothing lost or doubled)."""
    keyed = {t: load_project(root).table(t).physical.pk is not None for t in tables}
    check_tables(spark, root / "warehouse", sql, {"src": src.relation()}, keyed, 0)


def batch_ids(root: Path, table: str) -> list[int]:
    from deltalake import DeltaTable

    rows = DeltaTable(str(root / "warehouse" / "_octo" / table / "log")).to_pyarrow_table()
    return sorted(r["batch_id"] for r in rows.to_pylist() if r["kind"] == "commit")


def spark_python_processes() -> dict[int, str]:
    """Spark's Python processes started for this test session (source runners, daemons and
    their workers): descendants of this process running a ``pyspark`` module."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(raw[raw.rindex(")") + 2:].split()[1])
    ours, grew = {os.getpid()}, True
    while grew:
        more = {p for p, pp in parents.items() if pp in ours} - ours
        ours |= more
        grew = bool(more)
    found = {}
    for pid in ours - {os.getpid()}:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "-m" in words and any(w.startswith("pyspark.") for w in words):
            found[pid] = " ".join(words[words.index("-m") + 1:]).strip()
    return found


def kill_spark_pythons(only: str | None = None) -> list[str]:
    """SIGKILL the Python processes Spark runs for this session (those running module
    ``only``, or all); what was killed."""
    killed = []
    for pid, what in spark_python_processes().items():
        if only is None or what == only:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(what)
            except ProcessLookupError:
                pass
    return killed


def heal(spark) -> None:
    """Spark notices a killed Python daemon only when it next uses it, and that use fails
    once: use the task workers' and the data-source planner's daemons until they answer, so
    later tests of the session meet a healthy Spark."""
    for _ in range(5):
        try:
            spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).collect()
            spark.readStream.format("octo_batches").option("inputs", "[]") \
                .option("log", "unused").load()
            return
        except Exception:  # noqa: BLE001 - the failure we are clearing
            time.sleep(1)


def test_transient_failures_are_told_from_the_projects_errors():
    connect = StreamingQueryException(
        message="[STREAM_FAILED] Query [id = 1] terminated with exception: Python worker "
                "failed to connect back. SQLSTATE: XXKST")
    assert transient(connect)
    assert transient(Py4JNetworkError("Answer from Java side is empty"))
    assert transient(ConnectionResetError("peer reset"))
    # a source runner that died in Spark's handshake, seen once in a clean-clone run
    assert transient(IllegalArgumentException(message="Authentication failed."))
    assert not transient(IllegalArgumentException(message="[INVALID_PARAMETER_VALUE] x"))
    assert not transient(RunError("a batch follows another"))
    assert not transient(PlanError("not incremental"))
    assert not transient(AnalysisException(message="[UNRESOLVED_COLUMN] x"))
    assert not transient(KeyError("bug"))  # our own bug: retrying cannot help
    worker = "An exception was thrown from the Python worker:\nTraceback (most recent ...\n"
    assert not transient(PythonException(message=worker + "TypeError: not subscriptable"))
    assert transient(PythonException(message=worker + "OSError: [Errno 28] No space left"))
    ours = StreamingQueryException(message="terminated with exception: ... Traceback ...\n"
                                           "octo_platform.errors.RunError: log is gone")
    assert not transient(ours)  # raised by our source in Spark's Python source runner
    assert not transient(StreamingQueryException(
        message="ModuleNotFoundError: No module named 'octo_platform'"))
    assert not transient(KeyboardInterrupt())


def test_retries_are_bounded_and_the_projects_errors_are_not_retried(spark, tmp_path,
                                                                     monkeypatch):
    """A batch failing every time is tried BATCH_ATTEMPTS times, then the run fails naming
    the table, the attempts and the cause; a query that never starts is replaced
    QUERY_RESTARTS times; our own error fails at once."""
    monkeypatch.setattr(runner, "RETRY_BASE_S", 0.05)
    make_project(tmp_path, 1, seed=3)
    calls: list[int] = []

    def flaky(self, batch, inputs):
        calls.append(batch)
        raise OSError("disk went away")

    monkeypatch.setattr(pipeline.Pipeline, "run_batch", flaky)
    said: list[str] = []
    with pytest.raises(RunError) as err:
        run_tables(spark, tmp_path, options=default_options(progress=said.append), names=["per_k"])
    assert calls == [0] * runner.BATCH_ATTEMPTS
    assert "'per_k'" in str(err.value) and f"{runner.BATCH_ATTEMPTS} times" in str(err.value)
    assert "OSError: disk went away" in str(err.value)
    assert [m for m in said if "retrying" in m] == [
        f"[per_k] batch 0 failed (OSError: disk went away): retrying in {d:g}s "
        f"(attempt {n} of {runner.BATCH_ATTEMPTS})"
        for n, d in ((2, 0.05), (3, 0.1), (4, 0.2))]

    def wrong(self, batch, inputs):
        calls.append(batch)
        raise RunError("per_k: batch 0 follows 7")

    calls.clear()
    said.clear()
    monkeypatch.setattr(pipeline.Pipeline, "run_batch", wrong)
    with pytest.raises(RunError, match="batch 0 follows 7"):
        run_tables(spark, tmp_path, options=default_options(progress=said.append), names=["per_k"])
    assert calls == [0] and not [m for m in said if "retrying" in m or "restarting" in m]

    starts: list[int] = []

    def no_start(self, *, until_idle, interval):
        starts.append(1)
        raise ConnectionRefusedError("Python worker failed to connect back")

    monkeypatch.setattr(runner._Query, "start", no_start)
    with pytest.raises(RunError) as err:
        run_tables(spark, tmp_path, options=default_options(progress=said.append), names=["per_k"])
    assert len(starts) == runner.QUERY_RESTARTS + 1
    assert "'per_k'" in str(err.value)
    assert f"restarted {runner.QUERY_RESTARTS} times" in str(err.value)
    assert "ConnectionRefusedError: Python worker failed to connect back" in str(err.value)


HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"


@pytest.fixture
def cpu_hogs():
    """Busy loops that bring the load average to about 10 on this machine (the load under
    which `octo run --all --until-idle` failed), at least 2 of them: 8-10 on an idle machine,
    fewer when other work already loads it. Each exits when this process does."""
    count = max(2, min(10, round(10 - os.getloadavg()[0])))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]
    yield hogs
    for hog in hogs:
        hog.kill()
        hog.wait()


def test_an_oracle_run_on_a_saturated_cpu_is_exactly_once(spark, tmp_path, cpu_hogs):
    """A catch-up run of three tables (three batches each for an aggregate and a filter, side
    by side, then an aggregate of the aggregate) while busy loops keep the load average near
    10 on two cores: Spark's Python workers start slowly (a source runner that does not
    connect back within Spark's hard-coded 10 s fails its query) and batches crawl; the run
    finishes and every changelog is exactly once."""
    src, sql = make_project(tmp_path, 3, seed=11, sql=LOAD_SQL)
    started = time.monotonic()
    report = run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                        until_idle=True)
    assert all(p.poll() is None for p in cpu_hogs), "the CPU stayed saturated"
    check(spark, tmp_path, src, sql, tables=("per_k", "big_v", "histogram"))
    assert batch_ids(tmp_path, "per_k") == batch_ids(tmp_path, "big_v") == [0, 1, 2]
    assert [b.batch for b in report.for_table("big_v")] == [0, 1, 2]  # each run once
    print(f"\n{time.monotonic() - started:.0f}s with {len(cpu_hogs)} busy loops (load "
          f"average {os.getloadavg()[0]:.1f}); {len(report.retries)} retries/restarts:",
          *report.retries, sep="\n  ")


def test_killed_python_workers_are_replaced_and_the_run_is_exactly_once(spark, tmp_path,
                                                                        monkeypatch):
    """Right after the first batch of ``per_k`` commits, every Python process Spark runs for
    the session is SIGKILLed: the daemons that fork task workers and their workers. A daemon's
    next use fails once (a batch's job) and the batch is retried in the run. The run finishes
    and every batch is committed exactly once. (A catch-up run starts no streaming query;
    a continuous query whose source runner dies: see the last test.)"""
    monkeypatch.setattr(runner, "RETRY_BASE_S", 0.5)
    src, sql = make_project(tmp_path, 4, seed=21)
    killed: list[str] = []
    said: list[str] = []

    def progress(line: str) -> None:
        said.append(line)
        if line.startswith("[per_k] batch 0:") and not killed:
            killed.extend(kill_spark_pythons())

    try:  # driver_rows=0: the batches run as Spark jobs, where the faults are
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=4, progress=progress, driver_rows=0), until_idle=True)
    finally:
        heal(spark)
    assert any("pyspark.worker" in k for k in killed), f"the fault must fire: killed {killed}"
    assert any("retrying in 0.5s (attempt 2 of 4)" in m for m in report.retries), report.retries
    assert report.retries == [m for m in said if "restarting" in m or "retrying" in m]
    check(spark, tmp_path, src, sql)
    assert batch_ids(tmp_path, "per_k") == [0, 1, 2, 3]
    assert [b.batch for b in report.for_table("per_k")] == [0, 1, 2, 3]  # each run once
    print(f"\nkilled {killed}", *report.retries, sep="\n  ")


def test_a_batch_whose_spark_job_fails_is_retried_in_its_handler(spark, tmp_path,
                                                                  monkeypatch):
    """A Spark job of ``per_k``'s second batch is cancelled (not the handler's first job, which
    only reads the offset): the batch fails half-way, is retried in its handler and finishes
    exactly once."""
    monkeypatch.setattr(runner, "RETRY_BASE_S", 0.5)
    src, sql = make_project(tmp_path, 3, seed=31)
    sc = spark.sparkContext
    first_done, failed, finished = threading.Event(), threading.Event(), threading.Event()
    cancelled: list[int] = []

    def saboteur() -> None:
        # Until a batch fails: a job cancelled as it completes fails nothing (a short job can
        # finish between the poll and the cancel), so the next one is cancelled too.
        first_done.wait()
        first_job = None
        while not finished.is_set() and not failed.is_set():
            jobs = list(sc.statusTracker().getActiveJobsIds())
            if jobs and first_job is None:
                first_job = min(jobs)
            if any(j > first_job for j in jobs) and max(jobs) not in cancelled:
                sc.cancelAllJobs()
                cancelled.append(max(jobs))
            time.sleep(0.005)

    def progress(line: str) -> None:
        if line.startswith("[per_k] batch 0:"):
            first_done.set()
        if " failed (" in line:
            failed.set()

    thread = threading.Thread(target=saboteur, daemon=True)
    thread.start()
    try:  # driver_rows=0: the batches run as Spark jobs, where the fault is
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=4, progress=progress, driver_rows=0), names=["per_k"], until_idle=True)
    finally:
        finished.set()
        thread.join()
    assert cancelled, "the fault must fire"
    retried = [m for m in report.retries if re.match(
        r"\[per_k\] batch [12] failed \(.+\): retrying in 0\.5s \(attempt 2 of 4\)", m)]
    assert retried, report.retries
    check_tables(spark, tmp_path / "warehouse", sql, {"src": src.relation()},
                 {"per_k": True}, 0)
    assert batch_ids(tmp_path, "per_k") == [0, 1, 2]
    print(f"\ncancelled job {cancelled}", *report.retries, sep="\n  ")


class _Deadline(float):
    """A ``deadline`` for ``run_tables`` that also arrives as soon as ``event`` is set
    (``time.time() < deadline`` asks this subclass first)."""

    event: threading.Event

    def __new__(cls, at: float, event: threading.Event) -> _Deadline:
        self = super().__new__(cls, at)
        self.event = event
        return self

    def __gt__(self, now: object) -> bool:
        return not self.event.is_set() and float(self) > now


def test_a_continuous_run_replaces_a_query_whose_source_runner_died(spark, tmp_path):
    """Continuous mode: the query's source runner is killed after the first batch; the
    query is replaced and processes the files that arrive afterwards, exactly once."""
    src, sql = make_project(tmp_path, 1, seed=41)
    killed: list[str] = []
    done = threading.Event()

    def progress(line: str) -> None:
        if line.startswith("[per_k] batch 0:") and not killed:
            killed.extend(kill_spark_pythons(only=RUNNER_MODULE))
            add_files(tmp_path, src, 2, prefix="b")
        if line.startswith("[per_k] batch 2:"):
            done.set()

    report = run_tables(spark, tmp_path, options=default_options(buckets=4, progress=progress),
                        names=["per_k"], until_idle=False,
                        deadline=_Deadline(time.time() + 300, done))
    assert done.is_set(), "the run ended at the deadline, not after the last batch"
    assert RUNNER_MODULE in killed, "the fault must fire"
    assert any(m.startswith("[per_k] streaming query failed") for m in report.retries), \
        report.retries
    check_tables(spark, tmp_path / "warehouse", sql, {"src": src.relation()},
                 {"per_k": True}, 0)
    assert batch_ids(tmp_path, "per_k") == [0, 1, 2]


@pytest.mark.parametrize("stop_at", [("warehouse", "per_k"), ("_current", "per_k")],
                         ids=["changelog", "current"])
@pytest.mark.parametrize("first", ["driver", "spark"])
def test_a_batch_that_died_between_commits_is_finished_in_the_driver(spark, tmp_path,
                                                                       monkeypatch, stop_at,
                                                                       first):
    """``per_k``'s second batch, run on the ``first`` path, dies right before committing the
    table at ``stop_at`` (its changelog or current state; the tables before it committed,
    the others not); its retry resumes it on the driver path, which leaves the committed
    tables as they are and commits the rest once."""
    from octo_platform.runtime.driver import Unsupported
    from state.delta import DeltaStore

    monkeypatch.setattr(runner, "RETRY_BASE_S", 0.05)
    src, sql = make_project(tmp_path, 3, seed=37, sql=LOAD_SQL)
    commit, in_driver, died = DeltaStore.commit, pipeline.run_in_driver, []

    def dies_once(self, path, *args, batch, **kwargs):
        if batch == 1 and not died and Path(path).parts[-2:] == stop_at:
            died.append(path)
            raise OSError(f"died before committing {path}")
        return commit(self, path, *args, batch=batch, **kwargs)

    def first_on_spark(pipe, ctx, *args, **kwargs):
        if first == "spark" and ctx.batch == 1 and not died:
            raise Unsupported("the first attempt runs on the Spark path")
        return in_driver(pipe, ctx, *args, **kwargs)
    monkeypatch.setattr(DeltaStore, "commit", dies_once)
    monkeypatch.setattr(pipeline, "run_in_driver", first_on_spark)
    report = run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                        names=["per_k"], until_idle=True)
    assert died, "the fault must fire"
    assert any(re.match(r"\[per_k\] batch 1 failed \(.*died before committing", m)
               for m in report.retries), report.retries
    assert [(b.batch, b.path) for b in report.for_table("per_k")] == [
        (0, "driver"), (1, "driver"), (2, "driver")]
    check(spark, tmp_path, src, sql, tables=("per_k",))
    assert batch_ids(tmp_path, "per_k") == [0, 1, 2]
    if stop_at[0] == "_current":  # the changelog was committed: the retry wrote none of it
        from deltalake import DeltaTable

        changelog = tmp_path / "warehouse" / "per_k"
        committed = DeltaTable(str(changelog)).file_uris()
        assert len(list(changelog.rglob("*.parquet"))) == len(committed)


def test_a_table_that_fails_stops_only_the_tables_that_read_it(spark, tmp_path, monkeypatch):
    """``per_k``'s GROUP BY fails on an internal error (not transient: no retry): the run
    goes on with ``big_v``, which does not read it, to idle (its changelog complete), does
    not run ``histogram``, which reads it, and then fails with an error that gives both and
    names the operator that failed."""
    from octo_platform.runtime.operators.aggregate import AggregateStep

    src, sql = make_project(tmp_path, 2, seed=41, sql=LOAD_SQL)

    def run(self, *args, **kwargs):
        raise ValueError("Casting field 'x' with null values to non-nullable")

    monkeypatch.setattr(AggregateStep, "run", run)  # the driver path's, here
    said: list[str] = []
    with pytest.raises(RunError) as failed:
        run_tables(spark, tmp_path, options=default_options(progress=said.append),
                   until_idle=True)
    text = str(failed.value)
    assert "streaming table 'per_k' failed: ValueError: Casting field 'x' with null values " \
        "to non-nullable (in operator HashAggregate keys=[" in text, text
    assert re.search(r"\(SQL at \S+\.sql:\d+:\d+\)\)", text), text  # where its SELECT is
    assert "streaming table 'histogram' was not run: it reads 'per_k', which failed" in text
    assert any("[per_k] failed; the run goes on with the tables that do not read it "
               "(not run: histogram)" in line for line in said), said
    check(spark, tmp_path, src, sql, ("big_v",))
    assert not (tmp_path / "warehouse" / "histogram").exists()


def test_an_error_in_an_operators_task_names_the_operator():
    """A Spark task's error (``tasks.run_group``, in a Python worker) carries a note naming
    its operator, which Spark's error then shows in the worker's traceback."""
    import traceback

    from octo_platform.runtime.operators.tasks import run_group

    class Failing:
        def run(self, key, rows):
            raise ValueError("no kernel matching input types")

    with pytest.raises(ValueError) as failed:
        run_group(Failing(), "Aggregate keys=[k] aggs=[min(v)]", (0,), None)
    shown = "".join(traceback.format_exception(failed.value))
    assert "in operator Aggregate keys=[k] aggs=[min(v)]" in shown, shown


def test_a_cross_join_past_its_bound_fails_naming_the_join(spark, tmp_path, monkeypatch):
    """A cross join whose batch would pair more rows than its bound (patched to 100 here)
    leaves the driver path for the Spark path, whose task refuses before making the pairs:
    the run fails naming the table, the join and why; the other table runs."""
    from octo_platform.runtime.operators import join

    monkeypatch.setattr(join, "CROSS_PAIRS", 100)
    src = RandomInput(43, debezium=False)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(f"""
CREATE SOURCE src ({src.ddl()}) WITH (connector = 'files', path = 'data/src', format = 'json');
CREATE STREAMING TABLE pairs AS SELECT a.id AS x, b.id AS y FROM src a, src b WHERE a.v < 50;
CREATE STREAMING TABLE few AS SELECT k, COUNT(*) AS n FROM src GROUP BY k;
""")
    write_lines(tmp_path / "data" / "src", "a.json", src.lines(20))
    with pytest.raises(RunError) as failed:
        run_tables(spark, tmp_path, options=default_options(progress=None), until_idle=True)
    text = str(failed.value)
    assert "streaming table 'pairs' failed" in text and "a cross join (no equality " \
        "between its inputs) would pair" in text and "more than 100" in text, text
    assert "in operator InnerJoin strategy=delta-rule keys=[0 = 0]" in text, text
    assert "(SQL at sql/t.sql:3:33)" in text, text  # its SELECT
    assert "TooManyPairs" in text, text  # raised in a Spark task: the driver path left it
    check_tables(spark, tmp_path / "warehouse", (tmp_path / "sql" / "t.sql").read_text(),
                 {"src": src.relation()}, {"few": True}, 0)

"""Run streaming tables: each table's micro-batches, exactly once (``Pipeline.run_batch``).

``until_idle=True`` (catch-up): each table processes everything available when it starts,
its batches run one after another by a driver thread (``_Loop``: what an ``availableNow``
streaming query would do, without a query's start-up and per-trigger cost); a table starts
once its upstream tables of the run are done (so it sees their output of the same run), and
up to ``parallel`` tables run at once. A table with no pending batch and no new input ends
after one look at its batch log and inputs. A catch-up that stops making progress (no batch
started for ``STALL_S``) is replaced by a fresh one, which resumes from the batch log.
Otherwise (continuous) every table is a Spark Structured Streaming query (``readStream ▶
foreachBatch`` over the ``octo_batches`` source, a processing-time trigger), all running
concurrently until Ctrl-C or ``deadline``; stopping waits for the batch in flight, and an
interrupted batch is redone exactly once next time.

Transient failures of Spark's machinery (see ``transient``) are retried inside the run: a
batch that fails is run again in its handler (``BATCH_ATTEMPTS`` tries, exponential backoff);
a query that dies outside a batch (its Python source runner did not start or died) is
replaced by a fresh one (``QUERY_RESTARTS`` times in a row). Both are safe because a batch
is a deterministic function of its logged inputs: ``Pipeline.run_batch`` finishes a half-done
attempt exactly once. The project's own errors (``OctoError``, a plan Spark rejects) fail at
once. A continuous run starts a streaming query only when no other of the run is still being
set up by Spark: each set-up starts Python source runners that must connect back within
Spark's hard-coded 10 s, and on a loaded machine several starting at once miss it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from octo_platform.errors import OctoError, RunError, notes
from octo_platform.project import Project, load_project
from octo_platform.runtime.checks import check_project, diagnose
from octo_platform.runtime.layout import Layout
from octo_platform.runtime.locks import lock_tables
from octo_platform.runtime.offsets import available, next_inputs
from octo_platform.runtime.options import RunOptions
from octo_platform.runtime.pipeline import Pipeline, collecting_new_objects
from octo_platform.runtime.stats import BatchStats
from octo_platform.runtime.sinks import SinkRunner, SinkStats

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run_tables", "publish_sink", "RunReport", "open_project"]


@dataclass
class RunReport:
    batches: list[BatchStats] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)  # one line per retried batch / restart
    published: list[SinkStats] = field(default_factory=list)  # sink batches

    def for_table(self, name: str) -> list[BatchStats]:
        return [b for b in self.batches if b.table.lower() == name.lower()]

    @property
    def dead_letters(self) -> int:
        return sum(b.dead_letters for b in self.batches)


def open_project(project: str | Path | Project, options: RunOptions) -> tuple[Project, Layout]:
    """The project (loaded unless given) and its warehouse layout."""
    proj = project if isinstance(project, Project) else load_project(project)
    return proj, options.layout(proj.root)


class _Query:
    """One table's streaming query and its foreachBatch handler.

    ``new_pipeline`` builds the table's pipeline from what is on disk; a retried batch and a
    restarted query get a fresh one, exactly as a new run would.
    """

    def __init__(self, spark: SparkSession, new_pipeline: Callable[[], Pipeline],
                 report: RunReport, *, progress: Callable[[str], None] | None,
                 diagnose: Callable[[BaseException], OctoError | None]) -> None:
        self.spark = spark
        self.diagnose = diagnose  # an error of the table's SQL behind a batch's, or None
        self.new_pipeline = new_pipeline
        self.pipeline = new_pipeline()
        self.report = report
        self.progress = progress
        self.stopping = False
        self.wake = threading.Event()  # set by stop(): ends a retry's backoff early
        self.busy = threading.Lock()
        self.error: BaseException | None = None  # what made the handler give up
        self.diagnosis: OctoError | None = None  # the error of the SQL behind it, if any
        self.attempts = 0  # tries of the batch the handler gave up on
        self.active_at = time.monotonic()  # last time a batch started or ended
        self.restarts = 0  # stalled queries replaced (see _catch_up)
        self.failures = 0  # query failures outside a batch since the last batch done
        self.generation = 0  # queries started; a replaced query's late batches are ignored
        self.query = None
        self.started_at = 0.0  # when the current query was started
        self.set_up = True  # Spark has set up the current query (see initializing)
        self.checkpoints: list[str] = []

    @property
    def name(self) -> str:
        return self.pipeline.name

    def say(self, message: str) -> None:
        self.report.retries.append(message)
        if self.progress:
            self.progress(message)

    def handle(self, df: DataFrame, generation: int) -> None:
        """foreachBatch: the micro-batch's one row is the octo batch's offset."""

        def offset() -> dict | None:
            rows = df.collect()
            return json.loads(rows[0][0]) if rows else None

        self.run_next(offset, generation)

    def run_next(self, next_offset: Callable[[], dict | None], generation: int) -> bool:
        """Run the batch ``next_offset`` names (if any); whether one ran."""
        with self.busy:
            self.active_at = time.monotonic()
            try:
                if not self.stopping and generation == self.generation:
                    return self._handle(next_offset)
                return False  # not logged: planned again next time
            finally:
                self.active_at = time.monotonic()

    def stalled(self) -> bool:
        """No batch has started for ``STALL_S`` (and none is in flight) while the query (or
        the catch-up loop) is active."""
        return not self.busy.locked() and time.monotonic() - self.active_at > STALL_S

    def _handle(self, next_offset: Callable[[], dict | None]) -> bool:
        """Run the next octo batch (whether there was one); a transient failure is retried
        with backoff."""
        offset: dict | None = None
        for attempt in range(1, BATCH_ATTEMPTS + 1):
            try:
                if offset is None:
                    offset = next_offset()
                    if offset is None:
                        return False
                if attempt > 1:
                    self.pipeline = self.new_pipeline()  # state and batch log as on disk
                stats = self.pipeline.run_batch(int(offset["batch"]), offset["inputs"])
                break
            except Exception as e:  # retried, or re-raised to the runner
                if self.stopping or attempt == BATCH_ATTEMPTS or not transient(e):
                    self.error, self.attempts = e, attempt
                    self.diagnosis = self.diagnose(e)  # an AnalysisException only
                    raise
                delay = backoff(attempt)
                what = f"batch {offset['batch']}" if offset else "a batch"
                self.say(f"[{self.name}] {what} failed ({describe(e)}): retrying in "
                         f"{delay:g}s (attempt {attempt + 1} of {BATCH_ATTEMPTS})")
                if self.wake.wait(delay):
                    return False  # stopping: not committed, the next run redoes it
            except BaseException as e:  # KeyboardInterrupt and the like: re-raised as is
                self.error, self.attempts = e, attempt
                raise
        self.failures = 0
        self.report.published.extend(stats.sinks)
        if not stats.skipped:
            self.report.batches.append(stats)
        return True

    def start(self, *, until_idle: bool, interval: str):
        """Start the table's batches: a catch-up runs them in a driver thread (``_Loop``), a
        continuous run as a streaming query on a new checkpoint. Either resumes from the
        batch log. A replacement gets a fresh pipeline, and batches its predecessor may
        still hand over are ignored."""
        from octo_platform.runtime.batches import environment_option

        with self.busy:  # no batch of a previous query in flight
            self.generation += 1
            if self.generation > 1:
                self.pipeline = self.new_pipeline()
        p, generation = self.pipeline, self.generation
        self.active_at = self.started_at = time.monotonic()
        if until_idle:
            self.query = _Loop(self, generation)
            return self.query
        self.checkpoint = f"{p.layout.internal(p.name)}/checkpoints/{uuid.uuid4().hex}"
        self.checkpoints.append(self.checkpoint)
        reader = (self.spark.readStream.format("octo_batches")
                  .option("inputs", json.dumps([s.to_json() for s in p.inputs]))
                  .option("log", p.layout.log(p.name))
                  .option("environment", environment_option(p.env))
                  .load())
        writer = (reader.writeStream
                  .foreachBatch(lambda df, _spark_batch: self.handle(df, generation))
                  .queryName(f"octo-{p.name}")
                  .option("checkpointLocation", self.checkpoint)
                  .trigger(processingTime=interval))
        self.query = writer.start()
        self.set_up = False
        return self.query

    def initializing(self) -> bool:
        """Spark is still setting the query up: starting its Python source runners, which
        must connect back within 10 s (hard-coded in Spark). Queries are started one after
        another's set-up so their runners do not compete for the CPU (at most ``SETUP_S``)."""
        if not self.set_up:
            try:
                self.set_up = (not self.query.isActive or time.monotonic() - self.started_at
                               > SETUP_S or self.query.status["message"] not in _SETTING_UP)
            except Exception:  # noqa: BLE001 - a dying query is not being set up
                self.set_up = True
        return not self.set_up

    def failed(self, cause: BaseException) -> float:
        """The query died (or would not start) outside a batch: the delay before a fresh one
        starts. Raises ``RunError`` when ``cause`` is not transient or the restarts of the
        query in a row are used up."""
        self.failures += 1
        if not transient(cause):
            raise self.failure(cause) from cause
        if self.failures > QUERY_RESTARTS:
            raise RunError(
                f"streaming table {self.name!r} failed: its streaming query stopped "
                f"{self.failures} times in a row without finishing a batch (restarted "
                f"{QUERY_RESTARTS} times); last cause: {describe(cause, 2000)}. Batches "
                "already committed stay; the next run resumes where this one stopped."
            ) from cause
        delay = backoff(self.failures)
        self.say(f"[{self.name}] streaming query failed ({describe(cause)}): restarting it in "
                 f"{delay:g}s (restart {self.failures} of {QUERY_RESTARTS}; it resumes from "
                 "the batch log)")
        return delay

    def gave_up(self) -> OctoError:
        """The error of a run whose handler gave up on a batch (an error of the table's SQL
        where the batch's error comes from one)."""
        if self.diagnosis is not None:
            return self.diagnosis
        cause = self.error
        if self.attempts > 1:
            return RunError(f"streaming table {self.name!r} failed: a batch failed "
                            f"{self.attempts} times (retried with backoff); last cause: "
                            f"{describe(cause, 2000)}. Batches already committed stay; the "
                            "next run redoes this one.")
        return self.failure(cause)

    def failure(self, cause: BaseException) -> RunError:
        """The table's failure for good with ``cause``: its whole text and notes."""
        return RunError(f"streaming table {self.name!r} failed: "
                        f"{type(cause).__name__}: {cause}{notes(cause)}")

    def ended(self) -> float | None:
        """The query is no longer active: None if it finished, else the delay before it is
        replaced (a ``RunError`` if it may not be)."""
        try:
            self.query.awaitTermination()
            return None
        except Exception as e:  # noqa: BLE001 - classified by failed()
            if self.error is not None:  # the handler gave up, after its own retries
                raise self.gave_up() from self.error
            return self.failed(e)

    def launch(self, *, until_idle: bool, interval: str) -> float | None:
        """The table's sinks catch up (a run killed between a batch and its publishing),
        then ``start``; on a failure, the delay before trying again (or ``RunError``)."""
        try:
            self.report.published.extend(self.pipeline.publish())
            self.start(until_idle=until_idle, interval=interval)
            return None
        except Exception as e:  # noqa: BLE001 - classified by failed()
            return self.failed(e)

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        with self.busy:  # wait for the batch in flight
            pass
        if self.query is not None:
            self.query.stop()

    def cleanup(self) -> None:
        for path in self.checkpoints:
            if "://" not in path:
                shutil.rmtree(path, ignore_errors=True)


class _Loop:
    """A catch-up without a streaming query: the batches an ``availableNow`` query would
    run (everything available when it starts), one after another in a driver thread. It
    skips what a query costs and a catch-up does not need: its start-up (~1 s a table and
    run: Python source runners, a checkpoint) and ~0.35 s a trigger. Offers what the runner
    uses of a ``StreamingQuery``."""

    def __init__(self, query: _Query, generation: int) -> None:
        self.error: BaseException | None = None
        p = query.pipeline
        target = available(p.inputs, env=p.env)

        def offset() -> dict | None:
            p = query.pipeline  # a retried batch gets a fresh pipeline
            nxt = next_inputs(p.inputs, p.log, env=p.env, target=target)
            return None if nxt is None else {"batch": nxt[0], "inputs": nxt[1]}

        def run() -> None:
            try:  # until nothing is left, or stopping (run_next runs no batch then)
                while not self.stopped.is_set() and query.run_next(offset, generation):
                    pass
            except BaseException as e:  # noqa: BLE001 - raised by awaitTermination()
                self.error = e

        self.stopped = threading.Event()
        self.thread = threading.Thread(target=run, name=f"octo-{p.name}", daemon=True)
        self.thread.start()

    @property
    def isActive(self) -> bool:
        return self.thread.is_alive()

    def awaitTermination(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


_REGISTERED: set[int] = set()
# Catch-up tables at once: overlaps one table's driver work with another's jobs. Measured on
# 2 cores with streaming queries (12 tables, 22 batches a run): 2 used 14% less CPU than 3
# and was faster at load 8-12, 3 was 5-10% faster at load 3-7; with the driver loop,
# test_oracle_joins took 164 / 154-169 / 171 s with 2 / 3 / 4.
DEFAULT_PARALLEL = 3
STALL_S = 300.0  # a catch-up that has started no batch for this long is stuck
STALL_RESTARTS = 2  # ... and is restarted (it resumes exactly once) this often before failing
BATCH_ATTEMPTS = 4  # tries of a batch that fails transiently, in its handler
QUERY_RESTARTS = 5  # fresh queries for one that died outside a batch, in a row
RETRY_BASE_S = 2.0  # backoff before retry n: RETRY_BASE_S * 2**(n-1), at most RETRY_MAX_S
RETRY_MAX_S = 30.0
SETUP_S = 30.0  # at most this long a query's set-up holds back the start of the next one
_SETTING_UP = ("Initializing sources", "Initializing StreamExecution")
# In the text of an error Spark wraps (a Python worker's traceback, a failed query), signs
# that retrying cannot help: our own errors, a bug in Python code, a Python that cannot import
# the package (see PYSPARK_PYTHON). A worker that crashed or did not connect back has none.
# Arrow's errors of types and values (a cast, a kernel that does not exist) are permanent too.
_PERMANENT = re.compile(
    r"octo_platform\.errors\.|No module named|^\s*(?:[\w.]+\.)?(?:TypeError|KeyError|"
    r"AttributeError|NameError|UnboundLocalError|AssertionError|ValueError|IndexError|"
    r"ZeroDivisionError|NotImplementedError|ImportError|ModuleNotFoundError|RecursionError|"
    r"SyntaxError|ArrowInvalid|ArrowTypeError|ArrowNotImplementedError|ArrowKeyError|"
    r"ArrowIndexError)(?::|$)", re.MULTILINE)
# Spark's handshake with a Python worker it started (a UDF's, a data source's) failed: the
# worker died while connecting (e.g. its daemon was killed); Spark raises it as an
# IllegalArgumentException.
_HANDSHAKE = "Authentication failed"


def transient(error: BaseException) -> bool:
    """Whether ``error`` is a failure of Spark's machinery that a retry may not meet again:
    a Python worker that did not start, connect back or finish its handshake, a lost
    executor or task, a broken Py4J or socket connection, a failed Delta commit. Not: octo's
    own errors (``OctoError``: bad SQL, a changed plan, a missing upstream), a plan or value
    Spark rejects, or a bug in Python code (``TypeError``, ``KeyError``, ...)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import (
        AnalysisException,
        ArithmeticException,
        ArrayIndexOutOfBoundsException,
        DateTimeException,
        IllegalArgumentException,
        PySparkRuntimeError,
        SparkUpgradeException,
        UnsupportedOperationException,
    )
    from pyspark.errors.exceptions.captured import CapturedException

    if not isinstance(error, Exception) or isinstance(error, OctoError):
        return False
    if isinstance(error, IllegalArgumentException) and str(error).startswith(_HANDSHAKE):
        return True
    if isinstance(error, (AnalysisException, ArithmeticException, ArrayIndexOutOfBoundsException,
                          DateTimeException, IllegalArgumentException, SparkUpgradeException,
                          UnsupportedOperationException)):
        return False
    if _PERMANENT.search(str(error)):
        return False
    from pyspark.errors import (
        PythonException,
        SparkRuntimeException,
        StreamingQueryException,
        UnknownException,
    )

    if isinstance(error, (CapturedException, StreamingQueryException, PythonException,
                          UnknownException, SparkRuntimeException, PySparkRuntimeError,
                          Py4JError, OSError, EOFError)):
        return True
    from deltalake.exceptions import (
        DeltaError,
        DeltaProtocolError,
        SchemaMismatchError,
        TableNotFoundError,
    )

    return isinstance(error, DeltaError) and not isinstance(
        error, (DeltaProtocolError, SchemaMismatchError, TableNotFoundError))


def backoff(retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1, 2, ...): doubling, capped."""
    return min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (retry - 1))


def describe(error: BaseException | None, limit: int = 300) -> str:
    """``Type: first line of the message`` (Spark's messages carry whole stack traces; a raw
    Py4J error's first line only names the call, its second the Java exception)."""
    if error is None:
        return "unknown error"
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    if first.startswith("An error occurred while calling") and len(lines) > 1:
        first = f"{first} {lines[1].lstrip(': ')}"
    first = _worker_error(str(error)) or first
    text = f"{type(error).__name__}: {first}".rstrip(": ") + notes(error)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _worker_error(text: str) -> str | None:
    """In the text of an error Spark wraps, the Python worker's own error, if any: the line
    after its traceback's frames (``Type: message``), with the notes after it (``in
    operator ...``)."""
    at = text.rfind("Traceback (most recent call last):")
    found: list[str] = []
    for line in text[at:].splitlines()[1:] if at >= 0 else ():
        if line.strip() and not line.startswith((" ", "\t")):
            found.append(line.strip())
        elif found:
            break
    return "; ".join(found) or None


def _register(spark: SparkSession) -> None:
    """Register the offsets source once per session (a round trip of ~1-2 s)."""
    from octo_platform.runtime.batches import OctoBatches

    if id(spark) not in _REGISTERED:
        spark.dataSource.register(OctoBatches)
        _REGISTERED.add(id(spark))


def run_tables(
    spark: SparkSession,
    project: str | Path | Project,
    *,
    options: RunOptions,
    names: list[str] | None = None,
    until_idle: bool = True,
    deadline: float | None = None,
    interval: str = "1 second",
    parallel: int = DEFAULT_PARALLEL,
) -> RunReport:
    """Run the named streaming tables (all when ``names`` is None) with the environment and
    warehouse of ``options``; see module docstring.

    ``deadline`` (a ``time.time()`` value) ends a continuous run cleanly; ``parallel`` caps
    how many catch-up queries run at once.
    """
    proj, layout = open_project(project, options)
    tables = proj.order(names)
    if until_idle:  # a catch-up analyses a table's expressions when a batch fails on one
        proj.check_functions(spark.catalog.functionExists)
    else:  # a continuous run may wait long for its first rows: all of ``octo check``
        check_project(spark, proj, tables)
    if options.progress is not None:
        for line in _missing_paths(proj, tables):
            options.progress(line)
    os.makedirs(layout.warehouse, exist_ok=True) if "://" not in layout.warehouse else None
    if not until_idle:
        _register(spark)
    report = RunReport()
    with lock_tables(layout, [t.name for t in tables]), collecting_new_objects():
        queries = [_Query(spark, _pipeline_factory(spark, proj, t, layout, options), report,
                          progress=options.progress,
                          diagnose=lambda e, t=t: diagnose(spark, proj, t, e))
                   for t in tables]
        if until_idle:
            _catch_up(queries, parallel)
        else:
            _run_continuously(queries, interval, deadline, options.progress)
        for q in queries:  # a run that ended cleanly: what it held, for the next run here
            q.pipeline.finish()
    return report


def _missing_paths(proj: Project, tables: list) -> list[str]:
    """A line for each local ``files`` source of ``tables`` whose path does not exist: the
    run reads nothing from it until it does, which a misspelt path would leave unseen."""
    paths = {s.name: proj.source_path(s) for t in tables for src in t.physical.sources
             if src.kind == "source" and (s := proj.source(src.name)).connector == "files"}
    return [f"source {name}: {path} does not exist (yet): nothing to read from it until it "
            "does" for name, path in paths.items() if "://" not in path
            and not os.path.exists(path)]


def publish_sink(spark: SparkSession, project: str | Path | Project, name: str, *,
                 options: RunOptions) -> tuple[list[SinkStats], int | None]:
    """Publish what sink ``name``'s table has committed and the sink has not (its table's
    runs do this after each batch; this catches up without running the table), holding the
    table's lock. The sink batches published, and the changelog versions still unpublished
    (0, or None when the table has no changelog yet)."""
    proj, layout = open_project(project, options)
    sink = proj.sink(name)
    with lock_tables(layout, [sink.table]):
        runner = SinkRunner(spark, proj, sink, layout, options.env, progress=options.progress,
                            driver_rows=options.driver_rows)
        return runner.catch_up(), runner.lag()


def _pipeline_factory(spark: SparkSession, proj: Project, table, layout: Layout,
                      options: RunOptions) -> Callable[[], Pipeline]:
    """Builds ``table``'s pipeline from what is on disk (its batch log, checked plan)."""
    return lambda: Pipeline(spark, proj, table, layout, options.env, buckets=options.buckets,
                            progress=options.progress, driver_rows=options.driver_rows,
                            driver_state_rows=options.driver_state_rows)


def _catch_up(queries: list[_Query], parallel: int) -> None:
    """Run every query to idle, at most ``parallel`` at once, each once its upstream tables
    in this run are done (so it sees their output of the same run). A query that fails
    outside a batch, or that Spark stops driving (no batch started for ``STALL_S``), is
    replaced by a new one: it resumes from the batch log, so nothing is lost or doubled.
    A table that fails for good stops only the tables that read it: the others run to idle,
    then the run raises its error (``_failures``)."""
    by_name = {q.name.lower(): q for q in queries}
    deps = {n: {d.lower() for d in q.pipeline.table.definition.deps} & set(by_name)
            for n, q in by_name.items()}
    done: set[str] = set()
    running: set[str] = set()
    due: dict[str, float] = {}  # failed queries: when their replacement starts
    failed: dict[str, OctoError] = {}  # tables that failed for good
    blocked: dict[str, str] = {}  # tables not run, and the failed table they read

    def fail(n: str, error: OctoError) -> None:
        failed[n] = error
        more = True
        while more:  # everything downstream of a failed table, through any path
            more = False
            for m, ups in deps.items():
                upstream = next((u for u in sorted(ups) if u in failed or u in blocked), None)
                if m not in failed and m not in blocked and upstream is not None:
                    blocked[m], more = blocked.get(upstream, upstream), True
        below = sorted(by_name[m].name for m, why in blocked.items() if why == n)
        by_name[n].say(f"[{by_name[n].name}] failed; the run goes on with the tables that do "
                       "not read it" + (f" (not run: {', '.join(below)})" if below else ""))

    def launch(n: str) -> None:
        delay = by_name[n].launch(until_idle=True, interval="0 seconds")
        if delay is None:
            running.add(n)
        else:
            due[n] = time.monotonic() + delay

    try:
        while len(done) + len(failed) + len(blocked) < len(by_name):
            for n in [n for n, at in due.items() if at <= time.monotonic()]:
                del due[n]
                launch(n)
            for n in by_name:
                if len(running) + len(due) >= max(1, parallel):
                    break
                if n not in done and n not in running and n not in due and n not in failed \
                        and n not in blocked and deps[n] <= done:
                    launch(n)
            finished = [n for n in running if not by_name[n].query.isActive]
            for n in finished:
                running.discard(n)
                try:
                    delay = by_name[n].ended()
                except OctoError as e:
                    fail(n, e)
                    continue
                if delay is None:
                    done.add(n)
                    by_name[n].cleanup()
                else:
                    due[n] = time.monotonic() + delay
            for n in [n for n in running if by_name[n].stalled()]:
                q = by_name[n]
                _stop_quietly(q.query)
                running.discard(n)
                if q.restarts >= STALL_RESTARTS:
                    fail(n, RunError(
                        f"streaming table {q.name!r} made no progress for {STALL_S:.0f}s "
                        f"(no batch started), {q.restarts} time(s) in a row; stopped it. "
                        "Run again: the next run resumes where this one stopped."))
                    continue
                q.say(f"[{q.name}] no batch started for {STALL_S:.0f}s: "
                      "restarting it (it resumes exactly once)")
                q.restarts += 1
                launch(n)
            if not finished:
                time.sleep(0.05)
        if failed:
            raise _failures(failed, {by_name[m].name: by_name[n].name
                                     for m, n in blocked.items()})
    finally:
        for n in running:
            by_name[n].stopping = True
            by_name[n].wake.set()
            _stop_quietly(by_name[n].query)
        for q in queries:
            q.cleanup()


def _failures(failed: dict[str, OctoError], blocked: dict[str, str]) -> OctoError:
    """The error of a catch-up in which tables ``failed`` (and the tables that read them,
    ``blocked``: each with the failed table upstream, were not run): the one table's own
    error, else one that gives each."""
    if len(failed) == 1 and not blocked:
        return next(iter(failed.values()))
    lines = [str(e) for e in failed.values()]
    lines += [f"streaming table {m!r} was not run: it reads {n!r}, which failed"
              for m, n in sorted(blocked.items())]
    error = RunError(f"{len(failed)} streaming table(s) failed; the others ran:\n"
                     + "\n".join(f"  {line}" for line in lines))
    error.__cause__ = next(iter(failed.values()))
    return error


def _stop_quietly(query) -> None:
    """Stop a query Spark no longer drives; it may fail to stop within the stop timeout."""
    try:
        query.stop()
    except Exception:  # noqa: BLE001 - a wedged query; its replacement takes over
        pass


def _run_continuously(queries: list[_Query], interval: str, deadline: float | None,
                      progress: Callable[[str], None] | None) -> None:
    """Run every query until ``deadline`` or Ctrl-C; a query that fails outside a batch is
    replaced by a new one (``QUERY_RESTARTS`` times in a row, with backoff)."""
    due = {id(q): 0.0 for q in queries}  # queries to (re)start, and when
    try:
        while deadline is None or time.time() < deadline:
            for q in queries:
                if id(q) in due:
                    if due[id(q)] <= time.monotonic() and not any(
                            o.initializing() for o in queries if id(o) not in due):
                        delay = q.launch(until_idle=False, interval=interval)
                        if delay is None:
                            del due[id(q)]
                            if progress:
                                progress(f"[{q.name}] streaming: new input is looked for "
                                         f"every {interval}")
                        else:
                            due[id(q)] = time.monotonic() + delay
                elif not q.query.isActive:
                    delay = q.ended()
                    if delay is None:
                        raise RunError(f"streaming table {q.name!r} stopped unexpectedly")
                    due[id(q)] = time.monotonic() + delay
            time.sleep(0.5 if not due else 0.05)
        if progress:
            progress("deadline reached: stopping after the batches in flight")
    except KeyboardInterrupt:
        if progress:
            progress("interrupted: stopping after the batches in flight")
    finally:
        for q in queries:
            if q.query is not None and id(q) not in due:
                q.stop()
            q.cleanup()

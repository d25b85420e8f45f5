"""Run streaming tables as Spark Structured Streaming queries (``readStream ▶ foreachBatch``).

``until_idle=True`` (catch-up, ``availableNow``): each table processes everything
available; a table starts once its upstream tables of the run are done (so it sees their
output of the same run), and up to ``parallel`` tables run at once. Otherwise all tables
run concurrently until Ctrl-C or ``deadline``; stopping waits for the batch in flight, and
an interrupted batch is redone exactly once next time. A catch-up query that Spark stops
driving (no batch started for ``STALL_S``) is replaced by a fresh one, which resumes from the
batch log.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from octo_platform.errors import RunError
from octo_platform.project import DEFAULT_WAREHOUSE, Project, load_project
from octo_platform.runtime.pipeline import (
    DEFAULT_BUCKETS,
    BatchStats,
    Environment,
    Layout,
    Pipeline,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run_tables", "RunReport", "resolve_warehouse", "lock_tables", "open_project"]


@dataclass
class RunReport:
    batches: list[BatchStats] = field(default_factory=list)

    def for_table(self, name: str) -> list[BatchStats]:
        return [b for b in self.batches if b.table.lower() == name.lower()]

    @property
    def dead_letters(self) -> int:
        return sum(b.dead_letters for b in self.batches)


def resolve_warehouse(project_root: Path, warehouse: str | None) -> str:
    if warehouse is None:
        return str(project_root / DEFAULT_WAREHOUSE)
    if "://" in warehouse:
        return warehouse.rstrip("/")
    return str(Path(warehouse).resolve())


def open_project(project: str | Path | Project, warehouse: str | None,
                 env: Environment | None, storage_options: dict[str, str] | None
                 ) -> tuple[Project, Layout, Environment]:
    """The project (loaded unless given), its warehouse layout and the environment (the
    default wiring unless given)."""
    if env is None:
        from octo_platform.wiring import default_environment

        env = default_environment(storage_options)
    proj = project if isinstance(project, Project) else load_project(project)
    return proj, Layout(resolve_warehouse(proj.root, warehouse)), env


class _Lock:
    """An exclusive lock per table, so two runs never write the same table at once."""

    def __init__(self, layout: Layout, table: str) -> None:
        path = Path(layout.internal(table))
        path.mkdir(parents=True, exist_ok=True)
        self.fh = open(path / "lock", "w")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise RunError(f"streaming table {table!r} is being run by another process "
                           f"(lock {path / 'lock'})") from None

    def release(self) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


@contextmanager
def lock_tables(layout: Layout, tables: list[str]) -> Iterator[None]:
    """Hold every table's lock (fails at once if another process holds one)."""
    locks: list[_Lock] = []
    try:
        for t in tables:
            locks.append(_Lock(layout, t))
        yield
    finally:
        for lock in locks:
            lock.release()


class _Query:
    """One table's streaming query and its foreachBatch handler."""

    def __init__(self, spark: SparkSession, pipeline: Pipeline, report: RunReport,
                 storage_options: dict[str, str] | None) -> None:
        self.spark = spark
        self.pipeline = pipeline
        self.report = report
        self.storage_options = storage_options
        self.stopping = False
        self.busy = threading.Lock()
        self.error: BaseException | None = None
        self.active_at = time.monotonic()  # last time a batch started or ended
        self.restarts = 0  # stalled queries replaced (see _catch_up)
        internal = pipeline.layout.internal(pipeline.name)
        self.checkpoint = f"{internal}/checkpoints/{uuid.uuid4().hex}"

    def handle(self, df: DataFrame, _spark_batch: int) -> None:
        with self.busy:
            self.active_at = time.monotonic()
            try:
                self._handle(df)
            finally:
                self.active_at = time.monotonic()

    def stalled(self) -> bool:
        """Spark has not called the handler for ``STALL_S`` while the query is active."""
        return not self.busy.locked() and time.monotonic() - self.active_at > STALL_S

    def _handle(self, df: DataFrame) -> None:
        if self.stopping:
            return  # not logged: the next run plans this batch again
        rows = df.collect()
        if not rows:
            return
        offset = json.loads(rows[0][0])
        try:
            stats = self.pipeline.run_batch(int(offset["batch"]), offset["inputs"])
        except BaseException as e:  # noqa: BLE001 - re-raised by the runner
            self.error = e
            raise
        if not stats.skipped:
            self.report.batches.append(stats)

    def start(self, *, until_idle: bool, interval: str):
        p = self.pipeline
        reader = (self.spark.readStream.format("octo_batches")
                  .option("inputs", json.dumps([s.to_json() for s in p.inputs]))
                  .option("log", p.layout.log(p.name))
                  .option("storage_options", json.dumps(self.storage_options or {}))
                  .load())
        writer = (reader.writeStream.foreachBatch(self.handle)
                  .queryName(f"octo-{self.pipeline.name}")
                  .option("checkpointLocation", self.checkpoint))
        writer = writer.trigger(availableNow=True) if until_idle else \
            writer.trigger(processingTime=interval)
        self.active_at = time.monotonic()
        self.query = writer.start()
        return self.query

    def stop(self) -> None:
        self.stopping = True
        with self.busy:  # wait for the batch in flight
            pass
        self.query.stop()

    def cleanup(self) -> None:
        if "://" not in self.checkpoint:
            shutil.rmtree(self.checkpoint, ignore_errors=True)


_REGISTERED: set[int] = set()
DEFAULT_PARALLEL = 3  # catch-up queries at once: overlaps start-up and driver work of several
STALL_S = 300.0  # a catch-up query whose handler Spark has not called for this long is stuck
STALL_RESTARTS = 2  # ... and is restarted (it resumes exactly once) this often before failing


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
    warehouse: str | None = None,
    names: list[str] | None = None,
    until_idle: bool = True,
    env: Environment | None = None,
    storage_options: dict[str, str] | None = None,
    buckets: int = DEFAULT_BUCKETS,
    deadline: float | None = None,
    interval: str = "1 second",
    progress: Callable[[str], None] | None = print,
    parallel: int = DEFAULT_PARALLEL,
) -> RunReport:
    """Run the named streaming tables (all when ``names`` is None); see module docstring.

    ``deadline`` (a ``time.time()`` value) ends a continuous run cleanly; ``parallel`` caps
    how many catch-up queries run at once.
    """
    proj, layout, env = open_project(project, warehouse, env, storage_options)
    tables = proj.order(names)
    os.makedirs(layout.warehouse, exist_ok=True) if "://" not in layout.warehouse else None
    _register(spark)
    report = RunReport()
    with lock_tables(layout, [t.name for t in tables]):
        pipelines = [Pipeline(spark, proj, t, layout, env, buckets=buckets, progress=progress)
                     for t in tables]
        queries = [_Query(spark, p, report, storage_options) for p in pipelines]
        if until_idle:
            _catch_up(queries, parallel, progress)
        else:
            _run_continuously(queries, interval, deadline, progress)
    return report


def _catch_up(queries: list[_Query], parallel: int,
              progress: Callable[[str], None] | None = None) -> None:
    """Run every query to idle, at most ``parallel`` at once, each once its upstream tables
    in this run are done (so it sees their output of the same run). A query Spark stops
    driving (no batch started for ``STALL_S``) is stopped and started again: the new query
    resumes from the batch log, so nothing is lost or doubled."""
    by_name = {q.pipeline.name.lower(): q for q in queries}
    deps = {n: {d.lower() for d in q.pipeline.table.definition.deps} & set(by_name)
            for n, q in by_name.items()}
    done: set[str] = set()
    running: dict[str, object] = {}
    try:
        while len(done) < len(by_name):
            for n in by_name:
                if len(running) >= max(1, parallel):
                    break
                if n not in done and n not in running and deps[n] <= done:
                    running[n] = by_name[n].start(until_idle=True, interval="0 seconds")
            finished = [n for n, query in running.items() if not query.isActive]
            for n in finished:
                _await(by_name[n], running.pop(n))
                done.add(n)
            for n in [n for n in running if by_name[n].stalled()]:
                q = by_name[n]
                if q.restarts >= STALL_RESTARTS:
                    raise RunError(
                        f"streaming table {q.pipeline.name!r}: Spark's query made no progress "
                        f"for {STALL_S:.0f}s (no batch started), {q.restarts} time(s) in a "
                        "row; stopped it. Run again: the next run resumes where this one "
                        "stopped.")
                if progress:
                    progress(f"[{q.pipeline.name}] no batch started for {STALL_S:.0f}s: "
                             "restarting its streaming query (it resumes exactly once)")
                _stop_quietly(running[n])
                q.restarts += 1
                running[n] = q.start(until_idle=True, interval="0 seconds")
            if not finished:
                time.sleep(0.05)
    finally:
        for n, query in running.items():
            by_name[n].stopping = True
            query.stop()
            by_name[n].cleanup()


def _stop_quietly(query) -> None:
    """Stop a query Spark no longer drives; it may fail to stop within the stop timeout."""
    try:
        query.stop()
    except Exception:  # noqa: BLE001 - a wedged query; its replacement takes over
        pass


def _await(q: _Query, query) -> None:
    try:
        query.awaitTermination()
    except Exception as e:
        cause = q.error or e
        raise RunError(f"streaming table {q.pipeline.name!r} failed: "
                       f"{type(cause).__name__}: {cause}") from cause
    finally:
        q.cleanup()


def _run_continuously(queries: list[_Query], interval: str, deadline: float | None,
                      progress: Callable[[str], None] | None) -> None:
    running = [(q, q.start(until_idle=False, interval=interval)) for q in queries]
    try:
        while deadline is None or time.time() < deadline:
            for q, query in running:
                if not query.isActive:
                    _await(q, query)
                    raise RunError(f"streaming table {q.pipeline.name!r} stopped unexpectedly")
            time.sleep(0.5)
        if progress:
            progress("deadline reached: stopping after the batches in flight")
    except KeyboardInterrupt:
        if progress:
            progress("interrupted: stopping after the batches in flight")
    finally:
        for q, _ in running:
            q.stop()
            q.cleanup()

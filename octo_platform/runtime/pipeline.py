"""One streaming table's micro-batches, exactly once.

Batch N is a deterministic function of (its inputs, the state committed by N-1):
1. an *intent* record with N's inputs is written to the table's batch log before any work
   (a restarted run redoes a pending intent with the same inputs and timestamp);
2. operators read state pinned to the versions recorded by N-1's *commit* record;
3. every Delta write for N carries the app transaction (app_id, N) and is skipped when the
   table already has it, so a half-finished attempt only adds what is missing;
4. a *commit* record with the new table versions and the batch statistics closes N.
Then the table's sinks publish what its changelog gained (``sinks.py``; each exactly once
through its own batch log).
"""
from __future__ import annotations

import gc
import re
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from octo_platform.errors import RunError
from octo_platform.project import CompiledTable, Project
from octo_platform.runtime.driver import (
    DEFAULT_DRIVER_ROWS,
    DEFAULT_DRIVER_STATE_ROWS,
    Unsupported,
    forget_held,
    held_rows,
    keep_held,
    input_rows,
    plan_runs_in_driver,
    run_in_driver,
)
from octo_platform.runtime.colocated import colocated, table_writer
from octo_platform.runtime.environment import Environment
from octo_platform.runtime.inputs import (
    commit_kafka_offsets,
    input_specs,
    read_inputs,
    settle_inputs,
    watermarked_inputs,
)
from octo_platform.runtime.layout import Layout, ScratchLayout
from octo_platform.runtime.metrics import JobCounter
from octo_platform.runtime.offsets import BatchLog, source_key
from octo_platform.runtime.operators import BatchContext, Sink, evaluate, picked_columns
from octo_platform.runtime.operators import bucket_cache
from octo_platform.runtime.operators.arrow import DRIVER_BYTES
from octo_platform.runtime.publish import RECOMPUTED, publish_recomputed
from octo_platform.runtime.rescale import RESCALE, rescale_batch
from octo_platform.runtime.sink import appends_current, encode, update_current, write_batch
from octo_platform.runtime.sinks import SinkRunner, SinkStats
from octo_platform.runtime.state_log import STATE_FORMAT
from octo_platform.runtime.stats import BatchStats

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# BatchStats: from ``stats``
__all__ = ["BatchStats", "Pipeline", "DEFAULT_BUCKETS", "collecting_new_objects"]

# A new table's buckets unless it or the run says: twice the session's cores, at least this.
DEFAULT_BUCKETS = 8
BUCKETS_KEY = "_buckets"  # a table's first intent records its buckets under this key
MAINTENANCE_EVERY = 25  # batches between vacuuming state and compacting the batch log


_FREE_EVERY_S = 10.0
_freed = [time.monotonic()]


def _result_too_large(error: BaseException) -> bool:
    """Whether ``error`` is Spark refusing to send the driver more than
    ``spark.driver.maxResultSize``."""
    return "spark.driver.maxResultSize" in str(error)


def default_buckets(spark: SparkSession) -> int:
    """A new table's buckets: twice the session's parallelism (its cores), at least
    ``DEFAULT_BUCKETS``; each bucket is a task's unit of state, so a cluster's cores each
    get some."""
    return max(DEFAULT_BUCKETS, 2 * spark.sparkContext.defaultParallelism)


def free_jvm_objects() -> None:
    """Collect Python's garbage at most every ``_FREE_EVERY_S`` seconds. A DataFrame's
    Python object often dies in a reference cycle, and its JVM side (the query plan, and
    with it e.g. the broadcast tables of its joins, kept in the driver's block store) is
    released only once Python's cycle collector frees the proxy: between its rare full
    collections a test run's batches filled a 2 GB driver heap within minutes (the
    garbage collector then took most of the CPU)."""
    now = time.monotonic()
    if now - _freed[0] >= _FREE_EVERY_S:
        _freed[0] = now
        gc.collect()


@contextmanager
def collecting_new_objects() -> Iterator[None]:
    """A run's garbage collections (``free_jvm_objects``', and Python's own full ones) look
    only at the objects made since the run began: those alive then (modules, the caller's
    data) are set aside (``gc.freeze``) until it ends. In a process that imported Dagster
    and great-expectations (420K objects), a full collection took 0.4-0.6 s, holding the
    GIL and so every batch thread; after the freeze, microseconds. Garbage made before the
    run is collected after it. Runs that overlap in one process share the freeze: the
    first to end gives it back, and the others' collections see everything again."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Pipeline:
    """Runs the micro-batches of one streaming table against a warehouse."""

    def __init__(self, spark: SparkSession, project: Project, table: CompiledTable,
                 layout: Layout, env: Environment, *, buckets: int | None = None,
                 progress: Callable[[str], None] | None = print,
                 check_plan: bool = True, driver_rows: int = DEFAULT_DRIVER_ROWS,
                 driver_state_rows: int = DEFAULT_DRIVER_STATE_ROWS) -> None:
        self.spark = spark
        self.project = project
        self.table = table
        self.layout = layout
        self.env = env
        self.progress = progress
        self.name = table.name
        self.log = BatchLog(env.store, layout.log(self.name))
        option = table.definition.options.get("buckets")
        self.memo: dict[str, Any] = {}  # per run: shapes, and the driver path's state cache
        self.use_buckets(self.kept_buckets() or buckets or (int(option) if option else None)
                         or default_buckets(spark))
        # Batches of at most this many input rows run in the driver (``driver.py``).
        self.driver_rows = driver_rows if plan_runs_in_driver(table.physical) else 0
        # ... and only while the state they hold there is at most this many rows.
        self.driver_state_rows = driver_state_rows
        self.state_too_large = False  # said once a run
        self.cache_counts = bucket_cache.counter(spark)
        self.inputs = input_specs(project, table, layout)
        self.delta_sources = {
            src.name.lower(): env.delta_source(sdef, project.source_path(sdef))
            for src in table.physical.sources
            if src.kind == "source" and (sdef := project.source(src.name)).connector == "delta"}
        for name, dsrc in self.delta_sources.items():  # the table and its columns exist
            dsrc.check(self.name, last_read=self.log.last_version(source_key("source", name)))
        self.watermarked = watermarked_inputs(project, table)
        self.sinks = [] if isinstance(layout, ScratchLayout) else [
            SinkRunner(spark, project, s, layout, env, progress=progress,
                       driver_rows=driver_rows)
            for s in project.sinks_of(self.name)]
        if check_plan:
            self.check_fingerprint()

    def use_buckets(self, buckets: int) -> None:
        """Run with ``buckets`` buckets (at the start; after a rescale batch)."""
        self.buckets = buckets
        self.fingerprint = f"{self.table.physical.fingerprint}-b{buckets}"
        # An operator's tasks: as many as the session's cores or shuffle partitions, if more,
        # but no more than the buckets (each task's unit of work): on a cluster, octo's
        # default of 2 shuffle partitions for local[2] caps nothing.
        self.tasks = min(buckets, max(self.spark.sparkContext.defaultParallelism, int(
            self.spark.conf.get("spark.sql.shuffle.partitions") or 1)))
        self.memo.clear()  # shapes and the driver path's state, made for other buckets

    def kept_buckets(self) -> int | None:
        """The buckets the table was created with, once a batch began (its commits' plan
        fingerprint, or the intent of its first batch): kept whatever the run asks."""
        last = self.log.commit_payload(self.log.last_committed)
        found = re.search(r"-b(\d+)$", (last or {}).get("fingerprint", ""))
        if found:
            return int(found.group(1))
        pending = self.log.pending()
        return int(pending[1][BUCKETS_KEY]) if pending and BUCKETS_KEY in pending[1] else None

    def finish(self) -> None:
        """At the end of a run: the driver path's state kept on this machine for the next
        run (``driver.keep_held``)."""
        keep_held(self)

    def publish(self) -> list[SinkStats]:
        """Let every sink of the table publish what the changelog has (see ``sinks.py``)."""
        return [stats for sink in self.sinks for stats in sink.catch_up()]

    def check_fingerprint(self) -> None:
        last = self.log.commit_payload(self.log.last_committed)
        if last is not None and last.get("state_format", 1) != STATE_FORMAT:
            raise RunError(
                f"the state of streaming table {self.name!r} was written by an earlier version "
                f"of octo (state format {last.get('state_format', 1)}; this one reads format "
                f"{STATE_FORMAT}) and cannot be read. Run `octo reset {self.name}` to rebuild "
                "it from all input (downstream tables: `octo refresh`).")
        if last is not None and last.get("fingerprint") != self.fingerprint:
            raise RunError(
                f"the query of streaming table {self.name!r} changed since its state was "
                f"written (plan {last.get('fingerprint')} -> {self.fingerprint}); its state "
                f"cannot be reused. Run `octo reset {self.name}` to rebuild it from all input.")

    # -- one batch -------------------------------------------------------------------------
    def run_batch(self, batch: int, inputs: dict[str, Any]) -> BatchStats:
        """Process batch ``batch`` (or finish a half-done attempt of it) exactly once."""
        started = time.monotonic()
        log = self.log
        if batch in log.commits:  # a retry after the commit: only the sinks may lag
            return BatchStats(self.name, batch, skipped=True, sinks=self.publish())
        if batch != log.last_committed + 1:
            raise RunError(f"{self.name}: batch {batch} follows {log.last_committed}")
        pending = log.pending()
        resumed = pending is not None  # an earlier attempt may have committed some tables
        if pending is not None:
            _, inputs, ts_ms = pending
            inputs = {k: v for k, v in inputs.items() if k != BUCKETS_KEY}
        else:
            ts_ms = int(time.time() * 1000)
            # the first batch's intent holds the table's buckets (later ones: its commits)
            log.append(batch, "intent", {**inputs, BUCKETS_KEY: self.buckets} if batch == 0
                       else inputs, ts_ms)
        previous = log.commit_payload(batch - 1) or {}
        pinned: dict[str, int | None] = previous.get("versions", {})
        stats = BatchStats(self.name, batch, watermarks=dict(previous.get("watermarks", {})),
                           watermarked=self.watermarked)
        if RECOMPUTED in inputs:
            return publish_recomputed(self, batch, inputs[RECOMPUTED], pinned, ts_ms, stats,
                                      started)
        if RESCALE in inputs:
            stats = rescale_batch(self, batch, int(inputs[RESCALE]), pinned, ts_ms, stats,
                                  started, resumed=resumed)
            self.use_buckets(int(inputs[RESCALE]))
            return stats
        store = self.env.store
        state_logs: dict[str, list] = {}  # a state table's pinned files, read once a batch

        def state_log(t: str) -> list:
            if t not in state_logs:
                state_logs[t] = store.data_files(self.layout.state(self.name, t),
                                                 pinned.get(f"state/{t}"))
            return state_logs[t]

        ctx = BatchContext(
            self.spark, batch, self.buckets, {},
            lambda t, b: store.files(self.layout.state(self.name, t), pinned.get(f"state/{t}"), b),
            state_log=state_log, memo=self.memo,
            state_path=lambda t: self.layout.state(self.name, t), reader=store.reader(),
            opener=store.opener(), cache_counts=self.cache_counts, tasks=self.tasks)
        if self.table.physical.state_ttl:
            ctx.expired_through = self.expired_through(stats.watermark,
                                                       self.table.physical.state_ttl)
        jobs = JobCounter(self.spark, f"octo {self.name} batch {batch}")
        try:
            versions = None
            rows = input_rows(self, inputs, self.driver_rows) if self.driver_rows else None
            large = bool(self.driver_rows) and rows is None  # over the driver's bounds
            if rows is not None and not self.driver_holds(state_log, pinned):
                rows = None
            if rows is not None:
                try:
                    written = run_in_driver(self, ctx, inputs, rows, pinned, ts_ms, stats,
                                            resumed=resumed)
                    versions, stats.path = {**pinned, **written}, "driver"
                except Unsupported:
                    pass  # before anything was written: the Spark path runs the batch
                except Exception as e:  # noqa: BLE001 - only this one is taken, below
                    if not _result_too_large(e):
                        raise
                    # The batch's rows outgrow what the driver may collect (a Spark call
                    # of the driver path, before anything was written): the Spark path
                    # writes them from executors.
            if versions is None:
                if large and self.progress:  # its line comes when it is committed
                    self.progress(f"[{self.name}] running batch {batch} as Spark jobs: more "
                                  f"than --driver-rows ({self.driver_rows:,}) rows or "
                                  f"{DRIVER_BYTES >> 20} MiB in (or a remote input, not "
                                  "counted ahead)")
                observed = read_inputs(self, ctx, inputs, stats)
                versions = self.spark_batch(ctx, pinned, ts_ms, stats, resumed=resumed)
                settle_inputs(observed, stats, ctx.observed)
        finally:
            ctx.release()
            stats.spark_jobs = jobs.stop()
        stats.seconds = time.monotonic() - started
        free_jvm_objects()
        log.append(batch, "commit", {"versions": versions, "stats": stats.to_json(),
                                     "fingerprint": self.fingerprint,
                                     "state_format": STATE_FORMAT,
                                     "watermarks": stats.watermarks,
                                     "watermark": stats.watermark}, ts_ms)
        commit_kafka_offsets(self, inputs)
        if batch % MAINTENANCE_EVERY == MAINTENANCE_EVERY - 1:
            self.maintain()
        if self.progress:
            self.progress(stats.line())
        stats.sinks = self.publish()
        return stats

    def driver_holds(self, state_log: Callable[[str], list], pinned: dict[str, int | None]
                     ) -> bool:
        """Whether the driver may hold the batch's state (``driver.held_rows``: at most
        ``driver_state_rows``); if not, what the run held there is dropped, and the Spark
        path runs the batch."""
        held = held_rows(self, state_log, pinned, self.memo)
        if held is not None and held <= self.driver_state_rows:
            return True
        forget_held(self.memo)
        if self.progress and not self.state_too_large:
            size = "of unknown size" if held is None else f"of {held:,} rows"
            self.progress(f"[{self.name}] state {size}, more than the driver holds "
                          f"(driver_state_rows {self.driver_state_rows:,}): its batches run "
                          "as Spark jobs")
        self.state_too_large = True
        return False

    def spark_batch(self, ctx: BatchContext, pinned: dict[str, int | None], ts_ms: int,
                    stats: BatchStats, *, resumed: bool) -> dict[str, int | None]:
        """Run the batch's operators and writes as Spark jobs; the new table versions."""
        plan = self.table.physical
        picked = picked_columns(plan.root)
        if picked is not None and colocated(self, resumed=resumed) and \
                not appends_current(self, pinned):
            ctx.sink = Sink(picked[0], plan.root.columns, picked[1], plan.pk,
                            lambda rows: table_writer(self, ctx.batch, ts_ms, pinned, rows))
        counted = self.cache_counts.value
        delta = evaluate(plan.root, ctx)
        events = encode(self, ctx, delta, ts_ms, pinned, resumed=resumed)
        written = write_batch(self, ctx, events, pinned, ts_ms, resumed=resumed)
        now = self.cache_counts.value
        stats.cached_buckets = (now[0] - counted[0], now[1] - counted[1])
        versions = {**pinned, **written.versions}
        versions["current"] = update_current(self, ctx.batch, events, written, pinned,
                                             resumed=resumed)
        stats.events = events.counts(ctx.observed)
        return versions

    def expired_through(self, watermark: int | None, ttl: int) -> int | None:
        """``state_ttl``: the last batch whose changes the watermark has left ``ttl``
        behind (each batch's own watermark stands for the time of its changes)."""
        if watermark is None:
            return None
        cut = None
        for b in sorted(self.log.commits):
            mark = (self.log.commit_payload(b) or {}).get("watermark")
            if mark is not None and mark + ttl <= watermark:
                cut = b
        return cut

    def maintain(self) -> None:
        """Delete state files older than the last commit and compact the batch log.

        Safe right after a commit: the next batch reads exactly the versions just recorded.
        """
        store, lay = self.env.store, self.layout
        for t in self.table.physical.state_tables:
            store.compact(lay.state(self.name, t), rewrite=False)
        store.compact(lay.current(self.name), rewrite=False)
        store.compact(lay.log(self.name), rewrite=True)
        for sink in self.sinks:
            store.compact(lay.log(sink.sink.name), rewrite=True)

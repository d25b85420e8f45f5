"""One streaming table's micro-batches, exactly once.

Batch N is a deterministic function of (its inputs, the state committed by N-1):
1. an *intent* record with N's inputs is written to the table's batch log before any work
   (a restarted run redoes a pending intent with the same inputs and timestamp);
2. operators read state pinned to the versions recorded by N-1's *commit* record;
3. every Delta write for N carries the app transaction (app_id, N) and is skipped when the
   table already has it, so a half-finished attempt only adds what is missing;
4. a *commit* record with the new table versions and the batch statistics closes N.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any, Callable

from octo_platform.errors import RunError
from octo_platform.logical.plan import quote
from octo_platform.physical.plan import PSource
from octo_platform.project import CompiledTable, Project
from octo_platform.runtime.columns import BUCKET, WEIGHT
from octo_platform.runtime.offsets import BatchLog, InputSpec, Store, source_key
from octo_platform.runtime.operators import (
    BatchContext,
    bucket_sql,
    consolidate,
    evaluate,
    sql_expr,
)
from octo_platform.runtime.state_log import STATE_FORMAT
from octo_platform.runtime.writes import Output, Written, write_outputs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Layout", "ScratchLayout", "Environment", "BatchStats", "Pipeline", "input_specs",
           "RECOMPUTED"]

DEFAULT_BUCKETS = 8
ALL_BUCKETS_BYTES = 1 << 20  # input size from which a batch is assumed to touch every bucket
MAINTENANCE_EVERY = 25  # batches between vacuuming state and compacting the batch log
RECOMPUTED = "recompute"  # key of a batch-log intent that publishes a recomputation
_CB = "_cb"  # an event's bucket in the current-state table (reported, not written)


@dataclass(frozen=True)
class Layout:
    """Where each table lives under the warehouse (documented in README.md, "The warehouse")."""

    warehouse: str

    def changelog(self, table: str) -> str:
        return f"{self.warehouse}/{table}"

    def current(self, table: str) -> str:
        return f"{self.warehouse}/_current/{table}"

    def dead_letters(self, table: str) -> str:
        return f"{self.warehouse}/_dead_letters/{table}"

    def internal(self, table: str) -> str:
        return f"{self.warehouse}/_octo/{table}"

    def log(self, table: str) -> str:
        return f"{self.internal(table)}/log"

    def state(self, table: str, operator: str) -> str:
        return f"{self.internal(table)}/state/{operator}"


@dataclass(frozen=True)
class ScratchLayout(Layout):
    """Where a recomputation of ``table`` writes (a scratch warehouse under the live table's
    internal folder); every other table is read where ``live`` keeps it."""

    live: Layout = Layout("")
    table: str = ""

    @classmethod
    def for_batch(cls, live: Layout, table: str, batch: int) -> ScratchLayout:
        return cls(f"{live.internal(table)}/recompute/{batch}", live, table)

    def changelog(self, table: str) -> str:
        if table.lower() == self.table.lower():
            return super().changelog(table)
        return self.live.changelog(table)


@dataclass(frozen=True)
class Environment:
    """The pluggable edges: Delta IO and connectors (wired in ``octo_platform.wiring``)."""

    store: Store
    list_files: Callable[[str], list[str]]
    read_files: Callable[..., Any]
    file_source: Callable[..., Any]
    delta_source: Callable[..., Any]
    decode_changelog: Callable[[DataFrame, tuple[str, ...]], DataFrame]
    encode_changelog: Callable[..., DataFrame]
    encode_keyed: Callable[..., DataFrame]


@dataclass
class BatchStats:
    table: str
    batch: int
    rows_in: int = 0
    events: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    seconds: float = 0.0
    spark_jobs: int = 0  # Spark jobs the batch ran (its fixed cost is mostly these)
    skipped: bool = False

    def line(self) -> str:
        ops = " ".join(f"{op}={self.events.get(op, 0)}" for op in ("c", "u", "d"))
        return (f"[{self.table}] batch {self.batch}: {self.rows_in} rows in, events {ops}, "
                f"{self.dead_letters} dead letters, {self.seconds:.2f}s, "
                f"{self.spark_jobs} Spark jobs")

    def to_json(self) -> dict[str, Any]:
        return {"rows_in": self.rows_in, "events": self.events,
                "dead_letters": self.dead_letters, "seconds": round(self.seconds, 3),
                "spark_jobs": self.spark_jobs}


def input_specs(project: Project, table: CompiledTable, layout: Layout) -> tuple[InputSpec, ...]:
    """Where each input of ``table`` comes from, in a form the offsets source can pickle."""
    specs = []
    for src in table.physical.sources:
        key = source_key(src.kind, src.name)
        if src.kind == "table":
            specs.append(InputSpec(key, "changelog",
                                   layout.changelog(project.table(src.name).name)))
            continue
        sdef = project.source(src.name)
        if sdef.connector == "delta":
            specs.append(InputSpec(key, "delta", project.source_path(sdef)))
        else:
            specs.append(InputSpec(key, "files", project.source_path(sdef),
                                   int(sdef.options.get("max_files_per_batch", "1000"))))
    return tuple(specs)


class Pipeline:
    """Runs the micro-batches of one streaming table against a warehouse."""

    def __init__(self, spark: SparkSession, project: Project, table: CompiledTable,
                 layout: Layout, env: Environment, *, buckets: int = DEFAULT_BUCKETS,
                 progress: Callable[[str], None] | None = print,
                 check_plan: bool = True) -> None:
        self.spark = spark
        self.project = project
        self.table = table
        self.layout = layout
        self.env = env
        self.buckets = buckets
        self.progress = progress
        self.name = table.name
        self.fingerprint = f"{table.physical.fingerprint}-b{buckets}"
        self.memo: dict[str, Any] = {}
        self.inputs = input_specs(project, table, layout)
        self.log = BatchLog(env.store, layout.log(self.name))
        self.delta_sources = {
            src.name.lower(): env.delta_source(sdef, project.source_path(sdef))
            for src in table.physical.sources
            if src.kind == "source" and (sdef := project.source(src.name)).connector == "delta"}
        for name, dsrc in self.delta_sources.items():  # the table and its columns exist
            dsrc.check(self.name, last_read=self.log.last_version(source_key("source", name)))
        if check_plan:
            self.check_fingerprint()

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
        if batch in log.commits:
            return BatchStats(self.name, batch, skipped=True)
        if batch != log.last_committed + 1:
            raise RunError(f"{self.name}: batch {batch} follows {log.last_committed}")
        pending = log.pending()
        if pending is not None:
            _, inputs, ts_ms = pending
        else:
            ts_ms = int(time.time() * 1000)
            log.append(batch, "intent", inputs, ts_ms)
        previous = log.commit_payload(batch - 1) or {}
        pinned: dict[str, int | None] = previous.get("versions", {})
        stats = BatchStats(self.name, batch)
        if RECOMPUTED in inputs:
            return self.publish_recomputed(batch, inputs[RECOMPUTED], pinned, ts_ms, stats,
                                           started)
        store = self.env.store
        ctx = BatchContext(
            self.spark, batch, self.buckets, {},
            lambda t, b: store.files(self.layout.state(self.name, t), pinned.get(f"state/{t}"), b),
            state_log=lambda t: store.data_files(self.layout.state(self.name, t),
                                                 pinned.get(f"state/{t}")),
            memo=self.memo)
        jobs = _JobCounter(self.spark, f"octo {self.name} batch {batch}")
        try:
            observed = self.read_inputs(ctx, inputs, stats)
            delta = evaluate(self.table.physical.root, ctx)
            events = self.sink(ctx, delta, ts_ms)
            written = self.commit_writes(ctx, events, pinned)
            versions = {**pinned, **written.versions}
            versions["current"] = self.update_current(batch, events, written, pinned)
            stats.events = events.counts()
            self.write_dead_letters(self.settle_inputs(observed, stats), batch, ts_ms, stats)
        finally:
            ctx.release()
            stats.spark_jobs = jobs.stop()
        stats.seconds = time.monotonic() - started
        log.append(batch, "commit", {"versions": versions, "stats": stats.to_json(),
                                     "fingerprint": self.fingerprint,
                                     "state_format": STATE_FORMAT}, ts_ms)
        if batch % MAINTENANCE_EVERY == MAINTENANCE_EVERY - 1:
            self.maintain()
        if self.progress:
            self.progress(stats.line())
        return stats

    # -- a recomputation (backfill, see ``octo_platform.runtime.recompute``) ----------------
    def recompute_diff(self, scratch: Layout, pinned: dict[str, int | None]) -> DataFrame:
        """Weighted rows turning the current table (as of ``pinned``) into ``scratch``'s."""
        cols = [quote(c) for c in self.table.physical.root.columns]
        w = quote(WEIGHT)

        def rows(layout: Layout, version: int | None, weight: int) -> DataFrame:
            path = layout.current(self.name)
            files = self.env.store.files(path, version)
            df = (self.spark.read.parquet(*files) if files else
                  self.spark.createDataFrame(self.env.store.arrow_schema(path).empty_table()))
            return df.selectExpr(*cols, f"CAST({weight} AS BIGINT) AS {w}")

        old = rows(self.layout, pinned.get("current"), -1)
        new = rows(scratch, self.env.store.version(scratch.current(self.name)), 1)
        return consolidate(old.unionByName(new), cols)

    def publish_recomputed(self, batch: int, spec: dict[str, Any],
                           pinned: dict[str, int | None], ts_ms: int, stats: BatchStats,
                           started: float) -> BatchStats:
        """Batch ``batch`` of a recomputation: the difference between the current table and
        the recomputed one as change events; state and current table become the recomputed
        ones. Every write is idempotent, so a crash in between is finished by the next run."""
        scratch = ScratchLayout.for_batch(self.layout, self.name, batch)
        store, plan = self.env.store, self.table.physical
        if store.version(scratch.current(self.name)) is None:
            raise RunError(f"{self.name}: batch {batch} publishes a recomputation whose result "
                           f"is gone ({scratch.warehouse} was deleted); run `octo refresh "
                           f"{self.name}` to rebuild the table from all input")
        events = _Events(self.env.encode_changelog(
            self.recompute_diff(scratch, pinned), plan.root.columns, plan.pk,
            table=self.name, batch=batch, ts_ms=ts_ms))
        outputs = [Output("changelog", self.layout.changelog(self.name), events.rows)]
        copies = {f"state/{t}": (scratch.state(self.name, t), self.layout.state(self.name, t))
                  for t in plan.state_tables}
        copies["current"] = (scratch.current(self.name), self.layout.current(self.name))
        for key, (src, dst) in copies.items():
            if store.version(src) is None and store.version(dst) is None:
                continue
            rows, bucketed = self.read_whole(src if store.version(src) is not None else dst)
            if store.version(src) is None:
                rows = rows.limit(0)
            outputs.append(Output(key, dst, rows, bucketed=bucketed, replace="all",
                                  prefix="base"))
        versions = {**pinned, **write_outputs(outputs, batch=batch, store=store).versions}
        stats.events = events.counts()
        stats.seconds = time.monotonic() - started
        self.memo.clear()
        self.log.append(batch, "commit", {"versions": versions, "stats": stats.to_json(),
                                          "fingerprint": self.fingerprint,
                                          "state_format": STATE_FORMAT,
                                          RECOMPUTED: spec}, ts_ms)
        if "://" not in scratch.warehouse:
            shutil.rmtree(scratch.warehouse, ignore_errors=True)
        if self.progress:
            self.progress(stats.line() + f" (recomputed: {spec.get('what', 'all')})")
        return stats

    def read_whole(self, path: str) -> tuple[DataFrame, bool]:
        """The latest version of a table and whether it is ``_bucket``-partitioned (the
        column is then included, taken from the files' partition folders)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        store = self.env.store
        schema = store.arrow_schema(path)
        bucketed = BUCKET in schema.names
        files = store.files(path, store.version(path))
        if not files:
            return self.spark.createDataFrame(schema.empty_table()), bucketed
        if not bucketed:
            return self.spark.read.schema(from_arrow_schema(schema)).parquet(*files), False
        data = from_arrow_schema(schema.remove(schema.get_field_index(BUCKET)))
        bucket = f"CAST(regexp_extract(_metadata.file_path, '{BUCKET}=([0-9]+)', 1) AS INT)"
        return self.spark.read.schema(data).parquet(*files).selectExpr(
            *[quote(n) for n in data.names], f"{bucket} AS {BUCKET}"), True

    def maintain(self) -> None:
        """Delete state files older than the last commit and compact the batch log.

        Safe right after a commit: the next batch reads exactly the versions just recorded.
        """
        store, lay = self.env.store, self.layout
        for t in self.table.physical.state_tables:
            store.compact(lay.state(self.name, t), rewrite=False)
        store.compact(lay.current(self.name), rewrite=False)
        store.compact(lay.log(self.name), rewrite=True)

    def read_inputs(self, ctx: BatchContext, inputs: dict[str, Any],
                    stats: BatchStats) -> list[_Observed]:
        """Register each source's weighted rows in ``ctx``.

        File records are not read here: their good/bad counts are observed while the batch's
        first job runs (``settle_inputs``), which saves a job and a cache per batch.
        """
        observed: list[_Observed] = []
        size = 0
        for src in self.table.physical.sources:
            got = inputs.get(source_key(src.kind, src.name))
            dsrc = self.delta_sources.get(src.name.lower()) if src.kind == "source" else None
            if src.kind == "table" or dsrc is not None:
                if dsrc is None:
                    rows, files = self.upstream_changes(src, got)
                    size += _local_bytes(files)
                else:
                    rows = dsrc.changes(self.spark, got, table=self.name)
                    size += ALL_BUCKETS_BYTES if got and got["from"] is None else 0
                if got:
                    observed.append(_Observed.watch(src.name, rows, "count(1) AS good",
                                                    "0L AS bad"))
                    rows = observed[-1].records
                ctx.inputs[src.name.lower()] = rows
                continue
            sdef = self.project.source(src.name)
            fsrc = self.env.file_source(sdef, self.project.source_path(sdef))
            files = (got or {}).get("files", [])
            size += sum(os.path.getsize(f) for f in files if os.path.exists(f))
            parsed = self.env.read_files(self.spark, fsrc, files)
            records = parsed.records
            if sdef.format == "csv":
                # Spark refuses raw-CSV queries that read only the corrupt-record column.
                records = ctx.persist(records)
            observed.append(_Observed.watch(src.name, records,
                                            "count_if(_reason IS NULL) AS good",
                                            "count_if(_reason IS NOT NULL) AS bad"))
            records = observed[-1].records
            ctx.inputs[src.name.lower()] = parsed.rows(records.filter("_reason IS NULL"))
        # Any superset of the touched buckets is correct; a large batch touches them all.
        ctx.all_buckets = size > ALL_BUCKETS_BYTES
        return observed

    def settle_inputs(self, observed: list[_Observed], stats: BatchStats) -> list[DataFrame]:
        """Good/bad record counts (observed while the batch's write job read the inputs) and
        the dead-letter frames."""
        dead: list[DataFrame] = []
        for o in observed:
            counts = o.counts()
            stats.rows_in += counts["good"]
            stats.dead_letters += counts["bad"]
            if counts["bad"]:
                dead.append(o.records.filter("_reason IS NOT NULL").selectExpr(
                    "_raw AS raw", "_file AS source_file", f"'{o.source}' AS source",
                    "_reason AS reason"))
        return dead

    def upstream_changes(self, src: PSource, got: dict[str, Any] | None
                         ) -> tuple[DataFrame, list[str]]:
        """Weighted rows of the upstream table's change events between two versions, and
        the changelog files they come from."""
        upstream = self.project.table(src.name)
        path = self.layout.changelog(upstream.name)
        files = self.env.store.added_files(path, got["from"], got["to"]) if got else []
        if files:
            events = self.spark.read.parquet(*files)
        else:
            schema = self.env.store.arrow_schema(path)
            if schema is None:
                raise RunError(f"{self.name}: upstream table {upstream.name!r} has no changelog "
                               "yet; run it first")
            events = self.spark.createDataFrame(schema.empty_table())  # one empty chunk
        return self.env.decode_changelog(events, src.columns), files

    def sink(self, ctx: BatchContext, delta: DataFrame, ts_ms: int) -> _Events:
        """Δ encoded as change events, each with the ``_bucket`` of its row in the
        current-state table (bucketed by primary key, or the whole row) as ``_cb``."""
        plan = self.table.physical
        columns = plan.root.columns
        if plan.keyed_changes:
            events = self.env.encode_keyed(delta, columns, plan.pk, table=self.name,
                                           batch=ctx.batch, ts_ms=ts_ms)
        else:
            events = self.env.encode_changelog(
                consolidate(delta, [quote(c) for c in columns]), columns, plan.pk,
                table=self.name, batch=ctx.batch, ts_ms=ts_ms)
        return _Events(events.selectExpr("*", f"{self.event_bucket()} AS {_CB}"))

    def current_key(self) -> list[str]:
        plan = self.table.physical
        return list(plan.pk) if plan.pk is not None else list(plan.root.columns)

    def update_current(self, batch: int, events: _Events, written: Written,
                       pinned: dict[str, int | None]) -> int | None:
        """Rewrite the current-state buckets this batch's events fall in: their old rows
        plus the events (read back from the changelog files the batch added). The new
        version of the current-state table."""
        store, path = self.env.store, self.layout.current(self.name)
        changelog = self.layout.changelog(self.name)
        files = store.added_files(changelog, pinned.get("changelog"),
                                  written.versions["changelog"]) \
            if written.versions.get("changelog") is not None else []
        if "changelog" in written.wrote:
            touched = written.reported.get("changelog", set())
        else:  # an earlier attempt committed the events: find their buckets again
            touched = {r[0] for r in self.spark.read.parquet(*files).selectExpr(
                self.event_bucket()).distinct().collect()} if files else set()
        if not touched and pinned.get("current") is not None:
            return pinned["current"]
        cols = [quote(c) for c in self.table.physical.root.columns]
        w = quote(WEIGHT)
        image = events.unobserved.schema["after"].dataType
        changes = self.env.decode_changelog(
            self.spark.read.schema(events.unobserved.drop(_CB).schema).parquet(*files)
            if files else self.spark.createDataFrame([], events.unobserved.drop(_CB).schema),
            self.table.physical.root.columns)
        old_files = store.files(path, pinned.get("current"), touched)
        old = (self.spark.read.schema(image).parquet(*old_files) if old_files
               else self.spark.createDataFrame([], image))
        merged = (old.selectExpr(*cols, f"CAST(1 AS BIGINT) AS {w}").unionByName(changes)
                  .groupBy(*cols).agg(_sum_weight()).filter(f"{w} > 0"))
        rows = merged.selectExpr(*cols, f"explode(sequence(1, CAST({w} AS INT))) AS _i") \
            .selectExpr(*cols, f"{bucket_sql(self.current_key(), self.buckets)} AS {BUCKET}")
        return write_outputs([Output("current", path, rows, bucketed=True, replace=touched)],
                             batch=batch, store=store).versions["current"]

    def event_bucket(self) -> str:
        """SQL of a change event's bucket in the current-state table (as ``bucket_sql``)."""
        key = self.current_key()
        if not key:
            return "0"
        ref = ", ".join(f"coalesce(after.{quote(k)}, before.{quote(k)})" for k in key)
        return f"pmod(hash({ref}), {self.buckets})"

    def write_dead_letters(self, dead: list[DataFrame], batch: int, ts_ms: int,
                           stats: BatchStats) -> None:
        """Append the batch's bad records (if any) to the table's dead-letter table."""
        if not dead:
            return
        name = self.name.replace("'", "''")
        rows = reduce(lambda a, b: a.unionByName(b), dead).selectExpr(
            "raw", "source_file", "source", "reason", f"'{name}' AS table",
            f"CAST({batch} AS BIGINT) AS batch_id", f"CAST({ts_ms} AS BIGINT) AS ts_ms")
        write_outputs([Output("dead_letters", self.layout.dead_letters(self.name), rows)],
                      batch=batch, store=self.env.store)

    def commit_writes(self, ctx: BatchContext, events: _Events,
                      pinned: dict[str, int | None]) -> Written:
        """Write the batch's changelog and operator state in one Spark job and commit each
        table once (idempotently)."""
        lay = self.layout
        outputs = [Output(f"state/{w.table}", lay.state(self.name, w.table), w.data,
                          bucketed=w.buckets is not None,
                          replace=None if w.buckets is None else set(w.buckets),
                          remove=w.remove, prefix=w.prefix)
                   for w in ctx.writes
                   if w.buckets != [] or pinned.get(f"state/{w.table}") is None]
        outputs.append(Output("changelog", lay.changelog(self.name), events.rows, report=_CB))
        return write_outputs(outputs, batch=ctx.batch, store=self.env.store)


def _sum_weight():
    return sql_expr(f"sum({quote(WEIGHT)}) AS {quote(WEIGHT)}")


class _JobCounter:
    """Counts the Spark jobs this thread starts (through a job group) until ``stop``."""

    def __init__(self, spark: SparkSession, what: str) -> None:
        self.sc = spark.sparkContext
        self.group = f"{what} {uuid.uuid4().hex[:8]}"
        self.sc.setJobGroup(self.group, what)

    def stop(self) -> int:
        jobs = len(self.sc.statusTracker().getJobIdsForGroup(self.group))
        self.sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
        return jobs


def _local_bytes(uris: list[str]) -> int:
    """Bytes of local files (a remote one counts as large: its batch touches every bucket)."""
    total = 0
    for uri in uris:
        path = uri.removeprefix("file://")
        total += os.path.getsize(path) if "://" not in path and os.path.exists(path) \
            else ALL_BUCKETS_BYTES
    return total


def _observe(df: DataFrame, *exprs: str) -> tuple[DataFrame, Any]:
    from pyspark.sql import Observation

    obs = Observation()
    return df.observe(obs, *[sql_expr(e) for e in exprs]), obs


def _metrics(observation: Any, timeout: float = 5.0) -> dict[str, Any] | None:
    """An observation's metrics, or None if no job has produced them within ``timeout``
    (``Observation.get`` itself would wait forever)."""
    got: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: got.update(observation.get), daemon=True)
    waiter.start()
    waiter.join(timeout)
    return got or None


@dataclass
class _Observed:
    """An input's records, with good/bad counts observed by the job that reads them."""

    source: str
    observation: Any
    records: DataFrame
    exprs: tuple[str, ...]

    @classmethod
    def watch(cls, source: str, records: DataFrame, *exprs: str) -> _Observed:
        observed, observation = _observe(records, *exprs)
        return cls(source, observation, observed, exprs)

    def counts(self) -> dict[str, int]:
        got = _metrics(self.observation)
        if got is None:  # no job read the records: count them with a job of our own
            got = self.records.selectExpr(*self.exprs).collect()[0].asDict()
        return {"good": int(got["good"] or 0), "bad": int(got["bad"] or 0)}


class _Events:
    """A batch's change events, counted by op while the write job writes them."""

    EXPRS = tuple(f"count_if(op = '{op}') AS {op}" for op in ("c", "u", "d"))

    def __init__(self, events: DataFrame) -> None:
        self.unobserved = events
        self.rows, self.observation = _observe(events, *self.EXPRS)

    def counts(self) -> dict[str, int]:
        got = _metrics(self.observation)
        if got is None:  # not written by this attempt (an earlier one committed them)
            got = self.unobserved.selectExpr(*self.EXPRS).collect()[0].asDict()
        return {op: int(n) for op, n in got.items() if n}

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
import time
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any, Callable

from octo_platform.errors import RunError
from octo_platform.logical.plan import quote
from octo_platform.physical.plan import PSource, PStateless
from octo_platform.project import CompiledTable, Project
from octo_platform.runtime.columns import BUCKET, WEIGHT
from octo_platform.runtime.offsets import BatchLog, InputSpec, Store, source_key
from octo_platform.runtime.operators import (
    BatchContext,
    StagedWrite,
    apply_steps,
    bucket_sql,
    consolidate,
    evaluate,
    sql_expr,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Layout", "ScratchLayout", "Environment", "BatchStats", "Pipeline", "input_specs",
           "RECOMPUTED"]

APP_ID = "octo"
DEFAULT_BUCKETS = 8
ALL_BUCKETS_BYTES = 1 << 20  # input size from which a batch is assumed to touch every bucket
MAINTENANCE_EVERY = 25  # batches between vacuuming state and compacting the batch log
RECOMPUTED = "recompute"  # key of a batch-log intent that publishes a recomputation


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
    skipped: bool = False

    def line(self) -> str:
        ops = " ".join(f"{op}={self.events.get(op, 0)}" for op in ("c", "u", "d"))
        return (f"[{self.table}] batch {self.batch}: {self.rows_in} rows in, events {ops}, "
                f"{self.dead_letters} dead letters, {self.seconds:.2f}s")

    def to_json(self) -> dict[str, Any]:
        return {"rows_in": self.rows_in, "events": self.events,
                "dead_letters": self.dead_letters, "seconds": round(self.seconds, 3)}


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
        ctx = BatchContext(self.spark, batch, self.buckets, {}, lambda t, b: self.env.store.files(
            self.layout.state(self.name, t), pinned.get(f"state/{t}"), b), memo=self.memo)
        try:
            observed = self.read_inputs(ctx, inputs, stats)
            delta = evaluate(self.table.physical.root, ctx)
            events, current = self.sink(ctx, delta, pinned, ts_ms, stats)
            dead = self.settle_inputs(observed, stats)
            dead_rows = self.dead_letters(dead, batch, ts_ms)
            stats.dead_letters = 0 if dead_rows is None else dead_rows.num_rows
            versions = self.commit_writes(ctx, current, events, dead_rows, pinned)
        finally:
            ctx.release()
        stats.seconds = time.monotonic() - started
        log.append(batch, "commit", {"versions": versions, "stats": stats.to_json(),
                                     "fingerprint": self.fingerprint}, ts_ms)
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
        diff = self.recompute_diff(scratch, pinned).persist()
        try:
            events = self.env.encode_changelog(diff, plan.root.columns, plan.pk,
                                               table=self.name, batch=batch,
                                               ts_ms=ts_ms).toArrow()
        finally:
            diff.unpersist()
        stats.events = _op_counts(events)
        versions = dict(pinned)
        copies = {f"state/{t}": (scratch.state(self.name, t), self.layout.state(self.name, t))
                  for t in plan.state_tables}
        copies["current"] = (scratch.current(self.name), self.layout.current(self.name))
        for key, (src, dst) in copies.items():
            data = store.read(src)
            if data is None:
                schema = store.arrow_schema(dst)
                if schema is None:
                    continue
                data = schema.empty_table()
            versions[key] = store.write(dst, data, app_id=APP_ID, batch=batch,
                                        mode="overwrite", partition_by=[BUCKET])
        if len(events):
            versions["changelog"] = store.write(self.layout.changelog(self.name), events,
                                                app_id=APP_ID, batch=batch)
        stats.seconds = time.monotonic() - started
        self.memo.clear()
        self.log.append(batch, "commit", {"versions": versions, "stats": stats.to_json(),
                                          "fingerprint": self.fingerprint,
                                          RECOMPUTED: spec}, ts_ms)
        if "://" not in scratch.warehouse:
            shutil.rmtree(scratch.warehouse, ignore_errors=True)
        if self.progress:
            self.progress(stats.line() + f" (recomputed: {spec.get('what', 'all')})")
        return stats

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
                rows = (self.upstream_changes(src, got) if dsrc is None
                        else dsrc.changes(self.spark, got, table=self.name))
                if got:  # a Delta table can be large; count only what we read
                    rows = ctx.persist(rows)
                    n = rows.count()
                    stats.rows_in += n
                    size += n * 100
                ctx.inputs[src.name.lower()] = rows
                continue
            from pyspark.sql import Observation

            sdef = self.project.source(src.name)
            fsrc = self.env.file_source(sdef, self.project.source_path(sdef))
            files = (got or {}).get("files", [])
            size += sum(os.path.getsize(f) for f in files if os.path.exists(f))
            parsed = self.env.read_files(self.spark, fsrc, files)
            records = parsed.records
            if sdef.format == "csv":
                # Spark refuses raw-CSV queries that read only the corrupt-record column.
                records = ctx.persist(records)
            obs = Observation()
            records = records.observe(obs, sql_expr("count_if(_reason IS NULL) AS good"),
                                      sql_expr("count_if(_reason IS NOT NULL) AS bad"))
            observed.append(_Observed(src.name, obs, records))
            ctx.inputs[src.name.lower()] = parsed.rows(records.filter("_reason IS NULL"))
        # Any superset of the touched buckets is correct; a large batch touches them all.
        ctx.all_buckets = size > ALL_BUCKETS_BYTES
        return observed

    def settle_inputs(self, observed: list[_Observed], stats: BatchStats) -> list[DataFrame]:
        """Good/bad record counts (observed during the batch) and the dead-letter frames."""
        dead: list[DataFrame] = []
        for o in observed:
            counts = o.counts()
            stats.rows_in += counts["good"]
            if counts["bad"]:
                dead.append(o.records.filter("_reason IS NOT NULL").selectExpr(
                    "_raw AS raw", "_file AS source_file", f"'{o.source}' AS source",
                    "_reason AS reason"))
        return dead

    def upstream_changes(self, src: PSource, got: dict[str, Any] | None) -> DataFrame:
        """Weighted rows of the upstream table's change events between two versions."""
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
        return self.env.decode_changelog(events, src.columns)

    def sink(self, ctx: BatchContext, delta: DataFrame, pinned: dict[str, int | None],
             ts_ms: int, stats: BatchStats) -> tuple[pa.Table, list[StagedWrite]]:
        """Encode Δ as change events; stage the update of the current-state table."""
        import pyarrow.compute as pc

        plan = self.table.physical
        columns = plan.root.columns
        if plan.keyed_changes:
            events = self.env.encode_keyed(delta, columns, plan.pk, table=self.name,
                                           batch=ctx.batch, ts_ms=ts_ms).toArrow()
            current = self.current_from_aggregate(ctx, delta, pinned)
        else:
            cons = ctx.persist(consolidate(delta, [quote(c) for c in columns]))
            encoded = self.env.encode_changelog(cons, columns, plan.pk, table=self.name,
                                                batch=ctx.batch, ts_ms=ts_ms)
            # The current-state table is bucketed by primary key (or the whole row); each
            # event's bucket rides along with the events so no extra job finds them.
            key = list(plan.pk) if plan.pk is not None else list(columns)
            ref = ", ".join(f"coalesce(after.{quote(k)}, before.{quote(k)})" for k in key)
            sb = f"pmod(hash({ref}), {self.buckets})" if key else "0"
            events = encoded.selectExpr("*", f"{sb} AS _sb").toArrow()
            touched = set(pc.unique(events.column("_sb")).to_pylist()) if len(events) else set()
            events = events.drop_columns(["_sb"])
            current = self.current_by_merge(cons, key, touched, pinned)
        stats.events = _op_counts(events)
        return events, current

    def current_from_aggregate(self, ctx: BatchContext, delta: DataFrame,
                               pinned: dict[str, int | None]) -> list[StagedWrite]:
        """Current rows of the touched buckets straight from the aggregate's new state."""
        node, steps = self.table.physical.root, ()
        if isinstance(node, PStateless):
            node, steps = node.input, node.steps
        rows, touched = ctx.results[node.id]
        if rows is None:
            if pinned.get("current") is not None:
                return []
            rows = self.spark.createDataFrame([], delta.drop(WEIGHT).schema) \
                .selectExpr("*", f"0 AS {BUCKET}")
        else:
            rows = apply_steps(rows, steps, BUCKET)
        cols = [quote(c) for c in self.table.physical.root.columns]
        return [StagedWrite("current", rows.selectExpr(*cols, BUCKET), touched)]

    def current_by_merge(self, cons: DataFrame, key: list[str], touched: set[int],
                         pinned: dict[str, int | None]) -> list[StagedWrite]:
        """Current rows of the touched buckets: old rows plus the consolidated Δ."""
        if not touched and pinned.get("current") is not None:
            return []
        cols = [quote(c) for c in self.table.physical.root.columns]
        w = quote(WEIGHT)
        schema = cons.drop(WEIGHT).schema
        files = self.env.store.files(self.layout.current(self.name), pinned.get("current"),
                                     touched)
        old = (self.spark.read.schema(schema).parquet(*files) if files
               else self.spark.createDataFrame([], schema))
        merged = (old.selectExpr("*", f"CAST(1 AS BIGINT) AS {w}").unionByName(cons)
                  .groupBy(*cols).agg(_sum_weight()).filter(f"{w} > 0"))
        rows = merged.selectExpr(*cols, f"explode(sequence(1, CAST({w} AS INT))) AS _i") \
            .selectExpr(*cols, f"{bucket_sql(key, self.buckets)} AS {BUCKET}")
        return [StagedWrite("current", rows, sorted(touched))]

    def dead_letters(self, dead: list[DataFrame], batch: int, ts_ms: int) -> pa.Table | None:
        if not dead:
            return None
        name = self.name.replace("'", "''")
        return reduce(lambda a, b: a.unionByName(b), dead).selectExpr(
            "raw", "source_file", "source", "reason", f"'{name}' AS table",
            f"CAST({batch} AS BIGINT) AS batch_id", f"CAST({ts_ms} AS BIGINT) AS ts_ms").toArrow()

    def commit_writes(self, ctx: BatchContext, current: list[StagedWrite], events: pa.Table,
                      dead: pa.Table | None,
                      pinned: dict[str, int | None]) -> dict[str, int | None]:
        """Write everything batch N produced, each write idempotent; the versions after N."""
        store, lay, batch = self.env.store, self.layout, ctx.batch
        versions = dict(pinned)
        for w in ctx.writes:
            versions[f"state/{w.table}"] = store.write(
                lay.state(self.name, w.table), w.data.toArrow(), app_id=APP_ID, batch=batch,
                partition_by=[BUCKET], buckets=w.buckets)
        for w in current:
            versions["current"] = store.write(
                lay.current(self.name), w.data.toArrow(), app_id=APP_ID, batch=batch,
                partition_by=[BUCKET], buckets=w.buckets or None, mode="overwrite")
        if dead is not None and dead.num_rows:
            store.write(lay.dead_letters(self.name), dead, app_id=APP_ID, batch=batch)
        if len(events) or pinned.get("changelog") is None:
            versions["changelog"] = store.write(lay.changelog(self.name), events,
                                                app_id=APP_ID, batch=batch)
        return versions


def _op_counts(events: pa.Table) -> dict[str, int]:
    """Change events per op (``c``/``u``/``d``) of a batch's encoded changelog."""
    import pyarrow.compute as pc

    counts = pc.value_counts(events.column("op")).to_pylist() if len(events) else []
    return {c["values"]: c["counts"] for c in counts}


def _sum_weight():
    return sql_expr(f"sum({quote(WEIGHT)}) AS {quote(WEIGHT)}")


@dataclass
class _Observed:
    """A file source's records, with good/bad counts observed by whichever job reads them."""

    source: str
    observation: Any
    records: DataFrame

    def counts(self) -> dict[str, int]:
        # Metrics arrive with the first job that read the records; if none did (or they
        # are late), count with a job of our own rather than wait forever.
        deadline = time.monotonic() + 2.0
        future = self.observation._jo.future()
        while not future.isCompleted() and time.monotonic() < deadline:
            time.sleep(0.01)
        if future.isCompleted():
            got = self.observation.get
            return {"good": int(got["good"] or 0), "bad": int(got["bad"] or 0)}
        row = self.records.selectExpr("count_if(_reason IS NULL) AS good",
                                      "count_if(_reason IS NOT NULL) AS bad").collect()[0]
        return {"good": int(row["good"]), "bad": int(row["bad"])}

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

import json
import time
from functools import reduce
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from octo_platform.errors import RunError
from octo_platform.logical.plan import quote
from octo_platform.physical.plan import PSource
from octo_platform.project import CompiledTable, Project
from octo_platform.runtime.columns import BUCKET, WEIGHT
from octo_platform.runtime.operators import BatchContext, StagedWrite, bucket_sql, evaluate

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Layout", "Environment", "BatchLog", "BatchStats", "Pipeline", "next_inputs"]

APP_ID = "octo"
DEFAULT_BUCKETS = 8


@dataclass(frozen=True)
class Layout:
    """Where each table lives under the warehouse (documented in docs/warehouse.md)."""

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


class Store(Protocol):
    """What the runtime needs from Delta (implemented by ``state.delta.DeltaStore``)."""

    def version(self, path: str) -> int | None: ...
    def committed(self, path: str, app_id: str) -> int: ...
    def files(self, path: str, version: int | None,
              partitions: set[int] | None = None) -> list[str]: ...
    def added_files(self, path: str, from_version: int | None, to_version: int) -> list[str]: ...
    def read(self, path: str, version: int | None = None) -> pa.Table | None: ...
    def arrow_schema(self, path: str) -> pa.Schema | None: ...
    def write(self, path: str, data: pa.Table, *, app_id: str, batch: int, mode: str = ...,
              partition_by: list[str] | None = None,
              buckets: list[int] | None = None) -> int | None: ...


@dataclass(frozen=True)
class Environment:
    """The pluggable edges: Delta IO and connectors (wired in ``octo_platform.wiring``)."""

    store: Store
    list_files: Callable[[str], list[str]]
    read_files: Callable[..., Any]
    file_source: Callable[..., Any]
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


class BatchLog:
    """The table's batch log (a small Delta table): intents and commits, one row each."""

    def __init__(self, store: Store, path: str) -> None:
        self.store = store
        self.path = path
        table = store.read(path)
        rows = table.to_pylist() if table is not None else []
        self.intents = {r["batch_id"]: r for r in rows if r["kind"] == "intent"}
        self.commits = {r["batch_id"]: r for r in rows if r["kind"] == "commit"}

    @property
    def last_committed(self) -> int:
        return max(self.commits, default=-1)

    def pending(self) -> tuple[int, dict[str, Any], int] | None:
        """(batch, inputs, ts_ms) of an intent without a commit: the batch to redo first."""
        nxt = self.last_committed + 1
        if nxt in self.intents:
            row = self.intents[nxt]
            return nxt, json.loads(row["payload"]), row["ts_ms"]
        return None

    def commit_payload(self, batch: int) -> dict[str, Any] | None:
        row = self.commits.get(batch)
        return json.loads(row["payload"]) if row else None

    def processed_files(self, source: str) -> set[str]:
        files: set[str] = set()
        for row in self.intents.values():
            files.update(json.loads(row["payload"]).get(source, {}).get("files", []))
        return files

    def last_version(self, table: str) -> int | None:
        for batch in sorted(self.intents, reverse=True):
            got = json.loads(self.intents[batch]["payload"]).get(table)
            if got is not None:
                return int(got["to"])
        return None

    def append(self, batch: int, kind: str, payload: dict[str, Any], ts_ms: int) -> None:
        import pyarrow as pa

        row = pa.table({"batch_id": pa.array([batch], pa.int64()),
                        "kind": pa.array([kind]), "ts_ms": pa.array([ts_ms], pa.int64()),
                        "payload": pa.array([json.dumps(payload, sort_keys=True)])})
        self.store.write(self.path, row, app_id=kind, batch=batch)
        (self.intents if kind == "intent" else self.commits)[batch] = row.to_pylist()[0]


def _source_key(src: PSource) -> str:
    return f"{src.kind}:{src.name.lower()}"


def next_inputs(project: Project, table: CompiledTable, layout: Layout, env: Environment, *,
                target: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]] | None:
    """The next batch to run and its inputs, or None when nothing new is available.

    ``target`` (files / versions visible when an ``availableNow`` run started) caps what is
    admitted so a catch-up run ends even while input keeps arriving.
    """
    log = BatchLog(env.store, layout.log(table.name))
    pending = log.pending()
    if pending is not None:
        return pending[0], pending[1]
    inputs: dict[str, Any] = {}
    visible = target or available(project, table, layout, env)
    for src in table.physical.sources:
        key = _source_key(src)
        if src.kind == "source":
            done = log.processed_files(key)
            limit = int(project.source(src.name).options.get("max_files_per_batch", "1000"))
            new = [f for f in visible.get(key, []) if f not in done][:limit]
            if new:
                inputs[key] = {"files": new}
        else:
            to = visible.get(key)
            prev = log.last_version(key)
            if to is not None and (prev is None or to > prev):
                inputs[key] = {"from": prev, "to": to}
    if not inputs:
        return None
    return log.last_committed + 1, inputs


def available(project: Project, table: CompiledTable, layout: Layout,
              env: Environment) -> dict[str, Any]:
    """Everything each input has right now: file lists and upstream changelog versions."""
    seen: dict[str, Any] = {}
    for src in table.physical.sources:
        if src.kind == "source":
            seen[_source_key(src)] = env.list_files(project.source_path(project.source(src.name)))
        else:
            seen[_source_key(src)] = env.store.version(layout.changelog(project.table(src.name).name))
    return seen


class Pipeline:
    """Runs the micro-batches of one streaming table against a warehouse."""

    def __init__(self, spark: SparkSession, project: Project, table: CompiledTable,
                 layout: Layout, env: Environment, *, buckets: int = DEFAULT_BUCKETS,
                 progress: Callable[[str], None] | None = print) -> None:
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
        self.check_fingerprint()

    def check_fingerprint(self) -> None:
        log = BatchLog(self.env.store, self.layout.log(self.name))
        last = log.commit_payload(log.last_committed)
        if last is not None and last.get("fingerprint") != self.fingerprint:
            raise RunError(
                f"the query of streaming table {self.name!r} changed since its state was "
                f"written (plan {last.get('fingerprint')} -> {self.fingerprint}); its state "
                f"cannot be reused. Run `octo reset {self.name}` to rebuild it from all input.")

    # -- one batch -------------------------------------------------------------------------
    def run_batch(self, batch: int, inputs: dict[str, Any]) -> BatchStats:
        """Process batch ``batch`` (or finish a half-done attempt of it) exactly once."""
        started = time.monotonic()
        log = BatchLog(self.env.store, self.layout.log(self.name))
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
        ctx = BatchContext(self.spark, batch, self.buckets, {}, lambda t, b: self.env.store.files(
            self.layout.state(self.name, t), pinned.get(f"state/{t}"), b), memo=self.memo)
        try:
            dead = self.read_inputs(ctx, inputs, stats)
            delta = evaluate(self.table.physical.root, ctx)
            events, current = self.sink(ctx, delta, pinned, ts_ms, stats)
            dead_rows = self.dead_letters(dead, batch, ts_ms)
            stats.dead_letters = 0 if dead_rows is None else dead_rows.num_rows
            versions = self.commit_writes(ctx, current, events, dead_rows, pinned)
        finally:
            ctx.release()
        stats.seconds = time.monotonic() - started
        log.append(batch, "commit", {"versions": versions, "stats": stats.to_json(),
                                     "fingerprint": self.fingerprint}, ts_ms)
        if self.progress:
            self.progress(stats.line())
        return stats

    def read_inputs(self, ctx: BatchContext, inputs: dict[str, Any],
                    stats: BatchStats) -> list[DataFrame]:
        """Register each source's weighted rows in ``ctx``; return the dead-letter frames."""
        dead: list[DataFrame] = []
        for src in self.table.physical.sources:
            got = inputs.get(_source_key(src))
            if src.kind == "table":
                rows = self.upstream_changes(src, got)
                if got:  # an upstream changelog can be large; count only what we read
                    rows = ctx.persist(rows)
                    stats.rows_in += rows.count()
                ctx.inputs[src.name.lower()] = rows
                continue
            sdef = self.project.source(src.name)
            fsrc = self.env.file_source(sdef, self.project.source_path(sdef))
            parsed = self.env.read_files(self.spark, fsrc, (got or {}).get("files", []))
            records = ctx.persist(parsed.records)
            # One job parses the files and counts good and bad records.
            counts = dict(records.groupBy(F_isnull("_reason")).count().collect())
            stats.rows_in += counts.get(True, 0)
            if counts.get(False, 0):
                dead.append(records.filter("_reason IS NOT NULL").selectExpr(
                    "_raw AS raw", "_file AS source_file", f"'{src.name}' AS source",
                    "_reason AS reason"))
            ctx.inputs[src.name.lower()] = parsed.rows(records.filter("_reason IS NULL"))
        return dead

    def upstream_changes(self, src: PSource, got: dict[str, Any] | None) -> DataFrame:
        """Weighted rows of the upstream table's change events between two versions."""
        upstream = self.project.table(src.name)
        path = self.layout.changelog(upstream.name)
        files = self.env.store.added_files(path, got["from"], got["to"]) if got else []
        if files:
            events = self.spark.read.parquet(*files)
        else:
            import pyarrow as pa

            schema = self.env.store.arrow_schema(path)
            if schema is None:
                raise RunError(f"{self.name}: upstream table {upstream.name!r} has no changelog "
                               "yet; run it first")
            events = self.spark.createDataFrame(pa.Table.from_batches([], schema))
        return self.env.decode_changelog(events, src.columns)

    def sink(self, ctx: BatchContext, delta: DataFrame, pinned: dict[str, int | None],
             ts_ms: int, stats: BatchStats) -> tuple[pa.Table, list[StagedWrite]]:
        """Consolidate Δ into change events; stage the update of the current-state table."""
        import pyarrow.compute as pc

        plan = self.table.physical
        columns = plan.root.columns
        cols = [quote(c) for c in columns]
        w = quote(WEIGHT)
        if plan.keyed_changes:
            events = self.env.encode_keyed(delta, columns, plan.pk, table=self.name,
                                           batch=ctx.batch, ts_ms=ts_ms)
            cons = ctx.persist(delta)
        else:
            cons = ctx.persist(delta.groupBy(*cols).agg(_sum_weight()).filter(f"{w} != 0"))
            events = self.env.encode_changelog(cons, columns, plan.pk, table=self.name,
                                               batch=ctx.batch, ts_ms=ts_ms)
        # The current-state table is bucketed by primary key (or the whole row); the bucket
        # of each event's row rides along with the events so no extra job is needed.
        key = list(plan.pk) if plan.pk is not None else list(columns)
        ref = ", ".join(f"coalesce(after.{quote(k)}, before.{quote(k)})" for k in key)
        sb = f"pmod(hash({ref}), {self.buckets})" if key else "0"
        table = events.selectExpr("*", f"{sb} AS _sb").toArrow()
        touched = set(pc.unique(table.column("_sb")).to_pylist()) if len(table) else set()
        table = table.drop_columns(["_sb"])
        counts = pc.value_counts(table.column("op")).to_pylist() if len(table) else []
        stats.events = {c["values"]: c["counts"] for c in counts}
        if not touched and pinned.get("current") is not None:
            return table, []
        schema = cons.drop(WEIGHT).schema
        files = self.env.store.files(self.layout.current(self.name), pinned.get("current"),
                                     touched)
        old = (self.spark.read.schema(schema).parquet(*files) if files
               else self.spark.createDataFrame([], schema))
        merged = (old.selectExpr("*", f"CAST(1 AS BIGINT) AS {w}").unionByName(cons)
                  .groupBy(*cols).agg(_sum_weight()).filter(f"{w} > 0"))
        rows = merged.selectExpr(*cols, f"explode(sequence(1, CAST({w} AS INT))) AS _i") \
            .selectExpr(*cols, f"{bucket_sql(key, self.buckets)} AS {BUCKET}")
        return table, [StagedWrite("current", rows, sorted(touched))]

    def dead_letters(self, dead: list[DataFrame], batch: int, ts_ms: int) -> pa.Table | None:
        if not dead:
            return None
        name = self.name.replace("'", "''")
        return reduce(lambda a, b: a.unionByName(b), dead).selectExpr(
            "raw", "source_file", "source", "reason", f"'{name}' AS table",
            f"CAST({batch} AS BIGINT) AS batch_id", f"CAST({ts_ms} AS BIGINT) AS ts_ms").toArrow()

    def commit_writes(self, ctx: BatchContext, current: list[StagedWrite], events: pa.Table,
                      dead: pa.Table | None, pinned: dict[str, int | None]) -> dict[str, int | None]:
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


def _sum_weight():
    from pyspark.sql import functions as F

    return F.expr(f"sum({quote(WEIGHT)}) AS {quote(WEIGHT)}")


def F_isnull(column: str):  # noqa: N802 - reads like the SQL it stands for
    from pyspark.sql import functions as F

    return F.col(column).isNull().alias("good")

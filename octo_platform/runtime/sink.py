"""The changelog sink: a batch's Δ encoded as Debezium change events, written with the
operators' state and the current-state buckets the events fall in (``current.py``) in one
Spark job (a table whose columns that kernel does not cover, or a resumed attempt, rewrites
the buckets in a second job: ``update_current``), and the batch's dead letters appended by
that job too (``dead_letters``)."""
from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Any

from octo_platform.columns import BUCKET, WEIGHT
from octo_platform.runtime.colocated import ColocatedEvents, colocated, colocated_events
from octo_platform.runtime.current import current_key, current_output, kernel_covers
from octo_platform.runtime.metrics import metrics, observe
from octo_platform.runtime.operators import BatchContext, bucket_sql, consolidate
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.writes import Output, Written, write_outputs
from octo_platform.sqltext import quote, sql_expr, string

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from octo_platform.runtime.table_run import TableRun

__all__ = ["Events", "encode", "write_batch", "update_current", "write_dead_letters"]

_CB = "_cb"  # an event's bucket in the current-state table (reported, not written)
# An append-only table's batches append to its current state until it holds this many
# files per bucket; the next batch then rewrites the buckets its rows fall in.
APPENDS_PER_BUCKET = 8


def encode(pipe: TableRun, ctx: BatchContext, delta: DataFrame, ts_ms: int,
           pinned: dict[str, int | None], *, resumed: bool) -> Events | ColocatedEvents:
    """Δ encoded as change events, each with the ``_bucket`` of its row in the
    current-state table (bucketed by primary key, or the whole row) as ``_cb``; or, where
    each key's rows are in one of the tasks that computed Δ, those tasks' files of the
    changelog and the current state (``colocated``). ``resumed``: an earlier attempt of
    the batch may have committed some of its tables."""
    plan = pipe.table.physical
    columns = plan.root.columns
    if ctx.sunk is not None:  # the operator's tasks wrote the table
        return ctx.sunk
    if colocated(pipe, resumed=resumed) and not appends_current(pipe, pinned):
        done = colocated_events(pipe, ctx, delta, ts_ms, pinned)
        if done is not None:
            return done
    if plan.restarts_keys:
        delta = restarted(pipe, delta, pinned)
    if plan.keyed_changes:
        events = pipe.env.encode_keyed(delta, columns, plan.pk, table=pipe.name,
                                       batch=ctx.batch, ts_ms=ts_ms)
    else:
        events = pipe.env.encode_changelog(
            consolidate(delta, [quote(c) for c in columns]), columns, plan.pk,
            table=pipe.name, batch=ctx.batch, ts_ms=ts_ms)
    events = events.selectExpr("*", f"{event_bucket(pipe)} AS {_CB}")
    if appends_current(pipe, pinned):  # written twice: to the changelog and the current state
        return Events(ctx.checkpoint(events), appended=True)
    if not kernel_covers(pipe, arrow_schema(events.schema["after"].dataType)):
        return Events(events)
    # The write job reads the events twice: for the changelog and for the current state.
    events = ctx.checkpoint(events)
    return Events(events, current=current_output(pipe, events, _CB, ctx.batch, pinned))


def restarted(pipe: TableRun, delta: DataFrame, pinned: dict[str, int | None]) -> DataFrame:
    """``state_ttl``: a key whose state was forgotten starts afresh, so Δ inserts its row
    without retracting the one the table holds; add that retraction from the current
    state (the change becomes a ``u``, never a second row for the key)."""
    plan = pipe.table.physical
    keys = [quote(k) for k in plan.pk or ()]
    files = pipe.env.store.files(pipe.layout.current(pipe.name), pinned.get("current"))
    if not keys or not files:
        return delta
    w = quote(WEIGHT)
    cols = [quote(c) for c in plan.root.columns]
    schema = delta.drop(WEIGHT).schema
    same = " AND ".join(f"a.{k} <=> b.{k}" for k in keys)
    lone = delta.filter(f"{w} > 0").select(*keys).alias("a").join(
        delta.filter(f"{w} < 0").select(*keys).alias("b"), sql_expr(same), "left_anti")
    on = " AND ".join(f"c.{k} <=> l.{k}" for k in keys)
    old = (pipe.spark.read.schema(schema).parquet(*files).alias("c")
           .join(lone.alias("l"), sql_expr(on), "left_semi")
           .selectExpr(*cols, f"CAST(-1 AS BIGINT) AS {w}"))
    return delta.unionByName(old)


def event_bucket(pipe: TableRun) -> str:
    """SQL of a change event's bucket in the current-state table (as ``bucket_sql``)."""
    key = current_key(pipe)
    if not key:
        return "0"
    ref = ", ".join(f"coalesce(after.{quote(k)}, before.{quote(k)})" for k in key)
    return f"pmod(hash({ref}), {pipe.buckets})"


def write_batch(pipe: TableRun, ctx: BatchContext, events: Events | ColocatedEvents,
                pinned: dict[str, int | None], ts_ms: int, *, resumed: bool) -> Written:
    """Write the batch's changelog, operator state and dead letters in one Spark job and
    commit each table once (idempotently; ``resumed`` as in ``write_outputs``)."""
    lay = pipe.layout
    outputs = []
    for w in ctx.writes:
        key, path = f"state/{w.table}", lay.state(pipe.name, w.table)
        if w.buckets == [] and pinned.get(key) is not None:
            continue
        outputs.append(Output(key, path, w.data, bucketed=w.buckets is not None or w.bucketed,
                              replace=set(w.replace) if w.replace else
                              None if w.buckets is None else set(w.buckets),
                              remove=w.remove, prefix=w.prefix, written=w.written,
                              pick=w.pick,
                              replace_reported=key if w.replace_reported else None))
    if isinstance(events, ColocatedEvents):
        outputs += events.outputs
    else:
        outputs.append(Output("changelog", lay.changelog(pipe.name), events.rows, report=_CB))
    if events.current is not None and not resumed:  # else ``update_current`` finds them
        outputs.append(events.current)
    if events.appended:
        outputs.append(Output("current", lay.current(pipe.name), events.unobserved.selectExpr(
            "after.*", f"{_CB} AS {BUCKET}"), bucketed=True))
    bad = dead_letters(pipe, ctx.dead_letters, ctx.batch, ts_ms)
    outputs += [bad] if bad is not None else []
    written = write_outputs(outputs, batch=ctx.batch, store=pipe.env.store, resumed=resumed,
                            watched=ctx.watched)
    ctx.observed.update(written.observed)
    return written


def appends_current(pipe: TableRun, pinned: dict[str, int | None]) -> bool:
    """An append-only table's current state is every row it inserted: the write job
    appends the batch's rows to it, no rewrite, until it holds ``APPENDS_PER_BUCKET``
    files per bucket (then ``update_current`` rewrites the buckets the batch touches)."""
    if pipe.table.physical.root.mode != "append-only":
        return False
    files = pipe.env.store.files(pipe.layout.current(pipe.name), pinned.get("current"))
    return len(files) < APPENDS_PER_BUCKET * pipe.buckets


def update_current(pipe: TableRun, batch: int, events: Events, written: Written,
                   pinned: dict[str, int | None], *, resumed: bool) -> int | None:
    """Rewrite the current-state buckets this batch's events fall in: their old rows
    plus the events (read back from the changelog files the batch added). The new
    version of the current-state table (unless the write job appended to it)."""
    if "current" in written.versions:
        return written.versions["current"]
    store, path = pipe.env.store, pipe.layout.current(pipe.name)
    changelog = pipe.layout.changelog(pipe.name)
    files = store.added_files(changelog, pinned.get("changelog"),
                              written.versions["changelog"]) \
        if written.versions.get("changelog") is not None else []
    if "changelog" in written.wrote:
        touched = written.reported.get("changelog", set())
    else:  # an earlier attempt committed the events: find their buckets again
        touched = {r[0] for r in pipe.spark.read.parquet(*files).selectExpr(
            event_bucket(pipe)).distinct().collect()} if files else set()
    if not touched and pinned.get("current") is not None:
        return pinned["current"]
    plan = pipe.table.physical
    cols = [quote(c) for c in plan.root.columns]
    image = events.unobserved.schema["after"].dataType
    schema = events.unobserved.drop(_CB).schema
    batch_events = (pipe.spark.read.schema(schema).parquet(*files) if files
                    else pipe.spark.createDataFrame([], schema))
    old_files = store.files(path, pinned.get("current"), touched)
    old = (pipe.spark.read.schema(image).parquet(*old_files) if old_files
           else pipe.spark.createDataFrame([], image))
    if plan.keyed_changes:  # unique keys, one event per key: replace rows by key
        keys = [quote(k) for k in plan.pk or ()]
        changed = batch_events.selectExpr(
            *[f"coalesce(after.{k}, before.{k}) AS {k}" for k in keys])
        on = " AND ".join(f"o.{k} <=> c.{k}" for k in keys) or "true"
        rows = old.alias("o").join(changed.alias("c"), sql_expr(on), "left_anti") \
            .unionByName(batch_events.filter("after IS NOT NULL").selectExpr("after.*"))
    else:  # a bag, or keys the query cannot vouch for: add and remove rows by count
        w = quote(WEIGHT)
        changes = pipe.env.decode_changelog(batch_events, plan.root.columns)
        rows = (old.selectExpr(*cols, f"CAST(1 AS BIGINT) AS {w}").unionByName(changes)
                .groupBy(*cols).agg(_sum_weight()).filter(f"{w} > 0")
                .selectExpr(*cols, f"explode(sequence(1, CAST({w} AS INT))) AS _i"))
    rows = rows.selectExpr(*cols, f"{bucket_sql(current_key(pipe), pipe.buckets)} AS {BUCKET}")
    return write_outputs([Output("current", path, rows, bucketed=True, replace=touched)],
                         batch=batch, store=store, resumed=resumed).versions["current"]


def dead_letters(pipe: TableRun, dead: list[DataFrame], batch: int,
                 ts_ms: int) -> Output | None:
    """The batch's bad records (``BatchContext.dead_letters``) for the table's dead-letter
    table, committed only if there are any."""
    if not dead:
        return None
    rows = reduce(lambda a, b: a.unionByName(b), dead).selectExpr(
        "raw", "source_file", "source", "reason", f"{string(pipe.name)} AS table",
        f"CAST({batch} AS BIGINT) AS batch_id", f"CAST({ts_ms} AS BIGINT) AS ts_ms")
    return Output("dead_letters", pipe.layout.dead_letters(pipe.name), rows, if_any=True)


def write_dead_letters(pipe: TableRun, dead: list[DataFrame], batch: int, ts_ms: int, *,
                       resumed: bool) -> None:
    """Append the batch's bad records (if any) to the table's dead-letter table, in a job
    of their own."""
    out = dead_letters(pipe, dead, batch, ts_ms)
    if out is not None:
        write_outputs([out], batch=batch, store=pipe.env.store, resumed=resumed)


def _sum_weight():
    return sql_expr(f"sum({quote(WEIGHT)}) AS {quote(WEIGHT)}")


class Events:
    """A batch's change events, counted by op while the write job writes them."""

    EXPRS = tuple(f"count_if(op = '{op}') AS {op}" for op in ("c", "u", "d"))

    def __init__(self, events: DataFrame, appended: bool = False,
                 current: Output | None = None) -> None:
        self.unobserved = events
        self.appended = appended  # the write job appends them to the current state too
        self.current = current  # the write job's current-state output (``current.py``)
        self.rows, self.observation = observe(events, *self.EXPRS)

    def counts(self, known: dict[str, dict[str, Any]] | None = None) -> dict[str, int]:
        """Events by op (``known``: ``BatchContext.observed``)."""
        got = metrics(self.observation, known)
        if got is None:  # not written by this attempt (an earlier one committed them)
            got = self.unobserved.selectExpr(*self.EXPRS).collect()[0].asDict()
        return {op: int(n) for op, n in got.items() if n}

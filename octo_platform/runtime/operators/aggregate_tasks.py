"""GROUP BY on the Spark path: its step (``aggregate.AggregateStep``) in Spark tasks.

The batch's rows are shuffled once, by the bucket of their group key, and each bucket's
task reads that bucket's state log files (and nothing else), runs the step, writes each
state table's new rows of the bucket as a file, and returns, as one tagged frame: the output
Δ of the groups it touched (from their old and new accumulators, ``arrow_output``, as on the
driver path) and the files it wrote (``tasks``); the batch's write job commits the files.
Where the GROUP BY's rows are the
table's (``_sink``), each task turns its accumulators into change events itself
(``arrow_changes``: a group's old and new row are its event's images) and writes the table's
changelog and its current-state bucket too (``colocated.TableWriter``; the bucket from the
result rows of its state after the batch where the task keeps those, ``arrow_rows``): then
only files come back. A bucket's live rows after the batch
are kept on the task's machine for the next task there (``bucket_cache``), where no window
closes, nothing expires and no value multiset is kept. A bucket whose log is due for compaction
(``state_log.compaction`` of its files) is rewritten by its own task: its live rows before
the batch become ``base`` files, and the commit removes the bucket's older files. The cost
of a batch follows the buckets it touches, not the state's size.

Windows that close: a compaction keeps only the groups of open windows; with EMIT ON
WINDOW CLOSE the output is the final rows of the groups whose window the batch's watermark
closes, touched or not (a row of weight 0 visits every bucket when the watermark moves).

Without a key, the one group lives in bucket 0 (visited in the first batch, so that its
row comes out even over no input rows). With ``state_ttl`` a task reads no expired group's
row nor its values (the group starts afresh) and a compaction keeps none.

Covered: GROUP BY of types Arrow groups (``aggregate_step``); others (nested types) run as
``aggregate_frames.AggregateFrames``' Spark operators.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, COUNT, WEIGHT
from octo_platform.physical.plan import PAggregate
from octo_platform.runtime.operators import bucket_cache
from octo_platform.runtime.operators.aggregate import (
    AggregateStep,
    aggregate_step,
    arrow_changes,
    arrow_rows,
    live_rows,
)
from octo_platform.runtime.operators.aggregate import shape as aggregate_shape
from octo_platform.runtime.operators.aggregate_frames import AggregateFrames
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.operators.context import BatchContext, bucket_sql
from octo_platform.runtime.operators.tasks import (
    PART,
    Due,
    Log,
    LogFiles,
    bucket_logs,
    grouped,
    log_files,
    log_parts,
    read_bucket,
    run_group,
    stage_logs,
    tagged,
    tagged_schema,
    visits,
)
from octo_platform.runtime.state_log import unexpired, with_batch
from octo_platform.sqltext import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["run_aggregate"]

_SINK = -1  # the part of the tasks' rows that are the table's files (``_sink``)


def run_aggregate(node: PAggregate, ctx: BatchContext, delta: DataFrame) -> DataFrame:
    """The output Δ of GROUP BY ``node``: by its kernel in Spark tasks where it covers the
    node, else by the Spark operator."""
    from pyspark.sql.types import LongType, StructField, StructType

    shape = aggregate_shape(node, ctx, delta)
    step = aggregate_step(node, shape, ctx.batch)
    if step is None:
        return AggregateFrames(node, ctx).run(delta)
    tables = [node.id, *[node.multiset_table(i) for i in step.ms]]
    sink = _sink(node, ctx, step)
    out = StructType([*shape.out_schema.fields, StructField(WEIGHT, LongType())])
    schema = tagged_schema(out, None if sink is None else {"w": sink[1]})
    args = list(dict.fromkeys([*node.keys, *[a.arg for a in node.aggs if a.arg]]))
    logs, due = bucket_logs(ctx, tables)
    files = log_files(ctx, tables, [with_batch(s) for s in [shape.state_schema,
                                                           *shape.ms_schemas.values()]])
    task = _BucketTask(step, tables=logs, files=files, due=due, out=arrow_schema(schema),
                       reader=ctx.reader, marks=(ctx.watermark_before, ctx.watermark),
                       emit=node.emit_on_close, cut=ctx.cut(node),
                       sink=None if sink is None else sink[0], counts=ctx.cache_counts)
    rows = delta.selectExpr(*[quote(c) for c in args], quote(WEIGHT),
                            f"{bucket_sql(node.keys, ctx.buckets)} AS {BUCKET}")
    # Windows close in every bucket, touched or not; due compactions run in their bucket.
    closing = node.emit_on_close and ctx.watermark_moved
    visited = set(range(ctx.buckets)) if closing else set().union(*due)
    if not node.keys and not ctx.state_log(node.id):  # the one group's first row, even
        visited.add(0)  # over no input rows
    rows = visits(rows, WEIGHT, visited)
    out = grouped(ctx, rows).applyInArrow(
        functools.partial(run_group, task, node.located()), schema)
    if sink is None:
        out = ctx.checkpoint(out)
    else:  # the tasks wrote the table: no output Δ to compute here, and the write job's
        # one leg over their rows is all that reads them (no checkpoint)
        ctx.sunk = sink[0].writer.written(out, (f"{PART} = {_SINK}", "w"))
        out = ctx.sunk.frame
    return stage_logs(ctx, out, tables, due, files)


def _sink(node: PAggregate, ctx: BatchContext, step: AggregateStep
          ) -> tuple[Any, Any] | None:
    """Where the GROUP BY's rows are the table's (up to renames: ``BatchContext.sink``), its
    tasks write the table's changelog and current state themselves (``colocated``), each
    from the output rows of its bucket's groups (``arrow_changes``), when: the groups have
    keys, they are the table's primary key in their order and types (a group's
    current-state bucket is then its own), and no window emits on close. What the tasks
    need (``_Sunk``) and the Spark type of the rows its writer returns; else None."""
    sink = ctx.sink
    if sink is None or sink.node is not node or not node.keys or node.emit_on_close:
        return None
    mine = step.out
    pk = [sink.columns[sink.names.index(k)] for k in sink.pk or ()]
    if pk != list(node.columns[:len(node.keys)]):
        return None
    writer = sink.writer(pa.schema([pa.field(n, mine.field(c).type) for n, c in zip(
        sink.names, sink.columns)]).append(pa.field(WEIGHT, pa.int64())))
    if writer is None:
        return None
    return _Sunk(writer, mine, (*sink.columns, WEIGHT)), writer.files_type()


@dataclass(frozen=True)
class _Sunk:
    """The table's writer (``colocated.TableWriter``) in the tasks, the GROUP BY's output rows
    (``rows``: its columns and ``_w``) and, per column of the writer's rows, which of those
    it is."""

    writer: Any
    rows: pa.Schema
    picked: tuple[str, ...]

    def write(self, accs: pa.Table, step: AggregateStep, bucket: int,
              live: pa.Table | None) -> pa.Table:
        """The files of the table written for the groups' accumulators ``accs``: their
        change events straight from each group's old and new row (``arrow_changes``), and
        where the bucket's ``live`` state rows after the batch are at hand, its
        current-state file from their result rows (``arrow_rows``: the table's current
        state is the GROUP BY's result, its buckets the GROUP BY's), with no merge."""
        before, after, no_before, no_after = arrow_changes(step.keys, step.aggs, accs,
                                                           self.rows)
        current = None if live is None else arrow_rows(step.keys, step.aggs, live, self.rows)
        names = self.writer.rows.names[:-1]
        before, after, current = (
            None if rows is None else pa.table([rows[c] for c in self.picked[:-1]], names=names)
            for rows in (before, after, current))
        return self.writer.write_changes(before, after, no_before, no_after, bucket, current)


@dataclass(frozen=True)
class _BucketTask:
    """The ``applyInArrow`` function (runs in Spark tasks): one bucket's rows of the batch
    -> that bucket's tagged output (see the module docstring)."""

    step: AggregateStep
    tables: list[Log]  # per state table
    files: list[LogFiles]  # per state table, where the task writes its new files
    due: list[Due]  # per table, the buckets whose log is due for compaction (in full)
    out: pa.Schema
    reader: Callable[[str, str], Any]
    marks: tuple[int | None, int | None]  # the watermark before and after the batch
    emit: bool  # EMIT ON WINDOW CLOSE: the output is the groups whose window closes
    cut: int | None = None  # ``state_ttl``: the last batch whose state rows expired
    sink: _Sunk | None = None  # the output written as the table here (``_sink``)
    counts: Any = None  # ``BatchContext.cache_counts``

    def run(self, key: tuple, rows: pa.Table) -> pa.Table:
        bucket = key[0].as_py()
        step, keys = self.step, list(self.step.keys)
        delta = rows.drop_columns([BUCKET])
        delta = delta.filter(pc.not_equal(delta[WEIGHT], 0))  # a visit changes nothing
        layout = [step.logged, *[step.ms_logged(i) for i in step.ms]]
        # The state's rows after the batch are kept on this machine (``bucket_cache``) where
        # they are the bucket's live rows: no windows that close, no expiry, no multisets.
        keep = bool(keys) and not self.emit and step.closes is None and self.cut is None \
            and not step.ms
        befores, files = [], []
        for j, ((path, log), logged) in enumerate(zip(self.tables, layout)):
            mine = log.get(bucket, [])
            names, alive = (keys, COUNT if keys else None) if j == 0 else \
                ([*keys, "v"], "cnt")  # the one group of no key stays with count 0
            before = bucket_cache.cached(path, bucket, [f["path"] for f in mine],
                                         self.counts) if keep else None
            if before is None:
                before = live_rows(read_bucket(self.reader, path, mine, logged), mine, names,
                                   alive)
            if j == 0:  # a forgotten group starts afresh
                before = unexpired(before, self.cut)
            befores.append(before)
            files.append(mine)
        done = step.run(delta, befores[0], {i: b for i, b in zip(step.ms, befores[1:])},
                        keep_after=keep, forgets=self.cut is not None)
        accs = step.closing(done.table, befores[0], *self.marks) if self.emit else done.table
        if self.sink is None:
            parts = [(0, "o", step.output(accs))]
        else:  # the table's files, of this bucket's groups' output rows
            parts = [(_SINK, "w", self.sink.write(accs, step, bucket, done.after))]
        changed = [done.changes, *[c for c, _ in done.ms.values()]]
        for j, (changes, before, mine) in enumerate(zip(changed, befores, files)):
            due = bucket in self.due[j]
            mine_parts = log_parts(j, self.files[j], bucket, changes, mine, due,
                                   lambda b=before, j=j: step.kept(
                                       b, self.marks[1], self.cut, befores[0] if j else None))
            if keep and mine_parts:  # the files the commit leaves the bucket, and their rows
                wrote = [p for _, _, t in mine_parts for p in t.column("path").to_pylist()]
                kept = [] if due or not mine else [f["path"] for f in mine]
                bucket_cache.keep(self.tables[j][0], bucket, kept + wrote, done.after)
            parts += mine_parts
        return tagged(self.out, parts, bucket)

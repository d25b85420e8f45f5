"""Top-N, SESSION windows and sliding OVER ranges on the Spark path: their steps (``top_n``,
``session``, ``over``) in Spark tasks, one per bucket of the state the batch touches.

The batch's rows are shuffled once, by the bucket of their partition key; each bucket's task
reads that bucket's state files (and nothing else), runs the step over the bucket's rows
before and after the batch, writes the bucket's new rows, and returns, as one tagged frame
(``tasks``): the output Δ and a row that names the bucket and its new file (none when the
bucket is left empty). The commit replaces the files of the buckets the tasks named
(``StagedWrite.replace_reported``): a bucket whose partitions all left the state loses its
files, and no job runs beforehand to find which buckets the batch touches.

Covered: inputs of types Arrow groups and sorts, SESSION and OVER over a TIMESTAMP, OVER's
aggregates ``over.OverStep`` computes; others run as ``top_n_frames.TopNFrames``',
``session_frames.SessionFrames``' and ``over_frames.OverRange``'s Spark operators.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa

from octo_platform.columns import BUCKET, COUNT, WEIGHT
from octo_platform.local_frames import arrow_schema
from octo_platform.logical.plan import WINDOW_COLUMNS
from octo_platform.physical.plan import POver, PSession, PTopN
from octo_platform.runtime.operators.arrow import concat, primitive
from octo_platform.runtime.operators.context import BatchContext, StagedWrite, bucket_sql, \
    positional, side_schema
from octo_platform.runtime.operators.partition_steps import consolidated, is_micros
from octo_platform.runtime.operators.over import OverStep
from octo_platform.runtime.operators.over_frames import OverRange
from octo_platform.runtime.operators.session import SessionStep
from octo_platform.runtime.operators.session_frames import SessionFrames
from octo_platform.runtime.operators.tasks import PART, Log, LogFiles, bucket_logs, grouped, \
    log_files, read_bucket, run_group, tagged, tagged_schema
from octo_platform.runtime.operators.top_n import TopNStep
from octo_platform.runtime.operators.top_n_frames import TopNFrames
from octo_platform.sqltext import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["run_partitioned"]

def run_partitioned(node: PTopN | PSession | POver, ctx: BatchContext, delta: DataFrame
                    ) -> DataFrame:
    """The output Δ of top-N, SESSION or OVER ``node``: by its step in Spark tasks where it
    covers the node, else by the Spark operator."""
    names = list(node.input.columns)
    rows = delta.toDF(*names, WEIGHT)
    if isinstance(node, PSession):
        rows = rows.filter(f"{quote(node.time)} IS NOT NULL")
    weighted, output = arrow_schema(rows.schema), _output(node, ctx, rows)
    step = _step(node, weighted, arrow_schema(output))
    if step is None:
        frames = SessionFrames if isinstance(node, PSession) else \
            OverRange if isinstance(node, POver) else TopNFrames
        return frames(node, ctx).run(delta)
    stored = side_schema(rows.schema, names)
    schema = tagged_schema(output)
    (log,), _ = bucket_logs(ctx, [node.id])
    (files,) = log_files(ctx, [node.id], [stored])
    task = _PartitionTask(step, log, files, weighted, arrow_schema(schema), ctx.reader,
                          ctx.watermark)
    rows = rows.selectExpr("*", f"{bucket_sql(node.partition, ctx.buckets)} AS {BUCKET}")
    out = ctx.checkpoint(grouped(ctx, rows).applyInArrow(
        functools.partial(run_group, task, node.located()), schema))
    ctx.writes.append(StagedWrite(node.id, out, None, bucketed=True,
                                  written=files.committed(), pick=(f"{PART} = 1", "f"),
                                  replace_reported=True))
    return out.filter(f"{PART} = 0").selectExpr("o.*")


def _step(node: PTopN | PSession | POver, weighted: pa.Schema, out: pa.Schema
          ) -> TopNStep | SessionStep | OverStep | None:
    """The step of ``node`` over rows of ``weighted`` (the input's, weighted) with output
    ``out``, or None where it does not cover them."""
    if isinstance(node, POver):
        return OverStep.of(node, weighted, out)
    if not all(primitive(f.type) for f in weighted):
        return None
    if isinstance(node, PSession):
        return SessionStep.of(node) if is_micros(weighted.field(node.time).type) else None
    return TopNStep.of(node)


def _output(node: PTopN | PSession | POver, ctx: BatchContext, rows: DataFrame) -> Any:
    """The Spark schema of the step's output Δ (``rows``: the input, weighted)."""
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    if isinstance(node, POver):  # Spark's window functions' types (planned once per run)
        key = f"{node.id}:out:{rows.schema.simpleString()}"
        if key not in ctx.memo:
            ctx.memo[key] = OverRange(node, ctx).compute(rows.limit(0)).schema
        return ctx.memo[key]
    rows = rows.schema
    fields = list(rows.fields[:-1])
    if isinstance(node, PSession):
        time = rows[node.time].dataType
        fields += [StructField(c, time) for c in WINDOW_COLUMNS]
    else:
        fields = [StructField(c, f.dataType) for c, f in zip(node.columns, fields)]
        if node.rank:
            fields.append(StructField(node.rank, IntegerType()))
    return StructType([*fields, StructField(WEIGHT, LongType())])


@dataclass(frozen=True)
class _PartitionTask:
    """The ``applyInArrow`` function (runs in Spark tasks): one bucket's rows of the batch
    -> that bucket's tagged output (see the module docstring)."""

    step: TopNStep | SessionStep | OverStep
    table: Log
    files: LogFiles  # the state's columns (``c0``, ..., ``_n``) and where the task writes
    rows: pa.Schema  # the input's columns, weighted
    out: pa.Schema
    reader: Callable[[str, str], Any]
    watermark: int | None  # the table's, after the batch

    def run(self, key: tuple, rows: pa.Table) -> pa.Table:
        bucket = key[0].as_py()
        names = list(self.step.names)
        d = consolidated(rows.drop_columns([BUCKET]).cast(self.rows), names)
        if not d.num_rows:  # the batch's rows of the bucket cancel out
            return self.out.empty_table()
        path, stored = self.table
        here = pa.array(np.full(d.num_rows, bucket, np.int32))
        old = read_bucket(self.reader, path, stored.get(bucket, []), self.files.schema)
        old = old.rename_columns([*names, WEIGHT]).cast(self.rows).append_column(
            BUCKET, pa.array(np.full(old.num_rows, bucket, np.int32)))
        new = consolidated(concat([old, d.append_column(BUCKET, here)], old.schema),
                           [*names, BUCKET])
        out, keep = self.step.run(d, old, new, self.watermark)
        keep = keep.select([*names, WEIGHT]).rename_columns([*positional(names), COUNT])
        return tagged(self.out, [(0, "o", out), *self.files.write(1, bucket, keep, named=True)],
                      bucket)

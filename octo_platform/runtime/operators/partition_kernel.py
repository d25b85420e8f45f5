"""Top-N, SESSION windows and sliding OVER ranges on the driver path (``runtime/driver.py``):
the operators that recompute the partitions a batch touches (``context.PartitionRows``),
their steps over the run's state cache.

The state is ``PartitionRows``' table, written the same way: the input's rows with their
multiplicity, bucketed by the hash of the partition key, a touched bucket's files replaced
by its new rows. The cache finds a bucket's rows by ``_bucket``. Each runs its Arrow step
(``top_n``, ``session``, ``over``), which Spark tasks run too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, COUNT, WEIGHT
from octo_platform.physical.plan import POver, PPartitioned, PSession, PTopN
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.operators.arrow import concat, local_path, primitive, read_parquet
from octo_platform.runtime.operators.context import bucket_sql, positional, side_schema
from octo_platform.runtime.operators.kernels import LocalContext, StagedRows, Unsupported
from octo_platform.runtime.operators.over import OverStep
from octo_platform.runtime.operators.over_frames import OverRange
from octo_platform.runtime.operators.partition_steps import consolidated, is_micros
from octo_platform.runtime.operators.session import SessionStep
from octo_platform.runtime.operators.top_n import TopNStep
from octo_platform.runtime.state_log import StateFile
from octo_platform.sqltext import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TopNKernel", "SessionKernel", "OverKernel"]


def micros(time: pa.DataType) -> None:
    """Raise ``Unsupported`` unless ``time`` is Spark's TIMESTAMP (``is_micros``)."""
    if not is_micros(time):
        raise Unsupported(f"a time column of type {time}")


class PartitionState:
    """``PartitionRows`` in the driver: ``load`` finds the rows of the buckets the batch
    touches in the run's cache, ``store`` stages their new rows (replacing the buckets'
    files) and keeps them in the cache."""

    def __init__(self, node: PPartitioned, lc: LocalContext, delta: pa.Table) -> None:
        self.node, self.lc = node, lc
        self.names = list(node.input.columns)
        self.partition = list(node.partition)
        if not all(primitive(f.type) for f in delta.schema):
            raise Unsupported("nested types")
        self.schema = delta.schema  # the input's columns, then the weight

    def load(self, delta: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table] | None:
        """The batch's rows (consolidated), and the touched buckets' rows before and after
        it (weighted, with ``_bucket``); None when the batch changes nothing."""
        lc, names = self.lc, self.names
        d = consolidated(delta, names)
        if not d.num_rows:
            return None
        d = d.append_column(BUCKET, lc.bucket(d, self.partition))
        self.touched = pc.unique(d[BUCKET])
        self.cache = lc.cached(self.node.id, self.spark_rows, self.local_rows, [BUCKET])
        self.found = self.cache.find(pa.table({BUCKET: self.touched}))
        old = self.found.rows
        return d.drop_columns([BUCKET]), old, consolidated(concat([old, d], old.schema),
                                                           [*names, BUCKET])

    def store(self, keep: pa.Table) -> None:
        """Stage ``keep`` (weighted rows of the touched buckets, with ``_bucket``) as their
        new contents."""
        lc, node = self.lc, self.node
        rows = keep.select([*self.names, WEIGHT, BUCKET]).rename_columns(
            [*positional(self.names), COUNT, BUCKET])
        lc.writes.append(StagedRows(node.id, rows, bucketed=True,
                                    replace=tuple(sorted(self.touched.to_pylist()))))
        lc.fresh[node.id] = self.cache.replace(self.found, keep)

    def stored(self) -> pa.Schema:
        """The state table's Arrow schema (``context.side_schema``'s columns)."""
        fields = [pa.field(p, f.type) for p, f in zip(positional(self.names), self.schema)]
        return pa.schema([*fields, pa.field(COUNT, pa.int64())])

    def cached_rows(self, rows: pa.Table) -> pa.Table:
        """Stored rows (with ``_bucket``) as the cache holds them: named, weighted."""
        return rows.rename_columns([*self.names, WEIGHT, BUCKET]).cast(
            self.schema.append(pa.field(BUCKET, pa.int32())))

    def local_rows(self, files: list[StateFile]) -> pa.Table | None:
        """The pinned files' rows, read with Arrow (None when one is remote); each file's
        bucket is its partition's."""
        schema, parts = self.stored(), []
        for f in files:
            path = local_path(f["uri"])
            if path is None:
                return None
            rows = read_parquet(path, schema)
            parts.append(rows.append_column(BUCKET, pa.array(
                np.full(rows.num_rows, int(f["partition"][BUCKET]), np.int32))))
        return self.cached_rows(concat(parts, schema.append(pa.field(BUCKET, pa.int32()))))

    def spark_rows(self) -> DataFrame:
        """The pinned files' rows as the cache holds them, read by Spark (a remote
        warehouse; an empty frame for no files)."""
        lc, names = self.lc, self.names
        files = [f["uri"] for f in lc.ctx.state_log(self.node.id)]
        cached = self.schema.append(pa.field(BUCKET, pa.int32()))
        if not files:
            return lc.frame(cached.empty_table())
        pos = positional(names)
        part = [pos[names.index(p)] for p in self.partition]
        stored = side_schema(lc.frame(self.schema.empty_table()).schema, names)
        return lc.spark.read.schema(stored).parquet(*files).selectExpr(
            *[f"{p} AS {quote(n)}" for p, n in zip(pos, names)], f"{COUNT} AS {WEIGHT}",
            f"{bucket_sql(part, lc.ctx.buckets)} AS {BUCKET}")


class TopNKernel:
    """Top-N's step (``top_n.TopNStep``) over the run's cache."""

    def __init__(self, node: PTopN, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.step = TopNStep.of(node)

    def run(self, delta: pa.Table) -> pa.Table:
        delta = delta.rename_columns([*self.step.names, WEIGHT])
        state = PartitionState(self.node, self.lc, delta)
        loaded = state.load(delta)
        if loaded is None:
            return self.step.out_schema(delta.schema).empty_table()
        out, keep = self.step.run(*loaded, self.lc.ctx.watermark)
        state.store(keep)
        return out


class SessionKernel:
    """SESSION's step (``session.SessionStep``) over the run's cache."""

    def __init__(self, node: PSession, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.step = SessionStep.of(node)

    def run(self, delta: pa.Table) -> pa.Table:
        node, lc = self.node, self.lc
        delta = delta.rename_columns([*self.step.names, WEIGHT])
        micros(delta.schema.field(node.time).type)
        delta = delta.filter(pc.is_valid(delta[node.time]))
        state = PartitionState(node, lc, delta)
        loaded = state.load(delta)
        if loaded is None:
            return self.step.out_schema(delta.schema).empty_table()
        out, keep = self.step.run(*loaded, lc.ctx.watermark)
        state.store(keep)
        return out


class OverKernel:
    """A sliding OVER range's step (``over.OverStep``) over the run's cache; its output's
    types are Spark's window functions' (planned once per run, not run)."""

    def __init__(self, node: POver, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.names = list(node.input.columns)

    def run(self, delta: pa.Table) -> pa.Table:
        node, lc = self.node, self.lc
        delta = delta.rename_columns([*self.names, WEIGHT])
        out = lc.once(f"over:{node.id}:{delta.schema}", lambda: arrow_schema(
            OverRange(node, lc.ctx).compute(lc.frame(delta.slice(0, 0))).schema))
        step = OverStep.of(node, delta.schema, out)
        if step is None:
            raise Unsupported("SUM or AVG of floating-point numbers, or a time column of "
                              f"type {delta.schema.field(node.time).type}")
        state = PartitionState(node, lc, delta)
        loaded = state.load(delta)
        if loaded is None:
            return out.empty_table()
        got, keep = step.run(*loaded, lc.ctx.watermark)
        state.store(keep)
        return got

"""Top-N, SESSION windows and sliding OVER ranges on the driver path (``runtime/driver.py``):
the operators that recompute the partitions a batch touches (``context.PartitionRows``),
over the run's state cache.

The state is ``PartitionRows``' table, written the same way: the input's rows with their
multiplicity, bucketed by the hash of the partition key, a touched bucket's files replaced
by its new rows. The cache finds a bucket's rows by ``_bucket``. Top-N and SESSION run
their Arrow steps (``top_n``, ``session``, which Spark tasks run too). OVER's aggregates are
Spark's own window functions over a local relation of the touched partitions' rows (one
small Spark job).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, COUNT, WEIGHT
from octo_platform.physical.plan import POver, PPartitioned, PSession, PTopN
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.operators.arrow import concat, key_join, local_path, primitive, \
    read_parquet, safe_keys
from octo_platform.runtime.operators.context import bucket_sql, positional, side_schema
from octo_platform.runtime.operators.kernels import LocalContext, StagedRows, Unsupported
from octo_platform.runtime.operators.over import OverRange
from octo_platform.runtime.operators.partition_steps import consolidated, is_micros, touched
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
    """``over.OverRange`` on the driver path: the touched partitions' rows before and after
    the batch, in one local relation, get their sliding-range aggregates from Spark's own
    window functions (one small Spark job: a window is no projection Spark folds into the
    relation); rows before a partition's earliest changed time keep their values, the
    others' differences are the output."""

    SIDE = "_side"

    def __init__(self, node: POver, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.names = list(node.input.columns)
        self.op = OverRange(node, lc.ctx)

    def run(self, delta: pa.Table) -> pa.Table:
        node, lc, names = self.node, self.lc, self.names
        delta = delta.rename_columns([*names, WEIGHT])
        micros(delta.schema.field(node.time).type)
        state = PartitionState(node, lc, delta)
        sided = delta.append_column(self.SIDE, pa.array(np.zeros(delta.num_rows, np.int8)))
        out = lc.once(f"over:{node.id}:{delta.schema}", lambda: arrow_schema(
            self.op.compute(lc.frame(sided), self.SIDE).schema))
        result = out.remove(out.get_field_index(self.SIDE))
        loaded = state.load(delta)
        if loaded is None:
            return result.empty_table()
        d, old, new = loaded
        keep = new
        if node.closes and lc.ctx.watermark is not None:  # no row on time reaches back
            t = pc.cast(new[node.time], pa.int64())
            keep = new.filter(pc.fill_null(pc.or_kleene(pc.is_null(t), pc.greater_equal(
                t, lc.ctx.watermark - node.range_us)), False))
        state.store(keep)
        old, new = touched(node.partition, d, old, new)
        both = concat([t.select([*names, WEIGHT]).append_column(self.SIDE, pa.array(
            np.full(t.num_rows, side, np.int8))) for side, t in ((0, old), (1, new))],
            sided.schema)
        computed = lc.sql(f"{node.id}:over", both, lambda df: self.op.compute(df, self.SIDE))
        computed = self.since(d, computed)
        side = computed[self.SIDE].to_numpy()
        weight = np.where(side == 1, 1, -1).astype(np.int64)
        rows = computed.drop_columns([self.SIDE]).set_column(
            len(result) - 1, WEIGHT, pa.array(weight))
        return consolidated(rows, list(result.names[:-1]))

    def since(self, d: pa.Table, rows: pa.Table) -> pa.Table:
        """The ``rows`` at or after their partition's earliest time in ``d`` (a NULL time
        is a peer of NULLs only: always kept)."""
        node = self.node
        part, t = list(node.partition), node.time
        first = d.group_by(part, use_threads=False).aggregate([(t, "min")]) if part else \
            pa.table({f"{t}_min": pa.array([pc.min(d[t]).as_py()], d.schema.field(t).type)})
        left, lkeys = safe_keys(rows, part, "_l")
        right, rkeys = safe_keys(first, part, "_r")
        joined = key_join(left, right.select([*rkeys, f"{t}_min"]), lkeys, rkeys, "inner")
        keep = pc.fill_null(pc.or_kleene(pc.is_null(joined[t]), pc.greater_equal(
            joined[t], joined[f"{t}_min"])), False)
        return joined.filter(keep).select(rows.column_names)

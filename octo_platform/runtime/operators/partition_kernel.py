"""Top-N, SESSION windows and sliding OVER ranges on the driver path (``runtime/driver.py``):
the operators that recompute the partitions a batch touches (``context.PartitionRows``),
over the run's state cache.

The state is ``PartitionRows``' table, written the same way: the input's rows with their
multiplicity, bucketed by the hash of the partition key, a touched bucket's files replaced
by its new rows. The cache finds a bucket's rows by ``_bucket``. Top-N and SESSION are Arrow
kernels: rows are ordered as Spark's window functions order them (``arrow.sort_indices``:
ORDER BY's directions and NULL placement, NaN above every number) and numbered as
``row_number()`` numbers them. OVER's aggregates are Spark's own window functions over a
local relation of the touched partitions' rows (one small Spark job).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, COUNT, WEIGHT
from octo_platform.logical.plan import WINDOW_COLUMNS
from octo_platform.physical.plan import POver, PPartitioned, PSession, PTopN
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.operators.arrow import concat, key_join, \
    local_path, normal_floats, primitive, run_starts, safe_keys, sort_indices
from octo_platform.runtime.operators.context import bucket_sql, positional, side_schema
from octo_platform.runtime.operators.kernels import LocalContext, StagedRows, Unsupported
from octo_platform.runtime.operators.keyed_rows import KeyedRows
from octo_platform.runtime.operators.over import OverRange
from octo_platform.runtime.state_log import StateFile
from octo_platform.sqltext import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TopNKernel", "SessionKernel", "OverKernel"]


def consolidated(rows: pa.Table, columns: list[str]) -> pa.Table:
    """One row per distinct value of ``columns`` (floats as Spark groups them) with its
    summed weight, zeros dropped (``context.consolidate``)."""
    rows = normal_floats(rows.select([*columns, WEIGHT]))
    got = rows.group_by(columns, use_threads=False).aggregate([(WEIGHT, "sum")])
    got = got.rename_columns([*columns, WEIGHT])
    return got.filter(pc.not_equal(got[WEIGHT], 0)).cast(rows.schema)


def micros(time: pa.DataType) -> None:
    """Raise ``Unsupported`` unless ``time`` is Spark's TIMESTAMP (microseconds), whose
    integer values the kernels compare with the watermark and the gap."""
    if not (pa.types.is_timestamp(time) and time.unit == "us"):
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

    def touched_partitions(self, d: pa.Table, *tables: pa.Table) -> tuple[pa.Table, ...]:
        """The rows of each of ``tables`` whose partition key occurs in ``d`` (all of them
        for an empty key): only those partitions can change."""
        if not self.partition:
            return tables
        return tuple(KeyedRows(t, self.partition).find(d).rows for t in tables)

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
        import pyarrow.parquet as pq

        schema, parts = self.stored(), []
        for f in files:
            path = local_path(f["uri"])
            if path is None:
                return None
            rows = pq.read_table(path).select(schema.names).cast(schema)
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
    """``top_n.TopN`` in Arrow: the touched partitions' top rows before and after the batch
    (one row per unit of multiplicity, numbered as ``row_number()`` over the partition in
    the ORDER BY, ties broken by every column ascending, NULLs first), the new ones
    inserted and the old ones retracted."""

    def __init__(self, node: PTopN, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.names = list(node.input.columns)

    def run(self, delta: pa.Table) -> pa.Table:
        node = self.node
        delta = delta.rename_columns([*self.names, WEIGHT])
        state = PartitionState(node, self.lc, delta)
        loaded = state.load(delta)
        out = self.out_schema(delta)
        if loaded is None:
            return out.empty_table()
        d, old, new = loaded
        keep = new
        if node.closes:  # the rest can never re-enter
            top = self.rank(new)
            keep = consolidated(top.append_column(WEIGHT, pa.array(
                np.ones(top.num_rows, np.int64))), [*self.names, BUCKET])
        state.store(keep)
        old, new = state.touched_partitions(d, old, new)
        return concat([self.emit(self.rank(new), 1), self.emit(self.rank(old), -1)],
                      out)

    def rank(self, rows: pa.Table) -> pa.Table:
        """Each partition's first ``n`` units of ``rows`` (weighted) with ``_rn``."""
        node = self.node
        w = rows[WEIGHT].to_numpy()
        live = np.flatnonzero(w > 0)
        units = rows.take(np.repeat(live, w[live])).drop_columns([WEIGHT])
        keys = [(p, False, True) for p in node.partition]
        keys += [(k.column, k.desc, k.nulls_first) for k in node.order]
        keys += [(c, False, True) for c in self.names]
        units = units.take(sort_indices(units, keys))
        starts = run_starts(units, list(node.partition))
        at = np.arange(units.num_rows)
        rn = at - np.maximum.accumulate(np.where(starts, at, 0)) + 1
        keep = rn <= node.n
        return units.filter(pa.array(keep)).append_column("_rn", pa.array(rn[keep], pa.int32()))

    def out_schema(self, delta: pa.Table) -> pa.Schema:
        """The output's columns: the input's, the rank (when it is a column), the weight."""
        fields = [delta.schema.field(c) for c in self.names]
        if self.node.rank:
            fields.append(pa.field(self.node.rank, pa.int32()))
        return pa.schema([*fields, pa.field(WEIGHT, pa.int64())])

    def emit(self, ranked: pa.Table, weight: int) -> pa.Table:
        """Ranked rows as output rows of weight ``weight``."""
        cols = [*self.names, *(["_rn"] if self.node.rank else [])]
        rows = ranked.select(cols).append_column(
            WEIGHT, pa.array(np.full(ranked.num_rows, weight, np.int64)))
        return rows.rename_columns([*self.node.columns, WEIGHT])


class SessionKernel:
    """``session.Sessions`` in Arrow: the touched partitions' rows get their sessions
    before and after the batch (in time order, a row less than the gap after the row before
    it joins that row's session; a session is ``[first time, last time + gap)``), and the
    difference is the output: a row whose session grew or merged moves to the new one."""

    def __init__(self, node: PSession, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.names = list(node.input.columns)

    def run(self, delta: pa.Table) -> pa.Table:
        node, lc = self.node, self.lc
        delta = delta.rename_columns([*self.names, WEIGHT])
        micros(delta.schema.field(node.time).type)
        delta = delta.filter(pc.is_valid(delta[node.time]))
        state = PartitionState(node, lc, delta)
        out = self.out_schema(delta)
        loaded = state.load(delta)
        if loaded is None:
            return out.empty_table()
        d, old, new = loaded
        assigned = self.assign(new)
        keep = new
        if node.closes and lc.ctx.watermark is not None:  # closed sessions are final
            end = pc.cast(assigned[WINDOW_COLUMNS[1]], pa.int64())
            keep = assigned.filter(pc.greater(end, lc.ctx.watermark)).drop_columns(
                list(WINDOW_COLUMNS))
        state.store(keep)
        before, after = state.touched_partitions(d, self.assign(old), assigned)
        gone = before.set_column(before.schema.get_field_index(WEIGHT), WEIGHT,
                                 pc.negate(before[WEIGHT]))
        return consolidated(concat([after, gone], out), list(out.names[:-1]))

    def out_schema(self, delta: pa.Table) -> pa.Schema:
        """The input's columns, the session's start and end, the weight."""
        time = delta.schema.field(self.node.time).type
        return pa.schema([*(delta.schema.field(c) for c in self.names),
                          *(pa.field(c, time) for c in WINDOW_COLUMNS),
                          pa.field(WEIGHT, pa.int64())])

    def assign(self, rows: pa.Table) -> pa.Table:
        """``rows`` (weighted, time not NULL) with their session's start and end."""
        node = self.node
        part = list(node.partition)
        rows = rows.take(sort_indices(rows, [(c, False, True) for c in [*part, node.time]]))
        t = pc.cast(rows[node.time], pa.int64()).to_numpy()
        starts = run_starts(rows, part)
        starts[1:] |= np.diff(t) >= node.gap_us
        first = np.flatnonzero(starts)
        session = np.cumsum(starts) - 1
        last = np.append(first[1:], len(t)) - 1
        time = rows.schema.field(node.time).type
        start = pa.array(t[first][session]).cast(time) if len(t) else pa.array([], time)
        end = pa.array(t[last][session] + node.gap_us).cast(time) if len(t) else \
            pa.array([], time)
        return rows.append_column(WINDOW_COLUMNS[0], start).append_column(
            WINDOW_COLUMNS[1], end)


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
        old, new = state.touched_partitions(d, old, new)
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

"""Aggregates over a sliding time range (``f(x) OVER (PARTITION BY p ORDER BY t RANGE
BETWEEN <range> PRECEDING AND CURRENT ROW)``) over updating input: the formula, the state and
the step, in Arrow.

**Formula.** Every unit of an input row's multiplicity gets the aggregates of its frame: the
rows of its partition whose time is at most ``range`` before its own, up to its peers (rows
of the same time) included; a row of NULL time is a peer of the partition's NULL times only.
A batch changes only the frames of its partitions from the earliest time it changes on: the
touched partitions' rows from that time get their aggregates before and after the batch, and
the difference is the output (earlier rows keep their values).

**State.** The input's rows with multiplicity, bucketed by the hash of the partition key (as
top-N's, ``partition_steps``). Over append-only input the state keeps only rows within the
range of the watermark: no row on time can reach back further.

**The step** (``OverStep``) computes a frame's COUNT, SUM and AVG of integers and decimals
from prefix sums (exact) and its MIN and MAX from a sparse table of the values' order, with
Spark's result types and rounding (AVG of decimals: ``aggregate``'s). It runs in the driver
(``partition_kernel.OverKernel``) and in Spark tasks (``partition_tasks``). SUM and AVG of
floating-point numbers (Spark adds a frame's values in its order: a prefix sum would round
differently) and nested types run as ``over_frames.OverRange``'s Spark window functions.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import WEIGHT
from octo_platform.runtime.operators.aggregate import decimal_mean
from octo_platform.runtime.operators.arrow import concat, key_join, primitive, run_starts, \
    safe_keys, sort_indices
from octo_platform.runtime.operators.partition_steps import consolidated, is_micros, touched

__all__ = ["OverStep"]


@dataclass(frozen=True)
class OverStep:
    """One sliding OVER range's step (picklable). ``out``: the output's columns (the
    input's, then one per aggregate, typed as Spark's window functions type them) and
    ``_w``."""

    names: tuple[str, ...]
    partition: tuple[str, ...]
    time: str
    range_us: int
    aggs: tuple[tuple[str, str | None], ...]  # (function, argument or None for COUNT(*))
    closes: bool
    out: pa.Schema

    @staticmethod
    def of(node: Any, rows: pa.Schema, out: pa.Schema) -> OverStep | None:
        """The step of OVER ``node`` over input ``rows`` (weighted) with output ``out``;
        None where it does not compute the aggregates (see the module docstring)."""
        if not all(primitive(f.type) for f in rows) or not is_micros(rows.field(node.time).type):
            return None
        for a in node.aggs:
            t = rows.field(a.arg).type if a.arg else None
            if a.func in ("sum", "avg") and not (pa.types.is_integer(t) or pa.types.is_decimal(t)):
                return None
        return OverStep(tuple(node.input.columns), tuple(node.partition), node.time,
                        node.range_us, tuple((a.func, a.arg) for a in node.aggs),
                        bool(node.closes), out)

    def run(self, d: pa.Table, old: pa.Table, new: pa.Table, watermark: int | None = None
            ) -> tuple[pa.Table, pa.Table]:
        """(output Δ, the buckets' rows to keep) from the batch's rows ``d`` and the touched
        buckets' rows ``old`` and ``new`` (``watermark``: the table's, after the batch)."""
        keep = new
        if self.closes and watermark is not None:  # no row on time reaches back further
            t = pc.cast(new[self.time], pa.int64())
            keep = new.filter(pc.fill_null(pc.or_kleene(pc.is_null(t), pc.greater_equal(
                t, watermark - self.range_us)), False))
        old, new = touched(self.partition, d, old, new)
        parts = []
        for rows, weight in ((new, 1), (old, -1)):
            got = self.since(d, self.compute(rows))
            parts.append(got.append_column(WEIGHT, pa.array(np.full(got.num_rows, weight,
                                                                    np.int64))))
        return consolidated(concat(parts, self.out), list(self.out.names[:-1])), keep

    def compute(self, rows: pa.Table) -> pa.Table:
        """Each unit of ``rows``' multiplicity (weighted) with its frame's aggregates (the
        output's columns but ``_w``)."""
        w = rows[WEIGHT].to_numpy()
        live = np.flatnonzero(w > 0)
        part = list(self.partition)
        units = rows.take(np.repeat(live, w[live])).select(list(self.names))
        units = units.take(sort_indices(units, [(c, False, True) for c in [*part, self.time]]))
        lo, hi = self.frames(units)
        cols = [units[c] for c in self.names]
        for func, arg in self.aggs:
            cols.append(self.aggregate(func, None if arg is None else units[arg], lo, hi,
                                       self.out.field(len(cols)).type))
        return pa.table(cols, schema=pa.schema(list(self.out)[:-1]))

    def frames(self, units: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Per unit (sorted by partition and time, NULLs first), its frame: rows
        ``[lo, hi)``."""
        n = units.num_rows
        if not n:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        starts = run_starts(units, list(self.partition))
        pid = np.cumsum(starts) - 1
        first = np.flatnonzero(starts)[pid]  # each unit's partition's first row
        time = pc.cast(units[self.time], pa.int64())
        null = pc.is_null(time).to_numpy(zero_copy_only=False)
        t = pc.fill_null(time, np.iinfo(np.int64).min).to_numpy()
        nulls = np.bincount(pid, weights=null).astype(np.int64)  # NULL times come first
        lo = np.where(null, first, _rank(pid, t, pid, t - self.range_us, after=False))
        hi = np.where(null, first + nulls[pid], _rank(pid, t, pid, t, after=True))
        return lo.astype(np.int64), hi.astype(np.int64)

    @staticmethod
    def aggregate(func: str, x: pa.ChunkedArray | None, lo: np.ndarray, hi: np.ndarray,
                  t: pa.DataType) -> pa.Array:
        """``func`` of ``x`` (None: COUNT(*)) over each frame ``[lo, hi)``, as type ``t``."""
        if x is None:
            return pa.array(hi - lo, pa.int64()).cast(t)
        valid = pc.is_valid(x).to_numpy(zero_copy_only=False)
        count = _prefix(valid.astype(np.int64))
        counts = count[hi] - count[lo]
        if func == "count":
            return pa.array(counts, pa.int64()).cast(t)
        none = counts == 0
        if func in ("min", "max"):
            return _extremes(func, x, lo, hi, none).cast(t)
        if pa.types.is_decimal(x.type):  # exact: unscaled integers in Python
            scale = x.type.scale
            sums = _prefix(np.array([0 if v is None else int(v.scaleb(scale))
                                     for v in x.to_pylist()], dtype=object))
            total = pa.array([None if e else Decimal(int(v)).scaleb(-scale)
                              for v, e in zip(sums[hi] - sums[lo], none)],
                             pa.decimal256(76, scale))
        else:
            sums = _prefix(pc.fill_null(x, 0).to_numpy().astype(np.int64))
            total = pa.array(sums[hi] - sums[lo], pa.int64(), mask=none)
        if func == "sum":
            return total.cast(t)
        if pa.types.is_decimal(t):
            return decimal_mean(total, pa.array(counts, pa.int64()), t)
        return pc.divide(total.cast(pa.float64()), pa.array(counts, pa.float64())).cast(t)

    def since(self, d: pa.Table, rows: pa.Table) -> pa.Table:
        """The ``rows`` at or after their partition's earliest time in ``d`` (a NULL time
        is a peer of NULLs only: always kept)."""
        part, t = list(self.partition), self.time
        first = d.group_by(part, use_threads=False).aggregate([(t, "min")]) if part else \
            pa.table({f"{t}_min": pa.array([pc.min(d[t]).as_py()], d.schema.field(t).type)})
        left, lkeys = safe_keys(rows, part, "_l")
        right, rkeys = safe_keys(first, part, "_r")
        joined = key_join(left, right.select([*rkeys, f"{t}_min"]), lkeys, rkeys, "inner")
        keep = pc.fill_null(pc.or_kleene(pc.is_null(joined[t]), pc.greater_equal(
            joined[t], joined[f"{t}_min"])), False)
        return joined.filter(keep).select(rows.column_names)


def _prefix(values: np.ndarray) -> np.ndarray:
    """Prefix sums with a leading 0: a range ``[lo, hi)`` sums to ``p[hi] - p[lo]``."""
    return np.concatenate([np.zeros(1, values.dtype), np.cumsum(values)])


def _rank(pid: np.ndarray, t: np.ndarray, qpid: np.ndarray, qt: np.ndarray, after: bool
          ) -> np.ndarray:
    """Per query ``(qpid, qt)``, the number of rows ``(pid, t)`` (sorted) before it: below
    it, or (``after``) at most it."""
    n = len(pid)
    flag = np.concatenate([np.zeros(n, np.int8) if after else np.ones(n, np.int8),
                           np.ones(len(qpid), np.int8) if after else np.zeros(len(qpid),
                                                                               np.int8)])
    order = np.lexsort((flag, np.concatenate([t, qt]), np.concatenate([pid, qpid])))
    is_row = order < n
    before = np.cumsum(is_row) - is_row
    got = np.empty(len(qpid), np.int64)
    got[order[~is_row] - n] = before[~is_row]
    return got


def _extremes(func: str, x: pa.ChunkedArray, lo: np.ndarray, hi: np.ndarray,
              none: np.ndarray) -> pa.Array:
    """MIN or MAX of ``x`` over each frame ``[lo, hi)`` (NULLs skipped; NULL where a frame
    has no value, ``none``), from a sparse table of the values' positions in their order
    (Spark's: NaN above every number)."""
    n = len(x)
    order = sort_indices(pa.table({"x": x}), [("x", func == "max", False)]).to_numpy()
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)  # NULLs last: never picked over a value
    best = [rank]
    span = 1
    while span * 2 <= max(n, 1):
        prev = best[-1]
        best.append(np.minimum(prev[:-span], prev[span:]))
        span *= 2
    length = np.maximum(hi - lo, 1)
    level = np.floor(np.log2(length)).astype(np.int64)
    pick = np.zeros(len(lo), np.int64)
    for k in np.unique(level):
        at = np.flatnonzero(level == k)
        table = best[k]
        a, b = lo[at], np.maximum(hi[at] - (1 << k), lo[at])
        pick[at] = np.minimum(table[np.minimum(a, len(table) - 1)],
                              table[np.minimum(b, len(table) - 1)])
    values = x.combine_chunks().take(pa.array(order[np.minimum(pick, max(n - 1, 0))]
                                              if n else np.zeros(0, np.int64)))
    return pc.if_else(pa.array(none), pa.scalar(None, x.type), values)

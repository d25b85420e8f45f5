"""Top-N and SESSION windows' steps in pure Arrow: (the batch's rows of some partitions, the
rows of their buckets before and after it) -> (output Δ, the buckets' new rows). No Spark
here: the same step runs in the driver (``partition_kernel``, over the run's state cache)
and in Spark tasks (``partition_tasks``, one per bucket of the state).

Rows are weighted (the input's columns, then ``_w``; a bucket's rows also carry
``_bucket``), and ordered as Spark's window functions order them (``arrow.sort_indices``:
ORDER BY's directions and NULL placement, NaN above every number), numbered as
``row_number()`` numbers them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, WEIGHT
from octo_platform.logical.plan import WINDOW_COLUMNS
from octo_platform.physical.plan import PSession, PTopN
from octo_platform.runtime.operators.arrow import concat, normal_floats, run_starts, \
    sort_indices
from octo_platform.runtime.operators.keyed_rows import KeyedRows

__all__ = ["TopNStep", "SessionStep", "consolidated", "touched", "is_micros"]


def is_micros(time: pa.DataType) -> bool:
    """Whether ``time`` is Spark's TIMESTAMP (microseconds), whose integer values the steps
    compare with the watermark and the gap."""
    return pa.types.is_timestamp(time) and time.unit == "us"


def consolidated(rows: pa.Table, columns: list[str]) -> pa.Table:
    """One row per distinct value of ``columns`` (floats as Spark groups them) with its
    summed weight, zeros dropped (``context.consolidate``)."""
    rows = normal_floats(rows.select([*columns, WEIGHT]))
    got = rows.group_by(columns, use_threads=False).aggregate([(WEIGHT, "sum")])
    got = got.rename_columns([*columns, WEIGHT])
    return got.filter(pc.not_equal(got[WEIGHT], 0)).cast(rows.schema)


def touched(partition: tuple[str, ...], d: pa.Table, *tables: pa.Table) -> tuple[pa.Table, ...]:
    """The rows of each of ``tables`` whose partition key occurs in ``d`` (all of them for
    an empty key): only those partitions can change."""
    if not partition:
        return tables
    return tuple(KeyedRows(t, list(partition)).find(d).rows for t in tables)


@dataclass(frozen=True)
class TopNStep:
    """``top_n.TopN``'s step: the touched partitions' top rows before and after the batch
    (one row per unit of multiplicity, numbered as ``row_number()`` over the partition in
    the ORDER BY, ties broken by every column ascending, NULLs first), the new ones
    inserted and the old ones retracted. Over append-only input a bucket keeps only its
    partitions' top rows (the rest can never re-enter)."""

    names: tuple[str, ...]  # the input's columns
    columns: tuple[str, ...]  # the output's
    partition: tuple[str, ...]
    order: tuple[tuple[str, bool, bool], ...]  # (column, descending, NULLs first)
    n: int
    rank: bool  # the rank is a column of the output
    closes: bool

    @staticmethod
    def of(node: PTopN) -> TopNStep:
        return TopNStep(tuple(node.input.columns), tuple(node.columns), tuple(node.partition),
                        tuple((k.column, k.desc, k.nulls_first) for k in node.order), node.n,
                        bool(node.rank), node.closes)

    def run(self, d: pa.Table, old: pa.Table, new: pa.Table, watermark: int | None = None
            ) -> tuple[pa.Table, pa.Table]:
        """(output Δ, the buckets' rows to keep) from the batch's rows ``d`` and the
        touched buckets' rows ``old`` and ``new`` (``watermark``: ``SessionStep.run``'s,
        not needed here)."""
        keep = new
        if self.closes:
            top = self.ranked(new)
            keep = consolidated(top.append_column(WEIGHT, pa.array(
                np.ones(top.num_rows, np.int64))), [*self.names, BUCKET])
        old, new = touched(self.partition, d, old, new)
        return concat([self.emit(self.ranked(new), 1), self.emit(self.ranked(old), -1)],
                      self.out_schema(d.schema)), keep

    def ranked(self, rows: pa.Table) -> pa.Table:
        """Each partition's first ``n`` units of ``rows`` (weighted) with ``_rn``."""
        w = rows[WEIGHT].to_numpy()
        live = np.flatnonzero(w > 0)
        units = rows.take(np.repeat(live, w[live])).drop_columns([WEIGHT])
        keys = [(p, False, True) for p in self.partition]
        keys += [*self.order, *((c, False, True) for c in self.names)]
        units = units.take(sort_indices(units, keys))
        starts = run_starts(units, list(self.partition))
        at = np.arange(units.num_rows)
        rn = at - np.maximum.accumulate(np.where(starts, at, 0)) + 1
        keep = rn <= self.n
        return units.filter(pa.array(keep)).append_column("_rn", pa.array(rn[keep], pa.int32()))

    def out_schema(self, rows: pa.Schema) -> pa.Schema:
        """The output's columns: the input's (as ``rows`` types them), the rank (when it is
        a column), the weight."""
        fields = [rows.field(c) for c in self.names]
        if self.rank:
            fields.append(pa.field("_rn", pa.int32()))
        fields.append(pa.field(WEIGHT, pa.int64()))
        return pa.schema([pa.field(c, f.type) for c, f in
                          zip([*self.columns, WEIGHT], fields)])

    def emit(self, ranked: pa.Table, weight: int) -> pa.Table:
        """Ranked rows as output rows of weight ``weight``."""
        cols = [*self.names, *(["_rn"] if self.rank else [])]
        rows = ranked.select(cols).append_column(
            WEIGHT, pa.array(np.full(ranked.num_rows, weight, np.int64)))
        return rows.rename_columns([*self.columns, WEIGHT])


@dataclass(frozen=True)
class SessionStep:
    """``session.Sessions``' step: the touched partitions' rows get their sessions before
    and after the batch (in time order, a row less than the gap after the row before it
    joins that row's session; a session is ``[first time, last time + gap)``), and the
    difference is the output: a row whose session grew or merged moves to the new one.
    Over append-only input the rows of sessions the watermark closed leave the state."""

    names: tuple[str, ...]
    partition: tuple[str, ...]
    time: str
    gap_us: int
    closes: bool

    @staticmethod
    def of(node: PSession) -> SessionStep:
        return SessionStep(tuple(node.input.columns), tuple(node.partition), node.time,
                           node.gap_us, node.closes)

    def run(self, d: pa.Table, old: pa.Table, new: pa.Table, watermark: int | None
            ) -> tuple[pa.Table, pa.Table]:
        """(output Δ, the buckets' rows to keep); ``watermark``: the table's, after the
        batch (µs, None before the first)."""
        assigned = self.assign(new)
        keep = new
        if self.closes and watermark is not None:  # closed sessions are final
            end = pc.cast(assigned[WINDOW_COLUMNS[1]], pa.int64())
            keep = assigned.filter(pc.greater(end, watermark)).drop_columns(
                list(WINDOW_COLUMNS))
        before, after = touched(self.partition, d, self.assign(old), assigned)
        gone = before.set_column(before.schema.get_field_index(WEIGHT), WEIGHT,
                                 pc.negate(before[WEIGHT]))
        out = self.out_schema(d.schema)
        return consolidated(concat([after, gone], out), list(out.names[:-1])), keep

    def out_schema(self, rows: pa.Schema) -> pa.Schema:
        """The input's columns, the session's start and end, the weight."""
        time = rows.field(self.time).type
        return pa.schema([*(rows.field(c) for c in self.names),
                          *(pa.field(c, time) for c in WINDOW_COLUMNS),
                          pa.field(WEIGHT, pa.int64())])

    def assign(self, rows: pa.Table) -> pa.Table:
        """``rows`` (weighted, time not NULL) with their session's start and end."""
        part = list(self.partition)
        rows = rows.take(sort_indices(rows, [(c, False, True) for c in [*part, self.time]]))
        t = pc.cast(rows[self.time], pa.int64()).to_numpy()
        starts = run_starts(rows, part)
        starts[1:] |= np.diff(t) >= self.gap_us
        first = np.flatnonzero(starts)
        session = np.cumsum(starts) - 1
        last = np.append(first[1:], len(t)) - 1
        time = rows.schema.field(self.time).type
        start = pa.array(t[first][session]).cast(time) if len(t) else pa.array([], time)
        end = pa.array(t[last][session] + self.gap_us).cast(time) if len(t) else \
            pa.array([], time)
        return rows.append_column(WINDOW_COLUMNS[0], start).append_column(
            WINDOW_COLUMNS[1], end)

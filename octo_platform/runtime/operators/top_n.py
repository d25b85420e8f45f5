"""Top-N per partition over updating input: its formula, state and step, in Arrow.

**Formula.** Only the partitions a batch touches can change: their top rows (one per unit
of multiplicity, numbered as ``row_number()`` over the partition in the ORDER BY, ties
broken by every column ascending, NULLs first) are ranked before and after the batch, the
new ones inserted and the old ones retracted, so a deleted leader is replaced by the next
row and ranks shift as updates.

**State.** The input's rows with multiplicity (``c0, c1, ..., _n``), bucketed by the hash of
the partition key (``context.PartitionRows``' layout); a batch rewrites the buckets it
touches. Over append-only input a bucket keeps only its partitions' top rows (the rest can
never re-enter).

The step runs in the driver (``partition_kernel.TopNKernel``) and in Spark tasks
(``partition_tasks``); inputs of types Arrow cannot sort run as
``top_n_frames.TopNFrames``' Spark SQL over the same state.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from octo_platform.columns import BUCKET, WEIGHT
from octo_platform.physical.plan import PTopN
from octo_platform.runtime.operators.arrow import concat, run_starts, sort_indices
from octo_platform.runtime.operators.partition_steps import consolidated, touched

__all__ = ["TopNStep"]


@dataclass(frozen=True)
class TopNStep:
    """Top-N's step: the touched partitions' top rows before and after the batch
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

"""SESSION windows over updating input: their formula, state and step, in Arrow.

**Formula.** Rows less than the gap apart (in time order, per partition) share a session,
``[first time, last time + gap)``. A batch assigns the sessions of the partitions it touches
twice, over their rows before and after it, and emits the difference: a row whose session
grew or merged is retracted from the old session and inserted into the new one.

**State.** The input's rows with multiplicity, bucketed by the hash of the partition key (as
top-N's). Over append-only input the rows of sessions the watermark closed leave the
state: no row on time can join them any more.

The step runs in the driver (``partition_kernel.SessionKernel``) and in Spark tasks
(``partition_tasks``); a time column of another type than TIMESTAMP, or inputs of types
Arrow cannot sort, run as ``session_frames.SessionFrames``' Spark SQL over the same state.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import WEIGHT
from octo_platform.logical.plan import WINDOW_COLUMNS
from octo_platform.physical.plan import PSession
from octo_platform.runtime.operators.arrow import concat, run_starts, sort_indices
from octo_platform.runtime.operators.partition_steps import consolidated, touched

__all__ = ["SessionStep"]


@dataclass(frozen=True)
class SessionStep:
    """SESSION's step: the touched partitions' rows get their sessions before
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

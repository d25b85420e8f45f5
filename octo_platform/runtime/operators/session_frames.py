"""SESSION windows over a time column Arrow's step does not take, or inputs of types Arrow
cannot sort, in Spark SQL: ``session``'s formula over the same state."""
from __future__ import annotations

from typing import TYPE_CHECKING

from octo_platform.logical.plan import WINDOW_COLUMNS
from octo_platform.physical.plan import PSession
from octo_platform.runtime.operators.context import (
    BatchContext,
    PartitionRows,
    W,
    consolidate,
)
from octo_platform.sqltext import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SessionFrames"]


class SessionFrames:
    """SESSION windows over a partition's rows: rows less than the gap apart (in time
    order) share a session, ``[first time, last time + gap)``.

    State: the input's rows with multiplicity, bucketed by hash of the partition key (as
    top-N's). A batch assigns the sessions of the partitions it touches twice, over their
    rows before and after it, and emits the difference: a row whose session grew or merged
    is retracted from the old session and inserted into the new one. Over append-only
    input the rows of sessions the watermark closed leave the state: no row on time can
    join them any more.
    """

    def __init__(self, node: PSession, ctx: BatchContext) -> None:
        self.node = node
        self.ctx = ctx
        self.names = list(node.input.columns)
        self.cols = [quote(c) for c in self.names]

    def assign(self, rows: DataFrame) -> DataFrame:
        """``rows`` (weighted, time not NULL) with their session's start and end."""
        node = self.node
        t = f"unix_micros({quote(node.time)})"
        part = ", ".join(quote(p) for p in node.partition)
        by = f"PARTITION BY {part} " if part else ""
        gap = node.gap_us
        starts = rows.selectExpr(
            *self.cols, W, f"CASE WHEN {t} - lag({t}) OVER ({by}ORDER BY {t}) < {gap} "
                           f"THEN 0 ELSE 1 END AS _starts")
        numbered = starts.selectExpr(
            *self.cols, W, f"sum(_starts) OVER ({by}ORDER BY {t} ROWS UNBOUNDED PRECEDING) "
                           "AS _session")
        within = f"PARTITION BY {part + ', ' if part else ''}_session"
        start, end = WINDOW_COLUMNS
        return numbered.selectExpr(
            *self.cols, f"timestamp_micros(min({t}) OVER ({within})) AS {start}",
            f"timestamp_micros(max({t}) OVER ({within}) + {gap}) AS {end}", W)

    def run(self, delta: DataFrame) -> DataFrame:
        node, ctx = self.node, self.ctx
        state = PartitionRows(ctx, node.id, self.names, node.partition)
        delta = delta.filter(f"{quote(node.time)} IS NOT NULL")
        loaded = state.load(delta)
        if loaded is None:
            return self.assign(delta.limit(0))
        d, old, new = loaded
        assigned = ctx.checkpoint(self.assign(new))  # every row of the touched buckets
        keep = new
        if node.closes and ctx.watermark is not None:  # closed sessions are final
            end = quote(WINDOW_COLUMNS[1])
            keep = assigned.filter(f"unix_micros({end}) > {ctx.watermark}").selectExpr(
                *self.cols, W)
        state.store(keep)
        before, after = state.touched_partitions(d, self.assign(old), assigned)
        out = [*self.cols, *(quote(c) for c in WINDOW_COLUMNS)]
        return consolidate(after.unionByName(before.selectExpr(*out, f"-{W} AS {W}")), out)

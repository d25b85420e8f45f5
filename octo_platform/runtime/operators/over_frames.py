"""Sliding OVER ranges in Spark SQL: Spark's own window functions, for the aggregates and
types ``over``'s Arrow step does not compute (SUM and AVG of floating-point numbers, nested
types), and for the output's types."""
from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

from octo_platform.physical.plan import POver
from octo_platform.runtime.operators.context import (
    BatchContext,
    PartitionRows,
    W,
    consolidate,
)
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["OverRange"]


class OverRange:
    """``f(x) OVER (PARTITION BY p ORDER BY t RANGE BETWEEN <range> PRECEDING AND CURRENT
    ROW)`` for every input row, by Spark's own window function.

    State: the input's rows with multiplicity, bucketed by hash of the partition key (as
    top-N's). A batch computes the aggregates of its partitions' rows before and after it,
    from the earliest time it changes on (earlier rows keep their values), and emits the
    difference. Over append-only input the state keeps only rows within the range of the
    watermark: no row on time can reach back further.
    """

    def __init__(self, node: POver, ctx: BatchContext | None) -> None:
        """``ctx`` None: for ``compute`` alone (the output's types, ``runtime/checks``)."""
        self.node = node
        self.ctx = ctx
        self.names = list(node.input.columns)
        self.cols = [quote(c) for c in self.names]

    def compute(self, rows: DataFrame, side: str | None = None) -> DataFrame:
        """Each unit of ``rows``' multiplicity with its aggregates (weight 1); ``side``: a
        column of ``rows`` that splits them further (kept, after the input's columns)."""
        node = self.node
        part = ", ".join(quote(p) for p in [*node.partition, *([side] if side else [])])
        seconds = Decimal(node.range_us) / 1_000_000
        frame = (f"{'PARTITION BY ' + part + ' ' if part else ''}ORDER BY {quote(node.time)} "
                 f"RANGE BETWEEN INTERVAL '{seconds}' SECOND PRECEDING AND CURRENT ROW")
        cols = [*self.cols, *([side] if side else [])]
        units = rows.filter(f"{W} > 0").selectExpr(
            *cols, f"explode(sequence(1, CAST({W} AS INT))) AS _unit")
        outs = node.columns[len(self.names):]
        return units.selectExpr(*cols, *[
            f"{a.func}({'1' if a.arg is None else quote(a.arg)}) OVER ({frame}) AS {quote(o)}"
            for a, o in zip(node.aggs, outs)], f"CAST(1 AS BIGINT) AS {W}")

    def run(self, delta: DataFrame) -> DataFrame:
        node, ctx = self.node, self.ctx
        state = PartitionRows(ctx, node.id, self.names, node.partition)
        loaded = state.load(delta)
        if loaded is None:
            return self.compute(delta.limit(0))
        d, old, new = loaded
        keep = new
        t = quote(node.time)
        if node.closes and ctx.watermark is not None:
            keep = new.filter(f"{t} IS NULL OR unix_micros({t}) >= "
                              f"{ctx.watermark - node.range_us}")
        state.store(keep)
        old, new = state.touched_partitions(d, old, new)
        before, after = self.compute(old), self.compute(new)
        # Rows before a partition's earliest changed time keep their values (and rows
        # older than the state keeps are not there to be recomputed).
        part = [quote(p) for p in node.partition]
        first = d.groupBy(*part).agg(sql_expr(f"min({t}) AS _first")) if part else \
            d.selectExpr(f"min({t}) AS _first")
        on = " AND ".join([f"r.{p} <=> f.{p}" for p in part] or ["true"])
        since = f"r.{t} >= f._first OR r.{t} IS NULL"  # NULL times are peers of NULLs only
        before, after = (f.alias("r").join(first.alias("f"), sql_expr(on)).filter(since)
                         .select("r.*") for f in (before, after))
        out = [*self.cols, *(quote(c) for c in node.columns[len(self.names):])]
        return consolidate(after.unionByName(before.selectExpr(*out, f"-{W} AS {W}")), out)

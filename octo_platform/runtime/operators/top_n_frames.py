"""Top-N over inputs of types Arrow cannot sort, in Spark SQL: ``top_n``'s formula over the
same state."""
from __future__ import annotations

from typing import TYPE_CHECKING

from octo_platform.physical.plan import PTopN
from octo_platform.runtime.operators.context import (
    BatchContext,
    PartitionRows,
    W,
)
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TopNFrames"]


class TopNFrames:
    """Top-N per partition, re-ranking only the partitions a batch touches.

    State: the input's rows with multiplicity, bucketed by hash of the partition key; over
    append-only input only each partition's current top ``n`` rows (the rest can never
    re-enter). Output: the touched partitions' new top rows minus their old ones, so a
    deleted leader is replaced by the next row (and ranks shift as updates).
    """

    def __init__(self, node: PTopN, ctx: BatchContext) -> None:
        self.node = node
        self.ctx = ctx
        self.names = list(node.input.columns)
        self.cols = [quote(c) for c in self.names]

    def rank(self, rows: DataFrame) -> DataFrame:
        """Each partition's first ``n`` rows (one per unit of multiplicity) with ``_rn``."""
        node = self.node
        part = ", ".join(quote(p) for p in node.partition)
        order = [k.render() for k in node.order] + [f"{c} ASC NULLS FIRST" for c in self.cols]
        over = (f"PARTITION BY {part} " if part else "") + f"ORDER BY {', '.join(order)}"
        units = rows.filter(f"{W} > 0").selectExpr(
            *self.cols, f"explode(sequence(1, CAST({W} AS INT))) AS _unit")
        return units.selectExpr(*self.cols, f"row_number() OVER ({over}) AS _rn") \
            .filter(f"_rn <= {node.n}")

    def run(self, delta: DataFrame) -> DataFrame:
        node = self.node
        state = PartitionRows(self.ctx, node.id, self.names, node.partition)
        loaded = state.load(delta)
        if loaded is None:
            return self.emit(self.rank(delta.limit(0)), "")
        d, old, new = loaded
        keep = new
        if node.closes:
            keep = self.rank(new).groupBy(*self.cols).agg(sql_expr(f"count(1) AS {W}"))
        state.store(keep)
        old, new = state.touched_partitions(d, old, new)
        return self.emit(self.rank(new), "").union(self.emit(self.rank(old), "-"))

    def emit(self, ranked: DataFrame, sign: str) -> DataFrame:
        """Ranked rows as output rows with weight +1 (``sign`` "") or -1 (``sign`` "-")."""
        rank = [f"CAST(_rn AS INT) AS {quote(self.node.rank)}"] if self.node.rank else []
        return ranked.selectExpr(*self.cols, *rank, f"CAST({sign}1 AS BIGINT) AS {W}")



"""Incremental operators: each turns its input's weighted rows (Δ) into output Δ with Spark.

Stateful operators read the state of the keys a batch touches (pinned to the versions the
previous batch committed), compute new state and output, and stage their state changes;
the pipeline writes all staged changes in one job and commits them after the batch.
Aggregates and joins keep their state as a log of changes (``state_log``); top-N, session
windows and sliding-range aggregates rewrite the hash buckets their partitions fall in.

One room per operator: ``aggregate`` (GROUP BY), ``join``, ``top_n``, ``session`` (SESSION
windows), ``over`` (sliding OVER ranges), each with its incremental formula (in its
docstring), its state layout and its step in pure Arrow. Two schedulers run the steps:
Spark tasks, one per bucket of the state, on this path (``aggregate_tasks``,
``join_tasks``, ``partition_tasks``, sharing ``tasks``), and the driver over its state
cache for small batches (``kernels``, ``partition_kernel``, for ``runtime/driver.py``).
Inputs of types Arrow cannot group or sort (nested types) run as the same formula in Spark
SQL (``aggregate_frames``, ``join_frames``, ``top_n_frames``, ``session_frames``,
``over_frames``; the last also for OVER's sums of floating-point numbers). ``context``
holds what they share, ``partition_steps`` what top-N's, SESSION's and OVER's steps share,
``arrow`` the Arrow helpers; filters, projections and unions are applied here, in
``evaluate``.
"""
from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING

from octo_platform.columns import WEIGHT
from octo_platform.errors import in_operator
from octo_platform.physical.plan import (
    PAggregate,
    PJoin,
    PNode,
    POver,
    PSession,
    PSource,
    PStateless,
    PTopN,
    PUnion,
)
from octo_platform.runtime.operators.aggregate_tasks import run_aggregate
from octo_platform.runtime.operators.context import (
    BatchContext,
    Sink,
    StagedWrite,
    StateReader,
    W,
    apply_steps,
    bucket_sql,
    consolidate,
    picked_columns,
    touched_buckets,
)
from octo_platform.runtime.operators.join_tasks import run_join
from octo_platform.runtime.operators.partition_tasks import run_partitioned

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["StateReader", "StagedWrite", "BatchContext", "Sink", "picked_columns", "evaluate",
           "bucket_sql",
           "apply_steps", "consolidate", "touched_buckets"]


def evaluate(node: PNode, ctx: BatchContext) -> DataFrame:
    """The output Δ of ``node`` for this batch: its columns plus the weight column; an error
    in planning it carries the operator's name (``errors.in_operator``; the tasks' errors
    carry it too: ``tasks.run_group``)."""
    with in_operator(node.located()):
        return _evaluate(node, ctx)


def _evaluate(node: PNode, ctx: BatchContext) -> DataFrame:
    if isinstance(node, PSource):
        return ctx.inputs[node.name.lower()]
    if isinstance(node, PStateless):
        rows = evaluate(node.input, ctx)
        if ctx.sunk is not None:  # the operator below wrote the table: nothing reads these
            return rows
        return apply_steps(rows, node.steps, W)
    if isinstance(node, PUnion):
        parts = [evaluate(c, ctx).toDF(*node.columns, WEIGHT) for c in node.children]
        return reduce(lambda a, b: a.union(b), parts)
    if isinstance(node, PAggregate):
        return run_aggregate(node, ctx, evaluate(node.input, ctx))
    if isinstance(node, PJoin):
        return run_join(node, ctx, evaluate(node.left, ctx), evaluate(node.right, ctx))
    if isinstance(node, (PTopN, PSession, POver)):
        return run_partitioned(node, ctx, evaluate(node.input, ctx))
    raise TypeError(f"no runtime for {type(node).__name__}")



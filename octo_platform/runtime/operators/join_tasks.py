"""Joins on the Spark path: their step (``join.JoinStep``) in Spark tasks.

Each side's batch rows get their join key and its bucket in Spark SQL (``Join.with_keys``);
the two sides are co-grouped by bucket (one exchange per side), and each bucket's task finds
the rows of the join keys its batch touches in that bucket's files of both sides' logs (and
nothing else), runs the step, writes each side's new log rows of the bucket as a file, and
returns, as one tagged frame (``tasks``): the output Δ and the files it wrote. Each file is
found in the machine's cache (``bucket_cache.file_rows``: its rows sorted by key hash, kept
by the task that wrote it or first read it there), by binary search, so a batch reads the
rows of the keys it touches, not the sides' state. A bucket whose log is due for compaction is rewritten by its
own task: its ``delta`` files' rows, multiplicities summed, become one ``delta`` file (a
partial merge, the ``base`` files not read), or, once the deltas hold as many rows as the
base, all its rows become ``base`` files. The cost of a batch follows the keys it touches,
not the size of either side.

Covered: joins of every kind, over columns Arrow groups. A residual condition is Spark SQL,
applied to the tasks' output: to the matched pairs, and, for an outer, semi or anti join, to
each touched row's candidate matches (``JoinStep.candidates``, tagged ``_part`` 5 for the
left side's, 6 for the right's), whose kept matches are then counted per row
(``Join.counted``: one more exchange). With ``state_ttl`` each stored row carries the batch
that wrote it (``_batch``): a task reads no expired row, and a compaction keeps none. Joins
over columns Arrow does not group (nested types) run as ``join_frames.JoinFrames``' Spark
operators.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa

from octo_platform.columns import BUCKET, COUNT, WEIGHT
from octo_platform.physical.plan import PJoin
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.operators import bucket_cache
from octo_platform.runtime.operators.arrow import concat, primitive
from octo_platform.runtime.operators.context import BatchContext, bucket_sql
from octo_platform.runtime.operators.join import Join, JoinStep, summed
from octo_platform.runtime.operators.keyed_rows import key_hash
from octo_platform.runtime.operators.join_frames import JoinFrames
from octo_platform.runtime.state_log import BATCH, unexpired, with_batch
from octo_platform.runtime.operators.tasks import (
    PART,
    Due,
    Log,
    LogFiles,
    bucket_logs,
    grouped,
    log_files,
    log_parts,
    read_bucket,
    run_cogroup,
    stage_logs,
    tagged,
    tagged_schema,
    visits,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["run_join"]

_CANDIDATES = {"l": 5, "r": 6}  # the ``_part`` of each side's candidates


def run_join(node: PJoin, ctx: BatchContext, ldelta: DataFrame, rdelta: DataFrame
             ) -> DataFrame:
    """The output Δ of join ``node``: by its kernel in Spark tasks where it covers the node,
    else by the Spark operator."""
    op = Join(node, ctx)
    frames = {"l": ldelta.toDF(*op.names["l"], "_lw"), "r": rdelta.toDF(*op.names["r"], "_rw")}
    types = op.key_types(frames["l"], frames["r"])
    keyed = {s: op.with_keys(frames[s], s, types) for s in "lr"}
    stored = {s: op.stored_schema(s, keyed[s].schema) for s in "lr"}
    if node.ttl_us:  # each stored row's batch
        stored = {s: with_batch(t) for s, t in stored.items()}
    if not all(primitive(f.type) for s in "lr" for f in arrow_schema(stored[s])):
        return JoinFrames(node, ctx).run(ldelta, rdelta)
    tables = [node.side_table(op.SIDES[s]) for s in "lr"]
    step = op.step()
    deferred = step.unmatched_sides() if node.residual else ""
    more = {"c": _candidates(op, keyed)} if deferred else {}
    schema = tagged_schema(_output(op, keyed), more)
    logs, due = bucket_logs(ctx, tables, partial=True)
    files = log_files(ctx, tables, [stored[s] for s in "lr"])
    task = _JoinTask(step, tables=logs, files=files, due=due, out=arrow_schema(schema),
                     reader=ctx.reader, counts=ctx.cache_counts,
                     ttl=(ctx.batch, ctx.cut(node)) if node.ttl_us else None)
    # Stored names: PySpark resolves the co-grouped columns by name, and a user's may
    # hold a dot.
    sides = [keyed[s].toDF(*op.stored_names(s)).selectExpr(
        "*", f"{bucket_sql(op.stored_keys(s), ctx.buckets)} AS {BUCKET}") for s in "lr"]
    # due compactions run in their bucket
    sides[0] = visits(sides[0], COUNT, {*due[0], *due[1]})
    by_bucket = [grouped(ctx, side) for side in sides]
    out = ctx.checkpoint(by_bucket[0].cogroup(by_bucket[1]).applyInArrow(
        functools.partial(run_cogroup, task, node.located()), schema))
    rows = stage_logs(ctx, out, tables, due, files)
    if node.residual and node.kind not in ("semi", "anti"):
        rows = rows.filter(node.residual)
    schemas = {s: keyed[s].schema for s in "lr"}
    parts = [op.counted(s, out.filter(f"{PART} = {_CANDIDATES[s]}").selectExpr("c.*"),
                        schemas) for s in deferred]
    return functools.reduce(lambda a, b: a.union(b), parts, rows)


def _output(op: Join, keyed: dict[str, Any]) -> Any:
    """The Spark schema of the join's output Δ: its sides' columns and the weight."""
    from pyspark.sql.types import LongType, StructField, StructType

    sides = "l" if op.node.kind in ("semi", "anti") else "lr"
    fields = [keyed[s].schema[n] for s in sides for n in op.names[s]]
    return StructType([*fields, StructField(WEIGHT, LongType())])


def _candidates(op: Join, keyed: dict[str, Any]) -> Any:
    """The Spark schema of ``JoinStep.candidates``."""
    from pyspark.sql.types import BooleanType, LongType, StructField, StructType

    fields = [keyed[s].schema[n] for s in "lr" for n in op.names[s]]
    counts = [StructField(c, LongType()) for c in ("_lo", "_ln", "_ro", "_rn", "_id")]
    return StructType([*fields, *counts, StructField("_self", BooleanType())])


@dataclass(frozen=True)
class _JoinTask:
    """The ``applyInArrow`` function of the co-grouped sides (runs in Spark tasks): one
    bucket's batch rows of each side -> that bucket's tagged output."""

    step: JoinStep
    tables: list[Log]  # per side
    files: list[LogFiles]  # per side, its log's schema and where the task writes
    due: list[Due]  # per side, the buckets whose log is due for compaction
    out: pa.Schema
    reader: Callable[[str, str], Any]
    # ``state_ttl``: (this batch, the last batch whose rows expired, or None); each stored
    # row then carries its batch (``_batch``), and expired rows are neither read nor kept
    ttl: tuple[int, int | None] | None = None
    counts: Any = None  # ``BatchContext.cache_counts``

    def run(self, key: tuple, left: pa.Table, right: pa.Table) -> pa.Table:
        bucket = key[0].as_py()
        step = self.step
        deltas = {s: t.drop_columns([BUCKET]).rename_columns(step.row(s))
                  for s, t in (("l", left), ("r", right))}
        cut = None if self.ttl is None else self.ttl[1]
        hashes = {x: key_hash(deltas[x], list(step.kcols[x])) for x in "lr"}  # None: no hash
        old, mine, rows_of = {}, {}, {}
        for s, (path, log), schema in zip("lr", self.tables, (f.schema for f in self.files)):
            mine[s] = log.get(bucket, [])
            # each side's rows of the join keys the other side's rows touch (what an inner
            # join matches), or of those either side touches (outer, semi, anti)
            asked = [hashes[x] for x in "lr" if x != s or step.kind != "inner"]
            found, rows_of[s] = self.side(s, path, bucket, mine[s], schema, asked)
            old[s] = unexpired(found, cut).select(schema.names[:len(step.row(s))]) \
                .rename_columns(step.row(s))
        out, delta, found = step.run(deltas, old, first_id=bucket << 32)
        parts = [(0, "o", out), *((_CANDIDATES[s], "c", t) for s, t in found.items())]
        for j, (s, log) in enumerate(zip("lr", self.files)):
            changes = delta[s]
            if self.ttl is not None:
                changes = changes.append_column(BATCH, pa.repeat(
                    pa.scalar(self.ttl[0], pa.int64()), changes.num_rows))
            merged = self.due[j].get(bucket)  # a partial merge's files
            parts += log_parts(j, log, bucket, changes.rename_columns(log.schema.names),
                               mine[s], bucket in self.due[j],
                               lambda r=rows_of[s], m=merged: summed(unexpired(r(m), cut),
                                                                     log.schema),
                               functools.partial(bucket_cache.keep_file, self.tables[j][0],
                                                 bucket, keys=self.keys(s, log.schema)),
                               partial=merged is not None)
        return tagged(self.out, parts, bucket)

    def keys(self, s: str, schema: pa.Schema) -> list[str]:
        """Side ``s``'s join key columns in its log's ``schema``."""
        row = self.step.row(s)
        return schema.names[len(row) - len(self.step.kcols[s]):len(row)]

    def side(self, s: str, path: str, bucket: int, files: list[Any], schema: pa.Schema,
             asked: list[np.ndarray | None]
             ) -> tuple[pa.Table, Callable[[tuple[str, ...] | None], pa.Table]]:
        """A side's stored rows in ``bucket`` (its log's ``files``) of the join keys whose
        hashes are ``asked`` (``key_hash`` of batch rows; None: the keys have none), or
        more; and a function of the rows of some of its files (a compaction's: None for
        all). From the machine's file entries (``bucket_cache.file_rows``) where the keys
        hash, else read whole."""
        keys = self.keys(s, schema)
        names = [f["path"] for f in files]
        hashed = all(a is not None for a in asked)
        entries = []
        for name in names if hashed else ():
            got = bucket_cache.file_rows(path, bucket, name, lambda n=name: read_bucket(
                self.reader, path, [{"path": n}], schema), keys)
            if got is None:
                break
            entries.append(got)
        if not hashed or len(entries) < len(names):  # no hash for these keys, or no cache
            rows = read_bucket(self.reader, path, files, schema)
            return rows, lambda some: rows if some is None else read_bucket(
                self.reader, path, [f for f in files if f["path"] in some], schema)
        if self.counts is not None and names:
            self.counts.add((int(all(hit for _, hit in entries)), 1))
        bucket_cache.forget_files(path, bucket, names)
        hashes = np.unique(np.concatenate(asked))
        found = concat([bucket_cache.find(rows, hashes) for rows, _ in entries], schema)
        return found, lambda some: concat([
            rows.drop_columns([bucket_cache.HASH]) for name, (rows, _) in zip(names, entries)
            if some is None or name in some], schema)

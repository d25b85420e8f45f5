"""Operator state as a log of changes, LSM-style: a batch's cost follows the batch.

An aggregate's (or a multiset's) state table holds, per batch, only the rows of the keys the
batch changed (``delta-*`` files), each stamped with the batch (``_batch``); a key whose
group emptied gets a tombstone (count 0); the table is partitioned by the bucket of the
group key (``_bucket``). A GROUP BY's kernel (``operators/aggregate_tasks``) reads, per
bucket the batch touches, that bucket's files and keeps each key's newest row; the Spark
operators this module serves (windows that close, ``state_ttl``) take the rows of the keys the
batch touches with a semi-join (which Spark broadcasts when the batch is small). Untouched
keys are never rewritten. A join side's state is a log of weighted rows (``_n``) with their
join key, partitioned by the key's bucket, read without de-duplication (a join is linear in
each side's weights).

Compaction runs inside a batch's write job, amortized: when the delta files hold at least as
many rows as the ``base-*`` files, everything is merged into new base files (tombstones and
net-zero rows dropped), so the state is rewritten once each time it doubles in changes; when
there are more than ``MERGE_DELTAS`` delta writes, only those are merged (cost: their rows).
Files removed by a compaction stay until the table's vacuum; readers of older versions
(a batch redone after a crash reads the versions the batch before it committed) still find
them.
"""
from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any, Callable

from octo_platform.sqltext import quote

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["BATCH", "STATE_FORMAT", "MERGE_DELTAS", "StateFile", "read_log", "latest",
           "compaction", "generation", "with_batch", "unexpired", "unexpired_sql"]

STATE_FORMAT = 4  # version of the warehouse's state layout (1: bucket files rewritten whole;
# 2: unpartitioned logs; 3: aggregate logs partitioned by the bucket of the group key;
# 4: join sides' logs keep their join key and are partitioned by its bucket)
BATCH = "_batch"  # the batch that wrote a keyed state row
MERGE_DELTAS = 16  # delta writes to a state table before they are merged into one
StateFile = dict[str, Any]  # {"uri", "path", "rows", "size"} (``Store.data_files``)


def with_batch(schema: StructType) -> StructType:
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([*schema.fields, StructField(BATCH, LongType())])


def read_log(spark: SparkSession, files: list[StateFile], schema: StructType) -> DataFrame:
    """Every row of the state files (``schema``: their columns)."""
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*[f["uri"] for f in files])


def latest(spark: SparkSession, files: list[StateFile], schema: StructType, keys: list[str], *,
           wanted: DataFrame | None = None, alive: str | None = None,
           newer_than: int | None = None, keep_batch: bool = False) -> DataFrame:
    """Each key's newest row (``schema``'s columns, with ``_batch`` only if ``keep_batch``),
    only for the keys in ``wanted`` (a frame of key columns; all keys when None) and, with
    ``alive``, only rows that satisfy it (tombstones fail it); with ``newer_than``, only keys
    whose newest row a later batch wrote (older ones are expired: ``state_ttl``)."""
    rows = read_log(spark, files, with_batch(schema))
    if wanted is not None:
        on = " AND ".join(f"s.{quote(c)} <=> w.{quote(c)}" for c in wanted.columns) or "true"
        rows = rows.alias("s").join(wanted.distinct().alias("w"), _expr(on), "left_semi")
    if len({generation(f) for f in files}) > 1:  # one write holds each key once
        part = f"PARTITION BY {', '.join(quote(k) for k in keys)} " if keys else ""
        rows = rows.selectExpr("*", f"row_number() OVER ({part}ORDER BY {BATCH} DESC) AS _rk") \
            .filter("_rk = 1")
    if newer_than is not None:
        rows = rows.filter(f"{BATCH} > {newer_than}")
    rows = rows.selectExpr(*[quote(f.name) for f in schema.fields], *[BATCH] * keep_batch)
    return rows.filter(alive) if alive else rows


def compaction(files: list[StateFile]) -> tuple[list[StateFile], bool] | None:
    """The files to merge in this batch and whether they become base files (a full merge),
    or None. Amortized: a full merge when the delta files hold as many rows as the base."""
    base = [f for f in files if _is_base(f)]
    deltas = [f for f in files if not _is_base(f)]
    if not deltas:
        return None
    if sum(_rows(f) for f in deltas) >= sum(_rows(f) for f in base):
        return files, True
    if len({generation(f) for f in deltas}) > MERGE_DELTAS:  # writes, not files: a write
        return deltas, False  # of a partitioned log has a file per bucket (and task)
    return None


def merge_keyed(spark: SparkSession, files: list[StateFile], schema: StructType,
                keys: list[str], *, full: bool, alive: str | None) -> DataFrame:
    """The newest row per key of ``files``, with ``_batch`` (without tombstones if ``full``)."""
    rows = read_log(spark, files, with_batch(schema))
    part = f"PARTITION BY {', '.join(quote(k) for k in keys)} " if keys else ""
    rows = rows.selectExpr("*", f"row_number() OVER ({part}ORDER BY {BATCH} DESC) AS _rk") \
        .filter("_rk = 1").drop("_rk")
    return rows.filter(alive) if full and alive else rows


def merge_weighted(spark: SparkSession, files: list[StateFile], schema: StructType,
                   weight: str) -> DataFrame:
    """Rows of ``files`` with their weights summed, net-zero rows dropped."""
    cols = [quote(f.name) for f in schema.fields if f.name != weight]
    return read_log(spark, files, schema).groupBy(*cols).agg(
        _expr(f"sum({quote(weight)}) AS {quote(weight)}")).filter(f"{quote(weight)} != 0")


def _is_base(f: StateFile) -> bool:
    return posixpath.basename(f["path"]).startswith("base-")


def generation(f: StateFile) -> str:
    """The write a file belongs to: ``<prefix>-b<batch>-<write id>`` (see ``writes.py``)."""
    return "-".join(posixpath.basename(f["path"]).split("-")[:3])


def _rows(f: StateFile) -> int:
    return int(f["rows"] or 0)


def _expr(sql: str) -> Callable:
    from pyspark.sql import functions as F

    return F.expr(sql)


def unexpired(rows: pa.Table, cut: int | None) -> pa.Table:
    """``rows`` (with ``_batch``) but those ``state_ttl`` forgot: written by batch ``cut``
    (``BatchContext.cut``) or an earlier one; all of them for no cut."""
    import pyarrow.compute as pc

    return rows if cut is None else rows.filter(pc.greater(rows[BATCH], cut))


def unexpired_sql(cut: int | None) -> str | None:
    """``unexpired`` as a SQL condition (None for no cut)."""
    return None if cut is None else f"{BATCH} > {cut}"

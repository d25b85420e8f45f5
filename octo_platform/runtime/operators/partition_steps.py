"""What the steps of the operators that recompute the partitions a batch touches share
(top-N: ``top_n``, SESSION windows: ``session``): their state's rows consolidated, and the
rows of the touched partitions.

A step maps (the batch's rows of some partitions, the rows of their buckets before and
after it) to (output Δ, the buckets' new rows). No Spark there: the same step runs in the
driver (``partition_kernel``, over the run's state cache) and in Spark tasks
(``partition_tasks``, one per bucket of the state). Rows are weighted (the input's columns,
then ``_w``; a bucket's rows also carry ``_bucket``), and ordered as Spark's window
functions order them (``arrow.sort_indices``: ORDER BY's directions and NULL placement, NaN
above every number).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import WEIGHT
from octo_platform.runtime.operators.arrow import normal_floats
from octo_platform.runtime.operators.keyed_rows import KeyedRows

__all__ = ["consolidated", "touched", "is_micros"]


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

"""Arrow helpers of the driver path (``runtime/driver.py``): Spark SQL evaluated over a
small Arrow table as a local relation, and null-safe key joins.

Spark's optimizer folds projections and filters over a local relation (``ConvertToLocal
Relation``), so ``collect`` on them runs no Spark job: stateless expressions keep Spark SQL's
semantics in the driver, with no second SQL dialect to drift from Spark's.
"""
from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.local_frames import collect_arrow, local_frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DRIVER_BYTES", "spark_eval", "safe_keys", "key_join", "concat", "read_parquet",
           "primitive", "local_path", "normal_floats", "value_bytes", "sort_indices",
           "run_starts", "zero_of"]

# Whatever its rows, a batch whose input is larger than this runs on the Spark path: the
# driver holds the batch (and takes back what Spark computes over it, within
# ``spark.driver.maxResultSize``). Bytes as known before the read (``driver.input_rows``):
# Parquet row groups' uncompressed sizes, text and Delta files' sizes, 1 KiB a Kafka record.
DRIVER_BYTES = 256 << 20


def spark_eval(spark: SparkSession, table: pa.Table,
               build: Callable[[DataFrame], DataFrame], schema: pa.Schema | None = None
               ) -> pa.Table:
    """``build`` (Spark DataFrame calls) applied to ``table`` as a local relation; the
    result as Arrow, typed as Spark types it (``schema``, when the caller knows it already
    from an earlier call: asking Spark for it takes a dozen calls into the JVM).
    Projections and filters run in the driver."""
    return collect_arrow(build(local_frame(spark, table)), table.num_rows, schema)


def local_path(uri: str) -> str | None:
    """The local file a data file URI of the store names (``Store.data_files`` gives a
    local table's files as ``file://`` and their decoded path), or None for a file in
    object storage."""
    path = uri.removeprefix("file://")
    return None if "://" in path else path


def primitive(t: pa.DataType) -> bool:
    """Types the Arrow kernels group, join and sort on."""
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_boolean(t)
            or pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_decimal(t)
            or pa.types.is_binary(t) or pa.types.is_null(t))


def normal_floats(table: pa.Table) -> pa.Table:
    """``table`` with its floating-point values as Spark groups and joins them: -0.0 as
    0.0 and every NaN as one NaN (Spark's ``NormalizeFloatingNumbers``)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_floating(f.type):
            col = table.column(i)
            zero, nan = pa.scalar(0.0, f.type), pa.scalar(float("nan"), f.type)
            col = pc.if_else(pc.equal(col, zero), zero, pc.if_else(pc.is_nan(col), nan, col))
            table = table.set_column(i, f, col)
    return table


def zero_of(t: pa.DataType) -> pa.Scalar:
    """The zero (or empty) value of type ``t``."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.scalar("", t)
    if pa.types.is_binary(t):
        return pa.scalar(b"", t)
    if pa.types.is_boolean(t):
        return pa.scalar(False)
    if pa.types.is_date32(t):
        return pa.array([0], pa.int32()).cast(t)[0]
    if pa.types.is_decimal(t):
        return pa.scalar(Decimal(0), t)
    return pa.array([0], pa.int64()).cast(t)[0]


def safe_keys(table: pa.Table, keys: list[str], prefix: str) -> tuple[pa.Table, list[str]]:
    """``table`` with, per key column, a NULL flag and the value with NULL filled: equal
    under SQL's ``<=>`` exactly when these columns are equal (Arrow joins never match
    NULLs). Returns the table and the new columns' names."""
    cols: list[str] = []
    for i, k in enumerate(keys):
        col = table.column(k)
        if pa.types.is_null(col.type):
            col = col.cast(pa.int64())
        flag, filled = f"{prefix}z{i}", f"{prefix}k{i}"
        table = table.append_column(flag, pc.cast(pc.is_null(col), pa.int8()))
        table = table.append_column(filled, pc.fill_null(col, zero_of(col.type)))
        cols += [flag, filled]
    if not keys:  # a global aggregate: one group
        table = table.append_column(f"{prefix}g",
                                    pa.repeat(pa.scalar(0, pa.int8()), table.num_rows))
        cols.append(f"{prefix}g")
    return table, cols


def key_join(left: pa.Table, right: pa.Table, lkeys: list[str], rkeys: list[str],
             how: str) -> pa.Table:
    """Arrow join on columns made by ``safe_keys`` (``how``: an Acero join type). The
    right table is the hash-table side: pass the small one there."""
    return left.join(right, keys=lkeys, right_keys=rkeys, join_type=how, use_threads=False,
                     coalesce_keys=False)


def read_parquet(source: Any, schema: pa.Schema) -> pa.Table:
    """One of octo's Parquet files (a path or an open file) as ``schema``'s columns, read
    by ``ParquetFile``: ``pq.read_table``'s dataset layer cost more, the more row groups
    (24 files of 125K rows in row groups of 10K: 70 against 44 ms,
    ``benchmarks/parquet_costs.py``; a state log's 24 files, 2.2M rows: 218 against 116 ms)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(source, pre_buffer=True) as f:
        return f.read().select(schema.names).cast(schema)


def concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """Tables of the same columns as one table of ``schema``."""
    parts = [t.select(schema.names).cast(schema) for t in tables if t.num_rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def value_bytes(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A string or binary column's bytes (its data buffer, not copied), and each value's
    start in them and length, with no value copied to Python (a NULL's are whatever its
    offsets say)."""
    col = col.cast(pa.large_binary())
    n = len(col)
    offsets = np.frombuffer(col.buffers()[1], np.int64)[col.offset:col.offset + n + 1]
    data = col.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return data, offsets[:-1], np.diff(offsets)


def sort_indices(rows: pa.Table, keys: list[tuple[str, bool, bool]]) -> pa.Array:
    """The order of ``rows`` by Spark's ``ORDER BY`` of ``keys`` (column, descending,
    NULLs first): NaN above every number, as Spark orders it (Arrow puts NaNs beside the
    NULLs)."""
    sort_keys = []
    for i, (c, desc, nulls_first) in enumerate(keys):
        order, nulls = "descending" if desc else "ascending", \
            "at_start" if nulls_first else "at_end"
        if pa.types.is_floating(rows.schema.field(c).type):
            rows = rows.append_column(f"__octo_nan{i}", pc.is_nan(rows.column(c)))
            sort_keys.append((f"__octo_nan{i}", order, nulls))
        sort_keys.append((c, order, nulls))
    return pc.sort_indices(rows, sort_keys)


def run_starts(rows: pa.Table, columns: list[str]) -> np.ndarray:
    """Per row of ``rows`` (sorted), whether its ``columns`` differ from the row before's
    (NULLs equal, NaNs equal); the first row starts."""
    n = rows.num_rows
    starts = np.zeros(n, bool)
    starts[:1] = True
    for c in columns:
        col = rows.column(c).combine_chunks()
        a, b = col.slice(1), col.slice(0, max(n - 1, 0))
        same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))
        if pa.types.is_floating(col.type):
            same = pc.or_kleene(same, pc.and_(pc.is_nan(a), pc.is_nan(b)))
        starts[1:] |= ~pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    return starts

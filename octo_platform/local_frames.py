"""Small Arrow tables as Spark local relations, with few calls into the JVM, and what Spark
computes over them back as Arrow (``collect_arrow``) (ground floor: imports no octo stage).

``SparkSession.createDataFrame(arrow_table)`` reads four session settings and converts the
schema through the JVM on every call: about 40 py4j calls (measured on pyspark 4.2). The
driver path makes several local relations per batch, so ``local_frame`` reads the settings
once per session and hands the table to the same PySpark conversion: about 9 calls. The
result is the same DataFrame: for up to ``COLLECT_ROWS`` rows a local relation, whose
projections and filters Spark's optimizer evaluates in the driver, without a job. A larger
table is handed over as Arrow batches, one per core, that Spark's tasks turn into rows (as
``createDataFrame`` does above ``spark.sql.execution.arrow.localRelationThreshold``): a local
relation's rows are built in the driver's JVM and its projections and filters evaluated
there row by row, interpreted; measured on 2 cores, a TUMBLE's projection over 300K rows
taken back with ``toArrow`` 1.3-1.7 s as a local relation, 0.12-0.2 s as batches (100K
rows: 0.4-0.6 s against 0.1-0.15 s; 10K rows: 0.16 s against 0.09 s).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

COLLECT_ROWS = 2000  # measured: collecting 10K rows as Python objects took ~0.25 s

__all__ = ["local_frame", "collect_arrow", "arrow_schema", "arrow_type", "COLLECT_ROWS",
           "session_times"]

_SETTINGS = ("spark.sql.session.timeZone", "spark.sql.timestampType",
             "spark.sql.execution.arrow.useLargeVarTypes",
             "spark.sql.execution.arrow.maxRecordsPerBatch", "spark.sql.legacy.timeParserPolicy")
_LOCAL_RELATION = "spark.sql.execution.arrow.localRelationThreshold"
_lock = threading.Lock()


class _Settings(NamedTuple):
    """A session's settings that local frames and time strings are read with."""

    zone: str
    ntz: bool  # TIMESTAMP is TIMESTAMP_NTZ
    large: bool  # Arrow's large string and binary types
    batch: int  # records per Arrow batch
    cores: int
    legacy: bool  # the legacy (lenient) time parser


_settings: dict[int, _Settings] = {}


def _session_settings(spark: SparkSession) -> _Settings:
    """The settings ``local_frame`` converts with, read once per session (call under
    ``_lock``)."""
    key = id(spark._jsparkSession)
    settings = _settings.get(key)
    if settings is None:
        tz, ts_type, large, batch, parser = (spark.conf.get(k) for k in _SETTINGS)
        settings = _settings[key] = _Settings(
            tz, ts_type == "TIMESTAMP_NTZ", large == "true", int(batch),
            spark.sparkContext.defaultParallelism, parser.upper() == "LEGACY")
    return settings


def session_times(spark: SparkSession) -> tuple[str | None, bool]:
    """How the session's JSON reader reads time strings, read once per session: the zone a
    TIMESTAMP column's wall-clock strings are read in (``spark.sql.session.timeZone``;
    None where its TIMESTAMP has no zone, ``spark.sql.timestampType`` TIMESTAMP_NTZ), and
    whether DATE strings are read by the ISO calendar's rules. Both unknown (None, False)
    under Spark's legacy parser (``spark.sql.legacy.timeParserPolicy`` LEGACY), which is
    lenient: it reads ``2024-02-29T12:44:31.5Z`` as 5 milliseconds past the second."""
    with _lock:
        got = _session_settings(spark)
    return (None if got.ntz or got.legacy else got.zone), not got.legacy


def local_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``table`` as a Spark DataFrame (a local relation), as ``createDataFrame`` makes it."""
    convert = getattr(spark, "_create_from_arrow_table", None)
    if convert is None:  # another PySpark: its public way
        return spark.createDataFrame(table)
    with _lock:
        got = _session_settings(spark)
        tz, ntz, large = got.zone, got.ntz, got.large
        if table.num_rows <= COLLECT_ROWS:
            return convert(table, None, tz, ntz, large, got.batch)
        # As batches, one per core: the threshold is read when the frame is made, so it is
        # set for this call only (under the lock: octo's other threads make frames here too).
        before = spark.conf.get(_LOCAL_RELATION)
        spark.conf.set(_LOCAL_RELATION, "0")
        try:
            return convert(table, None, tz, ntz, large,
                           -(-table.num_rows // max(got.cores, 1)))
        finally:
            spark.conf.set(_LOCAL_RELATION, before)


def collect_arrow(df: DataFrame, rows_in: int = 1, schema: pa.Schema | None = None
                  ) -> pa.Table:
    """``df`` (projections and filters over a local relation of ``rows_in`` rows) as Arrow
    (of ``schema``, Spark's types for ``df``, when known). Up to ``COLLECT_ROWS`` rows,
    ``collect``: Spark evaluates it in the driver, no job; above, Python row objects cost
    more than a one-task job's Arrow transfer (~0.1 s): ``toArrow``. ``rows_in=0``: known
    to be empty, only its schema is wanted."""
    import pyarrow as pa

    if rows_in > COLLECT_ROWS:
        return df.toArrow()
    schema = arrow_schema(df.schema) if schema is None else schema
    rows = df.collect() if rows_in else []
    if not rows:
        return schema.empty_table()
    names = schema.names
    columns = list(zip(*[tuple(r) for r in rows]))
    return pa.table([pa.array([_plain(v) for v in col], f.type)
                     for col, f in zip(columns, schema)], names=names)


def arrow_schema(schema: StructType) -> pa.Schema:
    """A Spark schema as Arrow's (as Spark's own Arrow export types it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _plain(value):
    """A collected value as Arrow takes it (a struct ``Row`` becomes a dict)."""
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    return value


_ARROW_TYPES = {"tinyint": "int8", "byte": "int8", "smallint": "int16", "short": "int16",
                "int": "int32", "integer": "int32", "bigint": "int64", "long": "int64",
                "float": "float32", "real": "float32", "double": "float64",
                "string": "string", "boolean": "bool_", "date": "date32", "binary": "binary"}


def arrow_type(spark_type: str) -> pa.DataType | None:
    """The Arrow type Spark gives a column of SQL type ``spark_type`` (as Spark's Arrow
    export types it: ``TIMESTAMP`` as microseconds in UTC), or None for types this does not
    know. Used only to recognize casts that change nothing (``CAST(x AS T)`` where ``x`` is
    already a ``T``), which the driver path may then skip."""
    import pyarrow as pa

    name = "".join(spark_type.lower().split())
    if name in _ARROW_TYPES:
        return getattr(pa, _ARROW_TYPES[name])()
    if name == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if name.startswith("decimal(") and name.endswith(")"):
        try:
            precision, scale = (int(p) for p in name[8:-1].split(","))
        except ValueError:
            return None
        return pa.decimal128(precision, scale)
    return None

"""What every operator shares: the batch context (inputs, pinned state, staged writes) and
the SQL helpers operators build their Spark plans from.

Expressions are built as Spark SQL text (one JVM call per projection, not one per column):
on a small machine the Python-to-JVM round trips otherwise cost more than the data work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from octo_platform.columns import BUCKET, COUNT, WEIGHT
from octo_platform.runtime.state_log import StateFile, compaction
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["StateReader", "StagedWrite", "BatchContext", "Sink", "picked_columns",
           "PartitionRows", "bucket_sql",
           "apply_steps", "consolidate", "touched_buckets", "positional", "side_schema", "W"]

W = quote(WEIGHT)


class StateReader(Protocol):
    def __call__(self, table: str, buckets: set[int]) -> list[str]:
        """Files holding the given buckets of a state table, as of the previous batch."""


@dataclass
class StagedWrite:
    """Rows for a state table: with ``buckets``, the new contents of those ``_bucket``
    partitions; without, rows appended to a state log (``prefix`` ``delta``, or ``base``
    for a full compaction), with ``remove`` naming the files a compaction replaces
    (``bucketed``: a log partitioned by ``_bucket``, a column of ``data``). With
    ``written`` (the table's schema), ``data`` is files that tasks wrote into the table
    (``writes.WRITTEN_SCHEMA`` rows; one without a path names a bucket only), picked from
    ``data`` as ``pick`` says (``writes.Output.pick``); with ``replace_reported`` too, they
    are the new contents of the buckets their rows name."""

    table: str
    data: DataFrame
    buckets: list[int] | None
    remove: tuple[str, ...] = ()
    prefix: str = "delta"
    bucketed: bool = False
    replace: tuple[int, ...] | None = None  # buckets whose files the commit removes
    written: pa.Schema | None = None
    pick: tuple[str | None, str] = (None, "")
    replace_reported: bool = False


@dataclass
class BatchContext:
    spark: SparkSession
    batch: int
    buckets: int
    inputs: dict[str, DataFrame]
    state_files: StateReader
    state_log: Callable[[str], list[StateFile]] = lambda table: []  # a log's pinned files
    state_path: Callable[[str], str] = lambda table: ""  # a state table's location
    reader: Callable[[str, str], Any] | None = None  # ``Store.reader()``: files in tasks
    opener: Callable[[str, str], Any] | None = None  # ``Store.opener()``: writes in tasks
    memo: dict[str, Any] = field(default_factory=dict)  # per-pipeline, survives batches
    all_buckets: bool = False  # a large batch touches every bucket: skip finding which
    writes: list[StagedWrite] = field(default_factory=list)
    checkpoints: list[DataFrame] = field(default_factory=list)
    # Observed frames (``metrics.observe``) the batch's write job reads, so that it
    # reports their metrics: it reads each in a leg of its own that yields no row.
    watched: list[DataFrame] = field(default_factory=list)
    # Each input's bad records as dead letters (raw, source_file, source, reason), which
    # the write job writes too (``sink.dead_letters``).
    dead_letters: list[DataFrame] = field(default_factory=list)
    # What the batch's jobs observed (``metrics.observed_metrics``), by observation name.
    observed: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The table's watermark (µs since the epoch) as the batch began and after it (None:
    # none yet); windows whose end is at most ``watermark`` are closed by this batch.
    watermark_before: int | None = None
    watermark: int | None = None
    # state_ttl: state rows written by this batch or earlier ones are expired.
    expired_through: int | None = None
    # The table's own writer, offered to the operator under the plan's root (``Sink``); an
    # operator whose tasks write the table with it sets ``sunk``: the change events they
    # wrote (``colocated.TableWriter.written``).
    sink: Sink | None = None
    sunk: Any = None
    # What the tasks add their state buckets' cache lookups to (``bucket_cache.counter``).
    cache_counts: Any = None
    # Partitions of an operator's exchange by bucket, its tasks (``Pipeline.tasks``; 0:
    # ``spark.sql.shuffle.partitions``).
    tasks: int = 0

    def cut(self, node: Any) -> int | None:
        """``state_ttl``: the last batch whose state rows of operator ``node`` are
        forgotten (``state_log.unexpired``); None where nothing is."""
        return self.expired_through if getattr(node, "ttl_us", None) else None

    @property
    def watermark_moved(self) -> bool:
        """This batch moves the table's watermark: windows may close."""
        return self.watermark is not None and self.watermark != self.watermark_before

    def checkpoint(self, df: DataFrame) -> DataFrame:
        """``df``, computed once in the batch: a lazy local checkpoint (the first job that
        computes its rows keeps them in the executors' block stores for the batch). Later
        frames are planned over it as a leaf, not over its lineage: Spark analyses each new
        frame over its whole plan, and a small batch's frames spent most of their JVM time
        there; a cached frame (``persist``) keeps its lineage and adds a cache lookup to
        every plan of the session. A checkpoint must not hold an ``observe``d frame: its
        metrics would be reported, empty, as the checkpoint is set up (``watched``)."""
        df = df.localCheckpoint(eager=False)
        self.checkpoints.append(df)
        return df

    def release(self) -> None:
        """Drop the batch's checkpoints' rows."""
        for df in self.checkpoints:
            df._jdf.queryExecution().analyzed().rdd().unpersist(False)
        self.checkpoints.clear()

    def read_state(self, table: str, schema: StructType, buckets: set[int]) -> DataFrame:
        files = self.state_files(table, buckets)
        if not files:
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(*files)

    def append_log(self, table: str, rows: DataFrame,
                   bucket_keys: list[str] | None = None) -> None:
        """Stage ``rows`` for the end of a state log: as ``delta`` files, or, when the log
        is empty (its first write), as its ``base`` files (nothing to compact them with).
        ``bucket_keys``: the log is partitioned by the bucket of these columns."""
        self.writes.append(self._log_write(table, rows, bucket_keys,
                                           "delta" if self.state_log(table) else "base"))

    def compact(self, table: str, merge: Callable[[list[StateFile], bool], DataFrame],
                bucket_keys: list[str] | None = None) -> None:
        """Stage this batch's compaction of a state log, if it is due (``state_log``)."""
        due = compaction(self.state_log(table))
        if due is not None:
            files, full = due
            self.writes.append(self._log_write(table, merge(files, full), bucket_keys,
                                               "base" if full else "delta",
                                               tuple(f["path"] for f in files)))

    def _log_write(self, table: str, rows: DataFrame, bucket_keys: list[str] | None,
                   prefix: str, remove: tuple[str, ...] = ()) -> StagedWrite:
        if bucket_keys is None:
            return StagedWrite(table, rows, None, remove, prefix)
        rows = rows.selectExpr("*", f"{bucket_sql(bucket_keys, self.buckets)} AS {BUCKET}")
        return StagedWrite(table, rows, None, remove, prefix, bucketed=True)


@dataclass(frozen=True)
class Sink:
    """The table's writer (``colocated.TableWriter``), offered to the operator ``node`` whose
    output is the table's rows up to renames: the table's column ``names[i]`` is the node's
    column ``columns[i]``. ``writer``: given the table's rows' Arrow schema (its columns and
    ``_w``), the writer, or None where it does not cover them."""

    node: Any
    names: tuple[str, ...]  # the table's columns
    columns: tuple[str, ...]
    pk: tuple[str, ...] | None
    writer: Callable[[pa.Schema], Any]


def picked_columns(root: Any) -> tuple[Any, tuple[str, ...]] | None:
    """The operator under ``root`` whose rows are the table's up to renames (projections of
    bare column references only), and which of its columns each of the table's is; None
    where a filter or an expression lies between."""
    from octo_platform.physical.plan import PStateless
    from octo_platform.sqltext import unquote

    node, picked = root, list(root.columns)
    while isinstance(node, PStateless):
        for kind, names, exprs in reversed(node.steps):
            refs = dict(zip(names, (unquote(e) for e in exprs))) if kind == "project" else {}
            if kind != "project" or any(refs.get(c) is None for c in picked):
                return None
            picked = [refs[c] for c in picked]  # type: ignore[misc]
        node = node.input
    return node, tuple(picked)


def bucket_sql(keys: list[str] | tuple[str, ...], buckets: int) -> str:
    """SQL of the bucket a row's key falls in (0 for an empty key)."""
    if not keys:
        return "0"
    return f"pmod(hash({', '.join(quote(k) for k in keys)}), {buckets})"


def apply_steps(df: DataFrame, steps: tuple, carry: str) -> DataFrame:
    """Filters and projections of a stateless stage; ``carry`` (a column) passes through."""
    for kind, names, exprs in steps:
        if kind == "filter":
            df = df.filter(exprs[0])
        else:
            df = df.selectExpr(*[f"{e} AS {quote(n)}" for n, e in zip(names, exprs)], carry)
    return df


def consolidate(df: DataFrame, columns: list[str], weight: str = W) -> DataFrame:
    """One row per distinct value of ``columns`` with its summed weight (zeros dropped)."""
    return df.groupBy(*columns).agg(sql_expr(f"sum({weight}) AS {weight}")).filter(
        f"{weight} != 0")


def touched_buckets(ctx: BatchContext, df: DataFrame, keyed: bool) -> set[int]:
    """Buckets the rows of ``df`` fall in. Any superset is correct (untouched rows are
    rewritten as they were), so a large batch takes every bucket and skips the job."""
    if ctx.all_buckets and keyed:
        return set(range(ctx.buckets))
    return {r[0] for r in df.select(BUCKET).distinct().collect()}


class PartitionRows:
    """The state of an operator that recomputes the partitions a batch touches (top-N,
    SESSION, OVER): its input's rows with multiplicity, bucketed by hash of the partition
    key. ``load`` reads the buckets the batch touches, ``store`` stages their new rows."""

    def __init__(self, ctx: BatchContext, table: str, names: list[str],
                 partition: tuple[str, ...]) -> None:
        self.ctx, self.table, self.names, self.partition = ctx, table, names, partition
        self.cols = [quote(c) for c in names]
        self.bucket = bucket_sql(partition, ctx.buckets)
        self.touched: set[int] = set()

    def load(self, delta: DataFrame) -> tuple[DataFrame, DataFrame, DataFrame] | None:
        """The batch's rows (consolidated), and the touched buckets' rows before and after
        it (weighted, ``_w``); None when the batch touches nothing."""
        ctx = self.ctx
        d = ctx.checkpoint(consolidate(delta, self.cols).selectExpr(
            "*", f"{self.bucket} AS {BUCKET}"))
        self.touched = touched_buckets(ctx, d, keyed=bool(self.partition))
        if not self.touched:
            return None
        d = d.drop(BUCKET)
        stored = ctx.read_state(self.table, side_schema(delta.schema, self.names), self.touched)
        old = stored.toDF(*self.names, WEIGHT)
        return d, old, ctx.checkpoint(consolidate(old.unionByName(d), self.cols))

    def store(self, keep: DataFrame) -> None:
        """Stage ``keep`` (weighted rows of the touched buckets) as their new contents."""
        self.ctx.writes.append(StagedWrite(self.table, keep.selectExpr(
            *[f"{c} AS {p}" for c, p in zip(self.cols, positional(self.names))],
            f"{W} AS {COUNT}", f"{self.bucket} AS {BUCKET}"), sorted(self.touched)))

    def touched_partitions(self, delta: DataFrame, *frames: DataFrame
                           ) -> tuple[DataFrame, ...]:
        """The rows of each of ``frames`` whose partition key occurs in ``delta`` (all of
        them for an empty key): only those partitions can change."""
        if not self.partition:
            return frames
        keys = [quote(p) for p in self.partition]
        parts = delta.select(*keys).distinct()
        same = " AND ".join(f"a.{p} <=> k.{p}" for p in keys)
        return tuple(f.alias("a").join(parts.alias("k"), sql_expr(same), "left_semi")
                     for f in frames)


def positional(names: list[str] | tuple[str, ...]) -> list[str]:
    """State tables store columns as ``c0, c1, ...``: any user column name is safe there."""
    return [f"c{i}" for i in range(len(names))]


def side_schema(schema: Any, names: list[str]) -> Any:
    """Stored schema of a join side or top-N: positional columns, then ``_n``."""
    from pyspark.sql.types import LongType, StructField, StructType

    fields = [StructField(c, f.dataType) for c, f in zip(positional(names), schema.fields)]
    return StructType([*fields, StructField(COUNT, LongType())])


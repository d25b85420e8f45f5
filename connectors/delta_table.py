"""The ``delta`` connector: an existing Delta table (say a dimension someone else maintains)
as weighted rows.

The first batch that reads it gets the snapshot of the version it read (every row +1). Each
later batch gets the changes committed after the version the previous batch read, up to its
own: the change data feed where the table has it enabled (``insert`` / ``update_postimage``
+1, ``delete`` / ``update_preimage`` -1), otherwise the difference of the two versions' data
files (rows of removed files -1, rows of added files +1; rows a rewrite carries over cancel
out when the pipeline consolidates). Declared columns are taken from the table by name
(case-insensitive) and cast to the declared types.

A table with deletion vectors or column mapping (which delta-rs's reader cannot read) is read
by Spark's Delta reader instead, at the pinned versions (time travel): the snapshot, the
change data feed where the table has it and no column was renamed or dropped between the two
versions (Delta refuses that read), otherwise the difference of the two versions' rows
(each row's count in the newer snapshot minus its count in the older: one read of each).
Each version is read through one frame per session (``version_frame``), which keeps the
snapshot Delta built for it when the frame was first planned. A batch run in the driver takes
the changes as Arrow (``changes_arrow``), read once per process for each pair of versions.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from octo_platform.columns import WEIGHT
from octo_platform.errors import RunError
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from octo_platform.runtime.environment import Store

__all__ = ["DeltaSource", "spark_reads", "version_frame"]

FILE = "__octo_file"  # data file name, to give each row its file's weight and partition values
CDF_WEIGHT = ("CASE WHEN _change_type IN ('insert', 'update_postimage') THEN 1 "
              "WHEN _change_type IN ('delete', 'update_preimage') THEN -1 END")


# Spark's reads of Delta versions, by (session, path, table id, version), newest use last.
_FRAMES: OrderedDict[tuple, DataFrame] = OrderedDict()
_FRAMES_KEPT = 16
_lock = threading.Lock()  # the module's caches (``_FRAMES``, ``_CHANGES``, ``_reading``)


def _kept(cache: OrderedDict, key: tuple) -> Any:
    """``cache``'s value for ``key`` (None if not kept), now its newest use (under ``_lock``)."""
    value = cache.get(key)
    if value is not None:
        cache.move_to_end(key)
    return value


def _keep(cache: OrderedDict, key: tuple, value: Any, most: int) -> Any:
    """Keep ``value`` for ``key`` (unless one is kept already: that one is returned) as the
    newest use, and at most ``most`` values in all (under ``_lock``)."""
    value = cache.setdefault(key, value)
    cache.move_to_end(key)
    while len(cache) > most:
        cache.popitem(last=False)
    return value


def version_frame(spark: SparkSession, path: str, table_id: str, version: int) -> DataFrame:
    """Spark's read of version ``version`` of the Delta table ``table_id`` at ``path``: one
    frame per session and version, for the ``_FRAMES_KEPT`` versions read last. Delta builds
    a version's snapshot (its log replayed, its files' state computed by Spark jobs) as a
    frame over it is first planned, and keeps it with the frame, so the next batch (whose
    older version this batch's newer one is) and the other tables reading the source plan
    over it again: setting up a diff of two kept versions took 0.99 s here, of two new
    reads 1.82 s (``benchmarks/delta_versions.py``). A version of a table never changes; a
    table made anew at the same path has another id."""
    key = (id(spark._jsparkSession), path, table_id, version)
    with _lock:
        frame = _kept(_FRAMES, key)
    if frame is not None:
        return frame
    frame = spark.read.format("delta").option("versionAsOf", version).load(path)
    with _lock:
        return _keep(_FRAMES, key, frame, _FRAMES_KEPT)


# The changes between two versions as Arrow (``DeltaSource.changes_arrow``), newest use last.
_CHANGES: OrderedDict[tuple, pa.Table] = OrderedDict()
_CHANGES_KEPT = 8
CHANGES_KEPT_ROWS = 100_000  # a larger read is not kept
_reading: dict[tuple, threading.Lock] = {}  # one read of a key at a time


def spark_reads(info: dict[str, Any]) -> bool:
    """Whether the table's rows need Spark's Delta reader: deletion vectors or column
    mapping, which delta-rs's reader does not apply."""
    return (info["configuration"].get("delta.columnMapping.mode", "none") != "none"
            or "deletionVectors" in info["reader_features"])


@dataclass(frozen=True)
class DeltaSource:
    """A ``CREATE SOURCE ... WITH (connector = 'delta', path = ...)`` and the store to read it."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    path: str
    store: Store
    append_only: bool = False

    def check(self, table: str, version: int | None = None, *,
              last_read: int | None = None) -> tuple[dict[str, Any], dict[str, str]]:
        """The table's description at ``version`` (default: the latest) and the table column
        of each declared column; raises when the table, the version or a column is missing,
        or when the table is older than the version ``table`` read last (it was replaced)."""
        info = self.store.table_info(self.path, version)
        if info is None and version is not None:
            raise self.gone(version, table)
        if info is None:
            raise RunError(f"source {self.name!r}: no Delta table at {self.path} (option 'path')")
        if last_read is not None and info["version"] < last_read:
            raise RunError(f"source {self.name!r}: the Delta table at {self.path} is at version "
                           f"{info['version']}, but {table!r} already read version {last_read}: "
                           f"the table was replaced. Run `octo reset {table}` to rebuild "
                           f"{table!r} from its current snapshot.")
        names = {f.name.lower(): f.name for f in info["schema"]}
        missing = [c for c in self.columns if c.lower() not in names]
        if missing:
            raise RunError(f"source {self.name!r}: column(s) {', '.join(missing)} not found in "
                           f"the Delta table at {self.path} (available: "
                           f"{', '.join(f.name for f in info['schema'])})")
        return info, {c: names[c.lower()] for c in self.columns}

    def changes(self, spark: SparkSession, got: dict[str, Any] | None, *,
                table: str) -> DataFrame:
        """Weighted rows of the versions ``got`` = ``{"from": v0 or None, "to": v1}``."""
        if not got:
            return self.empty(spark)
        start, end = got["from"], got["to"]
        info, names = self.check(table, end)
        has_cdf = info["configuration"].get("delta.enableChangeDataFeed", "").lower() == "true"
        if spark_reads(info):
            rows = self.spark_changes(spark, info, names, start, end, has_cdf, table)
            return self.inserts_only(rows, start, end, table) if self.append_only else rows
        cdf = None
        if start is not None and has_cdf:
            cdf = self.store.change_data(self.path, start, end)
        if cdf is not None:
            picked = cdf.select([*dict.fromkeys(names.values()), "_change_type"])
            rows = self.weighted(spark.createDataFrame(picked), names, CDF_WEIGHT)
        else:
            rows = self.files_diff(spark, info, names, start, end, table)
        return self.inserts_only(rows, start, end, table) if self.append_only else rows

    def changes_arrow(self, spark: SparkSession, got: dict[str, Any], *,
                      table: str) -> pa.Table:
        """``changes`` as Arrow (``got``: not empty), read once per process (and Spark
        session) for each pair of versions: the tables that read the source see the same
        versions in a run's batches (the versions a batch reads are immutable), and each
        read is planned by Spark (for a table with deletion vectors, Delta lists the files
        of each version by Spark jobs as the read is optimized and again as it is planned:
        1-4 s for a diff of two versions here) or diffed by delta-rs."""
        info = self.store.table_info(self.path, got["to"])
        key = (id(spark._jsparkSession), self.path, self.columns, self.types, self.append_only,
               info["id"] if info else None, got["from"], got["to"])
        with _lock:
            reading = _reading.setdefault(key, threading.Lock())
        with reading:  # another table's thread may be reading it
            with _lock:
                rows = _kept(_CHANGES, key)
            if rows is not None:
                return rows
            try:
                rows = self.changes(spark, got, table=table).toArrow()
                if rows.num_rows <= CHANGES_KEPT_ROWS:
                    with _lock:
                        _keep(_CHANGES, key, rows, _CHANGES_KEPT)
            finally:
                with _lock:
                    _reading.pop(key, None)
        return rows

    def spark_changes(self, spark: SparkSession, info: dict[str, Any], names: dict[str, str],
                      start: int | None, end: int, has_cdf: bool, table: str) -> DataFrame:
        """Weighted rows between two versions, read by Spark's Delta reader."""
        if start is None:
            return self.weighted(version_frame(spark, self.path, info["id"], end), names, "1")
        before = self.store.table_info(self.path, start)
        if before is None:
            raise self.gone(start, table)
        # Spark reads lazily: a vacuumed file would fail the batch's job with Spark's error.
        self.changed_files(start, end, table)
        if has_cdf and {f.name for f in before["schema"]} <= {f.name for f in info["schema"]}:
            feed = (spark.read.format("delta").option("readChangeFeed", "true")
                    .option("startingVersion", start + 1).option("endingVersion", end)
                    .load(self.path))
            return self.weighted(feed, names, CDF_WEIGHT)
        # Each row's count at ``end`` minus its count at ``start`` (rows a rewrite carried
        # over cancel): one read of each version, where EXCEPT ALL both ways read each twice
        # (planning a read, Delta's snapshot of its version, is most of the cost: a lazy
        # checkpoint of the diff took 1.3-1.4 s that way, 0.8-0.9 s this way).
        both = self.weighted(version_frame(spark, self.path, info["id"], end), names, "1") \
            .unionByName(self.weighted(version_frame(spark, self.path, before["id"], start),
                                       names, "-1"))
        w = quote(WEIGHT)
        return both.groupBy(*[quote(c) for c in self.columns]).agg(
            sql_expr(f"sum({w}) AS {w}")).filter(f"{w} != 0")

    def files_diff(self, spark: SparkSession, info: dict[str, Any], names: dict[str, str],
                   start: int | None, end: int, table: str) -> DataFrame:
        """Rows of the files in ``end`` but not ``start`` (+1) and in ``start`` only (-1)."""
        import pyarrow as pa
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_type
        from pyspark.sql.types import StructField, StructType

        old, new, removed, added = self.changed_files(start, end, table)
        uris = [old[0][i] for i in removed] + [new[0][i] for i in added]
        if not uris:
            return self.empty(spark)
        values = pa.concat_tables([old[1].take(removed), new[1].take(added)],
                                  promote_options="permissive")
        files = pa.table({FILE: [u.rsplit("/", 1)[-1] for u in uris],
                          WEIGHT: pa.array([-1] * len(removed) + [1] * len(added), pa.int64()),
                          **{c: values.column(c) for c in values.column_names}})
        parts = set(info["partition_columns"])
        schema = StructType([StructField(f.name, from_arrow_type(f.type), True)
                             for f in info["schema"]
                             if f.name in names.values() and f.name not in parts])
        data = spark.read.schema(schema).parquet(*uris) \
            .selectExpr("*", f"_metadata.file_name AS {FILE}")
        rows = data.join(F.broadcast(spark.createDataFrame(files)), FILE)
        return self.weighted(rows, names, quote(WEIGHT))

    def changed_files(self, start: int | None, end: int, table: str) -> tuple:
        """The snapshots (file URIs, partition values) of ``start`` (none when None) and
        ``end``, and the positions of the files ``end`` no longer has and of those it added;
        raises ``gone`` when a version, or one of those files, was removed (vacuumed)."""
        import pyarrow as pa

        old = self.store.snapshot(self.path, start) if start is not None else ([], pa.table({}))
        new = self.store.snapshot(self.path, end)
        if old is None or new is None:
            raise self.gone(start if old is None else end, table)
        keep = set(new[0])
        removed = [i for i, u in enumerate(old[0]) if u not in keep]
        keep = set(old[0])
        added = [i for i, u in enumerate(new[0]) if u not in keep]
        uris = [old[0][i] for i in removed] + [new[0][i] for i in added]
        if start is not None and self.store.missing_files(self.path, uris):
            raise self.gone(start, table)
        return old, new, removed, added

    def empty(self, spark: SparkSession) -> DataFrame:
        ddl = ", ".join(f"{quote(c)} {t}" for c, t in zip(self.columns, self.types))
        return spark.createDataFrame([], f"{ddl}, {WEIGHT} BIGINT")

    def weighted(self, df: DataFrame, names: dict[str, str], weight: str) -> DataFrame:
        return df.selectExpr(*[f"CAST({quote(names[c])} AS {t}) AS {quote(c)}"
                               for c, t in zip(self.columns, self.types)],
                             f"CAST({weight} AS BIGINT) AS {WEIGHT}")

    def inserts_only(self, rows: DataFrame, start: int | None, end: int,
                     table: str) -> DataFrame:
        """A source declared ``mode = 'append-only'``: consolidated rows, none retracted."""
        if start is None:
            return rows
        w = quote(WEIGHT)
        cols = [quote(c) for c in self.columns]
        net = rows.groupBy(*cols).agg(sql_expr(f"sum({w}) AS {w}")).filter(f"{w} != 0")
        if net.filter(f"{w} < 0").limit(1).count():
            raise RunError(f"source {self.name!r} is declared mode = 'append-only', but rows "
                           f"were updated or deleted in the Delta table at {self.path} after "
                           f"version {start}: drop the option and run `octo reset {table}`")
        return net

    def gone(self, version: int, table: str) -> RunError:
        return RunError(f"source {self.name!r}: version {version} of the Delta table at "
                        f"{self.path} or its files were removed (vacuumed), so the changes "
                        f"since then cannot be read. Run `octo reset {table}` to rebuild "
                        f"{table!r} from the table's current snapshot.")

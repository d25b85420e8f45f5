"""What the operators that run their kernels in Spark tasks share (``aggregate_tasks``,
``join_tasks``): reading one bucket of a state log in a task, and the tasks' tagged output.

A task returns one frame for everything it made, tagged by ``_part``: 0 is the operator's
own output (struct column ``o``), ``1 + 2j`` and ``2 + 2j`` are state table ``j``'s new
``delta`` and ``base`` files, which the task wrote itself (struct column ``f``, a file's
name, size and rows as ``writes.WRITTEN_SCHEMA``): a bucket's first rows, or its
compaction, when due (``due_buckets``, decided in the driver); numbers above those are the
operator's own (a join's candidate matches). Each due bucket is visited by a task
(``visits``: a row of weight 0), and the commit removes its older files, so a compaction
that keeps nothing (a bucket of closed windows) empties the bucket. The state rows never
pass through Spark's JVM, and the batch's write job only commits their files.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from octo_platform.columns import BUCKET
from octo_platform.errors import in_operator
from octo_platform.runtime.operators.arrow import concat, read_parquet
from octo_platform.runtime.operators.context import BatchContext, StagedWrite
from octo_platform.runtime.state_log import StateFile, compaction
from octo_platform.runtime.writes import file_token, write_file, written_struct
from octo_platform.sqltext import quote
from octo_platform.workers import task_started

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["PART", "Log", "Kept", "Due", "LogFiles", "bucket_logs", "log_files", "visits",
           "read_bucket", "tagged_schema", "tagged", "log_parts", "stage_logs", "grouped",
           "run_group", "run_cogroup"]

PART = "_part"
Parts = list[tuple[int, str, pa.Table]]  # (part, struct column, rows)


Log = tuple[str, dict[int, list[StateFile]]]  # a state table's path, its files by bucket
Kept = Callable[[str, pa.Table], None]  # (a file's path in its table, its rows)
# A state table's buckets due for compaction: per bucket, the ``delta`` files a partial
# merge merges into one, or None for a full one (every file, into ``base`` files).
Due = dict[int, "tuple[str, ...] | None"]


def bucket_logs(ctx: BatchContext, tables: list[str], *, partial: bool = False
                ) -> tuple[list[Log], list[Due]]:
    """Per state table (partitioned by ``_bucket``): its path and pinned files by bucket,
    and the buckets whose files are due for compaction (``state_log.compaction``); with
    ``partial``, a merge of the ``delta`` files alone stays one (the operator's tasks merge
    them without reading its ``base`` files), else every compaction is a full one."""
    logs: list[Log] = []
    dues: list[Due] = []
    for t in tables:
        files: dict[int, list[StateFile]] = {}
        for f in ctx.state_log(t):
            files.setdefault(int(f["partition"][BUCKET]), []).append(f)
        logs.append((ctx.state_path(t), files))
        due: Due = {}
        for b, fs in files.items():
            if (merge := compaction(fs)) is not None:
                due[b] = None if merge[1] or not partial else tuple(f["path"] for f in merge[0])
        dues.append(due)
    return logs, dues


@dataclass(frozen=True)
class LogFiles:
    """Where the tasks write a state table's new files: the table's path, its columns, the
    start of the names of this batch's ``delta`` and ``base`` files (``writes.file_token``)
    and ``Store.opener()``."""

    path: str
    schema: pa.Schema
    tokens: tuple[str, str]
    opener: Callable[[str, str], Any]

    def write(self, part: int, bucket: int, rows: pa.Table, *, named: bool = False,
              kept: Kept | None = None) -> Parts:
        """``rows`` (``part``: odd for ``delta``, even for ``base``) as a new file of the
        bucket, written here (and given to ``kept`` with its path); its part of the task's
        result: none for no rows, unless ``named`` (then its row names the bucket, in its
        tags, with or without a file)."""
        tags = [bucket] if named else []
        if rows.num_rows:
            name = f"{self.tokens[1 - part % 2]}-{uuid.uuid4().hex[:8]}"
            rows = rows.cast(self.schema)
            done = write_file(self.opener, self.path, name, bucket, rows, tags)
            if kept is not None:
                kept(done["path"], rows)
        elif named:
            done = {"path": None, "size": 0, "rows": 0, "bucket": bucket, "tags": tags}
        else:
            return []
        return [(part, "f", pa.Table.from_pylist([done]))]

    def committed(self) -> pa.Schema:
        """The table's schema as its commit gives it (with ``_bucket``)."""
        return self.schema.append(pa.field(BUCKET, pa.int32()))


def log_files(ctx: BatchContext, tables: list[str], schemas: list[StructType]
              ) -> list[LogFiles]:
    """Per state table (``schemas``: its columns, as Spark's), where the tasks write."""
    from octo_platform.local_frames import arrow_schema

    return [LogFiles(ctx.state_path(t), arrow_schema(_nullable(s)),
                     (file_token("delta", ctx.batch), file_token("base", ctx.batch)),
                     ctx.opener) for t, s in zip(tables, schemas)]


def visits(rows: DataFrame, weight: str, buckets: set[int]) -> DataFrame:
    """``rows`` (with ``_bucket``) and, per bucket of ``buckets``, a row of weight 0 (NULL
    elsewhere): its task then runs even where the batch changes nothing."""
    if not buckets:
        return rows
    types = {f.name: f.dataType.simpleString() for f in rows.schema.fields}
    # One row exploded in one partition: no rows sent from Python, and one task, not one
    # per core (a local relation's).
    ids = rows.sparkSession.range(0, 1, 1, 1).selectExpr(*[
        f"CAST({0 if c == weight else 'NULL'} AS {t}) AS {quote(c)}" for c, t in types.items()
        if c != BUCKET], f"explode(array({', '.join(map(str, sorted(buckets)))})) AS {BUCKET}")
    return rows.unionByName(ids)


def grouped(ctx: BatchContext, rows: DataFrame) -> Any:
    """``rows`` grouped by ``_bucket`` for their tasks, in ``BatchContext.tasks`` partitions
    (else ``spark.sql.shuffle.partitions``): the operator's one exchange."""
    if ctx.tasks:
        rows = rows.repartition(ctx.tasks, BUCKET)
    return rows.groupBy(BUCKET)


def run_group(task, what, key, rows):  # no annotations: Spark would read them as the UDF's
    """The ``applyInArrow`` function of a grouped frame (``functools.partial`` with
    ``task``, whose ``run`` does the work, and ``what``, the operator's ``describe()``, which
    an error then names: ``errors.in_operator``; "" for none); runs in Spark tasks."""
    task_started()
    with in_operator(what):
        return task.run(key, rows)


def run_cogroup(task, what, key, left, right):  # no annotations: as ``run_group``
    """``run_group`` for a cogrouped frame."""
    task_started()
    with in_operator(what):
        return task.run(key, left, right)


def read_bucket(reader: Callable[[str, str], Any], path: str, files: list[StateFile],
                schema: pa.Schema) -> pa.Table:
    """In a task: the rows of a state table's ``files`` (at ``path``), as ``schema``."""
    return concat([read_parquet(reader(path, f["path"]), schema) for f in files], schema)


def tagged_schema(output: StructType, more: dict[str, StructType] | None = None
                  ) -> StructType:
    """The tasks' Spark schema: ``_part``, ``_bucket``, the output, the files written
    (``f``) and the operator's ``more`` struct columns."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    fields = [StructField(PART, IntegerType()), StructField(BUCKET, IntegerType()),
              StructField("o", _nullable(output)), StructField("f", written_struct())]
    fields += [StructField(c, _nullable(s)) for c, s in (more or {}).items()]
    return StructType(fields)


def _nullable(struct: StructType) -> StructType:
    """``struct`` with every field nullable (e.g. an outer join's padding)."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, f.dataType) for f in struct.fields])


def log_parts(j: int, files: LogFiles, bucket: int, changes: pa.Table,
              stored: list[StateFile], due: bool, base: Callable[[], pa.Table],
              kept: Kept | None = None, *, partial: bool = False) -> Parts:
    """State table ``j``'s new files in one bucket, written (``files``; each given to
    ``kept``): the batch's ``changes``, as ``base`` when the bucket has no ``stored`` files
    yet; with its compaction when ``due``: ``base()``, the bucket's live rows before the
    batch as ``base``, or with ``partial`` its merged ``delta`` files' rows as one
    ``delta``."""
    if not stored:
        return files.write(2 + 2 * j, bucket, changes, kept=kept)
    merged = files.write((1 if partial else 2) + 2 * j, bucket, base(), kept=kept) if due \
        else []
    return [*merged, *files.write(1 + 2 * j, bucket, changes, kept=kept)]


def tagged(out: pa.Schema, parts: Parts, bucket: int) -> pa.Table:
    """A task's result (``out``: ``tagged_schema`` as Arrow) from its parts."""
    return concat([_tagged(out, part, column, rows, bucket) for part, column, rows in parts],
                  out)


def _tagged(out: pa.Schema, part: int, column: str, rows: pa.Table, bucket: int) -> pa.Table:
    n = rows.num_rows
    cols = {PART: pa.repeat(pa.scalar(part, pa.int32()), n),
            BUCKET: pa.repeat(pa.scalar(bucket, pa.int32()), n)}
    for f in out:
        if f.name in cols:
            continue
        if f.name == column:
            data = rows.select([c.name for c in f.type]).cast(pa.schema(list(f.type)))
            cols[f.name] = pa.StructArray.from_arrays(
                [data[c.name].combine_chunks() for c in f.type], fields=list(f.type))
        else:
            cols[f.name] = pa.nulls(n, f.type)
    return pa.table(cols, schema=out)


def stage_logs(ctx: BatchContext, out: DataFrame, tables: list[str], due: list[Due],
               files: list[LogFiles]) -> DataFrame:
    """Stage the files the tasks wrote (their result ``out``) for each state table's commit
    (``due``: per table, the buckets its base files replace, and the delta files a partial
    merge replaces); the operator's output part (``o``'s columns)."""
    for j, (t, f) in enumerate(zip(tables, files)):
        ctx.writes.append(StagedWrite(
            t, out, None, bucketed=True,
            replace=tuple(sorted(b for b, merged in due[j].items() if merged is None)) or None,
            remove=tuple(p for merged in due[j].values() for p in merged or ()),
            written=f.committed(), pick=(f"{PART} IN ({1 + 2 * j}, {2 + 2 * j})", "f")))
    return out.filter(f"{PART} = 0").selectExpr("o.*")

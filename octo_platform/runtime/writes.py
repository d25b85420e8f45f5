"""The data path: executors write a batch's Parquet files, the driver commits them.

A small batch run in the driver (``runtime/driver.py``) writes its files there with Arrow
(``write_local``) and commits them the same way. Otherwise all tables a batch changes
(changelog, current state, operator state) are written by ONE Spark job: their rows are
tagged with their output and unioned, and a ``mapInArrow`` task
writes each output's rows (per ``_bucket``) into the output table's directory with Arrow.
Only file names, sizes and row counts come back to the driver, which then makes one Delta
commit per table carrying the app transaction ``(octo, N)``. Files of an attempt that dies
before its commit are in no Delta version, so readers never see them (vacuum drops them).
"""
from __future__ import annotations

import functools
import os
import re
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from octo_platform.columns import BUCKET
from octo_platform.runtime.environment import Store
from octo_platform.runtime.metrics import observed_metrics, unread
from octo_platform.sqltext import quote
from octo_platform.workers import task_started

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["Output", "write_outputs", "picked_field", "file_batch", "file_token", "LocalOutput",
           "write_local", "WRITTEN_SCHEMA", "written_schema", "written_struct", "write_file",
           "parquet_options", "threaded", "by_bucket"]

APP_ID = "octo"
_FILE_BATCH = re.compile(r"-b(\d{8,})-")  # a written file's name: <prefix>-b<batch>-<ids>
# A file a task wrote: its path (relative to the table), size, rows, ``_bucket``, and the
# distinct values of its output's ``report`` column; tagged with its output (``o``).
_WRITTEN_COLUMNS = (("path", "STRING"), ("size", "BIGINT"), ("rows", "BIGINT"),
                    ("bucket", "INT"), ("tags", "ARRAY<INT>"))
WRITTEN_SCHEMA = ", ".join(f"{c} {t}" for c, t in _WRITTEN_COLUMNS)
_FILE_SCHEMA = f"o INT, {WRITTEN_SCHEMA}"
T, R = TypeVar("T"), TypeVar("R")


@dataclass(frozen=True)
class Output:
    """Rows for one Delta table of the batch.

    ``bucketed``: the table is partitioned by ``_bucket`` (a column of ``frame``);
    ``replace``: buckets whose files the commit removes (``"all"``: the whole table), None
    to append; ``remove``: files
    (relative paths) the commit removes too; ``prefix`` starts the new files' names;
    ``report``: an INT column of ``frame`` that is not written, whose distinct values
    ``write_outputs`` reports; ``replace_reported``: the commit removes the files of the
    buckets output ``replace_reported`` reported (and is skipped when that is none and the
    output wrote nothing, the table existing); ``written``: ``frame`` holds files its
    tasks wrote into the table (``WRITTEN_SCHEMA``), not rows, and this is the table's
    schema; ``pick``: of such a ``frame``, the rows that are this output's files (an SQL
    condition, None for all) and the struct column that holds each ("": the frame's own
    columns). Outputs of files picked from one frame (the same object; disjoint
    conditions) share one leg of the job, so the tasks behind the frame run once, with no
    checkpoint between. ``if_any``: no commit when the output has no rows. Outputs with
    the same ``key`` go to one commit."""

    key: str
    path: str
    frame: DataFrame
    bucketed: bool = False
    replace: set[int] | Literal["all"] | None = None
    remove: tuple[str, ...] = ()
    prefix: str = "part"
    report: str | None = None
    replace_reported: str | None = None
    written: pa.Schema | None = None
    pick: tuple[str | None, str] = (None, "")
    if_any: bool = False


@dataclass
class Written:
    """What ``write_outputs`` did: each table's version afterwards, the values of each
    output's ``report`` column, which tables it wrote (the others held the batch), and the
    metrics of the observed frames its job read (``metrics.observed_metrics``)."""

    versions: dict[str, int | None]
    reported: dict[str, set[int]]
    wrote: set[str]
    observed: dict[str, dict[str, Any]] = field(default_factory=dict)


def write_outputs(outputs: list[Output], *, batch: int, store: Store,
                  resumed: bool = True, watched: list[DataFrame] | tuple = ()) -> Written:
    """Write and commit ``outputs`` as batch ``batch`` (one Spark job, one commit per table).

    ``resumed``: an earlier attempt of the batch may have committed some of the tables;
    those that already hold the batch are left alone (a first attempt skips asking).
    ``watched``: observed frames the job reads too (so it reports their metrics), each in
    a leg that yields no row."""
    from pyspark.sql.pandas.types import to_arrow_schema

    done = finished(outputs, batch=batch, store=store, resumed=resumed)
    todo = [o for o in outputs if o.key not in done]
    written = Written(done, {}, {o.key for o in todo})
    if not todo:
        return written
    schemas = [o.written if o.written is not None
               else to_arrow_schema(o.frame.schema, timezone="UTC") for o in todo]
    # Output i's rows as a struct column o<i>; unionByName types the other outputs' columns
    # as nulls (one call per output: building the columns in Python cost ~1,000 JVM calls).
    tagged = [o.frame.selectExpr(f"CAST({i} AS INT) AS _o", "struct({}) AS o{}".format(
        ", ".join(quote(c) for c in o.frame.columns), i)) for i, o in enumerate(todo)
        if o.written is None]
    meta = [(o.path, o.bucketed, schemas[i], file_token(o.prefix, batch), o.report)
            for i, o in enumerate(todo)]
    # Files the outputs' own tasks wrote, beside those the writer writes, in the same job:
    # a leg per frame they are picked from.
    legs: dict[int, list[int]] = {}
    for i, o in enumerate(todo):
        if o.written is not None:
            legs.setdefault(id(o.frame), []).append(i)
    jobs = [_picked(todo[mine[0]].frame, [(i, *todo[i].pick) for i in mine])
            for mine in legs.values()]
    # One write task per core, not one per output partition: a task's fixed cost (a
    # Python worker's Arrow stream, its files) is what a small batch pays most for.
    tasks = todo[0].frame.sparkSession.sparkContext.defaultParallelism
    if tagged:
        union = functools.reduce(
            lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)
        jobs.insert(0, union.coalesce(tasks).mapInArrow(_writer(meta, store.opener()),
                                                        _FILE_SCHEMA))
    jobs += [unread(w).selectExpr(
        "CAST(-1 AS INT) AS o", *(f"CAST(NULL AS {t}) AS {c}" for c, t in _WRITTEN_COLUMNS))
        for w in watched]
    # The job's legs (the writer, the operators' tasks that write their own files, the
    # observed frames) in one task per core too: each task of a stage deserializes the
    # whole stage (every leg's plan), and a union's partitions add up (16 tasks for Nexmark
    # q4's shape spent more time deserializing the job than running it).
    job = functools.reduce(lambda a, b: a.unionByName(b), jobs).coalesce(tasks)
    files = job.collect()
    written.observed = observed_metrics(job)
    keys = list(dict.fromkeys(o.key for o in todo))
    for key in keys:
        written.reported[key] = {t for f in files if todo[f.o].key == key for t in f.tags or ()}
    for key in keys:
        mine = [i for i, o in enumerate(todo) if o.key == key]
        first = todo[mine[0]]
        added = [{"path": f.path, "size": f.size, "rows": f.rows,
                  "partition": {BUCKET: f.bucket} if first.bucketed else {}}
                 for f in files if f.o in mine and f.path is not None]  # None: reports only
        replaced = [todo[i].replace if todo[i].replace_reported is None
                    else written.reported[todo[i].replace_reported] for i in mine
                    if todo[i].replace is not None or todo[i].replace_reported is not None]
        if first.replace_reported is not None and not added and not any(replaced) \
                and (version := store.version(first.path)) is not None:
            written.versions[key] = version  # nothing changed: no commit
            continue
        if first.if_any and not added:
            continue
        schema = schemas[mine[0]]
        if first.report:
            schema = schema.remove(schema.get_field_index(first.report))
        written.versions[key] = store.commit(
            first.path, added, schema=schema, app_id=APP_ID, batch=batch,
            partition_by=[BUCKET] if first.bucketed else None,
            replace="all" if "all" in replaced else
            (set().union(*replaced) if replaced else None),
            remove=tuple(p for i in mine for p in todo[i].remove))
    return written


def _picked(frame: DataFrame, picks: list[tuple[int, str | None, str]]) -> DataFrame:
    """The leg of the outputs ``picks`` (each: its index, ``Output.pick``) of files written
    by the tasks behind ``frame``: per file, its output (``o``) and ``WRITTEN_SCHEMA``."""
    whole = len(picks) == 1 and picks[0][1] is None  # every row, one output's

    def case(value: Callable[[int, str], str]) -> str:
        if whole:
            return value(picks[0][0], picks[0][2])
        return "CASE " + " ".join(f"WHEN {cond or 'TRUE'} THEN {value(i, column)}"
                                  for i, cond, column in picks) + " END"

    leg = frame.selectExpr(f"CAST({case(lambda i, _: str(i))} AS INT) AS o", *[
        f"{case(lambda _, column: picked_field(column, c))} AS {c}"
        for c, _ in _WRITTEN_COLUMNS])
    return leg if whole else leg.filter("o IS NOT NULL")


def picked_field(column: str, name: str) -> str:
    """Field ``name`` of a picked file's row (``Output.pick``): of struct ``column``, or the
    frame's own column for ""."""
    return f"{column}.{name}" if column else name


def written_schema() -> pa.Schema:
    """``WRITTEN_SCHEMA`` as Arrow (what a task that writes files returns)."""
    import pyarrow as pa

    return pa.schema([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()),
                      ("bucket", pa.int32()), ("tags", pa.list_(pa.int32()))])


def written_struct() -> Any:
    """``WRITTEN_SCHEMA`` as a Spark ``StructType``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(written_schema())


def write_file(open_output: Callable[[str, str], Any], path: str, name: str,
               bucket: int | None, rows: pa.Table, tags: list[int] | tuple = ()
               ) -> dict[str, Any]:
    """Write ``rows`` as the Parquet file ``name`` of the table at ``path`` (in ``bucket``'s
    partition, if any), opened by ``open_output`` (``Store.opener()``); what a task reports
    of it (``WRITTEN_SCHEMA``), ``tags`` as its tags."""
    import pyarrow.parquet as pq

    rel = f"{name}.parquet" if bucket is None else f"{BUCKET}={bucket}/{name}.parquet"
    stream = open_output(path, rel)
    pq.write_table(rows, stream, **parquet_options(rows.schema))
    size = stream.tell()
    stream.close()
    return {"path": rel, "size": size, "rows": rows.num_rows, "bucket": bucket,
            "tags": list(tags)}


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How octo writes Parquet: dictionaries for text columns only (for numbers the
    encoder's attempt cost 3x the write and saved nothing: 250K rows of three distinct
    BIGINTs, 27 against 9 ms), and INT / BIGINT columns delta-encoded (Parquet's
    ``DELTA_BINARY_PACKED``, which Spark, delta-rs and Arrow read): a current-state bucket
    of 250K rows of three BIGINTs was written in 8.5 ms instead of 14.1, read in 3.6 ms
    instead of 9.1, and took 1.30 MB instead of 2.62 (``benchmarks/parquet_costs.py``).
    Delta-encoded columns are not compressed: their bit-packed deltas leave snappy nothing
    to find (such a bucket of random keys: 2.06 MB either way), and it took 3 of the
    write's 10.5 ms. Other columns keep snappy. The fields of struct columns (a changelog's
    images and ``source``) are columns here too: 50K events of three BIGINTs were written
    in 11.5 ms instead of 27 and took 0.60 MB instead of 1.28. Tables with lists or maps
    keep Arrow's defaults."""
    import pyarrow as pa

    leaves = list(_leaves(schema))
    if any(t is None or pa.types.is_nested(t) for _, t in leaves):
        return {}
    options: dict[str, Any] = {"use_dictionary": [
        name for name, t in leaves
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)]}
    ints = [name for name, t in leaves if pa.types.is_int32(t) or pa.types.is_int64(t)]
    if ints:
        options["column_encoding"] = dict.fromkeys(ints, "DELTA_BINARY_PACKED")
        options["compression"] = {name: "none" if name in ints else "snappy"
                                  for name, _ in leaves}
    return options


def _leaves(fields: Any, prefix: str = "") -> Iterator[tuple[str, pa.DataType | None]]:
    """The Parquet columns of ``fields`` (a schema's or a struct's): each field not a
    struct, by its dotted path, and its type (None: a name with a dot, no path for it)."""
    import pyarrow as pa

    for f in fields:
        if "." in f.name:
            yield f.name, None
        elif pa.types.is_struct(f.type):
            yield from _leaves(f.type, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f.type


def file_token(prefix: str, batch: int) -> str:
    """The start of the names of an output's files written by batch ``batch``."""
    return f"{prefix}-b{batch:08d}-{uuid.uuid4().hex[:8]}"


def file_batch(path: str) -> int | None:
    """The batch that wrote a data file, from its name (None: not written here)."""
    found = _FILE_BATCH.search(path.rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


def _writer(meta: list[tuple[str, bool, pa.Schema, str, str | None]],
            open_output: Callable[[str, str], Any]):
    """The ``mapInArrow`` function: rows of output ``i`` go to Parquet files under
    ``meta[i]``'s table path (one file per output and bucket per task); yields one row per
    file written, with the distinct values of the output's ``report`` column. Runs on
    executors."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        task_started()
        task = uuid.uuid4().hex[:8]
        open_files: dict[tuple[int, int | None], tuple[Any, Any, str]] = {}
        counts: dict[tuple[int, int | None], int] = {}
        tags: dict[tuple[int, int | None], set[int]] = {}

        def sink(i: int, bucket: int | None, rows: pa.Table) -> None:
            key = (i, bucket)
            if key not in open_files:
                path, token = meta[i][0], meta[i][3]
                rel = f"{token}-{task}.parquet"
                if bucket is not None:
                    rel = f"{BUCKET}={bucket}/{rel}"
                stream = open_output(path, rel)
                schema = rows.schema if not meta[i][4] else \
                    rows.schema.remove(rows.schema.get_field_index(meta[i][4]))
                open_files[key] = (pq.ParquetWriter(stream, schema, **parquet_options(schema)),
                                   stream, rel)
                counts[key] = 0
                tags[key] = set()
            report = meta[i][4]
            if report:
                tags[key].update(pc.unique(rows.column(report)).to_pylist())
                rows = rows.drop_columns([report])
            open_files[key][0].write_table(rows)
            counts[key] += rows.num_rows

        for rb in batches:
            which = rb.column("_o")
            for i in pc.unique(which).to_pylist():
                bucketed, schema = meta[i][1], meta[i][2]
                part = rb.filter(pc.equal(which, i)).column(f"o{i}")
                rows = pa.Table.from_batches([pa.RecordBatch.from_struct_array(part)])
                rows = rows.cast(schema)
                if not bucketed:
                    sink(i, None, rows)
                    continue
                for b, part in by_bucket(rows):
                    sink(i, b, part)
        out: dict[str, list] = {"o": [], "path": [], "size": [], "rows": [], "bucket": [],
                                "tags": []}
        for (i, bucket), (writer, stream, rel) in open_files.items():
            writer.close()
            size = stream.tell()
            stream.close()
            values = (i, rel, size, counts[(i, bucket)], bucket,
                      sorted(t for t in tags[(i, bucket)] if t is not None))
            for k, v in zip(out, values):
                out[k].append(v)
        yield pa.RecordBatch.from_pydict(out, schema=pa.schema([("o", pa.int32()),
                                                                *written_schema()]))

    return write


@dataclass(frozen=True)
class LocalOutput:
    """Rows for one Delta table, built in the driver (a small batch: ``runtime/driver.py``);
    as ``Output`` otherwise (``bucketed``: ``table`` has a ``_bucket`` column)."""

    key: str
    path: str
    table: pa.Table
    bucketed: bool = False
    replace: set[int] | None = None
    remove: tuple[str, ...] = ()
    prefix: str = "part"


def by_bucket(rows: pa.Table) -> list[tuple[int, pa.Table]]:
    """``rows`` (with a ``_bucket`` column) split by bucket, in bucket order, the column
    dropped: slices of one sort (none when the rows come in bucket order), not a filter
    of every row per bucket."""
    import numpy as np

    buckets = rows.column(BUCKET).to_numpy()
    data = rows.drop_columns([BUCKET])
    if len(buckets) > 1 and np.any(buckets[1:] < buckets[:-1]):
        order = np.argsort(buckets, kind="stable")
        buckets, data = buckets[order], data.take(order)
    bounds = [0, *(np.flatnonzero(np.diff(buckets)) + 1), len(buckets)]
    return [(int(buckets[a]), data.slice(a, b - a)) for a, b in zip(bounds, bounds[1:]) if b > a]


def threaded(fn: Callable[[T], R], items: list[T]) -> list[tuple[T, R]]:
    """``(item, fn(item))`` for each item, in order, run on the driver's cores: Arrow's
    Parquet reads and writes and its compute functions release the GIL."""
    if len(items) < 2:
        return [(i, fn(i)) for i in items]
    with ThreadPoolExecutor(min(len(items), os.cpu_count() or 1, 4)) as pool:
        return list(zip(items, pool.map(fn, items)))


def finished(outputs: list[Output] | list[LocalOutput], *, batch: int, store: Store,
             resumed: bool) -> dict[str, int | None]:
    """The tables of ``outputs`` that an earlier attempt of batch ``batch`` committed (their
    app transaction holds the batch), and their versions: left alone (their commit would
    be skipped, ``Store.commit``, and their files written for nothing). ``resumed``: there
    was an earlier attempt (a first one skips asking)."""
    if not resumed:
        return {}
    return {o.key: store.version(o.path) for o in outputs
            if store.done(o.path, app_id=APP_ID, batch=batch)}


def write_local(outputs: list[LocalOutput], *, batch: int, store: Store,
                resumed: bool) -> dict[str, int | None]:
    """Write ``outputs`` from the driver as batch ``batch`` and commit each table once, as
    ``write_outputs`` does for a Spark job's files (``resumed`` as there); each table's
    version afterwards."""
    open_output = store.opener()
    tokens = {id(o): f"{file_token(o.prefix, batch)}-d" for o in outputs}  # one per write

    def write(part: tuple[LocalOutput, int | None, pa.Table]) -> dict[str, Any]:
        o, bucket, rows = part
        done = write_file(open_output, o.path, tokens[id(o)], bucket, rows)
        return {**done, "partition": {BUCKET: bucket} if o.bucketed else {}}

    versions = finished(outputs, batch=batch, store=store, resumed=resumed)
    outputs = [o for o in outputs if o.key not in versions]
    parts: list[tuple[LocalOutput, int | None, pa.Table]] = []
    for o in outputs:
        if not o.bucketed:
            parts.append((o, None, o.table))
            continue
        parts += [(o, b, rows) for b, rows in by_bucket(o.table)]
    written = threaded(write, [p for p in parts if p[2].num_rows])
    for key in dict.fromkeys(o.key for o in outputs):
        mine = [o for o in outputs if o.key == key]
        added = [w for p, w in written if p[0].key == key]
        first = mine[0]
        replaced = set().union(*[o.replace for o in mine if o.replace is not None]) \
            if any(o.replace is not None for o in mine) else None
        versions[key] = store.commit(
            first.path, added, schema=first.table.schema, app_id=APP_ID, batch=batch,
            partition_by=[BUCKET] if first.bucketed else None, replace=replaced,
            remove=tuple(p for o in mine for p in o.remove))
    return versions

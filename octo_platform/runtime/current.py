"""The current-state table's update as one Arrow kernel, run in two places.

``merge_current`` applies one bucket's change events to that bucket's rows: with keys the
query vouches for (``keyed_changes``: one event per key), the changed keys' rows are
replaced by their after images; otherwise (a bag) rows are added and removed by count. The
driver path runs it in the driver for each bucket a small batch touches
(``driver.current``), reading a bucket once per run and keeping its rows (a keyed table's
found by key: ``merge_keyed``) for the run's next batch; the Spark path runs it in the
batch's write job (``current_output``): the events are shuffled by their current-state
bucket and each touched bucket's task reads that bucket's files (and nothing else) and
writes the bucket's new file itself, beside the changelog the job writes; only the file's
name returns (or the tasks that computed the batch's Δ run it for the buckets of their own
events, with no exchange: ``colocated``). So a batch rewrites the buckets it touches, in
Arrow, with no job of its own; a table whose columns the kernel does not cover (nested
types) keeps
``sink.update_current``'s separate Spark job.
"""
from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, WEIGHT
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.operators import bucket_cache
from octo_platform.runtime.operators.arrow import normal_floats, primitive
from octo_platform.runtime.operators.keyed_rows import KeyedRows
from octo_platform.runtime.operators.tasks import read_bucket, run_group
from octo_platform.runtime.writes import WRITTEN_SCHEMA, Output, file_token, write_file, \
    written_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from octo_platform.runtime.environment import Store
    from octo_platform.runtime.table_run import TableRun

__all__ = ["merge_current", "merge_keyed", "current_output", "bucket_task", "CurrentBuckets",
           "kernel_covers", "current_key", "files_by_bucket"]


def merge_current(old: pa.Table, events: pa.Table, keys: list[str], keyed: bool
                  ) -> pa.Table:
    """One bucket's current-state rows (``old``, the image's columns) after its change
    ``events`` (``before`` / ``after`` images): ``keyed``, the rows of the changed
    ``keys`` replaced (``merge_keyed``); otherwise added and removed by count. Columns of
    types ``arrow.primitive`` (``kernel_covers``)."""
    if keyed:
        return merge_keyed(KeyedRows(old, keys), events).table()
    schema = old.schema
    new, gone = (_images(events, side, schema) for side in ("after", "before"))
    parts = [normal_floats(t).append_column(WEIGHT, pa.array(np.full(t.num_rows, w, np.int64)))
             for t, w in ((old, 1), (gone, -1), (new, 1))]
    counts = pa.concat_tables(parts).group_by(schema.names, use_threads=False).aggregate(
        [(WEIGHT, "sum")])
    weights = counts[f"{WEIGHT}_sum"].to_numpy()
    kept = np.flatnonzero(weights > 0)
    rows = counts.select(schema.names).take(np.repeat(kept, weights[kept]))
    return rows.cast(schema)


def merge_keyed(old: KeyedRows, events: pa.Table) -> KeyedRows:
    """A keyed bucket's rows (found by the key, ``old``) after its change ``events``: the
    rows of the keys an event names replaced by the events' after images. The driver path
    keeps the result for the run's next batch (``driver.current``)."""
    changed = pa.Table.from_struct_array(pc.coalesce(events["after"], events["before"]))
    return old.replace(old.find(changed.select(old.keys)), _images(events, "after", old.schema))


def _images(events: pa.Table, side: str, schema: pa.Schema) -> pa.Table:
    """The events' ``side`` images (those that have one) as rows of ``schema``."""
    images = events.filter(pc.is_valid(events[side]))
    return pa.Table.from_struct_array(images[side]).cast(schema)


def kernel_covers(pipe: TableRun, image: pa.Schema) -> bool:
    """Whether ``merge_current`` covers the table (rows of columns ``image``): Arrow
    groups its key columns (or, for a bag, every column)."""
    keys = current_key(pipe)
    covered = [image.field(k) for k in keys] if pipe.table.physical.keyed_changes \
        else list(image)
    return all(primitive(f.type) for f in covered)


def current_key(pipe: TableRun) -> list[str]:
    """The columns that identify a current-state row: the primary key, else all."""
    plan = pipe.table.physical
    return list(plan.pk) if plan.pk is not None else list(plan.root.columns)


def current_output(pipe: TableRun, events: DataFrame, bucket: str, batch: int,
                   pinned: dict[str, int | None]) -> Output:
    """The write job's output of the current-state buckets the change ``events`` fall in
    (column ``bucket``): one task per touched bucket runs ``merge_current`` and writes the
    bucket's new file itself (where ``kernel_covers`` the table). Only the files' names
    come back: the rows never pass through Spark's JVM."""
    image = arrow_schema(events.schema["after"].dataType)
    task = bucket_task(pipe, image, batch, pinned)
    files = events.select("before", "after", bucket).groupBy(bucket).applyInArrow(
        functools.partial(run_group, task, ""), WRITTEN_SCHEMA)
    return task.output(files)


def bucket_task(pipe: TableRun, image: pa.Schema, batch: int, pinned: dict[str, int | None]
                ) -> CurrentBuckets:
    """What a task needs to rewrite the table's current-state buckets (rows ``image``)."""
    store, path = pipe.env.store, pipe.layout.current(pipe.name)
    return CurrentBuckets(path, files_by_bucket(store, path, pinned.get("current")), image,
                       current_key(pipe), pipe.table.physical.keyed_changes, store.reader(),
                       store.opener(), file_token("part", batch), pipe.cache_counts)


def files_by_bucket(store: Store, path: str, version: int | None) -> dict[int, list[Any]]:
    """The data files of a table partitioned by ``_bucket``, at ``version``, by bucket."""
    files: dict[int, list[Any]] = {}
    for f in store.data_files(path, version):
        files.setdefault(int(f["partition"][BUCKET]), []).append(f)
    return files


@dataclass(frozen=True)
class CurrentBuckets:
    """Runs in Spark tasks: one bucket's change events -> that bucket's new current-state
    file, written here (``WRITTEN_SCHEMA``: its name); ``run`` is the ``applyInArrow``
    function of events grouped by bucket, ``bucket`` a task's call for one bucket
    (``colocated``)."""

    path: str
    files: dict[int, list[Any]]  # the pinned snapshot's files, by bucket
    image: pa.Schema
    keys: list[str]
    keyed: bool
    reader: Callable[[str, str], Any]
    opener: Callable[[str, str], Any]
    token: str  # the start of the files' names (``writes.file_token``)
    counts: Any = None  # ``TableRun.cache_counts``

    def output(self, files: DataFrame, pick: tuple[str | None, str] = (None, "")) -> Output:
        """The write job's output of the files the tasks wrote (``files``, as ``pick`` says:
        ``writes.Output.pick``): it replaces the buckets the changelog's files report."""
        return Output("current", self.path, files, bucketed=True, replace_reported="changelog",
                      written=self.image.append(pa.field(BUCKET, pa.int32())), pick=pick)

    def run(self, key: tuple, events: pa.Table) -> pa.Table:
        return pa.Table.from_pylist(self.bucket(key[0].as_py(), events),
                                    schema=written_schema())

    def bucket(self, bucket: int, events: pa.Table) -> list[dict[str, Any]]:
        """The bucket's new file after its ``events``, written (none when it is empty)."""
        files = self.files.get(bucket, [])
        old = bucket_cache.cached(self.path, bucket, [f["path"] for f in files], self.counts)
        if old is None:
            old = read_bucket(self.reader, self.path, files, self.image)
        rows = merge_current(old, events, self.keys, self.keyed)
        done = self.write(bucket, rows)
        if done:
            bucket_cache.keep(self.path, bucket, [done[0]["path"]], rows)  # its one file
        return done

    def write(self, bucket: int, rows: pa.Table) -> list[dict[str, Any]]:
        """The bucket's new file of all its ``rows`` (none when it is empty)."""
        if not rows.num_rows:
            return []
        return [write_file(self.opener, self.path, f"{self.token}-{uuid.uuid4().hex[:8]}",
                           bucket, rows.cast(self.image))]

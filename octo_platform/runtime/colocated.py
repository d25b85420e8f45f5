"""The Spark path's changelog and current state written by the tasks that computed the
batch's Δ, where each key's rows are in one task: no exchange of their own.

A table whose changes are keyed by a GROUP BY's key (``PhysicalPlan.keyed_changes``) gets
each key's retraction and insertion from one row of the aggregate's accumulators, so both
are in the partition of the task that computed that key's bucket, and the filters and
projections above the aggregate keep them there. Each such partition's task then does what
the driver path does with a whole batch: ``events.change_events`` pairs the rows into
change events, the task writes them as one changelog file and, per current-state bucket
they fall in (``events.event_buckets``), that bucket's new file (``current.merge_current``).
Without this, the events cost a shuffle by key (``debezium.encode_keyed``) and the current
state another by its bucket (``current.current_output``). Where the GROUP BY's rows are the
table's up to renames, its own bucket tasks write the table with a ``TableWriter``
(``aggregate_tasks``: offered through ``BatchContext.sink``), with no Spark SQL between, from
each group's old and new row, no pairing needed (``write_changes``);
otherwise a task per partition of Δ does (``colocated_events``). Only the files' names come back
(``writes.WRITTEN_SCHEMA``), the changelog's tagged with the current-state buckets its
events touched (the current state's commit replaces those), and the events' counts by op,
observed as the write job reads them.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, WEIGHT
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.current import CurrentBuckets, bucket_task, current_key
from octo_platform.runtime.events import arrow_buckets, change_events, event_buckets, \
    events_table, images
from octo_platform.runtime.metrics import metrics, observe
from octo_platform.runtime.operators.arrow import primitive
from octo_platform.runtime.writes import WRITTEN_SCHEMA, Output, by_bucket, file_token, \
    picked_field, write_file, written_schema
from octo_platform.workers import task_started

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from octo_platform.runtime.operators import BatchContext
    from octo_platform.runtime.table_run import TableRun

__all__ = ["colocated", "covered", "colocated_events", "table_writer", "ColocatedEvents",
           "TableWriter", "FILES", "FILES_DDL"]

_OPS = ("c", "u", "d")
_OUT = "_out"  # a file row's table: 0 the changelog, 1 the current state
# What the writing tasks return: a row per file written, its table, and (the changelog's)
# the events in it by op.
FILES = pa.schema([*written_schema(), (_OUT, pa.int32()), *[(op, pa.int64()) for op in _OPS]])
FILES_DDL = f"{WRITTEN_SCHEMA}, {_OUT} INT, " + ", ".join(f"{op} BIGINT" for op in _OPS)


def colocated(pipe: TableRun, *, resumed: bool) -> bool:
    """Whether the batch's tasks may write its changelog and current state (the module
    docstring): keyed changes, no ``state_ttl`` restarts of keys, and a first attempt (a
    resumed one may find one of the two tables committed). Its columns must be ``covered``
    too."""
    plan = pipe.table.physical
    return plan.keyed_changes and not plan.restarts_keys and not resumed


def covered(pipe: TableRun, image: pa.Schema) -> bool:
    """Whether the tasks pair and place events of rows ``image`` (Arrow types): every
    column of a type Arrow groups (``current.kernel_covers`` asks this of the key only) and
    a key Arrow hashes as Spark does."""
    return all(primitive(f.type) for f in image) and \
        arrow_buckets(pa.struct(list(image)), current_key(pipe))


class ColocatedEvents:
    """A batch's change events as the files its tasks wrote (``outputs``), counted by op
    (``sink.Events``' counterpart). ``files``: the tasks' rows, ``TableWriter.write``'s
    (or, with ``pick`` as ``writes.Output.pick``, those of the rows it picks, in that struct
    column), read by one leg of the write job: the observed frame (``frame``) is the one the
    frame's other readers in the job must read too."""

    appended = False
    current = None

    def __init__(self, files: DataFrame, writer: TableWriter,
                 pick: tuple[str | None, str] = (None, "")) -> None:
        where, column = pick
        self.frame, self.observation = observe(files, *[
            f"sum(CASE WHEN {where or 'TRUE'} THEN {picked_field(column, op)} END) AS {op}"
            for op in _OPS])
        table = [" AND ".join(c for c in (where, f"{picked_field(column, _OUT)} = {i}") if c)
                 for i in (0, 1)]
        self.outputs = [
            Output("changelog", writer.changelog, self.frame, written=writer.events_schema(),
                   pick=(table[0], column)),
            writer.current.output(self.frame, (table[1], column))]

    def counts(self, known: dict[str, dict[str, Any]] | None = None) -> dict[str, int]:
        """Events by op (``known``: ``BatchContext.observed``)."""
        got = metrics(self.observation, known) or {}
        return {op: int(n) for op, n in got.items() if n}


def table_writer(pipe: TableRun, batch: int, ts_ms: int, pinned: dict[str, int | None],
                 rows: pa.Schema) -> TableWriter | None:
    """What a task needs to write the batch's changelog and current state from Δ rows of
    ``rows`` (the table's columns and ``_w``); None where it does not cover them."""
    plan = pipe.table.physical
    image = rows.remove(rows.get_field_index(WEIGHT))
    if not covered(pipe, image):
        return None
    return TableWriter(rows, plan.root.columns, plan.pk, pipe.name, batch, ts_ms, pipe.buckets,
                       pipe.layout.changelog(pipe.name), file_token("part", batch),
                       bucket_task(pipe, image, batch, pinned))


def colocated_events(pipe: TableRun, ctx: BatchContext, delta: DataFrame, ts_ms: int,
                     pinned: dict[str, int | None]) -> ColocatedEvents | None:
    """The batch's events written by a task per partition of Δ (``delta``), where
    ``covered``."""
    delta = delta.toDF(*pipe.table.physical.root.columns, WEIGHT)
    writer = table_writer(pipe, ctx.batch, ts_ms, pinned, arrow_schema(delta.schema))
    if writer is None:
        return None
    return ColocatedEvents(delta.mapInArrow(writer.run, FILES_DDL), writer)


@dataclass(frozen=True)
class TableWriter:
    """Runs in Spark tasks: Δ rows (of whole keys) -> the changelog file of their events
    and the new files of the current-state buckets they fall in (the module docstring)."""

    rows: pa.Schema  # the Δ's columns and ``_w``
    columns: tuple[str, ...]
    pk: tuple[str, ...] | None
    table: str
    batch: int
    ts_ms: int
    buckets: int
    changelog: str  # the changelog's path
    token: str  # the start of its files' names (``writes.file_token``)
    current: CurrentBuckets

    def written(self, files: DataFrame, pick: tuple[str, str]) -> ColocatedEvents:
        """The events these tasks wrote: ``files`` as ``ColocatedEvents`` takes them."""
        return ColocatedEvents(files, self, pick)

    def events(self, delta: pa.Table) -> pa.Table:
        return change_events(delta, self.columns, self.pk, table=self.table, batch=self.batch,
                             ts_ms=self.ts_ms)

    @staticmethod
    def files_type() -> Any:
        """``FILES`` as a Spark type."""
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(FILES)

    def events_schema(self) -> pa.Schema:
        """The changelog's columns, as the tasks write them."""
        return self.events(self.rows.empty_table()).schema

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function: a partition's Δ rows -> ``write``'s rows."""
        task_started()
        parts = list(batches)
        delta = pa.Table.from_batches(parts).cast(self.rows) if parts else \
            self.rows.empty_table()
        yield from self.write(delta).to_batches()

    def write(self, delta: pa.Table, bucket: int | None = None) -> pa.Table:
        """The files written for ``delta`` (rows ``FILES``); ``bucket``: every event must
        fall in this current-state bucket (the task's own)."""
        return self.write_events(self.events(delta), bucket)

    def write_changes(self, before: pa.Table, after: pa.Table, no_before: pa.Array,
                      no_after: pa.Array, bucket: int, current: pa.Table | None = None
                      ) -> pa.Table:
        """``write`` for events given as their rows' old and new images (``rows``' columns
        but ``_w``, in its order) and where each is missing: a kernel that holds both
        (``aggregate.arrow_changes``) pairs them itself. ``current``: all of the
        bucket's rows after them, where the kernel holds those too (then the bucket is
        written from them, not merged)."""
        image = pa.struct([f for f in self.rows if f.name != WEIGHT])
        return self.write_events(events_table(
            images(before, image, no_before), images(after, image, no_after),
            table=self.table, batch=self.batch, ts_ms=self.ts_ms), bucket, current)

    def write_events(self, events: pa.Table, bucket: int | None,
                     current: pa.Table | None = None) -> pa.Table:
        """``write``'s files of the changelog's rows ``events`` (``current``: see
        ``write_changes``)."""
        if not events.num_rows:
            return FILES.empty_table()
        buckets = event_buckets(events, list(self.current.keys), self.buckets)
        touched = sorted(set(buckets.to_pylist()))
        if bucket is not None and touched != [bucket]:
            raise RuntimeError(f"events of current-state buckets {touched} in the task of "
                               f"bucket {bucket}")
        counts = dict.fromkeys(_OPS, 0)
        counts.update({c["values"]: c["counts"]
                       for c in pc.value_counts(events.column("op")).to_pylist()})
        written = [{**write_file(self.current.opener, self.changelog,
                                 f"{self.token}-{uuid.uuid4().hex[:8]}", None, events, touched),
                    _OUT: 0, **counts}]
        if current is not None:
            files = self.current.write(touched[0], current)  # the task's bucket (above)
        else:
            files = [f for b, part in by_bucket(events.select(["before", "after"])
                                                .append_column(BUCKET, buckets))
                     for f in self.current.bucket(b, part)]
        written += [{**f, _OUT: 1, **dict.fromkeys(_OPS, 0)} for f in files]
        return pa.Table.from_pylist(written, schema=FILES)

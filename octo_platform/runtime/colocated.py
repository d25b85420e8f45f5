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
state another by its bucket (``current.current_output``). Only the files' names come back
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
from octo_platform.runtime.current import _BucketTask, bucket_task, current_key, kernel_covers
from octo_platform.runtime.events import arrow_buckets, change_events, event_buckets
from octo_platform.runtime.metrics import metrics, observe
from octo_platform.runtime.operators.arrow import primitive
from octo_platform.runtime.writes import WRITTEN_SCHEMA, Output, by_bucket, file_token, \
    write_file, written_schema
from octo_platform.workers import task_started

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from octo_platform.runtime.operators import BatchContext
    from octo_platform.runtime.table_run import TableRun

__all__ = ["colocated", "ColocatedEvents"]

_OPS = ("c", "u", "d")
_OUT = "_out"  # a file row's table: 0 the changelog, 1 the current state
_SCHEMA = f"{WRITTEN_SCHEMA}, {_OUT} INT, " + ", ".join(f"{op} BIGINT" for op in _OPS)


def colocated(pipe: TableRun, delta: DataFrame, *, resumed: bool) -> bool:
    """Whether the batch's tasks write its changelog and current state (the module
    docstring): keyed changes, no key ``state_ttl`` restarts, columns Arrow pairs and hashes,
    and a first attempt (a resumed one may find one of the two tables committed)."""
    plan = pipe.table.physical
    if resumed or not plan.keyed_changes or plan.restarts_keys:
        return False
    image = arrow_schema(delta.drop(WEIGHT).schema)
    return all(primitive(f.type) for f in image) and kernel_covers(pipe, image) and \
        arrow_buckets(pa.struct(list(image)), current_key(pipe))


class ColocatedEvents:
    """A batch's change events as the files its tasks wrote (``outputs``), counted by op
    (``sink.Events``' counterpart)."""

    appended = False
    current = None

    def __init__(self, pipe: TableRun, ctx: BatchContext, delta: DataFrame, ts_ms: int,
                 pinned: dict[str, int | None]) -> None:
        plan = pipe.table.physical
        delta = delta.toDF(*plan.root.columns, WEIGHT)
        rows = arrow_schema(delta.schema)
        image = rows.remove(rows.get_field_index(WEIGHT))
        task = _Task(rows, plan.root.columns, plan.pk, pipe.name, ctx.batch, ts_ms,
                     pipe.buckets, pipe.layout.changelog(pipe.name),
                     file_token("part", ctx.batch), bucket_task(pipe, image, ctx.batch, pinned))
        files = ctx.checkpoint(delta.mapInArrow(task.run, _SCHEMA))  # read by both outputs
        observed, self.observation = observe(files, *[f"sum({op}) AS {op}" for op in _OPS])
        written = [f.name for f in written_schema()]
        self.outputs = [
            Output("changelog", task.changelog, observed.filter(f"{_OUT} = 0").select(*written),
                   written=task.events_schema()),
            task.current.output(files.filter(f"{_OUT} = 1").select(*written))]

    def counts(self, known: dict[str, dict[str, Any]] | None = None) -> dict[str, int]:
        """Events by op (``known``: ``BatchContext.observed``)."""
        got = metrics(self.observation, known) or {}
        return {op: int(n) for op, n in got.items() if n}


@dataclass(frozen=True)
class _Task:
    """The ``mapInArrow`` function (runs in Spark tasks): a partition's Δ rows -> its
    changelog file, its current-state buckets' new files (the module docstring)."""

    rows: pa.Schema  # the Δ's columns and ``_w``
    columns: tuple[str, ...]
    pk: tuple[str, ...] | None
    table: str
    batch: int
    ts_ms: int
    buckets: int
    changelog: str  # the changelog's path
    token: str  # the start of its files' names (``writes.file_token``)
    current: _BucketTask

    def events(self, delta: pa.Table) -> pa.Table:
        return change_events(delta, self.columns, self.pk, table=self.table, batch=self.batch,
                             ts_ms=self.ts_ms)

    def events_schema(self) -> pa.Schema:
        """The changelog's columns, as the tasks write them."""
        return self.events(self.rows.empty_table()).schema

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_started()
        parts = list(batches)
        delta = pa.Table.from_batches(parts).cast(self.rows) if parts else \
            self.rows.empty_table()
        events = self.events(delta)
        out = pa.schema([*written_schema(), (_OUT, pa.int32()),
                         *[(op, pa.int64()) for op in _OPS]])
        if not events.num_rows:
            yield from out.empty_table().to_batches()
            return
        buckets = event_buckets(events, list(self.current.keys), self.buckets)
        counts = {op: 0 for op in _OPS}
        counts.update({c["values"]: c["counts"]
                       for c in pc.value_counts(events.column("op")).to_pylist()})
        touched = sorted(set(buckets.to_pylist()))
        written = [{**write_file(self.current.opener, self.changelog,
                                 f"{self.token}-{uuid.uuid4().hex[:8]}", None, events, touched),
                    _OUT: 0, **counts}]
        for b, part in by_bucket(events.select(["before", "after"]).append_column(BUCKET,
                                                                                   buckets)):
            written += [{**f, _OUT: 1, **dict.fromkeys(_OPS, 0)}
                        for f in self.current.bucket(b, part)]
        yield from pa.Table.from_pylist(written, schema=out).to_batches()

"""Sinks: a streaming table's changelog published exactly once (``CREATE SINK``).

A sink has its own batch log (``_octo/<sink>/log``), over the versions of its table's
changelog. Sink batch N publishes the events the changelog gained between two versions:
1. an *intent* names the versions ``(from, to]`` and, per partition of the topic, the offset
   where N's messages start (the partitions' ends before any of them was sent);
2. executors publish the events (``connectors/kafka_sink.py``; up to ``driver_rows`` events
   of local changelog files: the driver, with no Spark job); a redone intent (a run
   killed mid-way) first reads each partition from its logged offset and sends only the
   events that are not there yet;
3. a *commit* records ``to`` and the counts; batch N+1 starts after it.
Each event is identified by its table batch and its sequence number within that batch: the
position of its row among the batch's changelog files (ordered by name, row counts from the
Delta log), so a redone batch numbers every event as the first attempt did.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from octo_platform.errors import RunError
from octo_platform.local_frames import local_frame
from octo_platform.frontend.definitions import SinkDef
from octo_platform.project import Project
from octo_platform.runtime.environment import Environment
from octo_platform.runtime.layout import Layout
from octo_platform.runtime.environment import Store
from octo_platform.runtime.offsets import BatchLog
from octo_platform.runtime.operators.arrow import DRIVER_BYTES, local_path, read_parquet
from octo_platform.runtime.writes import file_batch

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SinkStats", "SinkRunner", "MAX_VERSIONS", "unpublished"]

MAX_VERSIONS = 50  # changelog versions a sink batch publishes at most (catch-up in steps)


@dataclass
class SinkStats:
    sink: str
    batch: int
    versions: tuple[int | None, int]
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    resumed: bool = False

    def line(self) -> str:
        ops = " ".join(f"{op}={self.counts.get(op, 0)}" for op in ("c", "u", "d"))
        if self.counts.get("tombstone"):
            ops += f" tombstones={self.counts['tombstone']}"
        again = (f", {self.counts.get('present', 0)} already there (resumed)"
                 if self.resumed else "")
        first, last = self.versions
        span = f"{last}" if first is not None and last == first + 1 else \
            f"{'0' if first is None else first + 1}..{last}"
        return (f"[{self.sink}] sink batch {self.batch}: changelog version(s) {span}, "
                f"{self.counts.get('published', 0)} messages published ({ops}){again}, "
                f"{self.seconds:.2f}s")

    def to_json(self) -> dict[str, Any]:
        return {"counts": self.counts, "seconds": round(self.seconds, 3)}


class SinkRunner:
    """Publishes one sink's table changelog, batch after batch, exactly once."""

    def __init__(self, spark: SparkSession, project: Project, sink: SinkDef, layout: Layout,
                 env: Environment, *, driver_rows: int,
                 progress: Callable[[str], None] | None = print) -> None:
        self.spark = spark
        self.driver_rows = driver_rows  # sink batches of at most this many events: the driver
        # (``RunOptions.driver_rows``)
        self.sink = sink
        self.layout = layout
        self.env = env
        self.progress = progress
        table = project.table(sink.table)
        self.changelog = layout.changelog(table.name)
        self.target = env.kafka_sink(sink.name, sink.options, table=table.name,
                                     key=table.physical.pk)
        self.log = BatchLog(env.store, layout.log(sink.name))

    def catch_up(self) -> list[SinkStats]:
        """Publish everything the changelog has now (a pending batch first)."""
        done = []
        while (stats := self.step()) is not None:
            done.append(stats)
        return done

    def lag(self) -> int | None:
        """Changelog versions not yet published (None: the table has no changelog)."""
        return _lag(self.env.store.version(self.changelog), self.last_version())

    def last_version(self) -> int | None:
        return _published_version(self.log)

    def step(self) -> SinkStats | None:
        """Publish the next sink batch (or finish a pending one); None if nothing is new."""
        started = time.monotonic()
        planned = self.plan()
        if planned is None:
            return None
        batch, spec, ts_ms, resumed = planned
        stats = SinkStats(self.sink.name, batch, (spec["from"], spec["to"]), resumed=resumed)
        local = self.local_events(spec["from"], spec["to"])
        events = self.events(spec["from"], spec["to"]) if local is None \
            else local_frame(self.spark, local)
        if events is not None:
            stats.counts = self.env.publish_kafka(
                self.target, events, starts=self.starts(spec), resume=resumed,
                local_rows=None if local is None else local.num_rows)
        stats.seconds = time.monotonic() - started
        self.log.append(batch, "commit", {"version": spec["to"], "stats": stats.to_json()},
                        ts_ms)
        if self.progress:
            self.progress(stats.line())
        return stats

    def plan(self) -> tuple[int, dict[str, Any], int, bool] | None:
        """``(batch, spec, ts_ms, resumed)`` of the next sink batch, its intent logged (a
        pending one: ``resumed``); None if the changelog has nothing new."""
        log = self.log
        pending = log.pending()
        if pending is not None:
            return (*pending, True)
        head = self.env.store.version(self.changelog)
        last = self.last_version()
        if head is None or head == last:
            return None
        if last is not None and head < last:
            raise RunError(
                f"sink {self.sink.name!r}: the changelog of {self.sink.table!r} is at version "
                f"{head}, before the version {last} the sink has published (the table was "
                f"reset elsewhere); run `octo reset {self.sink.name}` to publish it again "
                "from its start")
        start = {str(p): high for p, (_, high) in
                 sorted(self.env.kafka_watermarks(self.target).items())}
        spec = {"from": last, "to": min(head, (-1 if last is None else last) + MAX_VERSIONS),
                "offsets": start}
        batch, ts_ms = log.last_committed + 1, int(time.time() * 1000)
        log.append(batch, "intent", spec, ts_ms)
        return batch, spec, ts_ms, False

    @staticmethod
    def starts(spec: dict[str, Any]) -> dict[int, int]:
        """Each partition's offset before the batch's first message (as logged)."""
        return {int(p): int(o) for p, o in spec["offsets"].items()}

    def events(self, first: int | None, last: int) -> DataFrame | None:
        """The change events added between two changelog versions, each with ``_seq``: its
        number within its table batch (files of a batch in name order, rows in file order)."""
        from pyspark.sql import functions as F

        added = self._added(first, last)
        if not added:
            return None
        offsets = self.spark.createDataFrame([(f["path"].rsplit("/", 1)[-1], base)
                                              for f, base in added],
                                             "_file STRING, _base BIGINT")
        rows = self.spark.read.parquet(*(f["uri"] for f, _ in added)).selectExpr(
            "*", "_metadata.file_name AS _file", "_metadata.row_index AS _row")
        return (rows.join(F.broadcast(offsets), "_file")
                .selectExpr("op", "before", "after", "ts_ms", "source", "_base + _row AS _seq"))

    def local_events(self, first: int | None, last: int) -> pa.Table | None:
        """``events`` read with Arrow in the driver, when they are at most ``driver_rows``
        rows and ``DRIVER_BYTES`` of local files; else None."""
        import numpy as np
        import pyarrow as pa

        added = self._added(first, last)
        paths = [local_path(f["uri"]) for f, _ in added]
        if not added or sum(int(f["rows"]) for f, _ in added) > self.driver_rows \
                or sum(int(f["size"]) for f, _ in added) > DRIVER_BYTES or None in paths:
            return None
        schema = self.env.store.arrow_schema(self.changelog)  # either path's files as one
        return pa.concat_tables([
            read_parquet(p, schema).append_column(
                "_seq", pa.array(np.arange(base, base + int(f["rows"]), dtype=np.int64)))
            for (f, base), p in zip(added, paths)])

    def _added(self, first: int | None, last: int) -> list[tuple[dict[str, Any], int]]:
        """The changelog's files added between two versions, in name order, each with the
        ``_seq`` of its first row."""
        store = self.env.store
        before = {f["path"] for f in store.data_files(self.changelog, first)}
        added = sorted((f for f in store.data_files(self.changelog, last)
                        if f["path"] not in before), key=lambda f: f["path"])
        out, seen = [], {}
        for f in added:
            group = file_batch(f["path"])
            out.append((f, seen.get(group, 0)))
            seen[group] = seen.get(group, 0) + int(f["rows"])
        return out


def unpublished(store: Store, layout: Layout, sink: SinkDef) -> int:
    """Versions of the sink's table changelog the sink has not published (read from the
    Delta logs only)."""
    return _lag(store.version(layout.changelog(sink.table)),
                _published_version(BatchLog(store, layout.log(sink.name)))) or 0


def _published_version(log: BatchLog) -> int | None:
    """The last changelog version a sink's log records as published."""
    return (log.commit_payload(log.last_committed) or {}).get("version")


def _lag(head: int | None, last: int | None) -> int | None:
    return None if head is None else head - (-1 if last is None else last)

"""Offsets: what each batch reads, decided once and logged before the batch runs.

Light on imports on purpose: Spark's Python streaming-source runner imports this module.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from octo_platform.errors import RunError

if TYPE_CHECKING:
    from octo_platform.runtime.environment import Environment, Store

__all__ = ["InputSpec", "BatchLog", "source_key", "next_inputs", "available",
           "kafka_ranges", "KAFKA_MAX_RECORDS"]

KAFKA_MAX_RECORDS = 1_000_000  # default max_records_per_batch of a Kafka source


@dataclass(frozen=True)
class InputSpec:
    """One input of a pipeline: new files in a directory, the versions of a Delta table
    (an upstream changelog, or a ``delta`` source), both kinds of table read as
    ``{"from": previous version or None, "to": version}``, or offset ranges of a Kafka
    topic, read as ``{"ranges": {partition: [from, to)}}``. ``options``: a Kafka source's
    ``WITH`` options."""

    key: str
    kind: str  # "files" | "changelog" | "delta" | "kafka"
    path: str
    max_files: int = 1000
    options: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "path": self.path,
                "max_files": self.max_files, "options": [list(o) for o in self.options]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputSpec:
        return cls(**{**data, "options": tuple(tuple(o) for o in data.get("options", ()))})

    @property
    def name(self) -> str:
        return self.key.split(":", 1)[1]


def source_key(kind: str, name: str) -> str:
    return f"{kind}:{name.lower()}"


@dataclass(frozen=True)
class LogEntry:
    ts_ms: int
    payload: dict[str, Any]


class BatchLog:
    """The table's batch log (a small Delta table): intents and commits, one row each.

    Read once; a pipeline keeps its instance, as it is the table's only writer (lock).
    """

    def __init__(self, store: Store, path: str) -> None:
        self.store = store
        self.path = path
        table = store.read(path)
        self.intents: dict[int, LogEntry] = {}
        self.commits: dict[int, LogEntry] = {}
        for r in table.to_pylist() if table is not None else []:
            self._entries(r["kind"])[r["batch_id"]] = LogEntry(r["ts_ms"],
                                                               json.loads(r["payload"]))

    def _entries(self, kind: str) -> dict[int, LogEntry]:
        return self.intents if kind == "intent" else self.commits

    @property
    def last_committed(self) -> int:
        return max(self.commits, default=-1)

    def pending(self) -> tuple[int, dict[str, Any], int] | None:
        """(batch, inputs, ts_ms) of an intent without a commit: the batch to redo first."""
        nxt = self.last_committed + 1
        if nxt in self.intents:
            entry = self.intents[nxt]
            return nxt, entry.payload, entry.ts_ms
        return None

    def commit_payload(self, batch: int) -> dict[str, Any] | None:
        entry = self.commits.get(batch)
        return entry.payload if entry else None

    def processed_files(self, source: str) -> set[str]:
        files: set[str] = set()
        for entry in self.intents.values():
            files.update(entry.payload.get(source, {}).get("files", []))
        return files

    def kafka_offsets(self, source: str) -> dict[str, int]:
        """The next offset to read of each partition of a Kafka input (logged ones only)."""
        offsets: dict[str, int] = {}
        for batch in sorted(self.intents):
            for p, (_, stop) in self.intents[batch].payload.get(source, {}).get(
                    "ranges", {}).items():
                offsets[p] = stop
        return offsets

    def last_version(self, table: str) -> int | None:
        for batch in sorted(self.intents, reverse=True):
            got = self.intents[batch].payload.get(table)
            if got is not None:
                return int(got["to"])
        return None

    def append(self, batch: int, kind: str, payload: dict[str, Any], ts_ms: int) -> None:
        import pyarrow as pa

        text = json.dumps(payload, sort_keys=True)
        row = pa.table({"batch_id": pa.array([batch], pa.int64()),
                        "kind": pa.array([kind]), "ts_ms": pa.array([ts_ms], pa.int64()),
                        "payload": pa.array([text])})
        self.store.write(self.path, row, app_id=kind, batch=batch)
        self._entries(kind)[batch] = LogEntry(ts_ms, json.loads(text))


def next_inputs(specs: tuple[InputSpec, ...], log: BatchLog, *, env: Environment,
                target: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]] | None:
    """The next batch to run and its inputs, or None when nothing new is available.

    ``target`` (files / versions visible when an ``availableNow`` run started) caps what is
    admitted so a catch-up run ends even while input keeps arriving.
    """
    pending = log.pending()
    if pending is not None:
        return pending[0], pending[1]
    inputs: dict[str, Any] = {}
    visible = target if target is not None else available(specs, env=env)
    for spec in specs:
        if spec.kind == "kafka":
            got = kafka_ranges(spec, log, visible[spec.key])
            if got is not None:
                inputs[spec.key] = got
        elif spec.kind == "files":
            done = log.processed_files(spec.key)
            new = [f for f in visible.get(spec.key, []) if f not in done][: spec.max_files]
            if new:
                inputs[spec.key] = {"files": new}
        else:
            to = visible.get(spec.key)
            prev = log.last_version(spec.key)
            if to is not None and (prev is None or to > prev):
                inputs[spec.key] = {"from": prev, "to": to}
    if not inputs:
        return None
    return log.last_committed + 1, inputs


def kafka_ranges(spec: InputSpec, log: BatchLog, marks: dict[str, list[int]]
                 ) -> dict[str, Any] | None:
    """The offset ranges of a Kafka input's next batch, from the offsets its batches have
    logged and the partitions' watermarks ``marks`` (``{partition: [low, high]}``); None if
    there is nothing new. The first batch of a ``startup = 'latest'`` source starts at the
    high watermarks (an empty batch that logs where reading starts); a partition added later
    starts at its beginning. ``max_records_per_batch`` is shared by the partitions
    (``_share``). Offsets deleted by retention before they were read fail the
    batch, or with ``on_data_loss = 'skip'`` are skipped and counted (``lost``)."""
    opts = dict(spec.options)
    logged = log.kafka_offsets(spec.key)
    first_latest = not logged and opts.get("startup", "earliest") == "latest"
    starts: dict[str, int] = {}
    lost = 0
    for p, (low, high) in sorted(marks.items(), key=lambda kv: int(kv[0])):
        start = high if first_latest else logged.get(p, low)
        if start < low:
            if opts.get("on_data_loss", "fail") != "skip":
                raise RunError(
                    f"source {spec.name!r}: offsets {start}..{low - 1} of partition {p} of "
                    f"{spec.path} were deleted (retention) before they were read; set "
                    "on_data_loss = 'skip' to skip them, or reset the tables that read it")
            lost, start = lost + low - start, low
        starts[p] = start
    take = _share(int(opts.get("max_records_per_batch", KAFKA_MAX_RECORDS)),
                  {p: marks[p][1] - start for p, start in starts.items()})
    ranges: dict[str, list[int]] = {}
    for p, start in starts.items():
        if take[p] or first_latest or lost:
            ranges[p] = [start, start + take[p]]
    if not any(b > a for a, b in ranges.values()) and not first_latest and not lost:
        return None
    return {"ranges": ranges, **({"lost": lost} if lost else {})}


def _share(budget: int, waiting: dict[str, int]) -> dict[str, int]:
    """Records to take from each partition: all of them if ``budget`` allows, else the
    budget shared evenly (a partition with less waiting leaves its share to the others), so
    a capped batch still reads every partition in parallel."""
    take: dict[str, int] = {}
    order = sorted(waiting, key=lambda p: (waiting[p], int(p)))
    for i, p in enumerate(order):
        take[p] = min(waiting[p], budget // (len(order) - i))
        budget -= take[p]
    return take


def available(specs: tuple[InputSpec, ...], *, env: Environment) -> dict[str, Any]:
    """Everything each input has right now: file lists, Delta table versions and Kafka
    watermarks (``{partition: [low, high]}``)."""
    out: dict[str, Any] = {}
    for s in specs:
        if s.kind == "files":
            out[s.key] = env.list_files(s.path)
        elif s.kind == "kafka":
            source = env.kafka_source(s.name, dict(s.options))
            out[s.key] = {str(p): list(lh) for p, lh in env.kafka_watermarks(source).items()}
        else:
            out[s.key] = env.store.version(s.path)
    return out

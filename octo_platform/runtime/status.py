"""What a streaming table looks like on disk right now: last batch, Delta versions, row counts
and the input still waiting (the backlog a catch-up run would process next).

Reads only the batch log and Delta metadata (file statistics), never the data, so it is cheap
enough for a materialization's metadata, a sensor or a lag view.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octo_platform.columns import BUCKET
from octo_platform.project import Project
from octo_platform.runtime.inputs import input_specs, watermarked_inputs
from octo_platform.runtime.offsets import BatchLog, available
from octo_platform.runtime.options import RunOptions
from octo_platform.runtime.sinks import unpublished

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["TableStatus", "table_status", "current_schema"]


@dataclass(frozen=True)
class TableStatus:
    """One streaming table's committed progress and waiting input.

    ``backlog`` maps each input (``source:<name>`` / ``table:<name>``) to what is waiting:
    new files for a ``files`` source, Delta versions not yet read for an upstream changelog
    or a ``delta`` source, records of a ``kafka`` source; and each of the table's sinks
    (``sink:<name>``) to the changelog versions it has not published (a run publishes them).
    """

    table: str
    last_batch: int  # -1: no batch committed yet
    last_commit_ms: int | None
    pending_batch: int | None  # a batch logged as started but not committed (a killed run)
    changelog_version: int | None
    current_version: int | None
    current_rows: int | None
    state_rows: dict[str, int] = field(default_factory=dict)  # per operator state table
    backlog: dict[str, int] = field(default_factory=dict)
    watermarked: bool = False  # a source of the table declares a WATERMARK
    watermark: str | None = None  # the table's watermark after the last batch (UTC)
    late_rows: int = 0  # late records dead-lettered by all committed batches

    @property
    def waiting(self) -> int:
        return sum(self.backlog.values())

    @property
    def total_state_rows(self) -> int:
        return sum(self.state_rows.values())


def table_status(project: Project, name: str, *, options: RunOptions) -> TableStatus:
    """Status of streaming table ``name`` in the warehouse of ``options``."""
    table = project.table(name)
    layout = options.layout(project.root)
    store, tname = options.env.store, table.name
    log = BatchLog(store, layout.log(tname))
    specs = input_specs(project, table, layout)
    visible = available(specs, env=options.env)
    backlog: dict[str, int] = {}
    for spec in specs:
        if spec.kind == "kafka":  # per partition: high watermark - next offset to read
            logged = log.kafka_offsets(spec.key)
            backlog[spec.key] = sum(max(0, high - logged.get(p, low))
                                    for p, (low, high) in visible[spec.key].items())
        elif spec.kind == "files":
            done = log.processed_files(spec.key)
            backlog[spec.key] = sum(1 for f in visible.get(spec.key) or [] if f not in done)
        else:
            to, prev = visible.get(spec.key), log.last_version(spec.key)
            backlog[spec.key] = 0 if to is None else max(0, to - (-1 if prev is None else prev))
    for sink in project.sinks_of(tname):
        backlog[f"sink:{sink.name}"] = unpublished(store, layout, sink)
    last = log.last_committed
    pending = log.pending()
    stats = [c.payload.get("stats", {}) for c in log.commits.values()]
    current = layout.current(tname)
    return TableStatus(
        table=tname,
        last_batch=last,
        last_commit_ms=log.commits[last].ts_ms if last in log.commits else None,
        pending_batch=pending[0] if pending is not None else None,
        changelog_version=store.version(layout.changelog(tname)),
        current_version=store.version(current),
        current_rows=store.num_rows(current),
        state_rows={t: store.num_rows(layout.state(tname, t)) or 0
                    for t in table.physical.state_tables},
        backlog=backlog,
        watermarked=watermarked_inputs(project, table) > 0,
        watermark=(log.commits[last].payload.get("stats", {}).get("watermark")
                   if last in log.commits else None),
        late_rows=sum(s.get("late_rows", 0) for s in stats),
    )


def current_schema(project: Project, name: str, *, options: RunOptions) -> pa.Schema | None:
    """Arrow schema of the table's current-state snapshot (its result columns), if written."""
    layout = options.layout(project.root)
    schema = options.env.store.arrow_schema(layout.current(project.table(name).name))
    if schema is None:
        return None
    return schema.remove(schema.get_field_index(BUCKET)) if BUCKET in schema.names else schema

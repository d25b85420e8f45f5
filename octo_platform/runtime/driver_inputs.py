"""A driver-path batch's inputs read in the driver, with no Spark job.

New JSON, Debezium JSON and Parquet files are read here and parsed by the connector's own
Spark SQL over a local relation (``connectors/files.read_files_local``); an upstream
table's changelog files are read with Arrow and decoded (``debezium.decode_arrow``).
Parquet records whose event times are all at or above their source's watermark skip Spark
altogether (``on_time``). Good and bad records, late ones and the latest event time are
counted from what was read, as the Spark path observes them (``inputs.settle_inputs``);
bad records become the batch's dead letters. Where a stateless node right above a source
starts with a filter, the Spark call that parses the records also evaluates that filter
(``first_filters``): the node then takes the rows it keeps without a Spark call of its own.
A Kafka source's ranges are fetched here by one consumer and parsed like lines of a file
(``connectors/kafka.read_local``). A ``delta`` source's changes are read as Arrow once per
process for each pair of versions, whichever table asks first (``changes_arrow``: Spark
reads a table with deletion vectors, delta-rs the others). Other inputs (CSV, remote files)
raise ``Unsupported``: the driver path then reads them with Spark (``inputs.read_inputs``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import WEIGHT
from octo_platform.errors import RunError
from octo_platform.local_frames import arrow_schema, collect_arrow, local_frame
from octo_platform.physical.plan import PNode, PSource, PStateless
from octo_platform.runtime.inputs import LATE, advanced, mark_late, upstream_watermark
from octo_platform.runtime.offsets import source_key
from octo_platform.runtime.operators.arrow import local_path, read_parquet
from octo_platform.runtime.operators.kernels import LocalContext, Unsupported

if TYPE_CHECKING:
    from octo_platform.runtime.stats import BatchStats
    from octo_platform.runtime.table_run import TableRun

__all__ = ["LocalInputs", "read_local", "DEAD_LETTERS"]

DEAD_LETTERS = pa.schema([("raw", pa.string()), ("source_file", pa.string()),
                          ("source", pa.string()), ("reason", pa.string())])


@dataclass
class LocalInputs:
    """Each source's weighted rows, and what the batch statistics take from the read."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    # per stateless node right above a source: its first filter, evaluated by the read
    kept: dict[str, pa.Array] = field(default_factory=dict)
    dead: list[pa.Table] = field(default_factory=list)
    rows_in: int = 0
    late: int = 0
    watermarks: dict[str, int] = field(default_factory=dict)

    def settle(self, stats: BatchStats) -> None:
        stats.rows_in += self.rows_in
        stats.dead_letters += sum(t.num_rows for t in self.dead)
        stats.late_rows += self.late
        stats.watermarks.update(self.watermarks)


def read_local(pipe: TableRun, lc: LocalContext, inputs: dict[str, Any], rows: int,
               stats: BatchStats) -> LocalInputs:
    """Read the batch's inputs (``rows``: as ``driver.input_rows`` counts them) in the
    driver (``stats``: only read, for the watermarks the batch begins with);
    ``Unsupported`` for an input only Spark reads."""
    out = LocalInputs()
    for src in pipe.table.physical.sources:
        key = source_key(src.kind, src.name)
        got = inputs.get(key)
        if src.kind == "table":
            changes = _upstream(pipe, src, got)
            mark = upstream_watermark(pipe, src, got)
            if mark is not None:
                out.watermarks[key] = mark
            out.rows_in += changes.num_rows
            out.tables[src.name.lower()] = changes
            continue
        sdef = pipe.project.source(src.name)
        if sdef.connector == "delta":  # read by Spark or delta-rs, once for every table
            dsrc = pipe.delta_sources[src.name.lower()]
            changes = dsrc.changes_arrow(lc.spark, got, table=pipe.name) if got else \
                lc.once(f"empty:{key}", lambda: arrow_schema(dsrc.empty(pipe.spark).schema)
                        .empty_table())  # noqa: B023 - called at once
            out.rows_in += changes.num_rows
            out.tables[src.name.lower()] = changes
            continue
        if sdef.connector == "kafka":
            ksrc = pipe.env.kafka_source(sdef.name, sdef.options, columns=sdef.columns,
                                         types=sdef.types)
            todo = {p: r for p, r in (got or {}).get("ranges", {}).items() if r[1] > r[0]}
            read = functools.partial(pipe.env.read_kafka_local, lc.spark, ksrc, todo)
            empty = functools.partial(pipe.env.read_kafka, pipe.spark, ksrc, {})
        elif sdef.connector == "files":
            fsrc = pipe.env.file_source(sdef, pipe.project.source_path(sdef))
            todo = (got or {}).get("files", [])
            read = functools.partial(pipe.env.read_files_local, lc.spark, fsrc, todo)
            empty = functools.partial(pipe.env.read_files, pipe.spark, fsrc, [])
        else:
            raise Unsupported(f"{sdef.connector} sources")
        if not todo:
            out.tables[src.name.lower()] = lc.once(f"empty:{key}", lambda: arrow_schema(
                _rows_schema(empty())).empty_table())
            continue
        try:
            parsed = read()
        except LookupError as e:
            raise Unsupported(str(e)) from e
        got_rows = None  # the records as Arrow, if no Spark call is needed for them
        kept: dict[str, str] = {}  # stateless node -> the column of its first filter
        if parsed.evaluated is not None:
            got_rows = parsed.evaluated if sdef.watermark is None else \
                on_time(parsed.evaluated, sdef, stats.watermarks.get(key))
        if got_rows is None:
            records = parsed.records if parsed.records is not None else \
                local_frame(lc.spark, parsed.evaluated)
            if sdef.watermark is not None:
                records, _ = mark_late(records, sdef, stats.watermarks.get(key))
                time = sdef.watermark.time_sql(sdef.format == "debezium-json")
                records = records.selectExpr("*", f"unix_micros({time}) AS _t")
            if sdef.format != "debezium-json":  # a record is a row: filter it in this call
                conds = first_filters(pipe.table.physical.root, src.name)
                kept = {node: f"_kept{i}" for i, node in enumerate(conds)}
                records = records.selectExpr("*", *[
                    f"coalesce(({cond}), false) AS {kept[node]}" for node, cond in conds.items()])
            got_rows = collect_arrow(records, rows_in=rows)
        good = got_rows.filter(pc.is_null(got_rows["_reason"]))
        bad = got_rows.filter(pc.is_valid(got_rows["_reason"]))
        out.kept.update({node: good[column] for node, column in kept.items()})
        if sdef.watermark is not None:
            out.late += pc.sum(pc.starts_with(bad["_reason"], LATE)).as_py() or 0
            latest = pc.max(good["_t"]).as_py() if good.num_rows else None
            mark = advanced(stats.watermarks.get(key), latest, sdef.watermark.delay_us)
            if mark is not None:
                out.watermarks[key] = mark
        out.rows_in += good.num_rows
        if bad.num_rows:
            out.dead.append(pa.table([bad["_raw"], bad["_file"],
                                      pa.array([src.name] * bad.num_rows, pa.string()),
                                      bad["_reason"]], schema=DEAD_LETTERS))
        if sdef.format == "debezium-json":
            weighted = pipe.env.decode_changelog_arrow(good, src.columns)
        else:
            weighted = good.select(list(sdef.columns)).append_column(
                WEIGHT, pa.array([1] * good.num_rows, pa.int64()))
        out.tables[src.name.lower()] = weighted
    return out


def first_filters(root: PNode, source: str) -> dict[str, str]:
    """The stateless nodes right above source ``source`` whose first step is a filter: by
    node id, that filter's condition. The read evaluates the conditions with the parsing
    (``LocalInputs.kept``), one Spark call fewer per node."""
    found: dict[str, str] = {}

    def walk(node: PNode) -> None:
        if (isinstance(node, PStateless) and isinstance(node.input, PSource)
                and node.input.kind == "source" and node.input.name.lower() == source.lower()
                and node.steps and node.steps[0][0] == "filter"):
            found[node.id] = node.steps[0][2][0]
        for child in node.inputs:
            walk(child)
    walk(root)
    return found


def on_time(records: pa.Table, sdef: Any, before: int | None) -> pa.Table | None:
    """``records`` (parsed in Arrow, none bad) with their event times as ``_t`` when each
    has one at or above the watermark ``before``: ``mark_late`` would then mark none, and
    Spark is not asked. None when some record is late or has no event time (``mark_late``
    makes them dead letters, with Spark's text of the time in the reason)."""
    wm = sdef.watermark
    if sdef.format == "debezium-json":  # a change event's time: as ``time_sql`` takes it
        (name,) = [f.name for f in records["after"].type if f.name.lower() == wm.column.lower()]
        times = pc.if_else(pc.equal(records["op"], "d"), pc.struct_field(records["before"], name),
                           pc.struct_field(records["after"], name))
    else:
        (name,) = [c for c in records.column_names if c.lower() == wm.column.lower()]
        times = records[name]
    # a TIMESTAMP (an instant): Spark's unix_micros is its value, whatever the session's zone
    if not (pa.types.is_timestamp(times.type) and times.type.unit == "us"
            and times.type.tz is not None) or times.null_count:
        return None
    micros = times.cast(pa.int64())
    if before is not None and records.num_rows and pc.min(micros).as_py() < before:
        return None
    return records.append_column("_t", micros)


def _rows_schema(parsed: Any):
    """The Spark schema of the weighted rows of a source's (empty) read."""
    return parsed.rows(parsed.records).schema


def _upstream(pipe: TableRun, src: Any, got: dict[str, Any] | None) -> pa.Table:
    """Weighted rows of an upstream table's change events between two versions."""
    upstream = pipe.project.table(src.name)
    path = pipe.layout.changelog(upstream.name)
    files = pipe.env.store.added_files(path, got["from"], got["to"]) if got else []
    local = [local_path(f) for f in files]
    if any(f is None for f in local):
        raise Unsupported("a remote warehouse")
    schema = pipe.env.store.arrow_schema(path)
    if schema is None:
        raise RunError(f"{pipe.name}: upstream table {upstream.name!r} has no changelog "
                       "yet; run it first")
    # Files of either path (their nullability differs) as the table's schema.
    events = pa.concat_tables([read_parquet(f, schema) for f in local]) if local \
        else schema.empty_table()
    return pipe.env.decode_changelog_arrow(events, src.columns)

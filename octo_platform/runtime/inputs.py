"""A batch's inputs: the logged files, upstream changelog versions and Delta versions read
as weighted rows, with their record counts and dead letters observed while the batch's write
job reads them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from octo_platform.errors import RunError
from octo_platform.frontend.definitions import SourceDef, Watermark
from octo_platform.physical.plan import PSource
from octo_platform.project import CompiledTable, Project
from octo_platform.runtime.layout import Layout
from octo_platform.runtime.metrics import metrics, observe
from octo_platform.runtime.offsets import BatchLog, InputSpec, source_key
from octo_platform.runtime.operators import BatchContext
from octo_platform.runtime.operators.arrow import local_path
from octo_platform.runtime.stats import BatchStats, iso_time, table_watermark
from octo_platform.sqltext import quote, string

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from octo_platform.runtime.table_run import TableRun

__all__ = ["input_specs", "read_inputs", "set_watermarks", "watermarked_inputs",
           "settle_inputs", "commit_kafka_offsets", "upstream_watermark", "advanced",
           "mark_late", "ALL_BUCKETS_BYTES", "LATE"]

ALL_BUCKETS_BYTES = 1 << 20  # input size from which a top-N takes all its buckets as touched
KAFKA_RECORD_BYTES = 100  # a Kafka record's size, as far as ALL_BUCKETS_BYTES is concerned
LATE = "late:"  # how a late record's dead-letter reason starts


def input_specs(project: Project, table: CompiledTable, layout: Layout) -> tuple[InputSpec, ...]:
    """Where each input of ``table`` comes from, in a form the offsets source can pickle."""
    specs = []
    for src in table.physical.sources:
        key = source_key(src.kind, src.name)
        if src.kind == "table":
            specs.append(InputSpec(key, "changelog",
                                   layout.changelog(project.table(src.name).name)))
            continue
        sdef = project.source(src.name)
        if sdef.connector == "delta":
            specs.append(InputSpec(key, "delta", project.source_path(sdef)))
        elif sdef.connector == "kafka":
            specs.append(InputSpec(key, "kafka", project.source_path(sdef),
                                   options=tuple(sorted(sdef.options.items()))))
        else:
            specs.append(InputSpec(key, "files", project.source_path(sdef),
                                   int(sdef.options.get("max_files_per_batch", "1000"))))
    return tuple(specs)


def watermarked_inputs(project: Project, table: CompiledTable) -> int:
    """How many inputs of ``table`` have a watermark: sources that declare one, upstream
    tables that pass theirs on."""
    return sum(1 for src in table.physical.sources
               if (project.source(src.name).watermark if src.kind == "source"
                   else project.table(src.name).definition.event_time) is not None)


def read_inputs(pipe: TableRun, ctx: BatchContext, inputs: dict[str, Any],
                stats: BatchStats) -> list[_Observed]:
    """Register each source's weighted rows in ``ctx``.

    Nothing is read here: each input is a checkpoint (``BatchContext.checkpoint``) that
    the batch's write job computes once, and its record counts (good, bad, late) and a
    watermarked source's latest event time are observed by that job too, in a leg of
    their own (``ctx.watched``, ``settle_inputs``), which saves a job per batch.
    ``stats.watermarks`` holds each input's watermark as the batch begins (from the
    previous commit): a source's rows below it are late and become dead letters. An
    upstream table that passes its watermark on gets its watermark as of the changelog
    version read. When the table's windows close by the watermark, the batch's new
    watermark is needed before it runs: a Parquet source's latest event time then comes
    from the files' footers where they vouch for every record (``FileSource.latest_time``);
    other watermarked sources' records are computed, and their latest event time read, by
    a job of its own (``ctx.watermark``). Each input's bad records become the batch's
    dead letters (``ctx.dead_letters``), which the write job writes too.
    """
    watermarks = dict(stats.watermarks)
    observed: list[_Observed] = []
    ctx.watched.clear()  # an earlier read of the batch (the driver path's) is not written
    ctx.dead_letters.clear()
    size = 0
    after: dict[str, int | None] = {}  # sources' watermarks after the batch, if needed now
    for src in pipe.table.physical.sources:
        key = source_key(src.kind, src.name)
        got = inputs.get(key)
        dsrc = pipe.delta_sources.get(src.name.lower()) if src.kind == "source" else None
        if src.kind == "table" or dsrc is not None:
            if dsrc is None:
                rows, files = upstream_changes(pipe, src, got)
                size += _local_bytes(files)
                mark = upstream_watermark(pipe, src, got)
                if mark is not None:
                    stats.watermarks[key] = after[key] = mark
            else:
                rows = dsrc.changes(pipe.spark, got, table=pipe.name)
                size += ALL_BUCKETS_BYTES if got and got["from"] is None else 0
            if got:
                rows = ctx.checkpoint(rows)
                observed.append(_Observed.watch(ctx, rows, "count(1) AS good", "0L AS bad"))
            ctx.inputs[src.name.lower()] = rows
            continue
        sdef = pipe.project.source(src.name)
        if sdef.connector == "kafka":
            ksrc = pipe.env.kafka_source(sdef.name, sdef.options, columns=sdef.columns,
                                         types=sdef.types)
            ranges = (got or {}).get("ranges", {})
            size += KAFKA_RECORD_BYTES * sum(b - a for a, b in ranges.values())
            parsed = pipe.env.read_kafka(pipe.spark, ksrc, ranges)
            fsrc, files = None, []
        else:
            fsrc = pipe.env.file_source(sdef, pipe.project.source_path(sdef))
            files = (got or {}).get("files", [])
            size += sum(os.path.getsize(f) for f in files if os.path.exists(f))
            parsed = pipe.env.read_files(pipe.spark, fsrc, files)
        records = parsed.records
        exact = fsrc.exact_rows(files) if fsrc is not None and sdef.watermark is None else None
        if exact is not None:  # no record can be bad: none to count, none to set aside
            stats.rows_in += exact
            ctx.inputs[src.name.lower()] = parsed.rows(records)
            continue
        exprs = ["count_if(_reason IS NULL) AS good", "count_if(_reason IS NOT NULL) AS bad"]
        if sdef.watermark is not None:
            records, timed = mark_late(records, sdef, watermarks.get(key))
            exprs += [f"count_if(startswith(_reason, '{LATE}')) AS late", timed]
        # Read once, by the write job (or the watermark's job): its operators' frames and
        # the counts' leg read the checkpoint (and a raw CSV query never reads the
        # corrupt-record column alone, which Spark refuses).
        records = ctx.checkpoint(records)
        if got:
            ctx.dead_letters.append(records.filter("_reason IS NOT NULL").selectExpr(
                "_raw AS raw", "_file AS source_file",
                f"{string(src.name)} AS source", "_reason AS reason"))
        if sdef.watermark is not None and pipe.table.physical.closes_windows:
            try:  # windows close in this batch: its watermark is needed before it runs:
                if fsrc is None:  # from Parquet footers, or a job
                    raise LookupError("a Kafka topic")
                latest = fsrc.latest_time(files, sdef.watermark.column)
            except LookupError:
                latest = records.selectExpr(timed).collect()[0][0]
            after[key] = advanced(watermarks.get(key), latest, sdef.watermark.delay_us)
        observed.append(_Observed.watch(ctx, records, *exprs, key=key,
                                        watermark=sdef.watermark, before=watermarks.get(key),
                                        idle=not got))
        ctx.inputs[src.name.lower()] = parsed.rows(records.filter("_reason IS NULL"))
    # Any superset of the touched buckets is correct; a large batch touches them all.
    ctx.all_buckets = size > ALL_BUCKETS_BYTES
    set_watermarks(pipe, ctx, watermarks, after)
    return observed


def set_watermarks(pipe: TableRun, ctx: BatchContext, before: dict[str, int],
                   after: dict[str, int | None]) -> None:
    """The table's watermark as the batch begins (``before``: its sources') and, when its
    windows close, after it (``after``: the sources' new ones, None where unchanged)."""
    ctx.watermark_before = table_watermark(before, pipe.watermarked)
    if pipe.table.physical.closes_windows:
        now = {**before, **{k: v for k, v in after.items() if v is not None}}
        ctx.watermark = table_watermark(now, pipe.watermarked)


def mark_late(records: DataFrame, sdef: SourceDef, before: int | None) -> tuple[DataFrame, str]:
    """``records`` with those below the watermark ``before`` (microseconds; None: no
    watermark yet) or without an event time made dead letters (keeping their raw record);
    and the SQL of an aggregate of the good records' latest event time."""
    from pyspark.sql import functions as F

    wm = sdef.watermark
    assert wm is not None
    time = wm.time_sql(sdef.format == "debezium-json")
    late = "false" if before is None else f"{time} < timestamp_micros({before})"
    shown = "" if before is None else iso_time(before)
    reason = (f"CASE WHEN _reason IS NOT NULL THEN _reason "
              f"WHEN {time} IS NULL THEN {string(f'missing event time: {wm.column} is null')} "
              f"WHEN {late} THEN concat({string(f'{LATE} {wm.column} ')}, "
              f"CAST({time} AS STRING), ' is below the watermark {shown}') END")
    columns = ("op, before, after" if sdef.format == "debezium-json"
               else ", ".join(quote(c) for c in sdef.columns))
    raw = f"coalesce(_raw, to_json(struct({columns})))"
    return (records.withColumns({"_reason": F.expr(reason), "_raw": F.expr(raw)}),
            f"max(CASE WHEN _reason IS NULL THEN unix_micros({time}) END) AS latest")


def advanced(before: int | None, latest: int | None, delay_us: int) -> int | None:
    """A source's watermark after reading rows whose latest event time is ``latest``."""
    marks = [w for w in (before, None if latest is None else latest - delay_us)
             if w is not None]
    return max(marks) if marks else None


def settle_inputs(observed: list[_Observed], stats: BatchStats,
                  known: dict[str, dict[str, Any]]) -> None:
    """Good/bad/late record counts and each watermarked source's new watermark (observed
    while the batch's write job read the inputs; ``known``: ``BatchContext.observed``)."""
    for o in observed:
        counts = o.counts(known)
        stats.rows_in += counts["good"]
        stats.dead_letters += counts["bad"]
        if o.watermark is not None:
            stats.late_rows += counts["late"]
            mark = advanced(o.before, counts["latest"], o.watermark.delay_us)
            if mark is not None:
                stats.watermarks[o.key] = mark


def commit_kafka_offsets(pipe: TableRun, inputs: dict[str, Any]) -> None:
    """After a batch's commit, its Kafka ranges' ends as the table's consumer-group offsets
    (for lag tools). Best effort: the batch log is the source of truth, so a failure here
    is reported and the run goes on."""
    for src in pipe.table.physical.sources:
        got = inputs.get(source_key(src.kind, src.name)) if src.kind == "source" else None
        if not got or not got.get("ranges"):
            continue
        sdef = pipe.project.source(src.name)
        try:
            pipe.env.commit_kafka(pipe.env.kafka_source(sdef.name, sdef.options), pipe.name,
                                  got["ranges"])
        except Exception as e:  # noqa: BLE001 - lag tools only; never fail a committed batch
            if pipe.progress:
                pipe.progress(f"[{pipe.name}] could not commit the consumer-group offsets of "
                              f"source {sdef.name!r} (lag tools only; reading resumes from "
                              f"the batch log): {e}")


def upstream_watermark(pipe: TableRun, src: PSource, got: dict[str, Any] | None
                       ) -> int | None:
    """An upstream table's watermark as of the changelog version this batch reads up to
    (the last of its batches that committed at most that version), when the table passes
    its watermark on (``event_time``); None otherwise or when nothing new is read."""
    upstream = pipe.project.table(src.name)
    if upstream.definition.event_time is None or not got:
        return None
    log = BatchLog(pipe.env.store, pipe.layout.log(upstream.name))
    for batch in sorted(log.commits, reverse=True):
        payload = log.commit_payload(batch) or {}
        version = payload.get("versions", {}).get("changelog")
        if version is not None and version <= got["to"]:
            return payload.get("watermark")
    return None


def upstream_changes(pipe: TableRun, src: PSource, got: dict[str, Any] | None
                     ) -> tuple[DataFrame, list[str]]:
    """Weighted rows of the upstream table's change events between two versions, and
    the changelog files they come from."""
    from pyspark.sql.pandas.types import from_arrow_schema

    upstream = pipe.project.table(src.name)
    path = pipe.layout.changelog(upstream.name)
    files = pipe.env.store.added_files(path, got["from"], got["to"]) if got else []
    schema = pipe.env.store.arrow_schema(path)
    if schema is None:
        raise RunError(f"{pipe.name}: upstream table {upstream.name!r} has no changelog "
                       "yet; run it first")
    if files:  # the schema given: inferring it from the files' footers is a Spark job
        events = pipe.spark.read.schema(from_arrow_schema(schema)).parquet(*files)
    else:
        events = pipe.spark.createDataFrame(schema.empty_table())  # one empty chunk
    return pipe.env.decode_changelog(events, src.columns), files


def _local_bytes(uris: list[str]) -> int:
    """Bytes of local files (a remote one counts as large: its batch touches every bucket)."""
    total = 0
    for uri in uris:
        path = local_path(uri)
        total += os.path.getsize(path) if path is not None and os.path.exists(path) \
            else ALL_BUCKETS_BYTES
    return total


@dataclass
class _Observed:
    """An input's records, with good/bad counts (and for a watermarked source: late
    records and the latest event time) observed by the job that reads them."""

    observation: Any
    records: DataFrame
    exprs: tuple[str, ...]
    key: str = ""
    watermark: Watermark | None = None
    before: int | None = None  # the source's watermark as the batch began
    idle: bool = False  # nothing to read in this batch: every count is 0

    @classmethod
    def watch(cls, ctx: BatchContext, records: DataFrame, *exprs: str,
              **how: Any) -> _Observed:
        """``records`` observed by the batch's write job (``ctx.watched``)."""
        observed, observation = observe(records, *exprs)
        if not how.get("idle"):
            ctx.watched.append(observed)
        return cls(observation, observed, exprs, **how)

    def counts(self, known: dict[str, dict[str, Any]] | None = None) -> dict[str, int | None]:
        """Each observed aggregate (a count: 0 when no record was read; ``known`` as
        ``metrics.metrics`` takes it)."""
        if self.idle:
            return {e.rsplit(" AS ", 1)[1]: None if e.endswith(" AS latest") else 0
                    for e in self.exprs}
        got = metrics(self.observation, known)
        if got is None:  # no job read the records: count them with a job of our own
            got = self.records.selectExpr(*self.exprs).collect()[0].asDict()
        return {k: v if k == "latest" else int(v or 0) for k, v in got.items()}

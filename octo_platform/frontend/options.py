"""Checks of the ``WITH (...)`` options of sources and streaming tables.

An error names the statement and points at the option it is about (``format = 'xml'``),
or at ``CREATE`` when a required option is missing.
"""
from __future__ import annotations

from octo_platform.errors import SqlError
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from octo_platform.frontend.definitions import SinkDef, SourceDef, Watermark
from octo_platform.frontend.intervals import interval_micros
from octo_platform.frontend.parser import SinkStmt, SourceStmt, TableStmt
from octo_platform.logical.plan import Mode
from octo_platform.partitions import GRANULARITIES, Partitioning, parse_time
from octo_platform.sqltext import DIALECT
from octo_platform.timeunits import parse_span

__all__ = ["FORMATS", "CONNECTORS", "TABLE_OPTIONS", "SINK_OPTIONS", "source_def",
           "table_options", "sink_def"]

FORMATS = ("json", "csv", "parquet", "debezium-json")
CONNECTORS = ("files", "delta", "kafka")
DELTA_OPTIONS = ("connector", "path", "primary_key", "mode")
KAFKA_FORMATS = ("json", "debezium-json")
# A Kafka source's and a sink's options, besides kafka.<librdkafka property>.
KAFKA_OPTIONS = ("connector", "bootstrap_servers", "topic", "format", "primary_key", "startup",
                 "max_records_per_batch", "on_data_loss", "broker_timeout")
KAFKA_CHOICES = {"startup": ("earliest", "latest"), "on_data_loss": ("fail", "skip")}
SINK_OPTIONS = ("connector", "bootstrap_servers", "topic", "format", "tombstones",
                "broker_timeout")
SINK_CHOICES = {"connector": ("kafka",), "format": ("debezium-json",),
                "tombstones": ("true", "false")}
MODES = ("updating", "append-only")
TABLE_OPTIONS = ("primary_key", "partition_by", "partitions", "partition_start", "state_ttl",
                 "buckets")
MAX_BUCKETS = 4096


def source_def(stmt: SourceStmt) -> SourceDef:
    """The definition of a ``CREATE SOURCE``: its connector, changelog mode and key."""
    opts = stmt.options
    what = f"source {stmt.name!r}"
    connector = opts.get("connector")
    if connector not in CONNECTORS:
        raise SqlError(f"{what}: connector must be one of {', '.join(CONNECTORS)}"
                       f" (got {connector!r})", stmt.location("connector"))
    mode: Mode
    if connector == "kafka":
        mode = _kafka_options(stmt, what)
    elif "path" not in opts:
        raise SqlError(f"{what}: option 'path' is required", stmt.location())
    elif connector == "delta":  # an existing Delta table: its rows may be updated and deleted
        for key in opts:
            if key not in DELTA_OPTIONS:
                raise SqlError(f"{what}: option {key!r} does not apply to connector 'delta' "
                               f"(its options: {', '.join(DELTA_OPTIONS)})", stmt.location(key))
        declared = opts.get("mode", "updating")
        if declared not in MODES:
            raise SqlError(f"{what}: option 'mode' must be one of {', '.join(MODES)} "
                           f"(got {declared!r})", stmt.location("mode"))
        mode = "append-only" if declared == "append-only" else "updating"
    else:
        fmt = opts.get("format", "")
        if fmt not in FORMATS:
            raise SqlError(f"{what}: format must be one of {', '.join(FORMATS)}"
                           f" (got {fmt!r})", stmt.location("format"))
        mode = "updating" if fmt == "debezium-json" else "append-only"
    columns = tuple(c for c, _ in stmt.columns)
    pk = _key_option(stmt, columns, what)
    return SourceDef(stmt.name, columns, tuple(t for _, t in stmt.columns), dict(opts), mode,
                     pk, stmt.file.path, _watermark(stmt, what))


WATERMARK_TYPES = ("TIMESTAMP", "TIMESTAMP_LTZ")


def _watermark(stmt: SourceStmt, what: str) -> Watermark | None:
    """The checked ``WATERMARK FOR col AS col [- INTERVAL ...]`` of a source."""
    wm = stmt.watermark
    if wm is None:
        return None
    at = stmt.file.location(wm.offset)
    if stmt.options.get("connector") not in ("files", "kafka"):
        raise SqlError(f"{what}: a WATERMARK needs connector 'files' or 'kafka' (got "
                       f"{stmt.options.get('connector')!r})", at)
    types = {c.lower(): (c, t) for c, t in stmt.columns}
    if wm.column.lower() not in types:
        raise SqlError(f"{what}: WATERMARK FOR {wm.column}: no such column (columns: "
                       f"{', '.join(c for c, _ in stmt.columns)})", at)
    column, typ = types[wm.column.lower()]
    if typ.upper() not in WATERMARK_TYPES:
        raise SqlError(f"{what}: the WATERMARK column {column} must be a TIMESTAMP "
                       f"(it is {typ})", at)
    form = f"{column} or {column} - INTERVAL '<n>' <unit>"
    where = stmt.file.location(wm.expression_offset)
    try:
        node = sqlglot.parse_one(wm.expression, dialect=DIALECT)
    except ParseError:
        raise SqlError(f"{what}: the WATERMARK expression must be {form}", where) from None
    delay: int | None = 0
    if isinstance(node, exp.Sub):
        node, delay = node.this, interval_micros(node.expression)
    if not isinstance(node, exp.Column) or node.name.lower() != column.lower() \
            or node.table or delay is None:
        raise SqlError(f"{what}: the WATERMARK expression must be {form} with a positive "
                       f"interval in microseconds to weeks (got {wm.expression!r})", where)
    return Watermark(column, delay, wm.expression)


def sink_def(stmt: SinkStmt) -> SinkDef:
    """The definition of a ``CREATE SINK`` (its table is checked by the catalog)."""
    what = f"sink {stmt.name!r}"
    opts = {"format": "debezium-json", "tombstones": "false", **stmt.options}
    for key, choices in SINK_CHOICES.items():
        if opts.get(key) not in choices:
            raise SqlError(f"{what}: option {key!r} must be "
                           f"{'one of ' if len(choices) > 1 else ''}{', '.join(choices)} "
                           f"(got {opts.get(key)!r})",
                           stmt.location(key if key in stmt.options else None))
    _kafka_connection(stmt, what, SINK_OPTIONS)
    return SinkDef(stmt.name, stmt.table, opts, stmt.file.path)


def _kafka_connection(stmt: SourceStmt | SinkStmt, what: str, known: tuple[str, ...]) -> None:
    """Only ``known`` options and ``kafka.<librdkafka property>``; the broker and topic given."""
    opts = stmt.options
    for key in opts:
        if key not in known and not (key.startswith("kafka.") and len(key) > 6):
            raise SqlError(f"{what}: option {key!r} does not apply to connector 'kafka' (its "
                           f"options: {', '.join(known)}, kafka.<librdkafka property>)",
                           stmt.location(key))
    for key in ("bootstrap_servers", "topic"):
        if not opts.get(key, "").strip():
            raise SqlError(f"{what}: option {key!r} is required for connector 'kafka'",
                           stmt.location(key) if key in opts else stmt.location())
    if "broker_timeout" in opts and parse_span(opts["broker_timeout"]) is None:
        raise SqlError(f"{what}: option 'broker_timeout' must be '<n> <unit>', e.g. "
                       f"'30 seconds' (got {opts['broker_timeout']!r})",
                       stmt.location("broker_timeout"))


def _kafka_options(stmt: SourceStmt, what: str) -> Mode:
    """Checks of a Kafka source's options; its changelog mode."""
    opts = stmt.options
    _kafka_connection(stmt, what, KAFKA_OPTIONS)
    fmt = opts.get("format", "")
    if fmt not in KAFKA_FORMATS:
        raise SqlError(f"{what}: format must be one of {', '.join(KAFKA_FORMATS)} for "
                       f"connector 'kafka' (got {fmt!r})", stmt.location("format"))
    for key, choices in KAFKA_CHOICES.items():
        if key in opts and opts[key] not in choices:
            raise SqlError(f"{what}: option {key!r} must be one of {', '.join(choices)} "
                           f"(got {opts[key]!r})", stmt.location(key))
    limit = opts.get("max_records_per_batch")
    if limit is not None and not (limit.isdigit() and int(limit) > 0):
        raise SqlError(f"{what}: option 'max_records_per_batch' must be a positive integer "
                       f"(got {limit!r})", stmt.location("max_records_per_batch"))
    return "updating" if fmt == "debezium-json" else "append-only"


def table_options(stmt: TableStmt, columns: tuple[str, ...]
                  ) -> tuple[tuple[str, ...] | None, Partitioning | None]:
    """The declared primary key and event-time partitions of a streaming table whose
    query returns ``columns``."""
    what = f"streaming table {stmt.name!r}"
    pk = _key_option(stmt, columns, what)
    unknown = sorted(set(stmt.options) - set(TABLE_OPTIONS))
    if unknown:
        raise SqlError(f"{what}: unknown option(s) {', '.join(unknown)} "
                       f"(known: {', '.join(TABLE_OPTIONS)})", stmt.location(unknown[0]))
    raw = stmt.options.get("buckets")
    if raw is not None and not (raw.strip().isdigit() and 1 <= int(raw) <= MAX_BUCKETS):
        raise SqlError(f"{what}: buckets must be a whole number from 1 to {MAX_BUCKETS} "
                       f"(got {raw!r})", stmt.location("buckets"))
    return pk, _partitioning(stmt, columns, what)


def _key_option(stmt: SourceStmt | TableStmt, columns: tuple[str, ...],
                what: str) -> tuple[str, ...] | None:
    raw = stmt.options.get("primary_key")
    if raw is None:
        return None
    lower = {c.lower(): c for c in columns}
    key = []
    for part in raw.split(","):
        name = part.strip()
        if name.lower() not in lower:
            raise SqlError(f"{what}: primary_key column {name!r} is not one of "
                           f"{', '.join(columns)}", stmt.location("primary_key"))
        key.append(lower[name.lower()])
    return tuple(key)


def _partitioning(stmt: TableStmt, columns: tuple[str, ...], what: str) -> Partitioning | None:
    """The event-time partitions a table declares (see ``octo_platform.partitions``)."""
    opts = stmt.options
    column = opts.get("partition_by")
    if column is None:
        extra = sorted(set(opts) & {"partitions", "partition_start"})
        if extra:
            raise SqlError(f"{what}: option {extra[0]!r} needs partition_by (the event-time "
                           "column that decides a row's partition)", stmt.location(extra[0]))
        return None
    lower = {c.lower(): c for c in columns}
    if column.strip().lower() not in lower:
        raise SqlError(f"{what}: partition_by column {column!r} is not one of "
                       f"{', '.join(columns)}", stmt.location("partition_by"))
    granularity = opts.get("partitions", "daily").strip().lower()
    if granularity not in GRANULARITIES:
        raise SqlError(f"{what}: option 'partitions' must be one of "
                       f"{', '.join(GRANULARITIES)}, not {granularity!r}",
                       stmt.location("partitions"))
    if "partition_start" not in opts:
        raise SqlError(f"{what}: partition_by needs partition_start (the first partition, "
                       "e.g. '2026-01-01')", stmt.location("partition_by"))
    try:
        start = parse_time(opts["partition_start"])
    except ValueError:
        raise SqlError(f"{what}: partition_start {opts['partition_start']!r} is not a date "
                       "or timestamp (YYYY-MM-DD[ HH:MM])",
                       stmt.location("partition_start")) from None
    p = Partitioning(lower[column.strip().lower()], granularity, start)
    if p.key_of(start) != start.strftime(p.key_format) or p.key_time(p.key_of(start)) != start:
        raise SqlError(f"{what}: partition_start {opts['partition_start']!r} is not the "
                       f"start of a {granularity} partition", stmt.location("partition_start"))
    return p

"""The ``files`` connector: new files in a directory, as weighted rows plus dead letters.

Formats: ``json`` (one object per line), ``csv`` (header line by default), ``parquet`` and
``debezium-json`` (plain or ``{"payload": ...}``-wrapped change events). A malformed line,
a value of the wrong type or a change event missing an image becomes a dead letter with the
raw record, its file and the reason; the good rows of the same file go on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from connectors import debezium
from connectors.json_lines import exact_json
from octo_platform.columns import WEIGHT
from octo_platform.local_frames import arrow_type, local_frame, session_times
from octo_platform.sqltext import quote, string

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FileSource", "Parsed", "list_files", "read_files", "read_files_local",
           "parse_json"]


@dataclass(frozen=True)
class FileSource:
    """What the reader needs to know about a ``CREATE SOURCE ... WITH (connector='files')``."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    path: str
    format: str
    options: tuple[tuple[str, str], ...] = ()

    @property
    def ddl(self) -> str:
        return ", ".join(f"{quote(c)} {t}" for c, t in zip(self.columns, self.types))

    def option(self, key: str, default: str) -> str:
        return dict(self.options).get(key, default)

    def exact_rows(self, files: list[str]) -> int | None:
        """How many records ``files`` hold, from their footers, when none can be bad:
        Parquet files (local or in S3) each holding every declared column with exactly the
        type Spark gives it (every cast the identity); None otherwise (or for no files)."""
        if self.format != "parquet" or not files:
            return None
        rows = 0
        for path in files:
            meta = _footer(path)
            if meta is None or _exact_columns(meta.schema.to_arrow_schema(), self) is None:
                return None
            rows += meta.num_rows
        return rows

    def latest_time(self, files: list[str], column: str) -> int | None:
        """The latest value (µs since the epoch) of TIMESTAMP ``column`` in ``files``' good
        records, from Parquet footers alone (no data read): only where each declared column
        is in every file with exactly the type Spark gives it (no record can then be bad)
        and every row group has the column's statistics; LookupError otherwise (read the
        rows). None when every value is NULL."""
        import pyarrow.parquet as pq

        if self.format != "parquet":
            raise LookupError("not Parquet")
        latest = None
        for path in files:
            local = path.removeprefix("file://")
            if "://" in local:
                raise LookupError("a remote file")
            meta = pq.ParquetFile(local).metadata
            schema = meta.schema.to_arrow_schema()
            names = _exact_columns(schema, self)
            if names is None:
                raise LookupError("a column needs a cast")
            at = schema.get_field_index(names[[c.lower() for c in self.columns].index(
                column.lower())])
            for g in range(meta.num_row_groups):
                chunk = meta.row_group(g).column(at)
                stats = chunk.statistics
                if stats is not None and stats.has_min_max:
                    latest = stats.max_raw if latest is None else max(latest, stats.max_raw)
                elif chunk.num_values and (stats is None or stats.null_count != chunk.num_values):
                    raise LookupError("no statistics")  # values, but not all NULL
        return latest


def list_files(path: str) -> list[str]:
    """Data files under ``path`` (recursively), skipping names starting with '.' or '_';
    in an object store (``s3://bucket/prefix``: pyarrow's file system, configured by the
    same ``AWS_*`` variables as delta-rs) as URIs of its scheme."""
    if "://" in path and not path.startswith("file://"):
        return _list_uri(path)
    root = Path(path.removeprefix("file://"))
    if root.is_file():
        return [str(root)]
    if not root.is_dir():
        return []
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        found.extend(os.path.join(dirpath, f) for f in filenames if not f.startswith((".", "_")))
    return sorted(found)


def _list_uri(uri: str) -> list[str]:
    from pyarrow import fs

    scheme = uri.split("://", 1)[0]
    store, root = fs.FileSystem.from_uri(uri.replace("s3a://", "s3://", 1))
    found = []
    for info in store.get_file_info(fs.FileSelector(root, allow_not_found=True,
                                                    recursive=True)):
        parts = info.path[len(root):].strip("/").split("/")
        if info.type == fs.FileType.File and not any(p.startswith((".", "_")) for p in parts):
            found.append(f"{scheme}://{info.path}")
    if not found and store.get_file_info(root).type == fs.FileType.File:
        return [uri]
    return sorted(found)


def _read_bytes(path: str) -> bytes:
    """A local file's or an object's (``s3://...``) bytes."""
    if "://" not in path:
        with open(path, "rb") as fh:
            return fh.read()
    from pyarrow import fs

    store, key = fs.FileSystem.from_uri(path.replace("s3a://", "s3://", 1))
    with store.open_input_stream(key) as fh:
        return fh.read()


@dataclass(frozen=True)
class Parsed:
    """One row per input record: its payload plus ``_raw``, ``_file`` and ``_reason`` (NULL
    for a good record). ``rows`` turns good records into weighted rows. ``read_files_local``
    gives the records already ``evaluated`` when parsing them would change nothing."""

    records: DataFrame | None
    rows: Callable[[DataFrame], DataFrame]
    evaluated: pa.Table | None = None  # the records in Arrow (``records`` is then None)


def read_files(spark: SparkSession, source: FileSource, files: list[str]) -> Parsed:
    """Parse ``files`` of ``source`` (lazily: nothing is read until an action runs)."""
    if not files:
        empty = spark.createDataFrame([], f"{source.ddl}, _raw STRING, _file STRING, "
                                          "_reason STRING")
        return Parsed(empty, lambda df: _weighted(df, source))
    if source.format == "csv":
        return _csv(spark, source, files)
    if source.format == "parquet":
        return _parquet(spark, source, files)
    return _json_lines(spark, source, files)


def read_files_local(spark: SparkSession, source: FileSource, files: list[str]) -> Parsed:
    """``read_files`` for a small batch in the driver: the files are read here and parsed
    by the same Spark SQL over a local relation (projections and filters only, which Spark
    evaluates in the driver: no job). JSON, Debezium JSON and Parquet files (local or in
    an object store);
    ``LookupError`` for anything else (the caller reads it with Spark instead)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if source.format == "csv":
        raise LookupError(f"{source.format} files are read by Spark")
    names = [f if "://" in f else f"file:{os.path.abspath(f)}" for f in files]
    if source.format == "parquet":
        if not files:
            raise LookupError("no files")
        tables = [pq.read_table(f.replace("s3a://", "s3://", 1)) for f in files]
        if any(t.schema != tables[0].schema for t in tables):
            raise LookupError("Parquet files of different schemas")
        data = pa.concat_tables([t.append_column("_file", pa.array([n] * t.num_rows, pa.string()))
                                 for t, n in zip(tables, names)])
        exact = _exact_records(data, source)
        if exact is not None:
            return Parsed(None, lambda df: _weighted(df, source), exact)
        return _parquet_records(local_frame(spark, data), source)
    values, where = [], []
    for f, n in zip(files, names):
        lines = _read_bytes(f).decode("utf-8", errors="replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        values += [line.removesuffix("\r") for line in lines]
        where += [n] * len(lines)
    return parse_lines(spark, pa.table({"value": pa.array(values, pa.string()),
                                        "file": pa.array(where, pa.string())}), source)


def parse_lines(spark: SparkSession, lines: pa.Table, source: FileSource) -> Parsed:
    """``parse_json`` of ``lines`` (Arrow: ``value``, ``file``) read in the driver: in
    Python where Spark's reading of them is certain (``json_lines``), else by Spark over a
    local relation."""
    exact = exact_json(lines, source.format, source.columns, source.types,
                       *session_times(spark))
    if exact is not None:
        return Parsed(None, _rows(source), exact)
    return parse_json(local_frame(spark, lines), source)


def _weighted(df: DataFrame, source: FileSource) -> DataFrame:
    return df.selectExpr(*[quote(c) for c in source.columns], f"CAST(1 AS BIGINT) AS {WEIGHT}")


def _json_lines(spark: SparkSession, source: FileSource, files: list[str]) -> Parsed:
    from pyspark.sql import functions as F

    return parse_json(spark.read.text(files).select(
        "value", F.col("_metadata.file_path").alias("file")), source)


def parse_json(lines: DataFrame, source: FileSource) -> Parsed:
    """Records of ``lines`` (``value``: one JSON document, ``file``: where it comes from)
    in ``source``'s format (``json`` or ``debezium-json``); blank values are skipped."""
    from pyspark.sql import functions as F

    lines = lines.filter(F.trim("value") != "")
    row = "struct<" + ", ".join(f"{quote(c)}: {t}" for c, t in zip(source.columns,
                                                                  source.types)) + ">"
    if source.format == "debezium-json":
        payload = f"struct<before: {row}, after: {row}, op: STRING>"
        schema = f"before {row}, after {row}, op STRING, payload {payload}, _corrupt STRING"
    else:
        schema = f"{source.ddl}, _corrupt STRING"
    parsed = lines.select(
        "value", "file",
        F.from_json("value", schema, {"mode": "PERMISSIVE",
                                      "columnNameOfCorruptRecord": "_corrupt"}).alias("j"))
    text = "from_json({}, 'map<string,string>')"  # a JSON object's values as text

    def image(side: str) -> str:  # a Debezium image's columns, at the top or in the payload
        fields = text.format(f"coalesce(get_json_object(value, '$.payload.{side}'), "
                             f"get_json_object(value, '$.{side}'))")
        return _mismatches(source, fields, lambda c: "CASE WHEN j.payload IS NOT NULL THEN "
                           f"j.payload.{side}.{c} ELSE j.{side}.{c} END", f"{side}.")
    named = _named([*image("before"), *image("after")] if source.format == "debezium-json"
                   else _mismatches(source, text.format("value"), lambda c: f"j.{c}"),
                   "a value does not match the declared type")
    bad_json = ("CASE WHEN j IS NULL OR j._corrupt IS NOT NULL THEN "
                f"CASE WHEN {text.format('value')} IS NULL THEN 'malformed JSON' "
                f"ELSE {named} END END")
    if source.format != "debezium-json":
        records = parsed.selectExpr("j.*", "value AS _raw", "file AS _file",
                                    f"{bad_json} AS _reason").drop("_corrupt")
        return Parsed(records, _rows(source))
    events = parsed.selectExpr(
        "value AS _raw", "file AS _file", f"{bad_json} AS _json_reason",
        "coalesce(j.payload.op, j.op) AS op",
        "CASE WHEN j.payload IS NOT NULL THEN j.payload.before ELSE j.before END AS before",
        "CASE WHEN j.payload IS NOT NULL THEN j.payload.after ELSE j.after END AS after")
    records = events.selectExpr("op", "before", "after", "_raw", "_file",
                                f"coalesce(_json_reason, {debezium.validate()}) AS _reason")
    return Parsed(records, _rows(source))


def _mismatches(source: FileSource, fields: str, parsed: Callable[[str], str],
                label: str = "") -> list[str]:
    """SQL per column, naming it where a record's value could not be read as the declared
    type (``column id: value does not match BIGINT``, as a Parquet file's reason reads;
    ``label`` before the column's name), else NULL: present in the record's ``fields`` (SQL
    of its values as text, by column name), NULL where Spark parsed it (``parsed(column)``;
    Spark keeps the columns it could read: its partial results)."""
    return [f"CASE WHEN {fields}[{string(c)}] IS NOT NULL AND {parsed(quote(c))} IS NULL "
            f"THEN {string(f'column {label}{c}: value does not match {t}')} END"
            for c, t in zip(source.columns, source.types)]


def _named(mismatches: list[str], otherwise: str) -> str:
    """SQL of a bad record's reason: the ``mismatches`` that name a column, else
    ``otherwise``."""
    return f"coalesce(nullif(concat_ws('; ', {', '.join(mismatches)}), ''), {string(otherwise)})"


def _rows(source: FileSource) -> Callable[[DataFrame], DataFrame]:
    """A JSON source's weighted rows of its good records (``Parsed.rows``)."""
    if source.format == "debezium-json":
        return lambda df: debezium.decode(df, source.columns)
    return lambda df: _weighted(df, source)


def _csv(spark: SparkSession, source: FileSource, files: list[str]) -> Parsed:
    from pyspark.sql import functions as F

    header = source.option("header", "true").lower() == "true"
    df = (spark.read.schema(f"{source.ddl}, _corrupt STRING")
          .option("header", header)
          .option("delimiter", source.option("delimiter", ","))
          .option("mode", "PERMISSIVE")
          .option("columnNameOfCorruptRecord", "_corrupt")
          .csv(files)
          .select("*", F.col("_metadata.file_path").alias("_file")))
    # Spark refuses queries that reference only the corrupt-record column of raw CSV; the
    # pipeline persists records before splitting them, which is what it asks for.
    # A line's fields as text, to name those Spark could not read as their declared type
    # (it keeps the others: NULL there, present here); else the line is malformed.
    text = ", ".join(f"{quote(c)} STRING" for c in source.columns)
    fields = (f"from_csv(_corrupt, {string(text)}, "
              f"map('delimiter', {string(source.option('delimiter', ','))}))")
    reason = _named(_mismatches(source, fields, lambda c: c),
                    "malformed CSV line or a value of the wrong type")
    records = df.selectExpr(
        *[quote(c) for c in source.columns], "_corrupt AS _raw", "_file",
        f"CASE WHEN _corrupt IS NOT NULL THEN {reason} END AS _reason")
    return Parsed(records, lambda d: _weighted(d, source))


def _parquet(spark: SparkSession, source: FileSource, files: list[str]) -> Parsed:
    from pyspark.sql import functions as F

    key = _footer_key(files[0])
    known = _SCHEMAS.get(key) if key is not None else None
    df = (spark.read if known is None else spark.read.schema(known)).parquet(*files)
    if key is not None and known is None:
        if len(_SCHEMAS) >= _MAX_SCHEMAS:
            _SCHEMAS.clear()
        _SCHEMAS[key] = df.schema
    return _parquet_records(df.select("*", F.col("_metadata.file_path").alias("_file")), source)


def _exact_records(data: pa.Table, source: FileSource) -> pa.Table | None:
    """``_parquet_records`` of ``data`` computed in Arrow when each declared column is in
    the files with exactly the type Spark gives it: every cast is then the identity, no
    value can fail to fit, so the records are the columns with no ``_raw`` and no
    ``_reason``. None otherwise (Spark parses them)."""
    import pyarrow as pa

    names = _exact_columns(data.schema, source)
    if names is None:
        return None
    none = pa.nulls(data.num_rows, pa.string())
    return pa.table([*[data[n] for n in names], none, data["_file"], none],
                    names=[*source.columns, "_raw", "_file", "_reason"])


def _exact_columns(schema: pa.Schema, source: FileSource) -> list[str] | None:
    """The columns of ``schema`` (a Parquet file's) that hold the declared columns, in
    their order, when each has exactly the type Spark gives it (every cast the identity,
    no value failing to fit); None otherwise."""
    present = {c.lower(): c for c in schema.names}
    names = []
    for col, typ in zip(source.columns, source.types):
        have = present.get(col.lower())
        if have is None or schema.field(have).type != arrow_type(typ):
            return None
        names.append(have)
    return names


def _parquet_records(df: DataFrame, source: FileSource) -> Parsed:
    """Records of Parquet rows (``df``: the files' columns and ``_file``): each declared
    column cast to its type, a value that does not fit making the record a dead letter."""
    present = {c.lower(): c for c in df.columns}
    casts, checks = [], []
    for col, typ in zip(source.columns, source.types):
        if col.lower() not in present:
            casts.append(f"CAST(NULL AS {typ}) AS {quote(col)}")
            continue
        src = quote(present[col.lower()])
        casts.append(f"try_cast({src} AS {typ}) AS {quote(col)}")
        checks.append(f"CASE WHEN {src} IS NOT NULL AND try_cast({src} AS {typ}) IS NULL "
                      f"THEN 'column {col}: value does not fit {typ}' END")
    reason = f"coalesce({', '.join(checks)})" if checks else "CAST(NULL AS STRING)"
    raw = "to_json(struct(" + ", ".join(quote(c) for c in df.columns if c != "_file") + "))"
    records = df.selectExpr(*casts, f"CASE WHEN {reason} IS NOT NULL THEN {raw} END AS _raw",
                            "_file", f"{reason} AS _reason")
    return Parsed(records, lambda d: _weighted(d, source))


# Spark infers a Parquet file's schema with a Spark job (one task reading a footer) on every
# read without a schema: a job per batch. Its answer depends only on the footer's schema, so
# it is kept per footer schema (read on the driver with pyarrow: one small read per batch).
_SCHEMAS: dict[bytes, object] = {}
_MAX_SCHEMAS = 64


def _footer_path(path: str) -> str | None:
    """Where pyarrow reads a file's footer: a local path, or an S3 URI (pyarrow's S3 file
    system, configured by the ``AWS_*`` variables); None for another scheme."""
    local = path.removeprefix("file://")
    if "://" not in local:
        return local
    return "s3://" + local.split("://", 1)[1] if local.startswith(("s3://", "s3a://")) else None


def _footer(path: str) -> Any:
    """A Parquet file's footer, read here (None: unreadable here, or of another scheme)."""
    import pyarrow.parquet as pq

    where = _footer_path(path)
    try:
        return None if where is None else pq.read_metadata(where)
    except (OSError, ValueError):  # Spark reports it when it reads
        return None


def _footer_key(path: str) -> bytes | None:
    """The first file's footer schema (metadata included), or None if it cannot be read
    here."""
    import pyarrow.parquet as pq

    where = _footer_path(path)
    try:
        return None if where is None else pq.read_schema(where).serialize().to_pybytes()
    except (OSError, ValueError):  # unreadable here: Spark reports it when it reads
        return None

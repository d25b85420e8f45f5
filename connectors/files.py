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
from typing import TYPE_CHECKING

from connectors import debezium
from octo_platform.logical.plan import quote
from octo_platform.runtime.columns import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FileSource", "list_files", "read_files", "DEAD_LETTER_COLUMNS"]

DEAD_LETTER_COLUMNS = ("raw", "source_file", "reason")


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


def list_files(path: str) -> list[str]:
    """Data files under ``path`` (recursively), skipping names starting with '.' or '_'."""
    root = Path(path)
    if root.is_file():
        return [str(root)]
    if not root.is_dir():
        return []
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        found.extend(os.path.join(dirpath, f) for f in filenames if not f.startswith((".", "_")))
    return sorted(found)


def read_files(spark: SparkSession, source: FileSource,
               files: list[str]) -> tuple[DataFrame, DataFrame]:
    """Read ``files`` of ``source``: (weighted rows, dead letters)."""
    if not files:
        return _empty_rows(spark, source), _empty_dead(spark)
    if source.format == "csv":
        return _csv(spark, source, files)
    if source.format == "parquet":
        return _parquet(spark, source, files)
    return _json_lines(spark, source, files)


def _empty_rows(spark: SparkSession, source: FileSource) -> DataFrame:
    return spark.createDataFrame([], f"{source.ddl}, {WEIGHT} BIGINT")


def _empty_dead(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], "raw STRING, source_file STRING, reason STRING")


def _weighted(df: DataFrame, source: FileSource) -> DataFrame:
    from pyspark.sql import functions as F

    return df.select(*[quote(c) for c in source.columns], F.lit(1).cast("bigint").alias(WEIGHT))


def _json_lines(spark: SparkSession, source: FileSource,
                files: list[str]) -> tuple[DataFrame, DataFrame]:
    from pyspark.sql import functions as F

    lines = (spark.read.text(files).select("value", F.col("_metadata.file_path").alias("file"))
             .filter(F.trim("value") != ""))
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
    malformed = F.when(F.from_json("value", "map<string,string>").isNull(), "malformed JSON") \
        .otherwise("a value does not match the declared type")
    bad_json = F.col("j").isNull() | F.col("j._corrupt").isNotNull()
    if source.format != "debezium-json":
        good = parsed.filter(~bad_json).select("j.*")
        dead = parsed.filter(bad_json).select(F.col("value").alias("raw"),
                                              F.col("file").alias("source_file"),
                                              malformed.alias("reason"))
        return _weighted(good, source), dead
    events = parsed.filter(~bad_json).select(
        "value", "file",
        F.coalesce("j.payload.op", "j.op").alias("op"),
        F.when(F.col("j.payload").isNotNull(), F.col("j.payload.before"))
        .otherwise(F.col("j.before")).alias("before"),
        F.when(F.col("j.payload").isNotNull(), F.col("j.payload.after"))
        .otherwise(F.col("j.after")).alias("after"))
    events = events.withColumn("reason", F.expr(debezium.validate()))
    dead = parsed.filter(bad_json).select(F.col("value").alias("raw"),
                                          F.col("file").alias("source_file"),
                                          malformed.alias("reason")).unionByName(
        events.filter("reason IS NOT NULL").select(F.col("value").alias("raw"),
                                                   F.col("file").alias("source_file"), "reason"))
    return debezium.decode(events.filter("reason IS NULL"), source.columns), dead


def _csv(spark: SparkSession, source: FileSource,
         files: list[str]) -> tuple[DataFrame, DataFrame]:
    from pyspark.sql import functions as F

    header = source.option("header", "true").lower() == "true"
    df = (spark.read.schema(f"{source.ddl}, _corrupt STRING")
          .option("header", header)
          .option("delimiter", source.option("delimiter", ","))
          .option("mode", "PERMISSIVE")
          .option("columnNameOfCorruptRecord", "_corrupt")
          .csv(files)
          .select("*", F.col("_metadata.file_path").alias("_file")))
    df = df.cache()
    good = df.filter("_corrupt IS NULL")
    dead = df.filter("_corrupt IS NOT NULL").select(
        F.col("_corrupt").alias("raw"), F.col("_file").alias("source_file"),
        F.lit("malformed CSV line or a value of the wrong type").alias("reason"))
    return _weighted(good, source), dead


def _parquet(spark: SparkSession, source: FileSource,
             files: list[str]) -> tuple[DataFrame, DataFrame]:
    from pyspark.sql import functions as F

    df = spark.read.parquet(*files).select("*", F.col("_metadata.file_path").alias("_file"))
    present = {c.lower(): c for c in df.columns}
    casts, checks = [], []
    for col, typ in zip(source.columns, source.types):
        if col.lower() not in present:
            casts.append(F.lit(None).cast(typ).alias(col))
            continue
        src = F.col(quote(present[col.lower()]))
        casted = F.expr(f"try_cast({quote(present[col.lower()])} AS {typ})")
        casts.append(casted.alias(col))
        checks.append(F.when(src.isNotNull() & casted.isNull(),
                             F.lit(f"column {col}: value does not fit {typ}")))
    reason = F.coalesce(*checks) if checks else F.lit(None).cast("string")
    typed = df.select(*casts, reason.alias("_reason"),
                      F.to_json(F.struct(*[F.col(quote(c)) for c in df.columns if c != "_file"]))
                      .alias("_raw"), "_file")
    good = typed.filter("_reason IS NULL")
    dead = typed.filter("_reason IS NOT NULL").select(
        F.col("_raw").alias("raw"), F.col("_file").alias("source_file"),
        F.col("_reason").alias("reason"))
    return _weighted(good, source), dead

"""The Debezium envelope, converted only at the edges.

``decode`` unrolls change events into weighted rows (insert ``after`` +1, remove ``before``
-1); ``encode`` turns a consolidated batch of weighted rows into ``c``/``u``/``d`` events,
pairing a retraction and an insertion of the same primary key into one ``u``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from octo_platform.logical.plan import quote
from octo_platform.runtime.columns import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["decode", "validate", "encode", "CHANGELOG_OPS"]

CHANGELOG_OPS = ("c", "u", "d", "r")


def validate(op: str = "op", before: str = "before", after: str = "after") -> str:
    """SQL giving the reason an event is unusable, NULL when it is fine."""
    return (
        f"CASE WHEN {op} IS NULL THEN 'missing op' "
        f"WHEN {op} NOT IN ('c', 'r', 'u', 'd') THEN concat('unsupported op ', {op}) "
        f"WHEN {op} IN ('c', 'r', 'u') AND {after} IS NULL "
        f"THEN concat('missing after image for op=', {op}) "
        f"WHEN {op} IN ('u', 'd') AND {before} IS NULL "
        f"THEN concat('missing before image for op=', {op}) END"
    )


def decode(events: DataFrame, columns: tuple[str, ...]) -> DataFrame:
    """Weighted rows of valid events with columns ``op``, ``before``, ``after``."""
    from pyspark.sql import functions as F

    def image(side: str, weight: int):
        fields = [F.col(f"{side}.{quote(c)}").alias(c) for c in columns]
        return F.when(F.col("op").isin(*(("c", "r", "u") if weight > 0 else ("u", "d"))),
                      F.struct(*fields, F.lit(weight).cast("bigint").alias(WEIGHT)))

    rows = F.array(image("after", 1), image("before", -1))
    return (events.select(F.explode(F.filter(rows, lambda x: x.isNotNull())).alias("r"))
            .select("r.*"))


def encode(delta: DataFrame, columns: tuple[str, ...], pk: tuple[str, ...] | None,
           *, table: str, batch: int, ts_ms: int) -> DataFrame:
    """Change events for a consolidated batch of weighted rows (no zero weights)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    cols = [quote(c) for c in columns]
    unit = delta.select(*cols, F.signum(WEIGHT).cast("int").alias("_sign"),
                       F.explode(F.sequence(F.lit(1), F.abs(F.col(WEIGHT)).cast("int"))).alias("_i"))
    row = F.struct(*[F.col(c) for c in cols])
    source = F.struct(F.lit(table).alias("table"), F.lit(batch).cast("bigint").alias("batch_id"),
                      F.lit("octo").alias("connector"))
    if not pk:
        if pk is None:
            events = unit.select(
                F.when(F.col("_sign") > 0, "c").otherwise("d").alias("op"),
                F.when(F.col("_sign") < 0, row).alias("before"),
                F.when(F.col("_sign") > 0, row).alias("after"))
            return _envelope(events, ts_ms, source)
    key = [quote(k) for k in pk] if pk else []
    order = Window.partitionBy(*key, "_sign").orderBy(*cols, "_i") if key else \
        Window.partitionBy("_sign").orderBy(*cols, "_i")
    numbered = unit.select(*[F.col(k).alias(f"_k{i}") for i, k in enumerate(key)],
                           "_sign", F.row_number().over(order).alias("_rn"), row.alias("img"))
    old = numbered.filter("_sign < 0").drop("_sign").withColumnRenamed("img", "before")
    new = numbered.filter("_sign > 0").drop("_sign").withColumnRenamed("img", "after")
    cond = [old[f"_k{i}"].eqNullSafe(new[f"_k{i}"]) for i in range(len(key))]
    cond.append(old["_rn"] == new["_rn"])
    joined = old.join(new, cond, "full_outer")
    events = joined.select(
        F.when(F.col("before").isNull(), "c").when(F.col("after").isNull(), "d")
        .otherwise("u").alias("op"),
        "before", "after")
    return _envelope(events, ts_ms, source)


def _envelope(events: DataFrame, ts_ms: int, source) -> DataFrame:
    from pyspark.sql import functions as F

    return events.select("op", "before", "after", F.lit(ts_ms).cast("bigint").alias("ts_ms"),
                         source.alias("source"))

"""The Debezium envelope, converted only at the edges.

``decode`` unrolls change events into weighted rows (insert ``after`` +1, remove ``before``
-1); ``encode`` turns a consolidated batch of weighted rows into ``c``/``u``/``d`` events,
pairing a retraction and an insertion of the same primary key into one ``u``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from octo_platform.columns import WEIGHT
from octo_platform.sqltext import quote, sql_expr, string

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["decode", "decode_arrow", "validate", "encode", "encode_keyed", "CHANGELOG_OPS"]

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

    def image(side: str, ops: str, weight: int) -> str:
        fields = ", ".join(f"{side}.{quote(c)} AS {quote(c)}" for c in columns)
        return (f"CASE WHEN op IN ({ops}) THEN struct({fields}, "
                f"CAST({weight} AS BIGINT) AS {quote(WEIGHT)}) END")

    inserted, removed = image("after", "'c', 'r', 'u'", 1), image("before", "'u', 'd'", -1)
    rows = f"array({inserted}, {removed})"
    return (events.selectExpr(f"explode(filter({rows}, x -> x IS NOT NULL)) AS r")
            .selectExpr("r.*"))


def decode_arrow(events: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """``decode`` for a small batch in the driver: weighted rows (``__octo_w``) of valid
    events given as Arrow (``op``, ``before``, ``after``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    for side, ops, weight in (("after", ["c", "r", "u"], 1), ("before", ["u", "d"], -1)):
        picked = events.filter(pc.is_in(events["op"], pa.array(ops)))
        images = pa.Table.from_struct_array(picked[side]).select(list(columns))
        parts.append(images.append_column(WEIGHT, pa.array([weight] * images.num_rows,
                                                           pa.int64())))
    return pa.concat_tables(parts)


def encode(delta: DataFrame, columns: tuple[str, ...], pk: tuple[str, ...] | None,
           *, table: str, batch: int, ts_ms: int) -> DataFrame:
    """Change events for a consolidated batch of weighted rows (no zero weights).

    Without a primary key every unit of weight is a ``c`` or ``d``; with one, the i-th
    retraction and the i-th insertion of the same key become one ``u``.
    """
    # Image fields must be nullable: Spark's Arrow export rejects a NULL image (the `before`
    # of a `c`) whose struct has a non-nullable field. `_sign` is never 0.
    cols = ", ".join(f"CASE WHEN _sign = 0 THEN NULL ELSE {quote(c)} END AS {quote(c)}"
                     for c in columns)
    w = quote(WEIGHT)
    unit = delta.selectExpr(*[quote(c) for c in columns], f"CAST(signum({w}) AS INT) AS _sign",
                            f"explode(sequence(1, CAST(abs({w}) AS INT))) AS _i")
    if pk is None:
        events = unit.selectExpr(
            "CASE WHEN _sign > 0 THEN 'c' ELSE 'd' END AS op",
            f"CASE WHEN _sign < 0 THEN struct({cols}) END AS before",
            f"CASE WHEN _sign > 0 THEN struct({cols}) END AS after")
    else:
        keys = [f"{quote(k)} AS _k{i}" for i, k in enumerate(pk)]
        part = ", ".join([*(quote(k) for k in pk), "_sign"])
        numbered = unit.selectExpr(
            *keys, "_sign", f"struct({cols}) AS img",
            f"row_number() OVER (PARTITION BY {part} ORDER BY "
            f"{', '.join(quote(c) for c in columns)}, _i) AS _rn")
        ks = [f"_k{i}" for i in range(len(pk))]
        old = numbered.filter("_sign < 0").selectExpr(*ks, "_rn", "img AS before")
        new = numbered.filter("_sign > 0").selectExpr(*ks, "_rn", "img AS after")
        on = " AND ".join([*(f"o.{k} <=> n.{k}" for k in ks), "o._rn = n._rn"])
        events = old.alias("o").join(new.alias("n"), sql_expr(on), "full_outer").selectExpr(
            "CASE WHEN o.before IS NULL THEN 'c' WHEN n.after IS NULL THEN 'd' ELSE 'u' END AS op",
            "o.before AS before", "n.after AS after")
    return _envelope(events, table=table, batch=batch, ts_ms=ts_ms)


def encode_keyed(delta: DataFrame, columns: tuple[str, ...], pk: tuple[str, ...], *,
                 table: str, batch: int, ts_ms: int) -> DataFrame:
    """Change events when every key has at most one retraction and one insertion of weight 1
    in the batch (the output of an aggregate): one shuffle by key, no consolidation."""
    w = quote(WEIGHT)
    cols = ", ".join(f"CASE WHEN {w} = 0 THEN NULL ELSE {quote(c)} END AS {quote(c)}"
                     for c in columns)  # nullable fields: see ``encode``
    keys = [quote(k) for k in pk]
    grouped = delta.groupBy(*keys) if keys else delta.groupBy()
    pairs = grouped.agg(sql_expr(f"max(CASE WHEN {w} < 0 THEN struct({cols}) END) AS before"),
                        sql_expr(f"max(CASE WHEN {w} > 0 THEN struct({cols}) END) AS after"))
    events = pairs.filter("NOT (before <=> after)").selectExpr(
        "CASE WHEN before IS NULL THEN 'c' WHEN after IS NULL THEN 'd' ELSE 'u' END AS op",
        "before", "after")
    return _envelope(events, table=table, batch=batch, ts_ms=ts_ms)


def _envelope(events: DataFrame, *, table: str, batch: int, ts_ms: int) -> DataFrame:
    return events.selectExpr(
        "op", "before", "after", f"CAST({int(ts_ms)} AS BIGINT) AS ts_ms",
        f"named_struct('table', {string(table)}, 'batch_id', CAST({int(batch)} AS BIGINT), "
        "'connector', 'octo') AS source")

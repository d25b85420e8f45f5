"""Change events of a batch's weighted rows in Arrow, as ``connectors.debezium`` encodes them
with Spark: the driver path encodes its batches here, and the Spark path's tasks encode
theirs here too where each key's rows fall in one task (``colocated``)."""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import WEIGHT
from octo_platform.runtime.operators.arrow import normal_floats, primitive, run_starts, \
    sort_indices
from octo_platform.runtime.operators.keyed_rows import key_hash, same_values, sorted_hashes
from octo_platform.runtime.operators.spark_hash import hashable, spark_hash, spark_pmod

__all__ = ["change_events", "events_table", "images", "event_buckets", "arrow_buckets"]

_SIGN = "__octo_sign"


def change_events(delta: pa.Table, columns: tuple[str, ...], pk: tuple[str, ...] | None, *,
                  table: str, batch: int, ts_ms: int) -> pa.Table:
    """Change events of weighted rows in Arrow, as ``connectors.debezium.encode`` makes
    them with Spark: weights consolidated; with a primary key, the i-th retraction and the
    i-th insertion of a key (in the order of their values) become one ``u``."""
    cols = list(columns)
    image = pa.struct([pa.field(c, delta.schema.field(c).type) for c in cols])
    pairs = _pairs if all(primitive(f.type) for f in image) else _pairs_of_rows
    return events_table(*pairs(delta, cols, pk, image), table=table, batch=batch, ts_ms=ts_ms)


def events_table(before: pa.Array, after: pa.Array, *, table: str, batch: int, ts_ms: int
                 ) -> pa.Table:
    """The changelog's rows of events of ``before`` and ``after`` images (NULL: none)."""
    n = len(before)
    source = pa.scalar({"table": table, "batch_id": batch, "connector": "octo"},
                       pa.struct([("table", pa.string()), ("batch_id", pa.int64()),
                                  ("connector", pa.string())]))
    op = pc.if_else(pc.is_null(before), pa.scalar("c"),
                    pc.if_else(pc.is_null(after), pa.scalar("d"), pa.scalar("u")))
    return pa.table({"op": op, "before": before, "after": after,
                     "ts_ms": pa.array(np.full(n, ts_ms, np.int64)),
                     "source": pa.repeat(source, n)})


def _pairs(delta: pa.Table, columns: list[str], pk: tuple[str, ...] | None,
           image: pa.StructType) -> tuple[pa.Array, pa.Array]:
    """The events' before and after images, in Arrow (columns of ``arrow.primitive``
    types): floats grouped as Spark groups them, a key's retractions and insertions each
    in Spark's ascending order (NULLs first), paired by rank."""
    rows = normal_floats(delta.select([*columns, WEIGHT]))
    sums = rows.group_by(columns, use_threads=False).aggregate([(WEIGHT, "sum")])
    w = sums.column(f"{WEIGHT}_sum").to_numpy()
    live = np.flatnonzero(w)
    units = np.repeat(live, np.abs(w[live]))  # one row per unit of weight
    rows, sign = sums.select(columns).take(units), np.sign(w[units]).astype(np.int8)
    if pk is None:
        return images(rows, image, sign > 0), images(rows, image, sign < 0)
    paired = _one_each(rows, sign, list(pk))
    if paired is not None:
        return tuple(images(rows.take(pa.array(at, mask=at < 0)), image, at < 0)
                     for at in paired)  # type: ignore[return-value]
    rows = rows.append_column(_SIGN, pa.array(sign))
    order = sort_indices(rows, [(c, False, True) for c in [*pk, _SIGN, *columns]])
    rows, sign = rows.take(order), sign[order.to_numpy()]
    at = np.arange(rows.num_rows)
    key_starts = run_starts(rows, list(pk))
    starts = key_starts | run_starts(rows, [_SIGN])
    key = np.cumsum(key_starts)  # the key's number, in order
    rank = at - np.maximum.accumulate(np.where(starts, at, 0))
    gone, new = (pa.table({"k": key[m], "r": rank[m], "i": at[m]}) for m in (sign < 0, sign > 0))
    paired = gone.join(new, keys=["k", "r"], join_type="full outer", left_suffix="_b",
                       right_suffix="_a", use_threads=False).sort_by([("k", "ascending"),
                                                                        ("r", "ascending")])
    return tuple(images(rows.take(paired[f"i_{s}"]), image, pc.is_null(paired[f"i_{s}"]))
                 for s in "ba")  # type: ignore[return-value]


def _one_each(rows: pa.Table, sign: np.ndarray, pk: list[str]
              ) -> tuple[np.ndarray, np.ndarray] | None:
    """When each key of ``pk`` has at most one retraction and one insertion among ``rows``
    (a GROUP BY's or a keyed join's usual change), their pairs found by the key's hash, no
    sort of the rows: per event the row of its before and of its after image (-1: none), in
    the keys' hash order. None otherwise (``_pairs`` ranks each key's rows)."""
    h = key_hash(rows, pk)
    if h is None:
        return None
    ordered, order = sorted_hashes(h)
    same = ordered[1:] == ordered[:-1]  # a key's two rows (or two keys' equal hashes)
    first, second = order[:-1][same], order[1:][same]
    if np.any(same[1:] & same[:-1]) or np.any(sign[first] == sign[second]) or not all(
            pc.all(same_values(rows[k].take(first), rows[k].take(second))).as_py() is not False
            for k in pk):
        return None
    starts = np.ones(len(order), bool)
    starts[1:] = ~same
    run = np.cumsum(starts) - 1  # the event of each sorted row
    before, after = (np.full(int(starts.sum()), -1) for _ in "ba")
    gone = sign[order] < 0
    before[run[gone]], after[run[~gone]] = order[gone], order[~gone]
    return before, after


def images(rows: pa.Table, image: pa.StructType, missing: Any) -> pa.Array:
    """``rows`` as a struct array of ``image``, NULL where ``missing`` (booleans: numpy's
    or Arrow's)."""
    if isinstance(missing, pa.ChunkedArray):  # pa.array() would take it value by value
        missing = missing.combine_chunks()
    elif not isinstance(missing, pa.Array):
        missing = pa.array(missing, pa.bool_())
    return pa.StructArray.from_arrays([rows.column(f.name).combine_chunks().cast(f.type)
                                       for f in image], fields=list(image), mask=missing)


def _pairs_of_rows(delta: pa.Table, columns: list[str], pk: tuple[str, ...] | None,
                   image: pa.StructType) -> tuple[pa.Array, pa.Array]:
    """``_pairs`` row by row, for images with nested types (Arrow neither groups nor sorts
    them)."""
    weights: Counter = Counter()
    for row in delta.to_pylist():
        weights[tuple(row[c] for c in columns)] += row[WEIGHT]
    pairs: list[tuple[tuple | None, tuple | None]] = []
    if pk is None:
        for values, w in weights.items():
            pairs += [(None, values) if w > 0 else (values, None)] * abs(w)
    else:
        at = [columns.index(k) for k in pk]
        by_key: dict[tuple, tuple[list, list]] = {}
        for values, w in weights.items():
            gone, new = by_key.setdefault(tuple(values[i] for i in at), ([], []))
            (new if w > 0 else gone).extend([values] * abs(w))
        for gone, new in by_key.values():
            gone.sort(key=_spark_order)
            new.sort(key=_spark_order)
            for i in range(max(len(gone), len(new))):
                pairs.append((gone[i] if i < len(gone) else None,
                              new[i] if i < len(new) else None))
    pairs = [(b, a) for b, a in pairs if b != a]
    return tuple(pa.array([None if p[which] is None else dict(zip(columns, p[which]))
                           for p in pairs], image)
                 for which in (0, 1))  # type: ignore[return-value]


def _spark_order(values: tuple) -> tuple:
    """Spark's ascending order (NULLs first) as a Python sort key."""
    return tuple((v is not None, v) for v in values)


def arrow_buckets(image: pa.StructType, keys: list[str]) -> bool:
    """Whether ``event_buckets`` computes the buckets of events of ``image`` keyed by
    ``keys`` (``spark_hash`` covers their types)."""
    return all(hashable(image.field(k).type) for k in keys)


def event_buckets(events: pa.Table, keys: list[str], buckets: int) -> pa.Array:
    """Each change event's bucket in the current-state table, as ``sink.event_bucket``
    computes it with Spark (``arrow_buckets``: for keys of the types it covers)."""
    if not keys:
        return pa.array(np.zeros(events.num_rows, np.int32), pa.int32())
    columns = [pc.coalesce(pc.struct_field(events["after"], k),
                           pc.struct_field(events["before"], k)) for k in keys]
    return spark_pmod(spark_hash(columns), buckets)

"""The current-state kernel (``runtime/current.py``) against Spark's own grouping, where Arrow
and Spark could disagree: NULLs, -0.0 and 0.0, NaNs, a row in the bag several times."""
from __future__ import annotations

import math
from collections import Counter

import pyarrow as pa

from octo_platform.runtime.current import merge_current

SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.float64()), ("s", pa.string())])
NAN = float("nan")


def events(before: list[tuple | None], after: list[tuple | None]) -> pa.Table:
    image = pa.struct(list(SCHEMA))

    def images(rows: list[tuple | None]) -> pa.Array:
        return pa.array([None if r is None else dict(zip(SCHEMA.names, r)) for r in rows],
                        image)
    return pa.table({"before": images(before), "after": images(after)})


def key(row: tuple) -> tuple:
    return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row)


def spark_bag(spark, old: list[tuple], gone: list[tuple], new: list[tuple]) -> Counter:
    """The bag after the events, as ``sink.update_current``'s Spark job counts it."""
    rows = [(*r, 1) for r in old] + [(*r, -1) for r in gone] + [(*r, 1) for r in new]
    df = spark.createDataFrame(rows, "k BIGINT, x DOUBLE, s STRING, w BIGINT")
    got = df.groupBy("k", "x", "s").agg({"w": "sum"}).collect()
    return Counter({key(tuple(r)[:3]): r[3] for r in got if r[3] > 0})


def test_a_bag_is_counted_as_spark_groups_it(spark):
    old = [(1, 0.0, "a"), (1, 0.0, "a"), (2, NAN, None), (3, 1.5, "c"), (None, None, None)]
    gone = [(1, -0.0, "a"), (2, NAN, None), (None, None, None)]
    new = [(4, -0.0, "d"), (3, 1.5, "c")]
    got = merge_current(pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in old],
                                             SCHEMA),
                        events([*gone, *[None] * len(new)], [*[None] * len(gone), *new]),
                        ["k", "x", "s"], keyed=False)
    assert Counter(key(tuple(r.values())) for r in got.to_pylist()) == \
        spark_bag(spark, old, gone, new)


def test_keyed_rows_are_replaced_by_key_as_spark_matches_it(spark):
    old = [(1, 0.0, "a"), (2, NAN, "b"), (3, 2.0, "c")]
    table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in old], SCHEMA)
    # keys (x): -0.0 replaces 0.0's row, a NaN replaces the NaN's row, 5.0 is new
    changes = events([(9, -0.0, "z"), (9, NAN, "y"), None],
                     [(7, -0.0, "new0"), None, (8, 5.0, "new5")])
    got = merge_current(table, changes, ["x"], keyed=True)
    df = spark.createDataFrame(old, "k BIGINT, x DOUBLE, s STRING")
    changed = spark.createDataFrame([(-0.0,), (NAN,), (5.0,)], "x DOUBLE")
    kept = df.join(changed, df.x.eqNullSafe(changed.x), "left_anti").collect()
    expected = Counter(key(tuple(r)) for r in kept) + Counter(
        key(r) for r in [(7, -0.0, "new0"), (8, 5.0, "new5")])
    assert Counter(key(tuple(r.values())) for r in got.to_pylist()) == expected

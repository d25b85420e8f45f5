"""The driver path's change events (``events.change_events``, Arrow) against the Spark path's
(``connectors.debezium.encode``) over the same weighted rows: NULLs, -0.0 and 0.0, NaNs,
rows of weight above one, keys with several retractions and insertions; and keys with at most
one of each (paired by their hash, ``events._one_each``), with hashes that collide."""
from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from connectors.debezium import encode
from octo_platform.columns import WEIGHT
from octo_platform.runtime import events
from octo_platform.runtime.events import change_events

NAN = float("nan")
SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.float64()), ("s", pa.string()),
                    (WEIGHT, pa.int64())])


def weighted_rows(seed: int, n: int = 300) -> list[tuple]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        rows.append((rng.choice([None, 1, 2, 3, 4]),
                     rng.choice([None, 0.0, -0.0, NAN, 1.5, -2.0]),
                     rng.choice([None, "", "a", "b", "é"]),
                     rng.choice([-3, -2, -1, 1, 1, 2, 3])))
    return rows


def plain(value):
    """A value of an event, comparable: NaN as a string, rows as tuples."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict) or hasattr(value, "asDict"):
        items = value.items() if isinstance(value, dict) else value.asDict().items()
        return tuple((k, plain(v)) for k, v in items)
    return value


VALUES = ([None, 1, 2, 3, 4], [None, 0.0, -0.0, NAN, 1.5, -2.0], [None, "", "a", "b", "é"])


def one_each(seed: int, pk: tuple[str, ...]) -> list[tuple]:
    """Rows where each key of ``pk`` has at most one retraction and one insertion (an
    update changes a column outside the key)."""
    rng = random.Random(seed)
    at = [SCHEMA.names.index(c) for c in pk]
    free = [i for i in range(3) if i not in at][0]
    rows, seen = [], set()
    for _ in range(100):
        row = tuple(rng.choice(values) for values in VALUES)
        key = tuple(plain(row[i]) for i in at)  # -0.0 == 0.0: one key, as Spark groups
        if key in seen:
            continue
        seen.add(key)
        kind = rng.choice("cduu")
        if kind in "du":
            rows.append((*row, -1))
        if kind in "cu":
            rows.append((*row[:free], rng.choice(VALUES[free]), *row[free + 1:], 1))
    return rows


@pytest.mark.parametrize("pk", [None, ("k",), ("k", "s")])
@pytest.mark.parametrize("seed", [0, 1])
def test_driver_events_equal_the_spark_paths(spark, pk, seed):
    assert_same_events(spark, weighted_rows(seed), pk)


@pytest.mark.parametrize("pk", [("k",), ("k", "s"), ("x",)])
@pytest.mark.parametrize("collide", [False, True])
def test_keys_with_one_change_each_are_paired_by_hash(spark, monkeypatch, pk, collide):
    """Each key at most one retraction and one insertion: paired by the key's hash, no
    sort; where every hash collides, the keys are told apart (``_pairs`` ranks them)."""
    paired = []
    one_each_ = events._one_each
    monkeypatch.setattr(events, "_one_each", lambda *a: paired.append(one_each_(*a)) or
                        paired[-1])
    if collide:
        monkeypatch.setattr(events, "key_hash", lambda rows, keys: np.zeros(
            rows.num_rows, np.uint64))
    assert_same_events(spark, one_each(len(pk), pk), pk)
    assert len(paired) == 1 and (paired[0] is None) == collide


def assert_same_events(spark, rows: list[tuple], pk: tuple[str, ...] | None) -> None:
    columns = ("k", "x", "s")
    df = spark.createDataFrame(rows, f"k BIGINT, x DOUBLE, s STRING, {WEIGHT} BIGINT")
    # The Spark path encodes a consolidated Δ (no zero weights).
    consolidated = df.groupBy(*columns).agg({WEIGHT: "sum"}).withColumnRenamed(
        f"sum({WEIGHT})", WEIGHT).filter(f"{WEIGHT} != 0")
    spark_events = encode(consolidated, columns, pk, table="t", batch=3, ts_ms=7).collect()
    want = Counter((r.op, plain(r.before), plain(r.after)) for r in spark_events)
    got = change_events(pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows],
                                             SCHEMA),
                        columns, pk, table="t", batch=3, ts_ms=7)
    assert Counter((r["op"], plain(r["before"]), plain(r["after"]))
                   for r in got.to_pylist()) == want
    assert set(got.column("ts_ms").to_pylist()) <= {7}
    assert all(s == {"table": "t", "batch_id": 3, "connector": "octo"}
               for s in got.column("source").to_pylist())
    if pk is not None:
        assert "u" in {r.op for r in spark_events}  # the pairing is exercised


def test_no_rows_make_no_events():
    got = change_events(SCHEMA.empty_table(), ("k", "x", "s"), ("k",), table="t", batch=0,
                        ts_ms=0)
    assert got.num_rows == 0
    assert got.schema.field("after").type == pa.struct(list(SCHEMA)[:3])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_group_by_pairs_its_events_from_its_accumulators(seed):
    """``aggregate.arrow_changes`` (the Spark path's GROUP BY tasks write their
    events from each group's old and new row) gives the events ``change_events`` pairs
    from the same groups' Δ (``arrow_output``): new groups, gone ones, unchanged ones,
    -0.0 against 0.0 and NaNs."""
    from types import SimpleNamespace

    from octo_platform.runtime.operators.aggregate import arrow_changes, arrow_output

    rng = random.Random(seed)
    aggs = (SimpleNamespace(strategy="count", arg=None, func="count"),
            SimpleNamespace(strategy="sum", arg="x", func="sum"),
            SimpleNamespace(strategy="running", arg="y", func="max"))
    cols = {c: [] for c in ["k", "o_n", "n_n", "oc1", "nc1", "os1", "ns1", "om2", "nm2",
                            "_touched"]}
    for k in range(200):
        old = rng.choice([None, 0, 1, 3])  # None: a new group; 0 a gone one
        new = rng.choice([0, 1, 3]) if rng.random() < 0.7 else old or 0
        for side, count in (("o", old), ("n", new)):
            cols[f"{side}_n"].append(count)
            cols[f"{side}c1"].append(None if count is None else rng.choice([0, count]))
            cols[f"{side}s1"].append(None if count is None else rng.choice([0.0, -0.0, NAN, 1.5]))
            cols[f"{side}m2"].append(None if count is None else rng.choice([None, 1, 2]))
        cols["k"].append(k)
        cols["_touched"].append(rng.random() < 0.9)
    accs = pa.table(cols, schema=pa.schema(
        [("k", pa.int64()), ("o_n", pa.int64()), ("n_n", pa.int64()), ("oc1", pa.int64()),
         ("nc1", pa.int64()), ("os1", pa.float64()), ("ns1", pa.float64()),
         ("om2", pa.int64()), ("nm2", pa.int64()), ("_touched", pa.bool_())]))
    out = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("s", pa.float64()),
                     ("m", pa.int64()), (WEIGHT, pa.int64())])
    image = pa.struct(list(out)[:-1])
    before, after, no_before, no_after = arrow_changes(["k"], aggs, accs, out)
    direct = events.events_table(events.images(before, image, no_before),
                                 events.images(after, image, no_after),
                                 table="t", batch=1, ts_ms=5)
    paired = change_events(arrow_output(["k"], aggs, accs, out), tuple(out.names[:-1]),
                           ("k",), table="t", batch=1, ts_ms=5)

    def bag(t: pa.Table) -> Counter:
        return Counter((e["op"], plain(e["before"]), plain(e["after"])) for e in t.to_pylist())

    assert direct.num_rows > 50
    assert bag(direct) == bag(paired)
    assert direct.schema == paired.schema

"""A sliding OVER range's step in Arrow (``operators/over.py``) against Spark's own window
functions: the same rows give the same aggregates per row, frames of peers, NULL times,
NULL values and NULL partition keys included."""
from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from types import SimpleNamespace

import pyarrow as pa
import pytest

from octo_platform.columns import WEIGHT
from octo_platform.local_frames import arrow_schema
from octo_platform.logical.plan import AggCall
from octo_platform.runtime.operators.over import OverStep
from octo_platform.runtime.operators.over_frames import OverRange
from tests.oracle import norm

COLUMNS = ("p", "ts", "n", "m", "s")
DDL = f"p BIGINT, ts TIMESTAMP, n BIGINT, m DECIMAL(12,2), s STRING, {WEIGHT} BIGINT"


def _rows(rng: random.Random, count: int) -> list[tuple]:
    start = datetime(2026, 12, 1, tzinfo=timezone.utc)
    rows = []
    for _ in range(count):
        rows.append((
            rng.choice([1, 2, 3, None]),
            None if rng.random() < 0.05 else start + timedelta(seconds=rng.randint(0, 60)),
            None if rng.random() < 0.1 else rng.randint(-50, 50),
            None if rng.random() < 0.1 else Decimal(rng.randint(-10**5, 10**5)) / 100,
            None if rng.random() < 0.1 else rng.choice(["a", "b", "ab", ""]),
            rng.choice([1, 1, 1, 2])))
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sliding_aggregates_equal_sparks_window_functions(spark, seed):
    rng = random.Random(seed)
    aggs = (AggCall("count", None), AggCall("count", "n"), AggCall("sum", "n"),
            AggCall("avg", "n"), AggCall("sum", "m"), AggCall("avg", "m"),
            AggCall("min", "s"), AggCall("max", "s"), AggCall("max", "m"), AggCall("min", "n"))
    outs = tuple(f"a{i}" for i in range(len(aggs)))
    node = SimpleNamespace(input=SimpleNamespace(columns=COLUMNS), partition=("p",),
                           time="ts", range_us=rng.choice([0, 5, 10]) * 1_000_000,
                           aggs=aggs, closes=False, columns=COLUMNS + outs)
    frame = spark.createDataFrame(_rows(rng, 300), DDL)
    want = Counter(norm(tuple(r)) for r in OverRange(node, None).compute(frame).collect())
    rows = frame.toArrow()
    out = arrow_schema(OverRange(node, None).compute(frame.limit(0)).schema)
    step = OverStep.of(node, rows.schema, out)
    assert step is not None, "the step covers these aggregates"
    got = step.compute(rows)
    assert got.schema == pa.schema(list(out)[:-1])
    assert Counter(norm((*r.values(), 1)) for r in got.to_pylist()) == want
    assert got.num_rows == sum(rows.column(WEIGHT).to_pylist())


def test_floating_point_sums_are_left_to_spark():
    """Spark adds a frame's doubles in the frame's order: the step does not sum them."""
    node = SimpleNamespace(input=SimpleNamespace(columns=("p", "ts", "x")), partition=("p",),
                           time="ts", range_us=1, aggs=(AggCall("sum", "x"),), closes=False)
    rows = pa.schema([("p", pa.int64()), ("ts", pa.timestamp("us", "UTC")),
                      ("x", pa.float64()), (WEIGHT, pa.int64())])
    assert OverStep.of(node, rows, rows) is None

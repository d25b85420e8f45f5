"""``ValueFilter``: a driver-path filter asked of Spark once per distinct value of the
columns it reads keeps exactly the rows Spark's own filter keeps (NULLs, repeated values,
strings, dates, timestamps, decimals, booleans), asks nothing about values it has seen,
and is not taken where the answer may depend on more than the values Arrow groups (or on
the clock)."""
from __future__ import annotations

import random
from datetime import date
from decimal import Decimal

import pyarrow as pa
import pytest

from octo_platform.runtime.operators import BatchContext
from octo_platform.runtime.operators.kernels import LocalContext
from octo_platform.runtime.operators.value_filter import ValueFilter

CONDITIONS = [
    "state IN ('OR', 'ID', 'CA')",
    "k > 3 AND (state <> 'NY' OR ok)",
    "coalesce(d, DATE'2026-01-01') >= DATE'2026-01-03' OR m < 0.5",
    "upper(state) = state AND ts IS NOT NULL",
    "NOT ok",
    "k % 2 = 0 <=> ok",
]


def _rows(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)

    def maybe(v):
        return None if rng.random() < 0.15 else v

    return pa.table({
        "k": pa.array([maybe(rng.randint(0, 6)) for _ in range(n)], pa.int64()),
        "state": pa.array([maybe(rng.choice(["OR", "ID", "CA", "NY", "or", "é"]))
                           for _ in range(n)], pa.string()),
        "ok": pa.array([maybe(rng.random() < 0.5) for _ in range(n)], pa.bool_()),
        "d": pa.array([maybe(date(2026, 1, rng.randint(1, 5))) for _ in range(n)],
                      pa.date32()),
        "ts": pa.array([maybe(rng.randint(0, 3) * 10**6) for _ in range(n)],
                       pa.timestamp("us", tz="UTC")),
        "m": pa.array([maybe(Decimal(rng.randint(0, 3)) / 4) for _ in range(n)],
                      pa.decimal128(6, 2)),
        "x": pa.array([rng.choice([0.0, -0.0, float("nan"), 1.5]) for _ in range(n)]),
        "__octo_w": pa.array([rng.choice([1, -1, 2]) for _ in range(n)], pa.int64()),
    })


def _plain(table: pa.Table) -> list[tuple]:
    """Rows comparable with ``==`` (NaN as its text)."""
    return [tuple(repr(v) if isinstance(v, float) else v for v in r.values())
            for r in table.to_pylist()]


def _context(spark) -> LocalContext:
    return LocalContext(BatchContext(spark, 0, 4, {}, lambda t, b: []), {})


@pytest.mark.parametrize("condition", CONDITIONS)
def test_the_rows_kept_are_those_spark_keeps(spark, condition):
    lc = _context(spark)
    for seed, n in enumerate([400, 800, 1]):  # batches of one run: answers carried over
        rows = _rows(n, seed)
        by_value = ValueFilter.of(lc, rows, condition)
        assert by_value is not None
        got = by_value.apply(lc, rows)
        assert got is not None  # few values, or (the last batch) only values seen
        want = spark.createDataFrame(rows).filter(condition).toArrow()
        assert _plain(got) == _plain(want.cast(rows.schema))  # in order


def test_values_seen_are_not_asked_again(spark):
    lc = _context(spark)
    rows = _rows(400, 7)
    by_value = ValueFilter.of(lc, rows, CONDITIONS[1])
    by_value.apply(lc, rows)
    assert 0 < len(by_value.answers) < rows.num_rows
    later = rows.slice(50)
    want = spark.createDataFrame(later).filter(CONDITIONS[1]).toArrow().cast(rows.schema)

    def no_spark(*args, **kwargs):
        raise AssertionError("asked Spark about values it had answered")
    lc.sql = no_spark
    assert _plain(by_value.apply(lc, later)) == _plain(want)
    assert ValueFilter.of(lc, rows, CONDITIONS[1]) is by_value  # one per run


@pytest.mark.parametrize("condition", [
    "rand() < 0.5", "x > 0", "1 = 1", "ts > now() - INTERVAL 1 HOUR",
    "CAST(ts AS DATE) = current_date()", "k < unix_timestamp()", "ts < localtimestamp()"])
def test_conditions_a_value_does_not_decide_are_left_to_spark(spark, condition):
    assert ValueFilter.of(_context(spark), _rows(10, 1), condition) is None


def test_rows_of_values_that_barely_repeat_are_left_to_spark(spark):
    lc = _context(spark)
    rows = pa.table({"k": pa.array(range(100), pa.int64()), "__octo_w": [1] * 100})
    by_value = ValueFilter.of(lc, rows, "k % 3 = 0")
    assert by_value is not None and by_value.apply(lc, rows) is None
    assert by_value.apply(lc, pa.concat_tables([rows.slice(0, 5)] * 4)).num_rows == 8

"""GROUP BY's step in Arrow (``operators/aggregate.py``) against Spark's own aggregation:
the same rows give the same result rows, to the last digit of a decimal."""
from __future__ import annotations

import random
from decimal import Decimal
from types import SimpleNamespace

import pyarrow as pa
import pytest

from octo_platform.columns import WEIGHT
from octo_platform.runtime.operators.aggregate import aggregate_step, shape


def _node(func: str, arg: str | None, strategy: str) -> SimpleNamespace:
    return SimpleNamespace(func=func, arg=arg, strategy=strategy, distinct=False)


@pytest.mark.parametrize("seed", [0, 1])
def test_decimal_sums_and_averages_equal_sparks(spark, seed):
    """SUM, AVG, MIN and MAX of DECIMAL(15,2) per group, from the step's accumulators
    (``arrow_output``), equal Spark's GROUP BY over the same rows: groups of 2^k rows make
    averages whose digits end in a 5 beyond the result's scale (rounded half up, away from
    zero), negative ones too."""
    rng = random.Random(seed)
    keys, values = [], []
    for k in range(40):
        for _ in range(rng.choice([1, 2, 4, 8, 16, 32, 64, 3, 7])):
            keys.append(k)
            values.append(None if rng.random() < 0.05 else
                          Decimal(rng.randint(-10**6, 10**6)) / 100)
    rows = pa.table({"k": pa.array(keys, pa.int64()),
                     "m": pa.array(values, pa.decimal128(15, 2)),
                     WEIGHT: pa.array([1] * len(keys), pa.int64())})
    node = SimpleNamespace(
        id="agg", keys=("k",), closes=None, columns=("k", "s", "a", "mn", "mx"),
        aggs=(_node("sum", "m", "sum"), _node("avg", "m", "sum"),
              _node("min", "m", "running"), _node("max", "m", "running")))
    frame = spark.createDataFrame(rows.to_pandas(), "k BIGINT, m DECIMAL(15,2), _w BIGINT")
    step = aggregate_step(node, shape(node, SimpleNamespace(memo={}), frame), batch=0)
    assert step is not None, "the step covers decimals"
    done = step.run(rows, step.logged.empty_table(), {})
    got = step.output(done.table)
    assert set(got.column(WEIGHT).to_pylist()) == {1}
    frame.createOrReplaceTempView("money")
    want = {tuple(r) for r in spark.sql(
        "SELECT k, SUM(m), AVG(m), MIN(m), MAX(m) FROM money GROUP BY k").collect()}
    assert {tuple(r[c] for c in node.columns) for r in got.to_pylist()} == want
    assert got.schema.field("a").type == pa.decimal128(19, 6)  # Spark's AVG type

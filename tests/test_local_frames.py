"""``local_frames``: a small Arrow table becomes a local relation (projections and filters
evaluated in the driver, ``collect`` with no job); a larger one becomes Arrow batches turned
into rows by Spark's tasks. Either way Spark sees the same rows, in order, as
``createDataFrame`` gives it, and what it computes comes back as Arrow."""
from __future__ import annotations

import random
from datetime import date
from decimal import Decimal

import pyarrow as pa
import pytest

from octo_platform.local_frames import _LOCAL_RELATION as _THRESHOLD
from octo_platform.local_frames import COLLECT_ROWS, collect_arrow, local_frame


def _table(n: int) -> pa.Table:
    rng = random.Random(n)

    def maybe(v):
        return None if rng.random() < 0.1 else v

    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "s": pa.array([maybe("".join(rng.choice("ab é€") for _ in range(rng.randint(0, 6))))
                       for _ in range(n)], pa.string()),
        "x": pa.array([maybe(rng.uniform(-1e6, 1e6)) for _ in range(n)], pa.float64()),
        "d": pa.array([maybe(date.fromordinal(rng.randint(700_000, 800_000)))
                       for _ in range(n)], pa.date32()),
        "ts": pa.array([maybe(rng.randint(-2**50, 2**50)) for _ in range(n)],
                       pa.timestamp("us", tz="UTC")),
        "m": pa.array([maybe(Decimal(rng.randint(-10**6, 10**6)) / 100) for _ in range(n)],
                      pa.decimal128(12, 2)),
    })


def _leaf(df) -> str:
    """The class of the analyzed plan's leaf: where the rows come from."""
    plan = df._jdf.queryExecution().analyzed()
    while plan.children().size():
        plan = plan.children().head()
    return plan.getClass().getSimpleName()


@pytest.mark.parametrize("n", [COLLECT_ROWS, COLLECT_ROWS + 1, 25_000])
def test_a_table_comes_back_as_spark_computes_it(spark, n):
    table = _table(n)
    before = spark.conf.get(_THRESHOLD)
    df = local_frame(spark, table)
    assert spark.conf.get(_THRESHOLD) == before  # set for the call only
    assert _leaf(df) == ("LocalRelation" if n <= COLLECT_ROWS else "LogicalRDD")
    if n > COLLECT_ROWS:  # one batch per core
        assert df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism
    exprs = ["id", "upper(s) AS s", "x * 2 AS x", "date_add(d, 1) AS d",
             "timestamp_micros(unix_micros(ts) - pmod(unix_micros(ts), 60000000)) AS ts",
             "m + 1 AS m"]
    got = collect_arrow(local_frame(spark, table).filter("id % 3 <> 1").selectExpr(*exprs),
                        n)
    want = spark.createDataFrame(table).filter("id % 3 <> 1").selectExpr(*exprs).toArrow()
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()  # the same rows, in the input's order
    assert got["id"].to_pylist() == [i for i in range(n) if i % 3 != 1]

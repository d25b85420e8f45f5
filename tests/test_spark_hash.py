"""The driver path's Spark hash (``runtime/operators/spark_hash.py``) equals Spark's own
``hash``/``pmod`` over random values of every type it covers, NULLs and multi-byte UTF-8
included: a change event lands in the same current-state bucket on either path."""
from __future__ import annotations

import random
from datetime import date

import pyarrow as pa
import pytest

from octo_platform.local_frames import local_frame
from octo_platform.runtime.operators.spark_hash import hashable, spark_hash, spark_pmod


def _table(rng: random.Random, n: int) -> pa.Table:
    def maybe(v):
        return None if rng.random() < 0.1 else v

    text = "ab1 é€𝄞"
    return pa.table({
        "i": pa.array([maybe(rng.randint(-2**31, 2**31 - 1)) for _ in range(n)], pa.int32()),
        "l": pa.array([maybe(rng.randint(-2**63, 2**63 - 1)) for _ in range(n)], pa.int64()),
        "s": pa.array([maybe("".join(rng.choice(text) for _ in range(rng.randint(0, 9))))
                       for _ in range(n)], pa.string()),
        # lengths far apart (the hash walks every value's words at once)
        "t": pa.array([maybe("".join(rng.choice(text) for _ in range(
            rng.choice((0, 1, 3, 4, 5, 17, 64, 301))))) for _ in range(n)], pa.string()),
        "b": pa.array([maybe(rng.random() < 0.5) for _ in range(n)], pa.bool_()),
        "d": pa.array([maybe(date.fromordinal(rng.randint(1, 800_000))) for _ in range(n)],
                      pa.date32()),
        "ts": pa.array([maybe(rng.randint(-2**50, 2**50)) for _ in range(n)],
                       pa.timestamp("us", tz="UTC")),
    })


@pytest.mark.parametrize("cols", [["i"], ["l"], ["s"], ["t"], ["b"], ["d"], ["ts"], ["l", "s"],
                                  ["s", "i", "ts", "b", "d", "t"]])
@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
def test_hash_and_bucket_equal_spark(spark, cols, sliced):
    table = _table(random.Random(len(cols)), 400)
    if sliced:  # columns that start inside their buffers, strings with 64-bit offsets
        table = table.slice(37, 300)
        table = table.set_column(2, "s", table["s"].cast(pa.large_string()))
    assert all(hashable(table.schema.field(c).type) for c in cols)
    listed = ", ".join(cols)
    want = local_frame(spark, table).selectExpr(f"hash({listed})", f"pmod(hash({listed}), 7)")
    want_hash, want_bucket = zip(*[tuple(r) for r in want.collect()])
    got = spark_hash([table[c].chunk(0) if sliced else table[c] for c in cols])
    assert [int(h) for h in got] == list(want_hash)
    assert spark_pmod(got, 7).to_pylist() == list(want_bucket)


def test_other_types_are_left_to_spark():
    assert not hashable(pa.float64()) and not hashable(pa.decimal128(10, 2))
    assert not hashable(pa.timestamp("ns", tz="UTC"))

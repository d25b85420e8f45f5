"""Spark SQL over an Arrow table in the driver: as a local relation, or as Arrow batches that
Spark's tasks turn into rows (``octo_platform.local_frames.local_frame`` above
``COLLECT_ROWS``).

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/local_relation.py \
        [--sizes 3000,10000,100000,300000 --repeat 3]

For each size: a table of (team, player, ts, weight) rows, a filter and a TUMBLE's
projection (the driver path's stateless step of ``windows.py``), taken back with
``toArrow``; median seconds of ``--repeat`` after one warm-up, each way in turn. "local
relation" is ``createDataFrame``'s own choice under its default
``spark.sql.execution.arrow.localRelationThreshold`` (48 MB); "batches" is ``local_frame``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import pyarrow as pa

from common import log, session

STEPS = ["team", "player", "ts",
         "timestamp_micros(unix_micros(ts) - pmod(unix_micros(ts), 60000000)) AS window_start",
         "timestamp_micros(unix_micros(ts) - pmod(unix_micros(ts), 60000000) + 60000000) "
         "AS window_end", "_w"]


def table(n: int) -> pa.Table:
    rng = np.random.default_rng(n)
    ts = 1_700_000_000_000_000 + np.sort(rng.integers(0, 3600 * 10**6, n))
    return pa.table({"team": rng.integers(0, 1000, n), "player": rng.integers(0, 10**6, n),
                     "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                     "_w": pa.array(np.ones(n, np.int64))})


def main(argv: list[str] | None = None) -> int:
    from octo_platform.local_frames import local_frame

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="3000,10000,100000,300000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    spark = session()
    ways = {"local relation": spark.createDataFrame, "batches": lambda t: local_frame(spark, t)}
    print("| rows | local relation | batches | batches / local relation |")
    print("|---|---|---|---|")
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            t, secs = table(n), {w: [] for w in ways}
            for i in range(args.repeat + 1):
                for way, frame in ways.items():
                    t0 = time.perf_counter()
                    got = frame(t).filter("ts IS NOT NULL").selectExpr(*STEPS).toArrow()
                    if i:
                        secs[way].append(time.perf_counter() - t0)
                    assert got.num_rows == n
            a, b = (statistics.median(secs[w]) for w in ways)
            log(f"[local_relation] {n} rows: local relation {a:.3f}s, batches {b:.3f}s")
            print(f"| {n:,} | {a:.3f} s | {b:.3f} s | {b / a:.2f}× |", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

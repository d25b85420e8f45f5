"""What Spark itself costs a tiny job in octo's session: the floor under a Spark-path batch.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/spark_fixed_costs.py \
        [--runs 30] [--conf KEY=VALUE ...]

Each row is a job over 12 rows built from ``spark.range``: a plain collect, an exchange, a
Python ``mapInArrow`` stage (what every octo kernel and writer is on the Spark path), and
two of each. Medians and minimums of ``--runs`` runs after a warm-up of as many, in one
session with the test suite's settings (``tests/conftest.py``'s ``SESSION_CONF``: code
generation off, the JIT compiling later) and any ``--conf`` given (e.g.
``spark.sql.shuffle.partitions=1``). A Spark-path batch of a join + aggregate runs several
such stages plus its planning, so what a row costs here is what a dozen-row batch cannot go
under (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import session  # noqa: E402
from tests.conftest import SESSION_CONF  # noqa: E402


def _through(batches):
    yield from batches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    spark = session({**SESSION_CONF, **dict(kv.split("=", 1) for kv in args.conf)})

    def one(parts: int = 1):
        return spark.range(0, 12, 1, parts)

    def arrow(df):
        return df.mapInArrow(_through, "id long")

    jobs = {
        "collect, 1 partition": lambda: one(),
        "collect, 2 partitions": lambda: one(2),
        "projection, 1 partition": lambda: one().selectExpr("id + 1 AS id"),
        "an exchange (2 stages)": lambda: one().repartition(2),
        "mapInArrow, 1 partition": lambda: arrow(one()),
        "an exchange, mapInArrow": lambda: arrow(one().repartition(2)),
        "(an exchange, mapInArrow) x 2": lambda: arrow(arrow(one().repartition(2))
                                                       .repartition(2)),
    }
    print(f"{'job over 12 rows':34s} {'median':>9s} {'min':>9s}")
    for name, make in jobs.items():
        seconds = []
        for i in range(2 * args.runs):
            t0 = time.perf_counter()
            make().collect()
            if i >= args.runs:  # the first half warms up
                seconds.append(time.perf_counter() - t0)
        print(f"{name:34s} {1000 * statistics.median(seconds):7.1f}ms "
              f"{1000 * min(seconds):7.1f}ms", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

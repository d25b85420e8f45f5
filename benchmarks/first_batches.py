"""A run's first batch, run after run: what a scheduled or catch-up run of a small change pays
beyond its later batches (opening its tables, first reads), on either path.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/first_batches.py \
        [--table q4 --runs 6 --driver-rows 1000000000 --out /tmp/octo-first-batches]

The project is the join oracle's (``tests/test_oracle_joins.py``: two JSON and two Debezium
JSON sources, 21 streaming tables); three rounds of its random input are run first, every
table, as that test runs them. Then ``--runs`` runs of ``--table`` alone follow in the same
session, each after a new file of 8 records per source, each one batch: the run's first.
Each run's ``BatchStats.seconds`` is printed, and their median without the first (which
pays for the JIT). ``--driver-rows 0`` runs them on the Spark path. To compare two
checkouts, put each first on ``PYTHONPATH`` in turn.
"""
from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/ (after PYTHONPATH)

from common import log, session  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", default="q4")
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--driver-rows", type=int, default=10**9)
    p.add_argument("--out", default="/tmp/octo-first-batches")
    args = p.parse_args(argv)

    from octo_platform.runtime.runner import run_tables
    from octo_platform.wiring import default_options
    from tests.oracle import RandomInput, write_lines
    from tests.test_oracle_joins import project_sql

    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    (root / "sql").mkdir(parents=True)
    rng = random.Random(20261123)
    (root / "sql" / "tables.sql").write_text(project_sql(rng))
    spark = session()
    feeds = {f"{s}_{k}": RandomInput(20261123 + i, k == "cdc")
             for i, (s, k) in enumerate((s, k) for s in "ab" for k in ("app", "cdc"))}

    def run(names: list[str] | None, rows: int):
        return run_tables(spark, root, names=names, until_idle=True, options=default_options(
            buckets=4, progress=None, driver_rows=rows))

    for round_no in range(3):
        for name, feed in feeds.items():
            write_lines(root / "data" / name, f"r{round_no}.json", feed.lines(rng.randint(3, 12)))
        run(None, args.driver_rows)
    seconds = []
    for r in range(args.runs):
        for name, feed in feeds.items():
            write_lines(root / "data" / name, f"m{r}-{time.time_ns()}.json", feed.lines(8))
        report = run([args.table], args.driver_rows)
        (batch,) = report.batches
        seconds.append(batch.seconds)
        log(f"run {r}: {batch.seconds:.3f} s on the {batch.path} path, "
            f"{batch.spark_jobs} Spark job(s)")
    print(f"{args.table}, a run's first batch, median of runs 2-{args.runs}: "
          f"{statistics.median(seconds[1:]):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

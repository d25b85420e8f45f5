"""Where the driver path stops paying: one batch of N rows on each path (the default
``driver_rows`` is set from this).

    PYSPARK_PYTHON=$(which python) python benchmarks/driver_threshold.py \
        [--sizes 1000,5000,20000,50000 --state-keys 100000 --repeat 3 --key-type bigint]

Table: ``SELECT auction, COUNT(*) AS n, SUM(price) AS s, MAX(price) AS top FROM bids GROUP
BY auction`` over Parquet files (``--key-type string``: auctions named ``auction-<n>``,
whose buckets the driver path hashes as Spark hashes strings), after a priming batch that
puts ``--state-keys`` groups in its state. For each size, ``--repeat`` batches of N
random-key bids run with ``driver_rows`` = N (driver path) and with 0 (Spark path), in one
run per path after a first batch of N that loads the driver path's state cache (a run's
first batch; not counted); the figure is the median of ``BatchStats.seconds``. Both
warehouses must end with the same current state.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import batch_seconds, delta_rows, log, run_octo, session

SQL = """CREATE SOURCE bids (auction {key_type}, price BIGINT) WITH (connector = 'files',
  path = 'data/bids', format = 'parquet', max_files_per_batch = '1');
CREATE STREAMING TABLE agg AS SELECT auction, COUNT(*) AS n, SUM(price) AS s,
  MAX(price) AS top FROM bids GROUP BY auction;
"""


def _auctions(numbers: np.ndarray, key_type: str) -> pa.Array:
    if key_type == "string":
        return pa.array([f"auction-{n:08d}" for n in numbers.tolist()], pa.string())
    return pa.array(numbers, pa.int64())


def _bids(rng: np.random.Generator, n: int, keys: int, key_type: str) -> pa.Table:
    return pa.table({"auction": _auctions(rng.integers(0, keys, n), key_type),
                     "price": rng.integers(1, 10**6, n)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,5000,20000,50000")
    ap.add_argument("--state-keys", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--key-type", choices=("bigint", "string"), default="bigint")
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench/driver_threshold"))
    args = ap.parse_args(argv)
    spark = session()
    rng = np.random.default_rng(5)
    roots = {}
    for path in ("driver", "spark"):
        root = args.out / path
        shutil.rmtree(root, ignore_errors=True)
        (root / "sql").mkdir(parents=True)
        (root / "data" / "bids").mkdir(parents=True)
        (root / "sql" / "t.sql").write_text(SQL.format(key_type=args.key_type.upper()))
        roots[path] = root
    seq = 0

    def add(table: pa.Table) -> None:
        nonlocal seq
        for root in roots.values():
            pq.write_table(table, root / "data" / "bids" / f"part-{seq:05d}.parquet")
        seq += 1

    add(pa.table({"auction": _auctions(np.arange(args.state_keys), args.key_type),
                  "price": np.ones(args.state_keys, np.int64)}))
    for path, root in roots.items():
        run_octo(spark, root, root / "warehouse", driver_rows=0)
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        secs: dict[str, list[float]] = {}
        for _ in range(args.repeat + 1):
            add(_bids(rng, n, args.state_keys, args.key_type))
        for path, root in roots.items():  # one run: the first batch loads the state cache
            report = run_octo(spark, root, root / "warehouse",
                              driver_rows=n if path == "driver" else 0)
            assert {b.path for b in report.batches} == {path}, report.batches
            secs[path] = batch_seconds(report)[1:]
        d, s = statistics.median(secs["driver"]), statistics.median(secs["spark"])
        rows.append((n, d, s))
        log(f"[threshold] {n} rows: driver {d:.3f}s, spark {s:.3f}s ({d / s:.2f}x)")
    def current(root: Path) -> list:
        t = delta_rows(root / "warehouse" / "_current" / "agg")
        return sorted(t.drop_columns(["_bucket"]).to_pylist(), key=lambda r: r["auction"])

    same = current(roots["driver"]) == current(roots["spark"])
    print("| batch rows | driver path | Spark path | driver / Spark |")
    print("|---|---|---|---|")
    for n, d, s in rows:
        print(f"| {n:,} | {d:.3f} s | {s:.3f} s | {d / s:.2f}x |")
    print(f"\nstate keys {args.state_keys:,} ({args.key_type}); both paths' current state "
          f"equal: {same}")
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

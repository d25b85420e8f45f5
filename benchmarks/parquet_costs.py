"""What writing and reading octo's Parquet files costs, one way against another.

    python benchmarks/parquet_costs.py [--rows 250000 --files 24 --repeat 7]

A current-state bucket like `keyed_agg.py`'s over 2M keys (`rows` rows of three BIGINTs:
random keys, small counts, prices) is written and read back with the options octo used
before (plain integers, snappy) and with `writes.parquet_options` (integers
delta-encoded); then `files` such files are read with `pq.read_table` (Arrow's dataset
layer) and with `ParquetFile.read` (`operators.arrow.read_parquet`). Prints the minimum
and median of `repeat` runs of each, and the sizes. The files have row groups of 10K rows,
as the write job's tasks write them (one per Arrow batch). No Spark.
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octo_platform.runtime.operators.arrow import read_parquet  # noqa: E402
from octo_platform.runtime.writes import parquet_options  # noqa: E402

from common import repeated  # noqa: E402


def timed(label: str, fn: Callable[[], object], repeat: int, extra: str = "") -> None:
    secs = repeated(fn, repeat)
    print(f"{label:<70} min {min(secs) * 1000:7.1f} ms  median "
          f"{statistics.median(secs) * 1000:7.1f} ms{extra}")


def bucket(rows: int, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"auction": rng.permutation(2_000_000)[:rows].astype(np.int64),
                     "bids": rng.integers(1, 6, rows, dtype=np.int64),
                     "top": rng.integers(1, 10_000, rows, dtype=np.int64)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    table = bucket(args.rows)
    ways = {"plain integers, snappy (before)": {"use_dictionary": []},
            "writes.parquet_options (integers delta-encoded)": parquet_options(table.schema)}
    for name, options in ways.items():
        sink = io.BytesIO()
        pq.write_table(table, sink, **options)
        data = sink.getvalue()
        timed(f"write {args.rows:,} rows, {name}",
              lambda o=options: pq.write_table(table, io.BytesIO(), **o), args.repeat,
              f"  ({len(data) / 1e6:.2f} MB)")
        timed(f"read them back, {name}",
              lambda d=data: pq.ParquetFile(pa.BufferReader(d)).read(), args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(args.files):
            part = Path(tmp) / f"_bucket={i % 8}" / f"part-{i}.parquet"
            part.parent.mkdir(exist_ok=True)
            pq.write_table(bucket(args.rows // 2, seed=i), part, row_group_size=10_000,
                           **parquet_options(table.schema))
            paths.append(str(part))
        timed(f"read {args.files} files, pq.read_table",
              lambda: [pq.read_table(p).select(table.schema.names).cast(table.schema)
                       for p in paths], args.repeat)
        timed(f"read {args.files} files, arrow.read_parquet (ParquetFile)",
              lambda: [read_parquet(p, table.schema) for p in paths], args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The state row of ``make bench``, repeated: a run's first and second 100K-event batch over
N keys of GROUP BY state, each run on a fresh copy of the same primed warehouse.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/state_batches.py \
        [--keys 2000000 --batches 2 --repeat 5 --out /tmp/octo-state-batches]

``keyed_agg.py`` takes the median of 3 runs per figure; on a noisy machine one run of the
same code moved 2-4x. Here one priming of N keys (``keyed_agg``'s query and data) is kept,
and ``--repeat`` runs of ``--batches`` batches each start from a copy of it, after a
warm-up run on a small separate table; each run's batch seconds are printed, then their
medians. To compare two checkouts, run it with each first on ``PYTHONPATH`` (the driver and
Spark's workers import octo from there), in turn.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import keyed_agg  # noqa: E402
from common import batch_seconds, log, run_octo, session  # noqa: E402

BATCH = 100_000


def prime(spark, base: Path, work: Path, keys: int, batches: int) -> None:
    """The warehouse after one batch of ``keys`` distinct auctions, kept in ``base``, and
    the next batches' files (random keys among them)."""
    if (base / f"done-{batches}").exists():
        return
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    (work / "input").mkdir(parents=True)
    base.mkdir(parents=True)
    rng = np.random.default_rng(7)
    keyed_agg._write_bids(work / "input" / "part-00000.parquet", np.arange(keys), rng)
    run_octo(spark, keyed_agg.write_octo_project(work / "input", work), work / "warehouse")
    shutil.copytree(work / "warehouse", base / "warehouse")
    (base / "next").mkdir()
    for i in range(1, batches + 1):
        keyed_agg._write_bids(base / "next" / f"part-{i:05d}.parquet",
                              rng.integers(0, keys, BATCH, dtype=np.int64), rng)
    (base / f"done-{batches}").touch()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default="/tmp/octo-state-batches")
    args = p.parse_args(argv)
    spark = session()
    root = Path(args.out)
    base, work = root / f"base-{args.keys}", root / f"run-{args.keys}"
    prime(spark, base, work, args.keys, args.batches)
    warm = root / "warm"
    shutil.rmtree(warm, ignore_errors=True)
    (warm / "input").mkdir(parents=True)
    rng = np.random.default_rng(1)
    keyed_agg._write_bids(warm / "input" / "part-00000.parquet", np.arange(50_000), rng)
    keyed_agg._write_bids(warm / "input" / "part-00001.parquet",
                          rng.integers(0, 50_000, BATCH), rng)
    run_octo(spark, keyed_agg.write_octo_project(warm / "input", warm), warm / "warehouse")
    project = keyed_agg.write_octo_project(work / "input", work)
    runs = []
    for r in range(args.repeat):
        shutil.rmtree(work / "warehouse", ignore_errors=True)
        shutil.copytree(base / "warehouse", work / "warehouse")
        for f in (work / "input").glob("part-*.parquet"):
            if f.name != "part-00000.parquet":
                f.unlink()
        for f in sorted((base / "next").iterdir())[:args.batches]:
            shutil.copy(f, work / "input")
        secs = batch_seconds(run_octo(spark, project, work / "warehouse"))
        log(f"run {r}: {', '.join(f'{s:.3f}' for s in secs)} s")
        runs.append(secs)
    medians = [statistics.median(r[i] for r in runs) for i in range(args.batches)]
    print(f"{args.keys:,} keys, medians of {args.repeat} runs, batch by batch: "
          + ", ".join(f"{m:.3f} s" for m in medians))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

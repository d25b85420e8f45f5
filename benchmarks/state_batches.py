"""The state row of ``make bench``, repeated: a run's first and second 100K-event batch over
N keys of GROUP BY state, each run on a fresh copy of the same primed warehouse.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/state_batches.py \
        [--keys 2000000 --batches 2 --repeat 5 --driver-rows N --out /tmp/octo-state-batches]

``keyed_agg.py`` takes the median of 3 runs per figure; on a noisy machine one run of the
same code moved 2-4x. Here one priming of N keys (``keyed_agg``'s query and data) is kept,
and ``--repeat`` runs of ``--batches`` batches each start from a copy of it, after a
warm-up run on a small separate table; each run's batch seconds are printed, then their
medians. To compare two checkouts, run it with each first on ``PYTHONPATH``, in turn, from a
directory outside both (Spark's workers put the directory they start in first on their
path). ``--driver-rows 0`` runs every batch on the
Spark path (the priming run stays on the driver path).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import keyed_agg  # noqa: E402
from common import batch_seconds, log, run_octo, session  # noqa: E402

BATCH = 100_000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--driver-rows", type=int, default=None,
                   help="octo's driver_rows for the timed runs (0: the Spark path)")
    p.add_argument("--out", default="/tmp/octo-state-batches")
    args = p.parse_args(argv)
    spark = session()
    root = Path(args.out)
    state = keyed_agg.PrimedState.make(spark, root / f"state-{args.keys}", args.keys,
                                       args.batches, BATCH, np.random.default_rng(7),
                                       reuse=True)
    warm = keyed_agg.PrimedState.make(spark, root / "warm", 50_000, 1, BATCH,
                                      np.random.default_rng(1))
    warm.fresh([1])
    run_octo(spark, warm.project, warm.warehouse)
    runs = []
    for r in range(args.repeat):
        state.fresh(range(1, args.batches + 1))
        opts = {} if args.driver_rows is None else {"driver_rows": args.driver_rows}
        secs = batch_seconds(run_octo(spark, state.project, state.warehouse, **opts))
        log(f"run {r}: {', '.join(f'{s:.3f}' for s in secs)} s")
        runs.append(secs)
    medians = [statistics.median(r[i] for r in runs) for i in range(args.batches)]
    print(f"{args.keys:,} keys, medians of {args.repeat} runs, batch by batch: "
          + ", ".join(f"{m:.3f} s" for m in medians))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

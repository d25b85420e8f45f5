"""One-row batches on a table with a join and an aggregate: seconds from a batch's start to
its last commit (issue 9 target: ≤ 0.4 s).

    PYSPARK_PYTHON=$(which python) python benchmarks/one_row.py \
        [--history-events 100000 --warmup 3 --rows 9 --out /tmp/octo-bench/one_row] \
        [--conf KEY=VALUE ...] [--driver-rows N]

The table is Nexmark q4 (``auctions JOIN bids`` with a MAX per auction, then an AVG per
category; see nexmark_joins.py) over Parquet sources with ``max_files_per_batch = '1'``.
A history of ``--history-events`` events (one batch, seeded ``nexmark_data`` input) is
loaded first (not timed), then ``--warmup`` + ``--rows`` files of one bid each are added and
octo catches up in one run: one batch per file, each bid on an existing auction at a price
above any reserve and any earlier bid, so every batch changes both aggregates and commits
change events. The figure is the median of the last ``--rows`` batches' reported seconds
(``BatchStats.seconds``: start of the batch to its last commit). Then one more one-row run is
made with its Spark jobs counted, and one with nothing to do. Finally octo's result must equal
the query run as a Spark batch job. ``--driver-rows 0`` runs every batch on the Spark path
(octo's default runs these batches in the driver).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import nexmark_data as nd
from connectors.generators.nexmark import BIDS_DDL, arrow_schema
from common import (
    Target,
    batch_jobs,
    batch_seconds,
    count_jobs,
    env_info,
    finish,
    jsonable,
    log,
    run_octo,
    session,
    stats,
)
from nexmark_joins import Q4, baseline_result, octo_result, same_multiset, write_project

GOAL_S = 0.2  # issue 20 (issue 9: 0.4)


def _one_bid(auction: int, price: int, i: int) -> pa.Table:
    schema = arrow_schema(BIDS_DDL)
    ts = (nd.BASE_EPOCH + 10**8 + i) * 1_000_000
    return pa.table({"auction": [auction], "bidder": [100], "price": [price], "channel": ["apple"],
                     "url": [f"https://www.nexmark.com/apple/item.htm?query={auction}"],
                     "date_time": pa.array([ts], pa.timestamp("us", tz="UTC"))}, schema=schema)


def measure(spark: Any, out: Path, *, history_events: int = 100_000, warmup: int = 3,
            rows: int = 9, seed: int = 11, driver_rows: int | None = None) -> dict[str, Any]:
    opts = {} if driver_rows is None else {"driver_rows": driver_rows}
    workdir = out / "runs"
    shutil.rmtree(workdir, ignore_errors=True)
    input_dir = workdir / "input"
    gen = nd.FastNexmark(seed=seed)
    data = gen.batch(0, nd.bids_for_events(history_events))
    paths = nd.write_batch({k: data[k] for k in ("auctions", "bids")}, input_dir, 0)
    project = write_project(input_dir, workdir, {"q4": Q4})
    warehouse = workdir / "warehouse"
    report = run_octo(spark, project, warehouse, ["q4"], **opts)
    log(f"[one_row] history: {data['auctions'].num_rows + data['bids'].num_rows} events, "
        f"{len(batch_seconds(report))} batch(es), {sum(batch_seconds(report)):.1f}s")
    files = {"auctions": [paths["auctions"]], "bids": [paths["bids"]]}
    auctions = data["auctions"]["id"].to_pylist()

    def add_bid(i: int) -> None:
        path = input_dir / "bids" / f"part-{i:05d}.parquet"
        pq.write_table(_one_bid(auctions[(i * 7919) % len(auctions)], 200_000 + i, i), path)
        files["bids"].append(str(path))

    n = warmup + rows
    for i in range(1, n + 1):
        add_bid(i)
    run = run_octo(spark, project, warehouse, ["q4"], **opts)
    secs = batch_seconds(run)
    if len(secs) != n:
        raise RuntimeError(f"{n} one-row files gave {len(secs)} batches")
    measured = secs[warmup:]
    log(f"[one_row] {rows} one-row batches (after {warmup} warm-up): median "
        f"{statistics.median(measured):.3f}s, all {[round(s, 3) for s in secs]}")
    add_bid(n + 1)
    jobs, report = count_jobs(spark, lambda: run_octo(spark, project, warehouse, ["q4"], **opts))
    idle, _ = count_jobs(spark, lambda: run_octo(spark, project, warehouse, ["q4"], **opts))
    want = baseline_result(spark, files, len(files["bids"]), "q4")
    got = octo_result(warehouse, "q4", list(want[0]) if want else [])
    correct = same_multiset(got, want)
    log(f"[one_row] one-row run: {jobs} Spark jobs, idle run {idle}; result equal={correct}")
    return {"params": {"history_events": history_events, "warmup": warmup, "rows": rows,
                       "seed": seed, "driver_rows": driver_rows},
            "batch_s": secs, "measured": stats(measured),
            "jobs_one_batch_run": jobs, "jobs_idle_run": idle,
            "runtime_jobs": batch_jobs(report), "runtime_jobs_measured": batch_jobs(run),
            "jobs_batch_s": batch_seconds(report), "correct": correct}


def targets(res: dict[str, Any]) -> list[Target]:
    p = res["params"]
    hist = p["history_events"]
    one, idle = res["jobs_one_batch_run"], res["jobs_idle_run"]
    own = res.get("runtime_jobs")
    return [Target(
        "one_row_batch", f"one-row batch, join + aggregate (Nexmark q4, {hist / 1e3:g}K events "
        "of history): batch start to last commit", "max", "s", res["measured"]["p50"], None,
        GOAL_S, "ok" if res["correct"] else "wrong result",
        note=f"median of {p['rows']} batches after {p['warmup']} warm-up (max "
             f"{res['measured']['max']} s); a one-row run started {one} Spark jobs"
             + (f" (the runtime's own count for the batch: {own[0]})" if own else "")
             + f", a run with nothing to do {idle}",
        details=res)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history-events", type=int, default=100_000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rows", type=int, default=9)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench/one_row"))
    ap.add_argument("--driver-rows", type=int, default=None,
                    help="octo's driver_rows (0: every batch on the Spark path)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the session (repeatable), e.g. to compare "
                         "spark.sql.codegen.cache.maxEntries=100 with octo's default")
    args = ap.parse_args(argv)
    spark = session(dict(c.split("=", 1) for c in args.conf))
    try:
        env = env_info(spark)
        res = measure(spark, args.out, history_events=args.history_events, warmup=args.warmup,
                      rows=args.rows, seed=args.seed, driver_rows=args.driver_rows)
    finally:
        spark.stop()
    return finish(args.out, res, env, targets(res), "issue 9 target (one-row batch)",
                  params=jsonable(vars(args)))


if __name__ == "__main__":
    sys.exit(main())

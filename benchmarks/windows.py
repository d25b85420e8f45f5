"""Tumbling-window benchmark (issue 10): the OctoSQL thesis' "simple query" on octo and on
Spark's native streaming ``window()`` with a watermark.

    PYSPARK_PYTHON=$(which python) python benchmarks/windows.py \
        [--goals 300000 --teams 1000 --files 30 --minutes 60 --out /tmp/octo-bench/windows] \
        [--driver-rows N]

Workload: ``--goals`` goal events from ``--teams`` teams over ``--minutes`` minutes of event
time (in order but for up to 2 s of disorder), as ``--files`` parquet files; goals per team
per one-minute tumbling window, with a 5-second watermark delay, each window emitted once
when the watermark closes it:
  a) spark native   ``withWatermark`` + ``groupBy(window(ts, '1 minute'), team).count()``,
                    append mode, noop sink, one micro-batch per file;
  b) octo           ``FROM TUMBLE(goals, ts, INTERVAL '1' MINUTE) ... EMIT ON WINDOW CLOSE``,
                    one batch per file (changelog, current state and operator state in Delta);
  c) octo, 1 batch  the same, all files in one batch.
octo runs with the default ``driver_rows`` unless ``--driver-rows`` is given (0: every batch
on the Spark path).
Each runs once on a small input first (warm-up, not timed), in one local[2] session. Times
are the run's wall time (session start excluded) and the sum of its batches' times; octo's
result is checked against Spark's batch query over the same rows, restricted to the windows
the final watermark closed. OctoSQL's figure is the thesis' (≈14 s on a 4-core laptop, read
from its plot): the issue's goal is 10× faster than it and ≥ 0.8× Spark native.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import Target, batch_seconds, delta_rows, env_info, finish, generated, log, \
    mark_generated, run_octo, session

OCTOSQL_S = 14.0  # the thesis' best time for the simple query, as read from its plot
DELAY_S = 5
T0_US = 1_700_000_000_000_000


def generate(out_dir: Path, goals: int, teams: int, files: int, minutes: int,
             seed: int = 11) -> Path:
    """``files`` parquet files of goal events ``(team, player, ts)``; reused if unchanged."""
    params = {"goals": goals, "teams": teams, "files": files, "minutes": minutes, "seed": seed}
    if generated(out_dir, params):
        return out_dir
    rng = np.random.default_rng(seed)
    base = np.sort(rng.integers(0, minutes * 60_000_000, goals, dtype=np.int64))
    ts = T0_US + base + rng.integers(-2_000_000, 1, goals, dtype=np.int64)  # some disorder
    team = rng.integers(0, teams, goals, dtype=np.int64)
    player = rng.integers(0, 25, goals, dtype=np.int64)
    per_file = goals // files
    for i in range(files):
        lo, hi = i * per_file, goals if i == files - 1 else (i + 1) * per_file
        pq.write_table(pa.table({
            "team": team[lo:hi], "player": player[lo:hi],
            "ts": pa.array(ts[lo:hi], pa.timestamp("us", tz="UTC"))}),
            out_dir / f"part-{i:05d}.parquet")
    mark_generated(out_dir, params)
    return out_dir


def run_spark(spark: Any, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """(a) Spark's own event-time windows: append mode (a window once, when it closes)."""
    from pyspark.sql import functions as F

    stream = (spark.readStream.schema("team BIGINT, player BIGINT, ts TIMESTAMP")
              .option("maxFilesPerTrigger", 1).parquet(str(input_dir)))
    counts = (stream.withWatermark("ts", f"{DELAY_S} seconds")
              .groupBy(F.window("ts", "1 minute"), "team").count())
    t0 = time.perf_counter()
    q = (counts.writeStream.format("noop").outputMode("append").trigger(availableNow=True)
         .option("checkpointLocation", str(workdir / "ckpt")).start())
    q.awaitTermination()
    wall = time.perf_counter() - t0
    batches = [p["durationMs"]["triggerExecution"] / 1000 for p in q.recentProgress
               if p["numInputRows"] > 0]
    return {"wall_s": wall, "batch_sum_s": sum(batches), "batches": len(batches)}


def run_octo_windows(spark: Any, input_dir: Path, workdir: Path, per_batch: int,
                     **options: Any) -> dict[str, Any]:
    """(b)/(c) octo with ``per_batch`` files a batch."""
    project = workdir / "project"
    (project / "sql").mkdir(parents=True, exist_ok=True)
    (project / "sql" / "goals.sql").write_text(
        "CREATE SOURCE goals (team BIGINT, player BIGINT, ts TIMESTAMP,\n"
        f"    WATERMARK FOR ts AS ts - INTERVAL '{DELAY_S}' SECOND)\n"
        f"WITH (connector = 'files', path = '{input_dir.resolve()}', format = 'parquet', "
        f"max_files_per_batch = '{per_batch}');\n\n"
        "CREATE STREAMING TABLE goals_per_minute AS\n"
        "SELECT window_start, window_end, team, COUNT(*) AS goals\n"
        "FROM TUMBLE(goals, ts, INTERVAL '1' MINUTE)\n"
        "GROUP BY window_start, window_end, team\nEMIT ON WINDOW CLOSE;\n")
    t0 = time.perf_counter()
    report = run_octo(spark, project, workdir / "warehouse", **options)
    wall = time.perf_counter() - t0
    secs = batch_seconds(report)
    return {"wall_s": wall, "batch_sum_s": sum(secs), "batches": len(secs),
            "watermark": report.batches[-1].watermark if report.batches else None}


def check(spark: Any, input_dir: Path, workdir: Path, watermark: int) -> bool:
    """octo's rows == Spark's batch query over all rows, windows closed by ``watermark``."""
    from pyspark.sql import functions as F

    got = delta_rows(workdir / "warehouse" / "_current" / "goals_per_minute",
                     ["window_end", "team", "goals"]).to_pylist()
    want = (spark.read.parquet(str(input_dir)).groupBy(F.window("ts", "1 minute"), "team")
            .count().filter(F.expr(f"unix_micros(window.end) <= {watermark}")).collect())
    norm = {(r["window_end"].replace(tzinfo=None), r["team"], r["goals"]) for r in got}
    return norm == {(r["window"]["end"], r["team"], r["count"]) for r in want}


def measure(spark: Any, out: Path, *, goals: int, teams: int, files: int,
            minutes: int, **options: Any) -> dict[str, Any]:
    input_dir = generate(out / "input", goals, teams, files, minutes)
    warm = generate(out / "warmup", 30_000, teams, 6, 10, seed=12)
    runs = out / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    contenders = [("a) spark native", lambda d, w: run_spark(spark, d, w)),
                  ("b) octo", lambda d, w: run_octo_windows(spark, d, w, 1, **options)),
                  ("c) octo, one batch",
                   lambda d, w: run_octo_windows(spark, d, w, files, **options))]
    for i, (name, fn) in enumerate(contenders):
        log(f"[windows] warm-up {name}")
        fn(warm, runs / f"warmup-{i}")
    results: dict[str, dict[str, Any]] = {}
    for i, (name, fn) in enumerate(contenders):
        log(f"[windows] {name}: {goals} goals in {files} files")
        res = fn(input_dir, runs / f"run-{i}")
        res["events_per_s"] = round(goals / res["wall_s"])
        if "watermark" in res:
            res["correct"] = check(spark, input_dir, runs / f"run-{i}", res["watermark"])
        log(f"[windows] {name}: {res['wall_s']:.1f}s wall, {res['batch_sum_s']:.1f}s in "
            f"{res['batches']} batches, {res['events_per_s']} events/s")
        results[name[0]] = {k: round(v, 3) if isinstance(v, float) else v
                            for k, v in res.items()}
    return {"params": {"goals": goals, "teams": teams, "files": files, "minutes": minutes},
            "results": results}


def targets(res: dict[str, Any]) -> list[Target]:
    a, b, c = (res["results"][k] for k in "abc")
    ok = "ok" if b.get("correct") and c.get("correct") else "wrong result"
    size = f"{res['params']['goals']:,} goals, {res['params']['files']} batches"
    return [
        Target("windows_vs_native", f"tumbling window, EMIT ON WINDOW CLOSE vs Spark native "
               f"window() append mode ({size})", "ratio_min", "ev/s", b["events_per_s"],
               a["events_per_s"], 0.8, ok, details={"octo": b, "spark": a}),
        Target("windows_vs_octosql", "the same, all in one batch, vs OctoSQL's ≈14 s "
               "(thesis plot, 4 cores)", "ratio_max", "s", c["wall_s"], OCTOSQL_S, 0.1, ok,
               details={"octo_one_batch": c}),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--goals", type=int, default=300_000)
    ap.add_argument("--teams", type=int, default=1_000)
    ap.add_argument("--files", type=int, default=30)
    ap.add_argument("--minutes", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench/windows"))
    ap.add_argument("--driver-rows", type=int, default=None)
    args = ap.parse_args(argv)
    options = {} if args.driver_rows is None else {"driver_rows": args.driver_rows}
    spark = session()
    try:
        env = env_info(spark)
        res = measure(spark, args.out, goals=args.goals, teams=args.teams, files=args.files,
                      minutes=args.minutes, **options)
    finally:
        spark.stop()
    print(json.dumps(res["results"], indent=1))
    return finish(args.out, res, env, targets(res), "issue 10 targets (tumbling windows)")


if __name__ == "__main__":
    sys.exit(main())

"""Keyed-aggregation benchmark: Spark native streaming vs. hand-written Delta MERGE vs. octo.

    PYSPARK_PYTHON=$(which python) python benchmarks/keyed_agg.py \
        [--bids 2000000 --auctions 120000 --files 20 --out /tmp/octo-bench]

All contenders read the same parquet file stream (one micro-batch per file) in one SparkSession
(local[2]) and maintain `SELECT auction, COUNT(*), MAX(price) FROM bids GROUP BY auction`:
  a) spark-noop     native update-mode aggregation into the noop sink (lower bound, no output)
  b) spark+merge    (a) plus foreachBatch MERGE of the updated rows into Delta via delta-rs
  c) octo           octo_platform's changelog runner (hook below, not wired yet)
Session startup and a warm-up of every variant on a small separate input (100K bids) are
excluded from the timings.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_DDL = "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, date_time TIMESTAMP"
QUERY = "SELECT auction, COUNT(*) AS bids, MAX(price) AS top FROM bids GROUP BY auction"
WARMUP_BIDS = 100_000  # enough batches/rows for the JIT to compile the hot aggregation paths
CHANNELS = ["apple", "google", "facebook", "baidu", "other"]


def generate_bids(out_dir: Path, bids: int, auctions: int, files: int, seed: int = 42) -> Path:
    """Write `files` equal-sized parquet files of seeded bids; reuse them if parameters match."""
    params = {"bids": bids, "auctions": auctions, "files": files, "seed": seed, "version": 1}
    marker = out_dir.with_name(out_dir.name + ".params.json")  # outside the dir readers scan
    if marker.exists() and json.loads(marker.read_text()) == params:
        return out_dir
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    # Mild skew (density ~ id^(-1/3)): the lowest 1% of ids get ~4.6% of bids; ~all ids appear.
    auction = (rng.random(bids) ** 1.5 * auctions).astype(np.int64) + 1000
    bidder = rng.integers(1, max(2, bids // 20), bids, dtype=np.int64)
    price = np.round(rng.lognormal(6.0, 1.0, bids)).astype(np.int64) + 1
    channel = rng.integers(0, len(CHANNELS), bids, dtype=np.int32)
    t0_us = 1_700_000_000_000_000
    date_time = t0_us + np.sort(rng.integers(0, 3_600_000_000, bids, dtype=np.int64))
    per_file = bids // files
    for i in range(files):
        lo, hi = i * per_file, (bids if i == files - 1 else (i + 1) * per_file)
        table = pa.table({
            "auction": auction[lo:hi],
            "bidder": bidder[lo:hi],
            "price": price[lo:hi],
            "channel": pa.DictionaryArray.from_arrays(channel[lo:hi], CHANNELS).cast(pa.string()),
            "date_time": pa.array(date_time[lo:hi], pa.timestamp("us", tz="UTC")),
        })
        pq.write_table(table, out_dir / f"part-{i:05d}.parquet")
    marker.write_text(json.dumps(params))
    return out_dir


def _stream(spark: Any, input_dir: Path) -> Any:
    reader = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1)
    reader.parquet(str(input_dir)).createOrReplaceTempView("bids")
    return spark.sql(QUERY)


def _batch_times(query: Any) -> list[float]:
    return [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress
            if p["numInputRows"] > 0]


def run_spark_noop(spark: Any, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """(a) native update-mode aggregation into the noop sink."""
    q = (_stream(spark, input_dir).writeStream.format("noop").outputMode("update")
         .trigger(availableNow=True).option("checkpointLocation", str(workdir / "ckpt")).start())
    q.awaitTermination()
    return {"batch_s": _batch_times(q)}


def run_spark_merge(spark: Any, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """(b) native aggregation + foreachBatch MERGE into Delta with delta-rs (hand-written today)."""
    from deltalake import DeltaTable, write_deltalake

    table_path = str(workdir / "auction_stats")
    merge_s: list[float] = []

    def upsert(batch_df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        rows = batch_df.toArrow()
        if not DeltaTable.is_deltatable(table_path):
            write_deltalake(table_path, rows)
        else:
            (DeltaTable(table_path).merge(source=rows, predicate="t.auction = s.auction",
                                          source_alias="s", target_alias="t")
             .when_matched_update_all().when_not_matched_insert_all().execute())
        merge_s.append(time.perf_counter() - t0)

    q = (_stream(spark, input_dir).writeStream.foreachBatch(upsert).outputMode("update")
         .trigger(availableNow=True).option("checkpointLocation", str(workdir / "ckpt")).start())
    q.awaitTermination()
    final = DeltaTable(table_path).to_pyarrow_table(columns=["bids"])
    return {"batch_s": _batch_times(q), "foreach_batch_mean_s": statistics.fmean(merge_s),
            "result_rows": final.num_rows, "result_bids": int(final["bids"].to_numpy().sum())}


def write_octo_project(input_dir: Path, workdir: Path) -> Path:
    """Write an octo project (sql/bench.sql) that maintains the same aggregate; return its dir."""
    project = workdir / "project"
    (project / "sql").mkdir(parents=True, exist_ok=True)
    (project / "sql" / "bench.sql").write_text(
        f"CREATE SOURCE bids ({SCHEMA_DDL})\n"
        f"WITH (connector='files', path='{input_dir.resolve()}', format='parquet', "
        "max_files_per_batch='1');\n\n"
        f"CREATE STREAMING TABLE auction_stats AS {QUERY};\n")
    return project


def run_octo(spark: Any, input_dir: Path, workdir: Path) -> None:
    """(c) octo: changelog-producing aggregation with Delta state, one batch per file."""
    project = write_octo_project(input_dir, workdir)
    # TODO(octo runner): wire this once octo_platform.runtime.runner exists:
    #   from octo_platform.runtime.runner import run_tables
    #   run_tables(spark, project, warehouse=workdir / "warehouse", until_idle=True)
    # and return per-batch times (same shape as the other runners) plus a result check.
    del spark, project
    raise NotImplementedError("octo runner not wired yet")


def measure_batch_vs_state(spark: Any, workdir: Path, batch_events: int = 100_000,
                           state_keys: tuple[int, ...] = (100_000, 2_000_000)) -> dict[str, Any]:
    """Time of one `batch_events` batch when octo's GROUP BY state already holds N keys, per N.

    Plan: for each N, prime octo state with one file of N distinct auctions, then add one file of
    `batch_events` bids over keys drawn from those N and time that single batch. With state laid
    out as bucketed Delta tables, the batch time should grow far slower than N.
    """
    # TODO(octo runner): implement with write_octo_project + run_tables once octo is wired.
    del spark, workdir, batch_events, state_keys
    raise NotImplementedError("octo runner not wired yet")


def _timed(name: str, fn: Callable[[Any, Path, Path], Any], spark: Any, input_dir: Path,
           bids: int, workdir: Path) -> dict[str, Any]:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        extra = fn(spark, input_dir, workdir) or {}
    except NotImplementedError as exc:
        return {"contender": name, "status": f"skipped: {exc}"}
    wall = time.perf_counter() - t0
    times = extra.pop("batch_s", [])
    return {"contender": name, "status": "ok", "wall_s": round(wall, 3),
            "events_per_s": round(bids / wall), "batches": len(times),
            "batch_mean_s": round(statistics.fmean(times), 3) if times else None,
            "batch_median_s": round(statistics.median(times), 3) if times else None,
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in extra.items()}}


def _markdown(results: list[dict[str, Any]]) -> str:
    cols = ["contender", "status", "wall_s", "events_per_s", "batches", "batch_mean_s",
            "batch_median_s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in results]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bids", type=int, default=2_000_000)
    ap.add_argument("--auctions", type=int, default=120_000)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench"))
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    input_dir = generate_bids(args.out / "input", args.bids, args.auctions, args.files, args.seed)
    warm_dir = generate_bids(args.out / "warmup", WARMUP_BIDS, 5_000, 4, args.seed + 1)

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("octo-bench-keyed-agg")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "4g")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.numRecentProgressUpdates", "10000").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    contenders: list[tuple[str, Callable[[Any, Path, Path], Any]]] = [
        ("a) spark native, noop sink", run_spark_noop),
        ("b) spark native + delta-rs MERGE", run_spark_merge),
        ("c) octo", run_octo),
    ]
    try:
        for i, (name, fn) in enumerate(contenders):
            _timed(name, fn, spark, warm_dir, WARMUP_BIDS, args.out / "runs" / f"warmup-{i}")
        results = [_timed(name, fn, spark, input_dir, args.bids, args.out / "runs" / f"run-{i}")
                   for i, (name, fn) in enumerate(contenders)]
        state_vs_batch: dict[str, Any]
        try:
            state_vs_batch = measure_batch_vs_state(spark, args.out / "runs" / "state")
        except NotImplementedError as exc:
            state_vs_batch = {"status": f"skipped: {exc}"}
    finally:
        spark_version = spark.version
        spark.stop()

    import deltalake

    report = {"params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "env": {"spark": spark_version, "deltalake": deltalake.__version__,
                      "python": platform.python_version(), "cpus": os.cpu_count()},
              "results": results, "batch_vs_state": state_vs_batch}
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    print(f"\nkeyed_agg: {args.bids} bids, {args.auctions} auctions, {args.files} files "
          f"(spark {spark_version}, local[2])\n")
    print(_markdown(results))
    extras = {r["contender"]: {k: v for k, v in r.items() if k.startswith(("foreach", "result"))}
              for r in results}
    print("\nextra:", json.dumps({k: v for k, v in extras.items() if v}))
    print("batch_vs_state:", json.dumps(state_vs_batch))
    print(f"results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

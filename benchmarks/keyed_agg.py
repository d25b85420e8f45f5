"""Keyed-aggregation benchmark: Spark native streaming vs. hand-written Delta MERGE vs. octo.

    PYSPARK_PYTHON=$(which python) python benchmarks/keyed_agg.py \
        [--bids 2000000 --auctions 120000 --files 20 --out /tmp/octo-bench]

All contenders read the same parquet file stream (one micro-batch per file) in one SparkSession
(local[2]) and maintain `SELECT auction, COUNT(*), MAX(price) FROM bids GROUP BY auction`:
  a) spark-noop     native update-mode aggregation into the noop sink (lower bound, no output)
  b) spark+merge    (a) plus foreachBatch MERGE of the updated rows into Delta via delta-rs
  c) octo           octo: Debezium changelog + current state + operator state in Delta
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


def run_octo(spark: Any, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """(c) octo: changelog-producing aggregation with Delta state, one batch per file."""
    from deltalake import DeltaTable

    from octo_platform.runtime.runner import run_tables

    project = write_octo_project(input_dir, workdir)
    report = run_tables(spark, project, warehouse=str(workdir / "warehouse"), until_idle=True,
                        progress=None)
    final = DeltaTable(str(workdir / "warehouse" / "_current" / "auction_stats"))
    bids = final.to_pyarrow_table(columns=["bids"])
    return {"batch_s": [b.seconds for b in report.batches], "result_rows": bids.num_rows,
            "result_bids": int(bids["bids"].to_numpy().sum())}


def measure_batch_vs_state(spark: Any, workdir: Path, batch_events: int = 100_000,
                           state_keys: tuple[int, ...] = (100_000, 2_000_000)) -> dict[str, Any]:
    """Time of one ``batch_events`` batch when octo's GROUP BY state already holds N keys.

    For each N: one priming file with N distinct auctions builds the state (not timed), then
    one file of ``batch_events`` bids over keys drawn from those N is processed and timed.
    """
    from octo_platform.runtime.runner import run_tables

    rng = np.random.default_rng(7)
    out: dict[str, Any] = {}
    for n in state_keys:
        work = workdir / f"state-{n}"
        shutil.rmtree(work, ignore_errors=True)
        input_dir = work / "input"
        input_dir.mkdir(parents=True)
        _write_bids(input_dir / "part-00000.parquet", np.arange(n, dtype=np.int64), rng)
        project = write_octo_project(input_dir, work)
        run_tables(spark, project, warehouse=str(work / "warehouse"), progress=None)
        keys = rng.integers(0, n, batch_events, dtype=np.int64)
        _write_bids(input_dir / "part-00001.parquet", keys, rng)
        report = run_tables(spark, project, warehouse=str(work / "warehouse"), progress=None)
        out[f"batch_s_with_{n}_keys"] = round(report.batches[-1].seconds, 3)
    return out


def _write_bids(path: Path, auctions: Any, rng: Any) -> None:
    n = len(auctions)
    table = pa.table({
        "auction": pa.array(auctions, pa.int64()),
        "bidder": pa.array(rng.integers(0, 50_000, n), pa.int64()),
        "price": pa.array(rng.integers(1, 10_000, n), pa.int64()),
        "channel": pa.array(rng.choice(CHANNELS, n)),
        "date_time": pa.array(np.full(n, 1_700_000_000_000_000, dtype="datetime64[us]"),
                              pa.timestamp("us", tz="UTC")),
    })
    pq.write_table(table, path)


def _timed(name: str, fn: Callable[[Any, Path, Path], Any], spark: Any, input_dir: Path,
           bids: int, workdir: Path) -> dict[str, Any]:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    t0 = time.perf_counter()
    extra = fn(spark, input_dir, workdir) or {}
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

    from octo_platform.runtime.session import spark_session

    # One session, octo's local defaults (local[2], 2 shuffle partitions), for every contender.
    spark = spark_session(conf={"spark.sql.streaming.numRecentProgressUpdates": "10000"})
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
        state_vs_batch = measure_batch_vs_state(spark, args.out / "runs" / "state")
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
    rate = {r["contender"][0]: r.get("events_per_s") for r in results}
    if all(rate.get(k) for k in "abc"):
        print(f"octo / (a) = {rate['c'] / rate['a']:.2f}x (target >= 0.5x); "
              f"octo / (b) = {rate['c'] / rate['b']:.2f}x (target >= 1.0x)")
    print("batch_vs_state:", json.dumps(state_vs_batch))
    print(f"results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

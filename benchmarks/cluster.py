"""Keyed aggregation on a two-worker Spark cluster with its data in an object store:
octo vs Spark's own streaming, side by side in one application.

    PYSPARK_PYTHON=$(which python) python benchmarks/cluster.py \
        [--bids 1000000 --auctions 100000 --files 10 --workers 2 --conf KEY=VALUE ...
         --out /tmp/octo-bench/cluster]

What it starts (and stops): moto's S3 server on loopback (``tests/object_store.py``) and a
Spark standalone master with ``--workers`` workers of one core each (``deploy/standalone.sh``,
each worker's executors with a state cache of their own, as on separate machines). The
bids (``keyed_agg.py``'s generator: ``--files`` Parquet files) are uploaded to the bucket;
one SparkSession on the cluster then maintains ``SELECT auction, COUNT(*), MAX(price) FROM
bids GROUP BY auction``, one batch per file, twice:
  a) Spark native update-mode aggregation into the noop sink, its checkpoint in the bucket;
  b) octo with its defaults (``driver_rows`` 1M: these batches run on the driver path,
     which reads the files and the state from the bucket in the driver), its warehouse in
     the bucket;
  c) octo with every batch on the Spark path (``driver_rows=0``: what larger batches run).
Each side's first batch (executors' Python workers, S3A's first connections) is left out;
the figure is events per second over the median of the later batches. Also reported: the
share of (c)'s bucket tasks that found their state in their machine's cache (``x/y state
buckets cached`` of the batch line).
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from common import BENCH_CONF, Target, batches, env_info, finish, human, log, run_octo
from keyed_agg import QUERY, SCHEMA_DDL, generate_bids

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/object_store.py
from tests.object_store import object_store  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def standalone(directory: Path, workers: int) -> Iterator[str]:
    """``deploy/standalone.sh start`` on free ports (this process's environment, the
    object store's variables among it, goes to the workers and their executors); stopped on
    exit. Yields the master's URL."""
    port = _free_port()
    env = {**os.environ, "OCTO_CLUSTER_DIR": str(directory), "SPARK_WORKERS": str(workers),
           "SPARK_MASTER_HOST": "127.0.0.1", "SPARK_MASTER_PORT": str(port),
           "SPARK_MASTER_WEBUI_PORT": str(_free_port()),
           "SPARK_WORKER_WEBUI_PORT": str(_free_port()),
           "OCTO_BIN": str(Path(sys.executable).parent)}
    script = str(REPO / "deploy" / "standalone.sh")
    subprocess.run([script, "start"], env=env, check=True)
    try:
        yield f"spark://127.0.0.1:{port}"
    finally:
        subprocess.run([script, "stop"], env=env, check=False)


def run_native(spark: Any, data: str, checkpoint: str) -> list[float]:
    reader = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1)
    reader.parquet(data).createOrReplaceTempView("bids")
    q = (spark.sql(QUERY).writeStream.format("noop").outputMode("update")
         .trigger(availableNow=True).option("checkpointLocation", checkpoint).start())
    q.awaitTermination()
    return [p["durationMs"]["triggerExecution"] / 1000 for p in q.recentProgress
            if p["numInputRows"] > 0]


def run_octo_side(spark: Any, data: str, warehouse: str, project: Path,
                  driver_rows: int) -> dict[str, Any]:
    from deltalake import DeltaTable

    (project / "sql").mkdir(parents=True, exist_ok=True)
    (project / "sql" / "bench.sql").write_text(
        f"CREATE SOURCE bids ({SCHEMA_DDL})\n"
        f"WITH (connector='files', path='{data}', format='parquet', "
        "max_files_per_batch='1');\n\n"
        f"CREATE STREAMING TABLE auction_stats AS {QUERY};\n")
    report = run_octo(spark, project, warehouse, driver_rows=driver_rows)
    done = batches(report)
    bids = DeltaTable(f"{warehouse}/_current/auction_stats").to_pyarrow_table(columns=["bids"])
    return {"batch_s": [float(b.seconds) for b in done],
            "cached_buckets": [list(getattr(b, "cached_buckets", (0, 0))) for b in done],
            "paths": [b.path for b in done],
            "result_rows": bids.num_rows, "result_bids": int(bids["bids"].to_numpy().sum())}


def main(argv: list[str] | None = None) -> int:
    from octo_platform.runtime.driver import DEFAULT_DRIVER_ROWS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bids", type=int, default=1_000_000)
    ap.add_argument("--auctions", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting of the session (repeatable; e.g. "
                    "spark.sql.adaptive.enabled=true)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench/cluster"))
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    local = generate_bids(args.out / "bids", args.bids, args.auctions, args.files)
    shutil.rmtree(args.out / "cluster", ignore_errors=True)
    (args.out / "cluster").mkdir(parents=True)
    sides = {"defaults": DEFAULT_DRIVER_ROWS, "spark_path": 0}  # octo's driver_rows
    octo: dict[str, dict[str, Any]] = {}
    with object_store(args.out / "moto.log") as store:
        os.environ.update(store.env)
        from pyarrow import fs

        data = store.uri("bids")
        s3, prefix = fs.FileSystem.from_uri(data)
        fs.copy_files(str(local), prefix, destination_filesystem=s3)
        log(f"[cluster] {args.files} files of bids in {data}")
        with standalone(args.out / "cluster", args.workers) as master:
            from octo_platform.runtime.session import spark_session

            spark = spark_session(master=master, uris=[data], conf={
                **BENCH_CONF, "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                **dict(c.split("=", 1) for c in args.conf)})
            try:
                env = env_info(spark)
                log("[cluster] a) Spark native, noop sink")
                native = run_native(spark, data, store.uri("native-checkpoint"))
                log(f"[cluster] a) {statistics.median(native[1:]):.2f} s a batch")
                for side, rows in sides.items():
                    log(f"[cluster] octo, {side} (driver_rows {rows})")
                    shutil.rmtree(args.out / f"project-{side}", ignore_errors=True)
                    octo[side] = run_octo_side(spark, data, store.uri(f"warehouse-{side}"),
                                               args.out / f"project-{side}", rows)
                    log(f"[cluster] octo, {side}: "
                        f"{statistics.median(octo[side]['batch_s'][1:]):.2f} s a batch")
            finally:
                spark.stop()
    per_file = args.bids / args.files
    rate = {name: per_file / statistics.median(times[1:])
            for name, times in (("native", native),
                                *((side, got["batch_s"]) for side, got in octo.items()))}
    cached = octo["spark_path"]["cached_buckets"][1:]
    hits, lookups = (sum(c[i] for c in cached) for i in (0, 1))
    size = (f"{human(args.bids)} bids on {human(args.auctions)} auctions, "
            f"{args.files} batches, {args.workers} workers of 1 core")
    res = {"params": vars(args) | {"out": str(args.out)}, "native_batch_s": native,
           "octo": octo}
    how = {"defaults": f"with its defaults (driver_rows {sides['defaults']:,})",
           "spark_path": "on the Spark path (driver_rows 0)"}
    rows = [Target(f"cluster_keyed_agg_{side}_vs_native",
                   f"keyed aggregation on a Spark cluster, warehouse in S3 (moto), octo "
                   f"{how[side]} vs Spark native update mode reading the same files, "
                   f"checkpoint in S3 ({size})", "ratio_min", "ev/s", round(rate[side]),
                   round(rate["native"]), 0.8,
                   "ok" if octo[side]["result_bids"] == args.bids else "wrong result",
                   note=f"octo's batches ran on the "
                        f"{' and '.join(sorted(set(octo[side]['paths'])))} path")
            for side in sides]
    rows.append(Target(
        "cluster_state_cache_hits", "octo's Spark-path bucket tasks that found their state in "
        "their machine's cache, batches after the first", "info", "%",
        round(100 * hits / lookups, 1) if lookups else None,
        note=f"{hits} of {lookups} bucket lookups"))
    return finish(args.out, res, env, rows, "issue 62 cluster targets")


if __name__ == "__main__":
    sys.exit(main())

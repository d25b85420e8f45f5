"""Keyed aggregation on a two-worker Spark cluster with its data in an object store:
octo's Spark path vs Spark's own streaming, side by side in one application.

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
  b) octo, every batch on the Spark path (``driver_rows=0``), its warehouse in the bucket.
Each side's first batch (executors' Python workers, S3A's first connections) is left out;
the figure is events per second over the median of the later batches. Also reported: the
share of octo's bucket tasks that found their state in their machine's cache (``x/y state
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


def run_octo_side(spark: Any, data: str, warehouse: str, project: Path) -> dict[str, Any]:
    from deltalake import DeltaTable

    (project / "sql").mkdir(parents=True, exist_ok=True)
    (project / "sql" / "bench.sql").write_text(
        f"CREATE SOURCE bids ({SCHEMA_DDL})\n"
        f"WITH (connector='files', path='{data}', format='parquet', "
        "max_files_per_batch='1');\n\n"
        f"CREATE STREAMING TABLE auction_stats AS {QUERY};\n")
    report = run_octo(spark, project, warehouse, driver_rows=0)
    done = batches(report)
    bids = DeltaTable(f"{warehouse}/_current/auction_stats").to_pyarrow_table(columns=["bids"])
    return {"batch_s": [float(b.seconds) for b in done],
            "cached_buckets": [list(getattr(b, "cached_buckets", (0, 0))) for b in done],
            "result_rows": bids.num_rows, "result_bids": int(bids["bids"].to_numpy().sum())}


def main(argv: list[str] | None = None) -> int:
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
    shutil.rmtree(args.out / "project", ignore_errors=True)
    (args.out / "cluster").mkdir(parents=True)
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
                log("[cluster] b) octo, Spark path")
                octo = run_octo_side(spark, data, store.uri("warehouse"), args.out / "project")
                log(f"[cluster] b) {statistics.median(octo['batch_s'][1:]):.2f} s a batch")
            finally:
                spark.stop()
    per_file = args.bids / args.files
    rate = {name: per_file / statistics.median(times[1:])
            for name, times in (("native", native), ("octo", octo["batch_s"]))}
    hits, lookups = (sum(c[i] for c in octo["cached_buckets"][1:]) for i in (0, 1))
    correct = octo["result_bids"] == args.bids
    size = (f"{human(args.bids)} bids on {human(args.auctions)} auctions, "
            f"{args.files} batches, {args.workers} workers of 1 core")
    res = {"params": vars(args) | {"out": str(args.out)}, "native_batch_s": native,
           "octo": octo}
    rows = [
        Target("cluster_keyed_agg_vs_native",
               f"keyed aggregation on a Spark cluster, warehouse in S3 (moto), Spark path vs "
               f"Spark native update mode reading the same files, checkpoint in S3 ({size})",
               "ratio_min", "ev/s", round(rate["octo"]), round(rate["native"]), 0.8,
               "ok" if correct else "wrong result"),
        Target("cluster_state_cache_hits",
               "octo's bucket tasks that found their state in their machine's cache, "
               "batches after the first", "info", "%",
               round(100 * hits / lookups, 1) if lookups else None,
               note=f"{hits} of {lookups} bucket lookups"),
    ]
    return finish(args.out, res, env, rows, "issue 62 cluster targets")


if __name__ == "__main__":
    sys.exit(main())

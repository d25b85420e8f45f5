"""Planning a `delta` source's version diff on the Spark path: new frames vs kept ones.

A table with deletion vectors and column mapping (read by Spark's Delta reader, as octo
reads such a source) gets a few UPDATEs; then the diff of two versions (each row's count in
the newer minus the older, as ``connectors.delta_table`` builds it) is set up as a lazy
local checkpoint (what a batch does with its inputs: Spark plans it), ``--repeat`` times:

- ``new frames``: each time a fresh ``spark.read.format("delta").option("versionAsOf")``
  of both versions (octo before ``version_frame``): Delta builds both snapshots again;
- ``kept frames``: both versions through ``connectors.delta_table.version_frame`` (the
  frames, and the snapshots Delta built with them, kept for the session).

Prints each setup's seconds and the Spark jobs it ran.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/delta_versions.py
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import log, session  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default="/tmp/octo-delta-versions")
    args = p.parse_args(argv)
    from connectors.delta_table import version_frame
    from state.delta import DeltaStore

    spark = session()
    path = Path(args.out) / "dim"
    shutil.rmtree(path, ignore_errors=True)
    spark.sql(f"CREATE TABLE delta.`{path}` (K BIGINT, Name STRING, tier INT) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', "
              "'delta.columnMapping.mode' = 'name')")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES "
              + ", ".join(f"({k}, 'n{k}', {k % 3})" for k in range(1, 101)))
    for k in range(1, 4):
        spark.sql(f"UPDATE delta.`{path}` SET tier = tier + 1 WHERE K = {k}")
    table_id = DeltaStore().table_info(str(path))["id"]
    sc = spark.sparkContext

    def diff(new, old):
        both = new.selectExpr("K", "Name", "tier", "1 AS w").unionByName(
            old.selectExpr("K", "Name", "tier", "-1 AS w"))
        return both.groupBy("K", "Name", "tier").agg({"w": "sum"}).filter("`sum(w)` != 0")

    def fresh(v: int):
        return spark.read.format("delta").option("versionAsOf", v).load(str(path))

    def kept(v: int):
        return version_frame(spark, str(path), table_id, v)

    for name, read in (("new frames", fresh), ("kept frames", kept)):
        secs, jobs = [], []
        for i in range(args.repeat + 1):  # the first: a warm-up (and the kept frames' first)
            group = f"{name}-{i}"
            sc.setJobGroup(group, group)
            t0 = time.perf_counter()
            diff(read(4), read(3)).localCheckpoint(eager=False)
            if i:
                secs.append(time.perf_counter() - t0)
                jobs.append(len(sc.statusTracker().getJobIdsForGroup(group)))
        log(f"[delta_versions] {name}: setup of a diff's checkpoint median "
            f"{statistics.median(secs):.3f} s (all {[round(s, 3) for s in secs]}), "
            f"Spark jobs {statistics.median(jobs):g}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

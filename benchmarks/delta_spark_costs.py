"""What delta-spark costs for a current-state table, before octo writes one with it (issue 21).

A current-state table of ``K`` keys (``k, n, total``, partitioned by ``_bucket``, written by
delta-rs as octo writes ``_current``), then a batch that updates ``--batch`` random keys, with
each writer, over 100K keys and over 2M keys (``--keys``):

- ``delta-rs rewrite``: what octo does today (copy-on-write): the buckets the batch touches
  are read, patched and rewritten, one commit that removes their old files;
- ``delta-spark MERGE``: ``MERGE INTO`` with deletion vectors on (the old rows are marked
  deleted in DV files, the new rows appended);

(``DELETE`` takes no subquery, so ``DELETE ... WHERE k IN (batch)`` plus an append is not
measured: a MERGE that deletes is the same plan as the MERGE above.)
plus the fixed cost of one small commit (a 1-row append) with each library. Every figure is
the median of ``--repeat`` batches in one session, after one warm-up batch.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/delta_spark_costs.py
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import log, repeated, session  # noqa: E402

BUCKETS = 8


def table(n: int, seed: int):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    k = np.arange(n, dtype=np.int64)
    return pa.table({"k": k, "n": rng.integers(1, 100, n), "total": rng.integers(0, 10**6, n),
                     "_bucket": (k % BUCKETS).astype(np.int32)})


def timed(fn, repeat: int) -> float:
    return statistics.median(repeated(fn, repeat))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", default="100000,2000000")
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="/tmp/octo-delta-spark-costs")
    args = p.parse_args(argv)
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    spark = session()
    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(1)
    results: dict[str, dict[int, float]] = {}

    def note(what: str, keys: int, seconds: float) -> None:
        results.setdefault(what, {})[keys] = seconds
        log(f"{what}, {keys:,} keys: {seconds:.3f} s")

    for keys in [int(x) for x in args.keys.split(",")]:
        def batch():
            picked = rng.choice(keys, size=min(args.batch, keys), replace=False)
            return pa.table({"k": picked.astype(np.int64),
                             "n": rng.integers(1, 100, len(picked)),
                             "total": rng.integers(0, 10**6, len(picked)),
                             "_bucket": (picked % BUCKETS).astype(np.int32)})

        # delta-rs copy-on-write of the touched buckets (octo's _current today)
        rs = str(root / f"rs_{keys}")
        write_deltalake(rs, table(keys, 0), partition_by=["_bucket"])

        def rewrite():
            b = batch()
            dt = DeltaTable(rs)
            touched = sorted(set(pc.unique(b["_bucket"]).to_pylist()))
            old = dt.to_pyarrow_table(filters=[("_bucket", "in", touched)])
            keep = old.filter(pc.invert(pc.is_in(old["k"], b["k"])))
            write_deltalake(dt, pa.concat_tables([keep, b.select(keep.column_names)]),
                            mode="overwrite", partition_by=["_bucket"],
                            predicate=f"_bucket IN ({', '.join(map(str, touched))})")
        note("delta-rs rewrite", keys, timed(rewrite, args.repeat))
        assert DeltaTable(rs).to_pyarrow_table().num_rows == keys
        log(f"  delta-rs table at version {DeltaTable(rs).version()}, {keys:,} rows")

        # delta-spark with deletion vectors
        ds = str(root / f"spark_{keys}")
        write_deltalake(ds, table(keys, 0), partition_by=["_bucket"])
        spark.sql(f"ALTER TABLE delta.`{ds}` SET TBLPROPERTIES "
                  "('delta.enableDeletionVectors' = 'true')")

        def merge():
            spark.createDataFrame(batch()).createOrReplaceTempView("b")
            spark.sql(f"MERGE INTO delta.`{ds}` t USING b ON t.k = b.k AND t._bucket = "
                      "b._bucket WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
        note("delta-spark MERGE", keys, timed(merge, args.repeat))

        dvs = spark.sql(f"DESCRIBE HISTORY delta.`{ds}`").filter(
            "operation = 'MERGE'").select("operationMetrics").first()[0]
        log(f"  a MERGE's metrics: {dict(sorted(dvs.items()))}")
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{ds}`").first()
        log(f"  after the batches: {detail['numFiles']} files, "
            f"{spark.read.format('delta').load(ds).count():,} rows (Spark's read)")
        try:
            DeltaTable(ds).to_pyarrow_table()
            log("  delta-rs (to_pyarrow_table) reads it")
        except Exception as e:  # what octo's own reads would meet
            log(f"  delta-rs (to_pyarrow_table) refuses it: {str(e).splitlines()[0]}")

    one = pa.table({"k": [1], "n": [1], "total": [1], "_bucket": pa.array([1], pa.int32())})
    small = str(root / "small")
    write_deltalake(small, one, partition_by=["_bucket"])
    note("delta-rs 1-row append", 1, timed(lambda: write_deltalake(small, one, mode="append"),
                                           args.repeat * 3))
    df = spark.createDataFrame(one)
    note("delta-spark 1-row append", 1, timed(
        lambda: df.write.format("delta").mode("append").save(small), args.repeat * 3))
    note("delta-spark snapshot + count", 1, timed(
        lambda: spark.read.format("delta").load(small).count(), args.repeat * 3))

    print("what | " + " | ".join(f"{k:,} keys" for k in sorted({k for r in results.values()
                                                                 for k in r})))
    for what, by in results.items():
        print(f"{what} | " + " | ".join(f"{s:.3f} s" for _, s in sorted(by.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

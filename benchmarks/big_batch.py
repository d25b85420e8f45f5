"""One batch whose changelog is hundreds of MB, run with ``spark.driver.maxResultSize=16m``.

Proves the executor-side data path: nothing proportional to a batch's rows may pass through
the driver (issue 9). Writes ``--rows`` input rows as Parquet (pyarrow, no Spark), then runs
``octo run --all --until-idle --conf spark.driver.maxResultSize=16m`` in a fresh process over
a project with a stateless copy of the rows and an aggregate with one group per row, in ONE
batch; reports success, seconds and the bytes of each table written.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/big_batch.py [--rows 3000000]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

SQL = """
CREATE SOURCE src (id BIGINT, k BIGINT, name STRING, v DOUBLE)
WITH (connector = 'files', path = 'data', format = 'parquet');
CREATE STREAMING TABLE copied AS
SELECT id, k, name, v, concat(name, '-', CAST(k AS STRING)) AS label FROM src;
CREATE STREAMING TABLE per_id AS SELECT id, COUNT(*) AS n, SUM(v) AS total FROM src GROUP BY id;
"""


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.parquet")) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=3_000_000)
    p.add_argument("--files", type=int, default=6)
    p.add_argument("--max-result-size", default="16m")
    p.add_argument("--out", default="/tmp/octo-big-batch")
    args = p.parse_args(argv)
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "t.sql").write_text(SQL)
    (root / "data").mkdir()
    rng = np.random.default_rng(7)
    per = args.rows // args.files
    for i in range(args.files):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        names = pa.array([f"customer-{x:09d}-{'x' * 24}" for x in ids])
        pq.write_table(pa.table({"id": ids, "k": rng.integers(0, 1000, per), "name": names,
                                 "v": rng.random(per)}), root / "data" / f"part-{i}.parquet")
    octo = Path(sys.executable).with_name("octo")
    cmd = [str(octo), "run", "--all", "--until-idle", "--project", str(root),
           "--conf", f"spark.driver.maxResultSize={args.max_result_size}"]
    started = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    wh = root / "warehouse"
    result = {
        "rows": per * args.files, "max_result_size": args.max_result_size,
        "ok": res.returncode == 0, "seconds": round(seconds, 1),
        "changelog_mb": {t: round(_bytes(wh / t) / 1e6, 1) for t in ("copied", "per_id")},
        "current_mb": {t: round(_bytes(wh / "_current" / t) / 1e6, 1)
                       for t in ("copied", "per_id")},
        "state_mb": round(_bytes(wh / "_octo" / "per_id" / "state") / 1e6, 1),
        "batch_lines": [ln for ln in res.stdout.splitlines() if "] batch " in ln],
    }
    if res.returncode:
        result["error"] = (res.stderr or res.stdout)[-2000:]
    print(json.dumps(result, indent=2))
    return 0 if res.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Nexmark q3/q4 benchmark: octo's incremental maintenance vs. recomputing the SQL per batch.

    PYSPARK_PYTHON=$(which python) python benchmarks/nexmark_joins.py \
        [--bids 1000000 --batches 10 --buckets 8 --out /tmp/octo-bench-joins]

Input (connectors/generators/nexmark.py, seeded, written once before the run and reused while
the parameters match): per batch one file per source, Nexmark proportions 1 person : 3
auctions : 46 bids (Parquet), plus a Debezium JSON feed of a mutable auctions table
(``auctions_cdc``; with B bids per batch: a snapshot of B/20 rows in batch 0, then per batch
B/100 creates, B/250 updates and B/500 deletes; updates move rows between categories and
collapse/raise reserves). Every source has ``max_files_per_batch = '1'``,
so octo batch i reads file i of each of its sources.

    q3  SELECT p.name, p.city, p.state, a.id FROM auctions_cdc a JOIN persons p
        ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')
        (updating auctions joined with append-only persons)
    q4  SELECT q.category, AVG(q.final) AS avg_final FROM (SELECT a.id, a.category,
        MAX(b.price) AS final FROM auctions a JOIN bids b ON a.id = b.auction
        AND b.price >= a.reserve GROUP BY a.id, a.category) q GROUP BY q.category
        (append-only auctions and bids: the generator's bids refer to those auctions)

octo runs both streaming tables until idle (q3 then q4, each its own batches). The baseline,
in the same local[2] SparkSession, runs the same SELECT as a Spark batch query over the input
prefix of every batch (files 0..i of each source; the CDC feed's live rows are the last event
per id by file order and line, deletes dropped) into the noop sink and times it. At the end,
octo's current tables must equal the batch results over all input (as multisets). A warm-up of
both on a small separate input is excluded from the timings. Results: ``<out>/results.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from connectors.generators.nexmark import (
    AUCTIONS_DDL,
    BIDS_DDL,
    PERSONS_DDL,
    NexmarkGenerator,
    arrow_schema,
    write_debezium,
    write_parquet,
)

Q3 = ("SELECT p.name, p.city, p.state, a.id FROM auctions_cdc a JOIN persons p "
      "ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')")
Q4 = ("SELECT q.category, AVG(q.final) AS avg_final FROM (SELECT a.id, a.category, "
      "MAX(b.price) AS final FROM auctions a JOIN bids b ON a.id = b.auction "
      "AND b.price >= a.reserve GROUP BY a.id, a.category) q GROUP BY q.category")
QUERIES = {"q3": Q3, "q4": Q4}
# Which sources each query reads (each source is read by exactly one of them).
QUERY_SOURCES = {"q3": ("persons", "auctions_cdc"), "q4": ("auctions", "bids")}
SOURCES = {  # name -> (DDL, format)
    "persons": (PERSONS_DDL, "parquet"),
    "auctions": (AUCTIONS_DDL, "parquet"),
    "bids": (BIDS_DDL, "parquet"),
    "auctions_cdc": (AUCTIONS_DDL, "debezium-json"),
}
GEN_VERSION = 1
WARMUP = {"bids": 20_000, "batches": 2}


# -- input ------------------------------------------------------------------------------------
def generate_input(out_dir: Path, bids: int, batches: int, seed: int,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Write the per-batch files of every source (reused if the parameters match).

    Returns ``{"files": {source: [path per batch]}, "counts": {source: [events per batch]}}``.
    """
    params = {"bids": bids, "batches": batches, "seed": seed, "version": GEN_VERSION}
    marker = out_dir.with_name(out_dir.name + ".manifest.json")  # outside the dirs read
    if marker.exists():
        manifest = json.loads(marker.read_text())
        if manifest.get("params") == params and all(
                os.path.exists(f) for fs in manifest["files"].values() for f in fs):
            log(f"input: reusing {out_dir} ({_total(manifest['counts'])} events)")
            return manifest
    shutil.rmtree(out_dir, ignore_errors=True)
    marker.unlink(missing_ok=True)
    gen = NexmarkGenerator(seed=seed)
    files: dict[str, list[str]] = {s: [] for s in SOURCES}
    counts: dict[str, list[int]] = {s: [] for s in SOURCES}
    per_batch = bids // batches
    t0 = time.perf_counter()
    for i in range(batches):
        n_bids = per_batch if i < batches - 1 else bids - per_batch * (batches - 1)
        gen.begin_round(i)
        rows = {"persons": gen.persons(max(1, n_bids // 46)),
                "auctions": gen.auctions(max(1, n_bids * 3 // 46)),
                "bids": gen.bids(n_bids)}
        if i == 0:
            gen.seed_cdc(max(10, n_bids // 20))
            events = gen.snapshot_events() + gen.auction_changes(
                0, 0, n_creates=max(1, n_bids // 100))
        else:
            events = gen.auction_changes(max(1, n_bids // 250), max(1, n_bids // 500),
                                         n_creates=max(1, n_bids // 100))
        for name, data in rows.items():
            files[name].append(write_parquet(data, out_dir / name,
                                             schema=arrow_schema(SOURCES[name][0])))
            counts[name].append(len(data))
        files["auctions_cdc"].append(write_debezium(events, out_dir / "auctions_cdc"))
        counts["auctions_cdc"].append(len(events))
        log(f"input: batch {i + 1}/{batches} written "
            f"({sum(c[-1] for c in counts.values())} events, {time.perf_counter() - t0:.1f}s)")
    manifest = {"params": params, "files": files, "counts": counts}
    marker.write_text(json.dumps(manifest))
    return manifest


def _total(counts: dict[str, list[int]], sources: tuple[str, ...] | None = None) -> int:
    return sum(sum(v) for k, v in counts.items() if sources is None or k in sources)


def write_project(input_dir: Path, workdir: Path) -> Path:
    """An octo project with the four sources (one file per batch each) and q3, q4."""
    project = workdir / "project"
    (project / "sql").mkdir(parents=True, exist_ok=True)
    decls = []
    for name, (ddl, fmt) in SOURCES.items():
        pk = ", primary_key = 'id'" if fmt == "debezium-json" else ""
        decls.append(f"CREATE SOURCE {name} ({ddl})\nWITH (connector = 'files', "
                     f"path = '{(input_dir / name).resolve()}', format = '{fmt}', "
                     f"max_files_per_batch = '1'{pk});\n")
    (project / "sql" / "sources.sql").write_text("\n".join(decls))
    for name, sql in QUERIES.items():
        (project / "sql" / f"{name}.sql").write_text(f"CREATE STREAMING TABLE {name} AS\n{sql};\n")
    return project


# -- octo -------------------------------------------------------------------------------------
def run_octo(spark: Any, project: Path, warehouse: Path, buckets: int,
             log: Callable[[str], None]) -> dict[str, Any]:
    """Run q3 then q4 until idle; per table: wall time and per-batch (rows_in, seconds)."""
    from octo_platform.runtime.runner import run_tables

    out: dict[str, Any] = {}
    for name in QUERIES:
        t0 = time.perf_counter()
        report = run_tables(spark, project, warehouse=str(warehouse), names=[name],
                            until_idle=True, buckets=buckets, progress=log)
        wall = time.perf_counter() - t0
        out[name] = {"wall_s": wall,
                     "batch_s": [b.seconds for b in report.for_table(name)],
                     "rows_in": [b.rows_in for b in report.for_table(name)],
                     "dead_letters": report.dead_letters}
    return out


def state_bytes(warehouse: Path, table: str) -> dict[str, int]:
    """Bytes under ``_octo/<table>/state`` (everything on disk) and in live files only."""
    from deltalake import DeltaTable

    root = warehouse / "_octo" / table / "state"
    on_disk = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    live = 0
    for op in sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []:
        actions = DeltaTable(str(op)).get_add_actions(flatten=True)
        live += sum(actions.column("size_bytes").to_pylist())
    return {"on_disk": on_disk, "live": live}


def octo_result(warehouse: Path, table: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    rows = DeltaTable(str(warehouse / "_current" / table)).to_pyarrow_table()
    return rows.drop_columns([c for c in rows.column_names if c == "_bucket"]).to_pylist()


# -- baseline ---------------------------------------------------------------------------------
def _envelope(ddl: str) -> str:
    row = "struct<" + ", ".join(f"{n}: {t}" for n, t in (c.split() for c in ddl.split(","))) + ">"
    return f"before {row}, after {row}, op STRING, ts_ms BIGINT"


def register_prefix(spark: Any, files: dict[str, list[str]], n: int,
                    sources: tuple[str, ...]) -> None:
    """Temp views of ``sources`` over their first ``n`` files (the CDC feed as live rows)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    for name in sources:
        ddl, fmt = SOURCES[name]
        paths = files[name][:n]
        if fmt == "parquet":
            spark.read.schema(ddl).parquet(*paths).createOrReplaceTempView(name)
            continue
        # Last event per id in (file, line) order; file names sort in write order and a small
        # file is one partition, so monotonically_increasing_id follows its lines.
        events = spark.read.schema(_envelope(ddl)).json(paths).select(
            "op", "after", F.col("_metadata.file_name").alias("_file"),
            F.monotonically_increasing_id().alias("_line"),
            F.coalesce("after.id", "before.id").alias("_id"))
        latest = Window.partitionBy("_id").orderBy(F.desc("_file"), F.desc("_line"))
        (events.withColumn("_rank", F.row_number().over(latest))
         .filter("_rank = 1 AND op <> 'd'").select("after.*")
         .createOrReplaceTempView(name))


def run_baseline(spark: Any, files: dict[str, list[str]], batches: int,
                 log: Callable[[str], None]) -> dict[str, Any]:
    """Per query: the time of recomputing it from scratch over each batch prefix."""
    out: dict[str, Any] = {name: {"batch_s": []} for name in QUERIES}
    for i in range(batches):
        for name, sql in QUERIES.items():
            t0 = time.perf_counter()
            register_prefix(spark, files, i + 1, QUERY_SOURCES[name])
            spark.sql(sql).write.format("noop").mode("overwrite").save()
            took = time.perf_counter() - t0
            out[name]["batch_s"].append(took)
            log(f"[baseline {name}] prefix {i + 1}/{batches}: {took:.2f}s")
    return out


def baseline_result(spark: Any, files: dict[str, list[str]], name: str) -> list[dict[str, Any]]:
    register_prefix(spark, files, len(files["bids"]), QUERY_SOURCES[name])
    return [r.asDict() for r in spark.sql(QUERIES[name]).collect()]


# -- correctness ------------------------------------------------------------------------------
def same_multiset(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    """Equal as multisets of rows; floats compared rounded to 6 places, then by isclose."""
    if len(got) != len(want):
        return False
    cols = sorted(want[0]) if want else sorted(got[0]) if got else []
    if got and want and sorted(got[0]) != cols:
        return False

    def key(r: dict[str, Any], places: int) -> tuple:
        return tuple(round(r[c], places) if isinstance(r[c], float) else r[c] for c in cols)

    if Counter(key(r, 6) for r in got) == Counter(key(r, 6) for r in want):
        return True

    def sort_key(r: dict[str, Any]) -> tuple:
        return tuple((v is None, str(v)) for v in key(r, 3))

    for a, b in zip(sorted(got, key=sort_key), sorted(want, key=sort_key)):
        for c in cols:
            x, y = a[c], b[c]
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9):
                    return False
            elif x != y:
                return False
    return True


# -- report -----------------------------------------------------------------------------------
def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "p50": None, "max": None}
    return {"mean": round(statistics.fmean(xs), 3), "p50": round(statistics.median(xs), 3),
            "max": round(max(xs), 3)}


def summarize(manifest: dict[str, Any], octo: dict[str, Any], base: dict[str, Any],
              state: dict[str, Any], checks: dict[str, Any]) -> dict[str, Any]:
    counts = manifest["counts"]
    batches = len(counts["bids"])
    per_query = {}
    for name in QUERIES:
        events = _total(counts, QUERY_SOURCES[name])
        o, b = octo[name]["batch_s"], base[name]["batch_s"]
        ratios = [r / s for r, s in zip(b, o) if s > 0]
        expected_rows = [sum(counts[s][i] for s in QUERY_SOURCES[name]) for i in range(batches)]
        per_query[name] = {
            "events": events, "octo_wall_s": round(octo[name]["wall_s"], 3),
            "octo_events_per_s": round(events / octo[name]["wall_s"]),
            "octo_batches": len(o), "octo_batch_s": _stats(o),
            "octo_batch_sum_s": round(sum(o), 3),
            "octo_batches_match_files": octo[name]["rows_in"] == expected_rows,
            "state_bytes": state[name]["on_disk"], "state_live_bytes": state[name]["live"],
            "recompute_batch_s": _stats(b), "recompute_sum_s": round(sum(b), 3),
            "ratio_recompute_over_octo": {**_stats(ratios),
                                          "last": round(ratios[-1], 2) if ratios else None},
            "result_rows": checks[name]["rows"], "correct": checks[name]["equal"],
        }
    total_events = _total(counts)
    total_wall = sum(octo[n]["wall_s"] for n in QUERIES)
    per_batch = []
    for i in range(batches):
        row: dict[str, Any] = {"batch": i, "events": sum(c[i] for c in counts.values())}
        for name in QUERIES:
            o = octo[name]["batch_s"][i] if i < len(octo[name]["batch_s"]) else None
            b = base[name]["batch_s"][i]
            row[f"octo_{name}_s"] = round(o, 3) if o is not None else None
            row[f"recompute_{name}_s"] = round(b, 3)
            row[f"ratio_{name}"] = round(b / o, 2) if o else None
        per_batch.append(row)
    return {"events": total_events, "events_by_source": {k: sum(v) for k, v in counts.items()},
            "octo_wall_s": round(total_wall, 3),
            "octo_events_per_s": round(total_events / total_wall),
            "queries": per_query, "per_batch": per_batch}


def _table(cols: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def print_summary(s: dict[str, Any]) -> None:
    cols = ["query", "events", "octo wall s", "events/s", "batch mean/p50/max s",
            "state bytes (live)", "recompute mean/p50/max s", "recompute/octo mean / last",
            "correct"]
    rows = []
    for name, q in s["queries"].items():
        ob, rb, ra = q["octo_batch_s"], q["recompute_batch_s"], q["ratio_recompute_over_octo"]
        rows.append([name, q["events"], q["octo_wall_s"], q["octo_events_per_s"],
                     f"{ob['mean']} / {ob['p50']} / {ob['max']}",
                     f"{q['state_bytes']} ({q['state_live_bytes']})",
                     f"{rb['mean']} / {rb['p50']} / {rb['max']}",
                     f"{ra['mean']} / {ra['last']}", q["correct"]])
    rows.append(["both", s["events"], s["octo_wall_s"], s["octo_events_per_s"],
                 "", "", "", "", all(q["correct"] for q in s["queries"].values())])
    print(_table(cols, rows))
    print("\nper batch (seconds; ratio = recompute / octo):\n")
    keys = ["batch", "events"] + [f"{p}_{n}{x}" for n in QUERIES
                                  for p, x in (("octo", "_s"), ("recompute", "_s"), ("ratio", ""))]
    print(_table(keys, [[r[k] for k in keys] for r in s["per_batch"]]))


# -- main -------------------------------------------------------------------------------------
def run_all(spark: Any, out: Path, name: str, bids: int, batches: int, seed: int,
            buckets: int, log: Callable[[str], None]) -> dict[str, Any]:
    manifest = generate_input(out / f"{name}-input", bids, batches, seed, log)
    workdir = out / "runs" / name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    project = write_project(out / f"{name}-input", workdir)
    warehouse = workdir / "warehouse"
    log(f"octo: {name}, {_total(manifest['counts'])} events in {batches} batches")
    octo = run_octo(spark, project, warehouse, buckets, log)
    state = {n: state_bytes(warehouse, n) for n in QUERIES}
    log(f"baseline: {name}, Spark batch query over every prefix")
    base = run_baseline(spark, manifest["files"], batches, log)
    checks = {}
    for n in QUERIES:
        got, want = octo_result(warehouse, n), baseline_result(spark, manifest["files"], n)
        checks[n] = {"rows": len(want), "equal": same_multiset(got, want)}
        log(f"check {n}: octo {len(got)} rows, batch query {len(want)} rows, "
            f"equal={checks[n]['equal']}")
    return summarize(manifest, octo, base, state, checks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bids", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench-joins"))
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_start = os.getloadavg()  # a busy machine (other jobs on 2 cores) skews every timing

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {line}", flush=True)

    from octo_platform.runtime.session import spark_session

    spark = spark_session()  # octo's local defaults: local[2], 2 shuffle partitions
    try:
        if not args.no_warmup:
            run_all(spark, args.out, "warmup", WARMUP["bids"], WARMUP["batches"],
                    args.seed + 1, args.buckets, log)
        summary = run_all(spark, args.out, "main", args.bids, args.batches, args.seed,
                          args.buckets, log)
    finally:
        spark_version = spark.version
        spark.stop()

    import deltalake

    report = {"params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "env": {"spark": spark_version, "deltalake": deltalake.__version__,
                      "python": platform.python_version(), "cpus": os.cpu_count(),
                      "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
              "queries": QUERIES, **summary}
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    print(f"\nnexmark_joins: {summary['events']} events ({summary['events_by_source']}) in "
          f"{args.batches} batches (spark {spark_version}, local[2], {args.buckets} buckets; "
          f"load average {load_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end)\n")
    print_summary(summary)
    print(f"\nresults: {args.out / 'results.json'}")
    ok = all(q["correct"] for q in summary["queries"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

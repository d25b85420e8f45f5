"""Nexmark q3/q4 benchmark: octo's per-batch time vs. recomputing the SQL as a Spark batch job.

    PYSPARK_PYTHON=$(which python) python benchmarks/nexmark_joins.py [--scale small|full] \
        [--history-events N --history-batches N --batch-events N --measured-batches N] \
        [--buckets N --seed 7 --no-warmup --out /tmp/octo-bench/nexmark_joins]

Scales (issue 9's targets): ``small`` = 1M events of history, then 10K-event batches
(target: octo per batch ≤ 1× the recompute); ``full`` = 10M events of history, then
100K-event batches (target ≤ 0.2×). The ``--history-*``/``--batch-*`` options override a
scale's sizes (e.g. a quick check of the harness).

Input (``benchmarks/nexmark_data.py``, seeded, written once under ``<out>/data`` and reused
while the parameters match): per batch one file per source, Nexmark proportions 1 person :
3 auctions : 46 bids (Parquet), plus a Debezium JSON feed of a mutable auctions table
(``auctions_cdc``). Every source has ``max_files_per_batch = '1'``, so octo batch i reads
file i of each of its sources.

    q3  SELECT p.name, p.city, p.state, a.id FROM auctions_cdc a JOIN persons p
        ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')
        (updating auctions joined with append-only persons)
    q4  SELECT q.category, AVG(q.final) AS avg_final FROM (SELECT a.id, a.category,
        MAX(b.price) AS final FROM auctions a JOIN bids b ON a.id = b.auction
        AND b.price >= a.reserve GROUP BY a.id, a.category) q GROUP BY q.category

Phases, each query (q3, then q4) run on its own with ``run_tables(..., until_idle=True)``:
  1. history: the history's files (``--history-batches`` large batches) are put in the source
     directories and octo catches up (timed separately, not part of the target);
  2. measured: ``--measured-batches`` files of ``--batch-events`` events each are added and
     octo catches up; the per-batch figure is the median of the run's reported seconds per
     batch (``BatchStats.seconds``: the batch's start to its last commit);
  3. jobs: one more file of the same size is added and the Spark jobs of that one-batch run are
     counted, then those of a run with nothing to do (the run's fixed part);
  4. recompute: in the same local[2] session, for every measured batch i the same SELECT runs
     as a Spark batch query over all files up to it (history + measured 0..i; the CDC feed as
     its live rows: last event per id by file and line, deletes dropped) into the noop sink,
     timed; the baseline figure is the median;
  5. check: octo's ``_current`` tables must equal the batch query over all input (multisets).
A warm-up of both (a tiny history and two batches) runs first and is excluded.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nexmark_data as nd
from common import (
    Target,
    batch_jobs,
    batch_seconds,
    batches,
    count_jobs,
    delta_rows,
    env_info,
    human,
    jsonable,
    log,
    print_targets,
    run_octo,
    session,
    stats,
    write_json,
)

Q3 = ("SELECT p.name, p.city, p.state, a.id FROM auctions_cdc a JOIN persons p "
      "ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')")
Q4 = ("SELECT q.category, AVG(q.final) AS avg_final FROM (SELECT a.id, a.category, "
      "MAX(b.price) AS final FROM auctions a JOIN bids b ON a.id = b.auction "
      "AND b.price >= a.reserve GROUP BY a.id, a.category) q GROUP BY q.category")
QUERIES = {"q3": Q3, "q4": Q4}
# Which sources each query reads (each source is read by exactly one of them).
QUERY_SOURCES = {"q3": ("persons", "auctions_cdc"), "q4": ("auctions", "bids")}
SOURCES = nd.SOURCES
GEN_VERSION = 2  # 2: benchmarks/nexmark_data.py (vectorized), history + measured batches

# Issue 9's two sizes; `goal` (issue 20's): octo per-batch seconds / recompute seconds must be
# at most this.
SCALES: dict[str, dict[str, Any]] = {
    "small": {"history_events": 1_000_000, "history_batches": 4, "batch_events": 10_000,
              "measured_batches": 5, "goal": 0.5},
    "full": {"history_events": 10_000_000, "history_batches": 10, "batch_events": 100_000,
             "measured_batches": 5, "goal": 0.2},
}
WARMUP = {"history_events": 20_000, "history_batches": 1, "batch_events": 2_000,
          "measured_batches": 2}


# -- input ------------------------------------------------------------------------------------
def batch_plan(sizes: dict[str, Any]) -> dict[str, list[int]]:
    """Bids per batch for each phase: history, measured, jobs (one batch)."""
    h, n = sizes["history_events"], sizes["history_batches"]
    history = [nd.bids_for_events(h // n + (1 if i < h % n else 0)) for i in range(n)]
    batch = nd.bids_for_events(sizes["batch_events"])
    return {"history": history, "measured": [batch] * sizes["measured_batches"],
            "jobs": [batch]}


def generate_input(data_dir: Path, sizes: dict[str, Any], seed: int) -> dict[str, Any]:
    """Write every batch's files under ``data_dir`` (reused if the parameters match).

    Returns ``{"files": {source: [path per batch]}, "counts": {source: [events per batch]},
    "phases": {phase: [batch indexes]}}``.
    """
    plan = batch_plan(sizes)
    params = {"plan": plan, "seed": seed, "version": GEN_VERSION}
    marker = data_dir.with_name(data_dir.name + ".manifest.json")  # outside the dirs read
    if marker.exists():
        manifest = json.loads(marker.read_text())
        if manifest.get("params") == params and all(
                os.path.exists(f) for fs in manifest["files"].values() for f in fs):
            log(f"input: reusing {data_dir} ({_total(manifest['counts'])} events)")
            return manifest
    shutil.rmtree(data_dir, ignore_errors=True)
    marker.unlink(missing_ok=True)
    gen = nd.FastNexmark(seed=seed)
    files: dict[str, list[str]] = {s: [] for s in SOURCES}
    counts: dict[str, list[int]] = {s: [] for s in SOURCES}
    phases: dict[str, list[int]] = {}
    t0 = time.perf_counter()
    i = 0
    for phase, bids in plan.items():
        phases[phase] = []
        for n_bids in bids:
            data = gen.batch(i, n_bids)
            for name, path in nd.write_batch(data, data_dir, i).items():
                files[name].append(path)
                counts[name].append(nd.count(data[name]))
            phases[phase].append(i)
            i += 1
        log(f"input: {phase} written ({len(bids)} batches, "
            f"{sum(sum(c[j] for c in counts.values()) for j in phases[phase])} events, "
            f"{time.perf_counter() - t0:.1f}s so far)")
    manifest = {"params": params, "files": files, "counts": counts, "phases": phases,
                "generate_s": round(time.perf_counter() - t0, 1)}
    marker.write_text(json.dumps(manifest))
    return manifest


def _total(counts: dict[str, list[int]], sources: tuple[str, ...] | None = None,
           idx: list[int] | None = None) -> int:
    return sum(sum(v if idx is None else [v[i] for i in idx]) for k, v in counts.items()
               if sources is None or k in sources)


def release(manifest: dict[str, Any], idx: list[int], input_dir: Path) -> None:
    """Make batches ``idx`` visible to octo: link their files into the source directories."""
    for name, paths in manifest["files"].items():
        d = input_dir / name
        d.mkdir(parents=True, exist_ok=True)
        for i in idx:
            src = Path(paths[i])
            dst = d / src.name
            if dst.exists():
                continue
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)


def write_project(input_dir: Path, workdir: Path,
                  queries: dict[str, str] | None = None) -> Path:
    """An octo project with the sources of ``queries`` (default q3, q4; one file per batch
    each) and the queries as streaming tables."""
    queries = queries or QUERIES
    project = workdir / "project"
    (project / "sql").mkdir(parents=True, exist_ok=True)
    used = {s for q in queries for s in QUERY_SOURCES[q]}
    decls = []
    for name, (ddl, fmt) in SOURCES.items():
        if name not in used:
            continue
        pk = ", primary_key = 'id'" if fmt == "debezium-json" else ""
        decls.append(f"CREATE SOURCE {name} ({ddl})\nWITH (connector = 'files', "
                     f"path = '{(input_dir / name).resolve()}', format = '{fmt}', "
                     f"max_files_per_batch = '1'{pk});\n")
    (project / "sql" / "sources.sql").write_text("\n".join(decls))
    for name, sql in queries.items():
        (project / "sql" / f"{name}.sql").write_text(f"CREATE STREAMING TABLE {name} AS\n{sql};\n")
    return project


# -- octo -------------------------------------------------------------------------------------
def octo_phase(spark: Any, project: Path, warehouse: Path, name: str, opts: dict[str, Any],
               count: bool = False) -> dict[str, Any]:
    """Catch ``name`` up; its wall time, per-batch seconds and rows in (and Spark jobs)."""
    t0 = time.perf_counter()
    if count:
        jobs, report = count_jobs(spark, lambda: run_octo(spark, project, warehouse, [name],
                                                          **opts))
    else:
        jobs, report = None, run_octo(spark, project, warehouse, [name], **opts)
    return {"wall_s": time.perf_counter() - t0, "batch_s": batch_seconds(report, name),
            "rows_in": [getattr(b, "rows_in", None) for b in batches(report, name)],
            "runtime_jobs": batch_jobs(report, name),
            "dead_letters": getattr(report, "dead_letters", 0), "jobs": jobs}


def state_bytes(warehouse: Path, table: str) -> int:
    """Bytes of octo's files for ``table`` beside its changelog and current table."""
    root = warehouse / "_octo" / table
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def octo_result(warehouse: Path, table: str, columns: list[str]) -> list[dict[str, Any]]:
    return delta_rows(warehouse / "_current" / table, columns).to_pylist()


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


def recompute(spark: Any, files: dict[str, list[str]], n: int, name: str) -> float:
    """Seconds to run query ``name`` as a Spark batch job over the first ``n`` files."""
    t0 = time.perf_counter()
    register_prefix(spark, files, n, QUERY_SOURCES[name])
    spark.sql(QUERIES[name]).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def baseline_result(spark: Any, files: dict[str, list[str]], n: int,
                    name: str) -> list[dict[str, Any]]:
    register_prefix(spark, files, n, QUERY_SOURCES[name])
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


# -- one scale --------------------------------------------------------------------------------
def measure(spark: Any, out: Path, label: str, sizes: dict[str, Any], *, seed: int = 7,
            buckets: int | None = None, count_jobs_phase: bool = True,
            driver_rows: int | None = None) -> dict[str, Any]:
    """History, measured batches, a counted one-batch run and the recompute for one size."""
    manifest = generate_input(out / "data" / label, sizes, seed)
    files, counts, phases = manifest["files"], manifest["counts"], manifest["phases"]
    workdir = out / "runs" / label
    shutil.rmtree(workdir, ignore_errors=True)
    input_dir = workdir / "input"
    project = write_project(input_dir, workdir)
    warehouse = workdir / "warehouse"
    opts: dict[str, Any] = {} if buckets is None else {"buckets": buckets}
    if driver_rows is not None:  # 0: every batch on the Spark path
        opts["driver_rows"] = driver_rows
    res: dict[str, Any] = {"sizes": sizes, "generate_s": manifest.get("generate_s"),
                           "events": {p: _total(counts, idx=ix) for p, ix in phases.items()},
                           "queries": {}}
    qs: dict[str, dict[str, Any]] = {n: {} for n in QUERIES}
    for phase in ("history", "measured", "jobs") if count_jobs_phase else ("history", "measured"):
        release(manifest, phases[phase], input_dir)
        for name in QUERIES:
            ix = phases[phase]
            r = octo_phase(spark, project, warehouse, name, opts, count=(phase == "jobs"))
            r["events"] = _total(counts, QUERY_SOURCES[name], ix)
            expected = [sum(counts[s][i] for s in QUERY_SOURCES[name]) for i in ix]
            r["batches_match_files"] = r["rows_in"] == expected
            if len(r["batch_s"]) != len(ix):
                raise RuntimeError(f"{name} {phase}: {len(ix)} files per source gave "
                                   f"{len(r['batch_s'])} batches")
            qs[name][phase] = r
            log(f"[{label}] octo {name} {phase}: {len(ix)} batches, {r['events']} events, "
                f"{r['wall_s']:.1f}s (batches median {statistics.median(r['batch_s']):.2f}s)"
                + (f", {r['jobs']} Spark jobs" if r["jobs"] is not None else ""))
        if phase == "jobs":
            for name in QUERIES:
                qs[name]["idle"] = r = octo_phase(spark, project, warehouse, name, opts,
                                                  count=True)
                log(f"[{label}] octo {name} run with nothing to do: {r['wall_s']:.1f}s, "
                    f"{r['jobs']} Spark jobs")
    n_history = len(phases["history"])
    for name in QUERIES:
        # Recompute at the same points as octo's measured batches: history + measured 0..i.
        secs = []
        for i in range(len(phases["measured"])):
            secs.append(recompute(spark, files, n_history + i + 1, name))
        n_all = n_history + len(phases["measured"]) + (len(phases["jobs"]) if count_jobs_phase
                                                       else 0)
        jobs, _ = count_jobs(spark, lambda: recompute(spark, files, n_all, name))  # noqa: B023
        want = baseline_result(spark, files, n_all, name)
        cols = list(want[0]) if want else []
        got = octo_result(warehouse, name, cols) if cols else []
        equal = same_multiset(got, want)
        o = qs[name]["measured"]["batch_s"]
        qs[name].update({
            "recompute_s": secs, "recompute_jobs": jobs,
            "octo_batch": stats(o), "recompute": stats(secs),
            "ratio_p50": statistics.median(o) / statistics.median(secs),
            "result_rows": len(want), "correct": equal, "state_bytes": state_bytes(warehouse, name),
        })
        log(f"[{label}] recompute {name}: median {statistics.median(secs):.2f}s over "
            f"{len(secs)} prefixes, {jobs} Spark jobs; octo median "
            f"{statistics.median(o):.2f}s; result {len(want)} rows, equal={equal}")
    res["queries"] = qs
    return res


def warm_up(spark: Any, out: Path, seed: int = 7, buckets: int | None = None,
            driver_rows: int | None = None) -> None:
    """Both paths once on a tiny input (JIT, first-use costs), results discarded."""
    log("[nexmark] warm-up")
    measure(spark, out, "warmup", WARMUP, seed=seed + 1, buckets=buckets,
            count_jobs_phase=False, driver_rows=driver_rows)


def targets(res: dict[str, Any], goal: float | None, jobs_row: bool = True) -> list[Target]:
    """Rows of issue 9's table: q3/q4 per batch vs recompute (and q3's Spark jobs)."""
    sz = res["sizes"]
    rows = []
    for name in QUERIES:
        q = res["queries"][name]
        rows.append(Target(
            f"{name}_{human(sz['history_events'])}_{human(sz['batch_events'])}",
            f"Nexmark {name} per batch vs recompute ({human(sz['history_events'])} events of "
            f"history, {human(sz['batch_events'])}-event batches)", "ratio_max", "s",
            q["octo_batch"]["p50"], q["recompute"]["p50"], goal,
            "ok" if q["correct"] else "wrong result",
            note=(f"medians of {q['octo_batch']['n']} batches; history load "
                  f"{q['history']['wall_s']:.0f}s for {q['history']['events']:,} events")
            if name == "q4" else "",
            details=q))
    if jobs_row:
        q = res["queries"]["q3"]
        one, idle = q["jobs"]["jobs"], q["idle"]["jobs"]
        own = q["jobs"]["runtime_jobs"]
        rows.append(Target(
            "jobs_q3", "Spark jobs per batch, Nexmark q3 (octo vs one recompute)", "info",
            "jobs", None if one is None or idle is None else one - idle, q["recompute_jobs"],
            note=f"octo: a run of one {human(sz['batch_events'])}-event batch started {one} "
                 f"jobs, a run with nothing to do {idle} (the difference is the batch's"
                 + (f"; the runtime's own count for the batch: {own[0]}" if own else "")
                 + "); recompute: the jobs of one Spark batch query over all input",
            details={"one_batch_run": one, "idle_run": idle, "runtime": own,
                     "recompute": q["recompute_jobs"]}))
    return rows


def print_details(res: dict[str, Any]) -> None:
    cols = ["query", "history events", "history load s", "measured events/batch",
            "octo batch p50 / max s", "recompute p50 / max s", "octo / recompute",
            "state bytes", "correct"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, q in res["queries"].items():
        h, m = q["history"], q["measured"]
        lines.append("| " + " | ".join(str(v) for v in [
            name, f"{h['events']:,}", f"{h['wall_s']:.1f}",
            f"{m['events'] // max(1, len(m['batch_s'])):,}",
            f"{q['octo_batch']['p50']} / {q['octo_batch']['max']}",
            f"{q['recompute']['p50']} / {q['recompute']['max']}",
            f"{q['ratio_p50']:.2f}×", f"{q['state_bytes']:,}", q["correct"]]) + " |")
    print("\n".join(lines))


def scale_sizes(args: argparse.Namespace) -> dict[str, Any]:
    sizes = dict(SCALES[args.scale])
    for k in ("history_events", "history_batches", "batch_events", "measured_batches"):
        if getattr(args, k) is not None:
            sizes[k] = getattr(args, k)
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--history-events", type=int)
    ap.add_argument("--history-batches", type=int)
    ap.add_argument("--batch-events", type=int)
    ap.add_argument("--measured-batches", type=int)
    ap.add_argument("--buckets", type=int, help="default_options(buckets=...) if it takes it")
    ap.add_argument("--driver-rows", type=int,
                    help="octo's driver_rows (0: every batch on the Spark path)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench/nexmark_joins"))
    args = ap.parse_args(argv)
    sizes = scale_sizes(args)
    args.out.mkdir(parents=True, exist_ok=True)

    spark = session()  # octo's local defaults: local[2], 2 shuffle partitions
    try:
        env = env_info(spark)
        if not args.no_warmup:
            warm_up(spark, args.out, args.seed, args.buckets, args.driver_rows)
        res = measure(spark, args.out, args.scale, sizes, seed=args.seed, buckets=args.buckets,
                      driver_rows=args.driver_rows)
    finally:
        spark.stop()
    env["loadavg_end"] = os.getloadavg()
    rows = targets(res, sizes["goal"])
    write_json(args.out / "results.json", {"params": jsonable(vars(args)), "env": env,
                                           "queries": QUERIES, **res,
                                           "targets": [t.to_json() for t in rows]})
    print(f"\nnexmark_joins ({args.scale}): {res['events']} events by phase "
          f"(spark {env['spark']}, local[2]; load average {env['loadavg'][0]:.1f} at start, "
          f"{env['loadavg_end'][0]:.1f} at end)\n")
    print_details(res)
    print_targets(rows, f"issue 9 targets (Nexmark joins, scale {args.scale})")
    print(f"\nresults: {args.out / 'results.json'}")
    return 0 if all(t.status == "ok" for t in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

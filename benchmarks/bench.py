"""The runtime issues' benchmark targets (9, then 20) in one run and session; one table.

    make bench        # = PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/bench.py
    make bench-full   # the same plus Nexmark at 10M events of history (--scale full)

    python benchmarks/bench.py [--scale small|full] [--quick] [--only keyed,joins,one_row]
                               [--out /tmp/octo-bench]

Runs, in this order and in one local[2] session (octo's defaults):
  keyed    keyed_agg.py: octo vs Spark native streaming aggregation (noop sink; foreachBatch
           delta-rs MERGE), one 100K-event batch over 100K vs 2M keys of state, Spark jobs;
  joins    nexmark_joins.py: q3 and q4 per batch vs recomputing them as a Spark batch job at
           1M events of history with 10K-event batches (and, with --scale full, at 10M events
           with 100K-event batches), Spark jobs of a q3 batch;
  one_row  one_row.py: one-row batches on a join + aggregate table, start to last commit.
``--quick`` shrinks every size (a check of the harness in a few minutes; the figures are not
the issue's). A part that fails is reported in its rows and the others still run. The table
goes to stdout, progress to stderr, everything to ``<out>/results.json``. Exit status 1 if a
part failed or a result was wrong, 0 otherwise (targets not met included).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import keyed_agg
import nexmark_joins
import one_row
import windows
from common import Target, env_info, guarded, log, not_run, print_targets, session, write_json

FULL_HINT = "not run (make bench-full)"
KEYED = {"bids": 2_000_000, "auctions": 120_000, "files": 20,
         "state_keys": (100_000, 2_000_000), "state_batch": 100_000}
KEYED_QUICK = {"bids": 200_000, "auctions": 12_000, "files": 10,
               "state_keys": (10_000, 200_000), "state_batch": 10_000}
JOINS_QUICK = {"small": {"history_events": 100_000, "history_batches": 2, "batch_events": 1_000,
                         "measured_batches": 3},
               "full": {"history_events": 300_000, "history_batches": 3, "batch_events": 3_000,
                        "measured_batches": 3}}
ONE_ROW = {"history_events": 100_000, "warmup": 3, "rows": 9}
ONE_ROW_QUICK = {"history_events": 20_000, "warmup": 2, "rows": 5}
WINDOWS = {"goals": 300_000, "teams": 1_000, "files": 30, "minutes": 60}
WINDOWS_QUICK = {"goals": 30_000, "teams": 100, "files": 6, "minutes": 10}


def _joins_rows(res: dict[str, Any], scale: str, jobs_row: bool) -> list[Target]:
    return nexmark_joins.targets(res, nexmark_joins.SCALES[scale]["goal"], jobs_row=jobs_row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=["small", "full"], default="small",
                    help="full adds Nexmark at 10M events of history, 100K-event batches")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness only")
    ap.add_argument("--only", default="keyed,joins,one_row,windows",
                    help="comma-separated parts to run (keyed, joins, one_row, windows)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench"))
    args = ap.parse_args(argv)
    parts = set(args.only.split(","))
    started = time.perf_counter()
    results: dict[str, Any] = {}
    durations: dict[str, float] = {}
    spark = session()
    env = env_info(spark)
    log(f"bench: scale {args.scale}{' (quick)' if args.quick else ''}, parts "
        f"{sorted(parts)}, out {args.out}; load average {env['loadavg'][0]:.1f}")

    def timed(part: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            durations[part] = round(time.perf_counter() - t0, 1)
            log(f"bench: {part} took {durations[part]:.0f}s")

    rows: dict[str, list[Target]] = {}
    try:
        if "keyed" in parts:
            def keyed() -> list[Target]:
                res = keyed_agg.measure(spark, args.out / "keyed_agg",
                                        **(KEYED_QUICK if args.quick else KEYED))
                results["keyed_agg"] = res
                return keyed_agg.targets(res)

            rows["keyed"] = timed("keyed", lambda: guarded(
                "keyed_agg", "keyed aggregation and state size", "ratio_min", None, keyed))

        scales = ["small"] + (["full"] if args.scale == "full" else [])
        if "joins" in parts:
            jout = args.out / "nexmark_joins"
            warmed = []

            def joins(scale: str) -> list[Target]:
                if not warmed:
                    nexmark_joins.warm_up(spark, jout)
                    warmed.append(True)
                sizes = {**nexmark_joins.SCALES[scale],
                         **(JOINS_QUICK[scale] if args.quick else {})}
                res = nexmark_joins.measure(spark, jout, scale, sizes)
                results[f"nexmark_{scale}"] = res
                return _joins_rows(res, scale, jobs_row=(scale == "small"))

            for scale in scales:
                rows[f"joins_{scale}"] = timed(f"joins_{scale}", lambda s=scale: guarded(
                    f"nexmark_{s}", f"Nexmark q3/q4 ({s})", "ratio_max",
                    nexmark_joins.SCALES[s]["goal"], lambda: joins(s)))

        if "one_row" in parts:
            def one() -> list[Target]:
                res = one_row.measure(spark, args.out / "one_row",
                                      **(ONE_ROW_QUICK if args.quick else ONE_ROW))
                results["one_row"] = res
                return one_row.targets(res)

            rows["one_row"] = timed("one_row", lambda: guarded(
                "one_row_batch", "one-row batch, join + aggregate", "max", one_row.GOAL_S, one))

        if "windows" in parts:
            def tumbling() -> list[Target]:
                res = windows.measure(spark, args.out / "windows",
                                      **(WINDOWS_QUICK if args.quick else WINDOWS))
                results["windows"] = res
                return windows.targets(res)

            rows["windows"] = timed("windows", lambda: guarded(
                "windows_vs_native", "tumbling window vs Spark native window()", "ratio_min",
                0.8, tumbling))
    finally:
        spark.stop()

    table = assemble(rows, parts, args.scale)
    total = time.perf_counter() - started
    env["loadavg_end"] = os.getloadavg()
    path = write_json(args.out / "results.json", {
        "params": {"scale": args.scale, "quick": args.quick, "parts": sorted(parts)},
        "env": env, "durations_s": {**durations, "total": round(total, 1)},
        "targets": [t.to_json() for t in table], "results": results})
    quick = ", QUICK sizes (harness check only)" if args.quick else ""
    changed = env["runtime_changed_files"]
    octo = (f"octo {env['commit']}" + (f" + {changed} changed runtime files" if changed else "")
            if env["commit"] != "?" else f"octo from {env['runtime']} (not a git checkout)")
    title = (f"issue 20 targets — scale {args.scale}{quick}; "
             f"{octo}, spark {env['spark']}, local[2], {env['cpus']} cpus, "
             f"load average {env['loadavg'][0]:.1f} → {env['loadavg_end'][0]:.1f}; "
             f"{total / 60:.1f} min")
    print_targets(table, title)
    print(f"\nresults: {path}")
    bad = [t for t in table if t.status.startswith("error") or t.status == "wrong result"]
    return 1 if bad else 0


def assemble(rows: dict[str, list[Target]], parts: set[str], scale: str) -> list[Target]:
    """Every target in a fixed order; the ones not measured say why."""
    def pick(group: str, key_prefix: str) -> list[Target]:
        got = rows.get(group, [])
        if len(got) == 1 and got[0].status.startswith("error"):
            return got if key_prefix == _first_key(group) else []
        return [t for t in got if t.key.startswith(key_prefix)]

    skipped = "not run (--only)"
    out: list[Target] = []
    if "keyed" in parts:
        out += pick("keyed", "keyed_agg") + pick("keyed", "batch_vs_state") + \
            pick("keyed", "restart")
    else:
        out += [not_run("keyed_agg_vs_native_noop", "keyed aggregation vs Spark native noop",
                        "ratio_min", 0.8, skipped),
                not_run("keyed_agg_vs_native_merge", "keyed aggregation vs Spark native + MERGE",
                        "ratio_min", 1.0, skipped),
                not_run("batch_vs_state", "100K-event batch, 2M vs 100K keys of state",
                        "ratio_max", 1.5, skipped)]
    for s, label in (("small", "1M events of history, 10K-event batches"),
                     ("full", "10M events of history, 100K-event batches")):
        goal = nexmark_joins.SCALES[s]["goal"]
        if "joins" in parts and f"joins_{s}" in rows:
            out += pick(f"joins_{s}", "q")
        else:
            why = skipped if "joins" not in parts else FULL_HINT
            out += [not_run(f"{q}_{s}", f"Nexmark {q} per batch vs recompute ({label})",
                            "ratio_max", goal, why) for q in ("q3", "q4")]
    out += pick("one_row", "one_row") if "one_row" in parts else [not_run(
        "one_row_batch", "one-row batch, join + aggregate", "max", one_row.GOAL_S, skipped)]
    out += pick("windows", "windows") if "windows" in parts else [not_run(
        "windows_vs_native", "tumbling window vs Spark native window()", "ratio_min", 0.8,
        skipped)]
    out += pick("keyed", "jobs") if "keyed" in parts else []
    out += pick("joins_small", "jobs") if "joins" in parts else []
    out.append(Target("make_test", "`make test` in a clean clone, install included", "na",
                      goal=12, status="not measured by the bench: `time make test`"))
    return out


def _first_key(group: str) -> str:
    return {"keyed": "keyed_agg", "joins_small": "q", "joins_full": "q",
            "one_row": "one_row", "windows": "windows_vs_native"}[group]


if __name__ == "__main__":
    sys.exit(main())

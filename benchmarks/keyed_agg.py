"""Keyed-aggregation benchmark: Spark native streaming vs. hand-written Delta MERGE vs. octo.

    PYSPARK_PYTHON=$(which python) python benchmarks/keyed_agg.py \
        [--bids 2000000 --auctions 120000 --files 20 --state-keys 100000,2000000 \
         --state-batch 100000 --out /tmp/octo-bench/keyed_agg]

All contenders read the same parquet file stream (one micro-batch per file) in one SparkSession
(local[2]) and maintain `SELECT auction, COUNT(*), MAX(price) FROM bids GROUP BY auction`:
  a) spark-noop     native update-mode aggregation into the noop sink (lower bound, no output)
  b) spark+merge    (a) plus foreachBatch MERGE of the updated rows into Delta via delta-rs
  c) octo           octo: Debezium changelog + current state + operator state in Delta
  d) octo, Spark path  (c) with every batch as Spark jobs (``driver_rows=0``)
Session startup and a warm-up of every variant on a small separate input (100K bids) are
excluded from the timings. Then one 100K-event batch is timed with 100K and with 2M keys
already in octo's state (the median of 7 runs, each on a copy of the primed warehouse),
and again with its 100K events on as many distinct keys (the change held equal); Spark
native is compared with octo's Spark path at 2M keys (a priming batch of every key, then 5
batches of 100K bids); and the Spark jobs of a one-batch octo run are counted. Prints the
issue 9 rows it covers (see benchmarks/README.md); ``benchmarks/bench.py`` runs it with the
other benchmarks in one session.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import (
    Target,
    batch_jobs,
    batch_seconds,
    count_jobs,
    delta_rows,
    env_info,
    finish,
    generated,
    human,
    log,
    mark_generated,
    run_octo,
    session,
)

SCHEMA_DDL = "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, date_time TIMESTAMP"
QUERY = "SELECT auction, COUNT(*) AS bids, MAX(price) AS top FROM bids GROUP BY auction"
WARMUP_BIDS = 100_000  # enough batches/rows for the JIT to compile the hot aggregation paths
# Runs per state-row figure, on copies of one primed warehouse (the median): with 3, the
# same code's row read 2.08x and 1.16x within two hours (benchmarks/README.md).
STATE_REPEAT = 7
BIG_KEYS_BATCHES = 5  # 100K-event batches after the priming one, in the 2M-key comparison
CHANNELS = ["apple", "google", "facebook", "baidu", "other"]


def generate_bids(out_dir: Path, bids: int, auctions: int, files: int, seed: int = 42) -> Path:
    """Write `files` equal-sized parquet files of seeded bids; reuse them if parameters match."""
    params = {"bids": bids, "auctions": auctions, "files": files, "seed": seed, "version": 1}
    if generated(out_dir, params):
        return out_dir
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
    mark_generated(out_dir, params)
    return out_dir


def generate_primed(out_dir: Path, keys: int, batch: int, batches: int, seed: int = 7) -> Path:
    """A first file with one bid on each of ``keys`` auctions (the priming batch: every key
    in the state), then ``batches`` files of ``batch`` bids on uniformly drawn auctions of
    those keys; reused while the parameters match."""
    params = {"keys": keys, "batch": batch, "batches": batches, "seed": seed, "version": 1}
    if generated(out_dir, params):
        return out_dir
    rng = np.random.default_rng(seed)
    sizes = [keys] + [batch] * batches
    for i, n in enumerate(sizes):
        auction = np.arange(n, dtype=np.int64) if i == 0 else rng.integers(0, keys, n)
        pq.write_table(pa.table({
            "auction": auction,
            "bidder": rng.integers(1, 1_000_000, n),
            "price": rng.integers(1, 10_000, n),
            "channel": pa.array([CHANNELS[0]] * n),
            "date_time": pa.array(np.full(n, 1_700_000_000_000_000 + i), pa.timestamp("us",
                                                                                    tz="UTC")),
        }), out_dir / f"part-{i:05d}.parquet")
    mark_generated(out_dir, params)
    return out_dir


def measure_big_keys(spark: Any, workdir: Path, keys: int, batch: int,
                     batches: int = BIG_KEYS_BATCHES) -> dict[str, Any]:
    """Spark native (noop sink) and octo's Spark path over the same ``generate_primed``
    input, one batch per file: the median seconds of the batches after the priming one."""
    input_dir = generate_primed(workdir / "input", keys, batch, batches)
    got: dict[str, Any] = {"keys": keys, "batch": batch, "batches": batches}
    for name, fn in (("native", run_spark_noop), ("octo_spark_path", run_octo_spark_path)):
        log(f"[keyed_agg] {name}: a priming batch of {keys} keys, then {batches} batches of "
            f"{batch} bids")
        run = workdir / "runs" / name
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        ran = fn(spark, input_dir, run)
        times = ran["batch_s"]
        if "result_bids" in ran:  # octo's current state holds every bid
            got["correct"] = ran["result_bids"] == keys + batch * batches
        got[f"{name}_batch_s"] = [round(t, 3) for t in times]
        got[f"{name}_median_s"] = round(statistics.median(times[1:]), 3) if len(times) > 1 \
            else None
    return got


def _stream(spark: Any, input_dir: Path) -> Any:
    reader = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1)
    reader.parquet(str(input_dir)).createOrReplaceTempView("bids")
    return spark.sql(QUERY)


def _batch_times(query: Any) -> list[float]:
    return [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress
            if p["numInputRows"] > 0]


def run_spark_noop(spark: Any, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """(a) native update-mode aggregation into the noop sink."""
    def run() -> Any:
        q = (_stream(spark, input_dir).writeStream.format("noop").outputMode("update")
             .trigger(availableNow=True).option("checkpointLocation", str(workdir / "ckpt"))
             .start())
        q.awaitTermination()
        return q

    jobs, q = count_jobs(spark, run)
    return {"batch_s": _batch_times(q), "spark_jobs": jobs}


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
    final = delta_rows(table_path, ["bids"])
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


def run_octo_contender(spark: Any, input_dir: Path, workdir: Path,
                       **options: Any) -> dict[str, Any]:
    """(c) octo: changelog-producing aggregation with Delta state, one batch per file."""
    project = write_octo_project(input_dir, workdir)
    report = run_octo(spark, project, workdir / "warehouse", **options)
    bids = delta_rows(workdir / "warehouse" / "_current" / "auction_stats", ["bids"])
    return {"batch_s": batch_seconds(report), "result_rows": bids.num_rows,
            "result_bids": int(bids["bids"].to_numpy().sum())}


def measure_batch_vs_state(spark: Any, workdir: Path, batch_events: int = 100_000,
                           state_keys: tuple[int, ...] = (100_000, 2_000_000),
                           repeat: int = STATE_REPEAT) -> dict[str, Any]:
    """Time of one ``batch_events`` batch when octo's GROUP BY state already holds N keys.

    For each N: one priming file with N distinct auctions builds the state (not timed) and
    the warehouse is kept. Then, ``repeat`` times, and each time for every N in turn (so a
    machine whose speed drifts moves both sides of the ratio alike), on a fresh copy of
    N's warehouse, a run of one file of ``batch_events`` bids over keys drawn from those N
    is timed (the run's reported seconds of that batch; the median is the figure: one run
    each moved 2-4x on a noisy machine), and so is a run of two such files' second batch
    (the state cache loaded). Drawn with replacement, ``batch_events`` keys are fewer
    distinct ones the fewer keys there are (100K draws: 63.2K distinct keys of 100K, 97.5K
    of 2M), so the larger state's batch also changes more rows; a run of one file of
    ``batch_events`` distinct keys times the same with the change held equal. The Spark jobs
    of a one-batch run are counted, and, for the first N, those of a following run with
    nothing to do (the run's fixed part).
    """
    rng = np.random.default_rng(7)
    states = {n: PrimedState.make(spark, workdir / f"state-{n}", n, 3, batch_events, rng,
                                  distinct=1) for n in state_keys}
    first: dict[int, list[float]] = {n: [] for n in state_keys}
    second: dict[int, list[float]] = {n: [] for n in state_keys}
    restart: dict[int, list[float]] = {n: [] for n in state_keys}
    equal: dict[int, list[float]] = {n: [] for n in state_keys}
    out: dict[str, Any] = {}
    for _ in range(repeat):
        for n, state in states.items():
            project, warehouse, fresh = state.project, state.warehouse, state.fresh
            fresh((1,))
            jobs, report = count_jobs(
                spark, lambda: run_octo(spark, project, warehouse))  # noqa: B023
            secs = batch_seconds(report)
            if len(secs) != 1:
                raise RuntimeError(f"expected one batch, the run reported {len(secs)}")
            first[n].append(secs[0])
            out[f"jobs_one_batch_run_{n}_keys"] = jobs
            out[f"runtime_jobs_{n}_keys"] = batch_jobs(report)
            fresh((2, 3))
            second[n].append(batch_seconds(run_octo(spark, project, warehouse))[-1])
            fresh((2,))  # a run that ends cleanly (it keeps what it held), then a restart
            run_octo(spark, project, warehouse)
            state.add((3,))
            restart[n].append(batch_seconds(run_octo(spark, project, warehouse))[0])
            fresh((4,))
            equal[n].append(batch_seconds(run_octo(spark, project, warehouse))[0])
    idle_state = states[state_keys[0]]
    idle_state.fresh((1,))
    run_octo(spark, idle_state.project, idle_state.warehouse)
    idle, report = count_jobs(
        spark, lambda: run_octo(spark, idle_state.project, idle_state.warehouse))
    out["jobs_idle_run"] = idle
    out["idle_run_batches"] = len(batch_seconds(report))
    for n in state_keys:
        out[f"batch_s_with_{n}_keys"] = round(statistics.median(first[n]), 3)
        out[f"distinct_batch_s_with_{n}_keys"] = round(statistics.median(equal[n]), 3)
        out[f"distinct_batch_s_runs_{n}_keys"] = [round(x, 3) for x in equal[n]]
        out[f"batch_s_runs_{n}_keys"] = [round(x, 3) for x in first[n]]
        out[f"next_batch_s_with_{n}_keys"] = round(statistics.median(second[n]), 3)
        out[f"restart_batch_s_with_{n}_keys"] = round(statistics.median(restart[n]), 3)
        out[f"restart_batch_s_runs_{n}_keys"] = [round(x, 3) for x in restart[n]]
        for label, runs in ((f"{batch_events} events over {n} keys", first[n]),
                            (f"the next batch of a run over {n} keys", second[n]),
                            (f"a restart's first batch over {n} keys", restart[n]),
                            (f"{batch_events} distinct keys over {n} keys", equal[n])):
            log(f"[state] {label}: {statistics.median(runs):.2f}s (median of "
                f"{', '.join(f'{x:.2f}' for x in runs)})")
        log(f"[state] a one-batch run over {n} keys: "
            f"{out[f'jobs_one_batch_run_{n}_keys']} Spark jobs")
    return out


@dataclass(frozen=True)
class PrimedState:
    """An octo project whose GROUP BY state holds ``keys`` auctions (its warehouse kept in
    ``primed``), and files of bids over them (``later``, numbered from 1) to run on fresh
    copies of that warehouse (``fresh``)."""

    work: Path
    keys: int

    @property
    def project(self) -> Path:
        return self.work / "project"

    @property
    def warehouse(self) -> Path:
        return self.work / "warehouse"

    @staticmethod
    def make(spark: Any, work: Path, keys: int, files: int, batch_events: int, rng: Any,
             reuse: bool = False, distinct: int = 0) -> PrimedState:
        """Prime the state with one file of ``keys`` distinct auctions (a run, not timed) and
        write ``files`` files of ``batch_events`` bids over them (auctions drawn with
        replacement), then ``distinct`` files numbered after those, each of ``batch_events``
        bids on as many distinct auctions; with ``reuse``, those an earlier call left in
        ``work`` for as many files."""
        state, done = PrimedState(work, keys), work / f"primed-{files}-{distinct}-files"
        if reuse and done.exists():
            return state
        shutil.rmtree(work, ignore_errors=True)
        (work / "input").mkdir(parents=True)
        _write_bids(work / "input" / "part-00000.parquet", np.arange(keys, dtype=np.int64),
                    rng)
        write_octo_project(work / "input", work)
        t0 = time.perf_counter()
        run_octo(spark, state.project, state.warehouse)
        log(f"[state] {keys} keys primed in {time.perf_counter() - t0:.1f}s")
        shutil.copytree(state.warehouse, work / "primed")
        (work / "later").mkdir()
        for i in range(1, files + distinct + 1):
            auctions = rng.integers(0, keys, batch_events, dtype=np.int64) if i <= files \
                else rng.choice(keys, batch_events, replace=False).astype(np.int64)
            _write_bids(work / "later" / f"part-{i:05d}.parquet", auctions, rng)
        done.touch()
        return state

    def add(self, files: Iterable[int]) -> None:
        """These later files as input too."""
        for i in files:
            shutil.copy(self.work / "later" / f"part-{i:05d}.parquet", self.work / "input")

    def fresh(self, files: Iterable[int]) -> None:
        """The primed warehouse again, and of the later files these alone as input."""
        shutil.rmtree(self.warehouse)
        shutil.copytree(self.work / "primed", self.warehouse)
        for f in (self.work / "input").glob("part-*.parquet"):
            if f.name != "part-00000.parquet":
                f.unlink()
        self.add(files)


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


def run_octo_spark_path(spark: Any, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """(d) octo with every batch on the Spark path (``driver_rows=0``: what a cluster runs)."""
    return run_octo_contender(spark, input_dir, workdir, driver_rows=0)


CONTENDERS: list[tuple[str, Callable[[Any, Path, Path], Any]]] = [
    ("a) spark native, noop sink", run_spark_noop),
    ("b) spark native + delta-rs MERGE", run_spark_merge),
    ("c) octo", run_octo_contender),
    ("d) octo, Spark path", run_octo_spark_path),
]


def measure(spark: Any, out: Path, *, bids: int = 2_000_000, auctions: int = 120_000,
            files: int = 20, seed: int = 42, state_keys: tuple[int, ...] = (100_000, 2_000_000),
            state_batch: int = 100_000) -> dict[str, Any]:
    """Run the three contenders (after a warm-up) and the batch-vs-state measurement."""
    input_dir = generate_bids(out / "input", bids, auctions, files, seed)
    warm_dir = generate_bids(out / "warmup", WARMUP_BIDS, 5_000, 4, seed + 1)
    for i, (name, fn) in enumerate(CONTENDERS):
        log(f"[keyed_agg] warm-up {name}")
        _timed(name, fn, spark, warm_dir, WARMUP_BIDS, out / "runs" / f"warmup-{i}")
    results = []
    for i, (name, fn) in enumerate(CONTENDERS):
        log(f"[keyed_agg] {name}: {bids} bids in {files} files")
        results.append(_timed(name, fn, spark, input_dir, bids, out / "runs" / f"run-{i}"))
        log(f"[keyed_agg] {name}: {results[-1]['wall_s']}s, "
            f"{results[-1]['events_per_s']} events/s")
    state = measure_batch_vs_state(spark, out / "runs" / "state", state_batch, state_keys)
    big = measure_big_keys(spark, out / "big_keys", max(state_keys), state_batch)
    return {"params": {"bids": bids, "auctions": auctions, "files": files, "seed": seed,
                       "state_keys": list(state_keys), "state_batch": state_batch},
            "results": results, "batch_vs_state": state, "big_keys": big}


def targets(res: dict[str, Any]) -> list[Target]:
    """The rows of issue 9's table this benchmark measures."""
    p, st = res["params"], res["batch_vs_state"]
    by = {r["contender"][0]: r for r in res["results"]}
    a, b, c, d = by["a"], by["b"], by["c"], by["d"]
    correct = (c.get("result_bids") == p["bids"] and b.get("result_bids") == p["bids"]
               and c.get("result_rows") == b.get("result_rows"))
    status = "ok" if correct else "wrong result"
    spark_path = "ok" if d.get("result_bids") == p["bids"] and \
        d.get("result_rows") == b.get("result_rows") else "wrong result"
    size = f"{human(p['bids'])} bids, {p['files']} batches"
    rows = [
        Target("keyed_agg_vs_native_noop",
               f"keyed aggregation vs Spark native update-mode, noop sink ({size})",
               "ratio_min", "ev/s", c["events_per_s"], a["events_per_s"], 0.8, status,
               details={"octo": c, "spark_native_noop": a}),
        Target("keyed_agg_vs_native_merge",
               f"keyed aggregation vs Spark native + foreachBatch delta-rs MERGE ({size})",
               "ratio_min", "ev/s", c["events_per_s"], b["events_per_s"], 1.0, status,
               details={"octo": c, "spark_native_merge": b}),
        Target("keyed_agg_spark_path_vs_native",
               f"keyed aggregation, Spark path (driver_rows 0) vs Spark native update-mode, "
               f"noop sink ({size})", "ratio_min", "ev/s", d["events_per_s"],
               a["events_per_s"], 1.0, spark_path,
               details={"octo_spark_path": d, "spark_native_noop": a}),
    ]
    big = res.get("big_keys") or {}
    if big:
        t_octo, t_native = big["octo_spark_path_median_s"], big["native_median_s"]
        rows.append(Target(
            "keyed_agg_spark_path_big_keys_vs_native",
            f"the same at {human(big['keys'])} keys: {human(big['batch'])}-event batches over a "
            f"primed state, Spark path vs Spark native update-mode, noop sink", "ratio_min",
            "ev/s", None if not t_octo else round(big["batch"] / t_octo),
            None if not t_native else round(big["batch"] / t_native), 1.0,
            "ok" if big.get("correct") else "wrong result",
            note=f"a priming batch of one bid per key, then {big['batches']} batches of "
                 "uniformly drawn keys, one file each; the median of the batches after the "
                 "priming one, each side's own batch seconds", details=big))
    k_small, k_big = p["state_keys"][0], p["state_keys"][-1]
    t_small, t_big = st[f"batch_s_with_{k_small}_keys"], st[f"batch_s_with_{k_big}_keys"]
    rows.append(Target(
        "batch_vs_state",
        f"one {human(p['state_batch'])}-event batch, {human(k_big)} vs {human(k_small)} keys of "
        f"state (octo vs octo, medians of {STATE_REPEAT} runs)", "ratio_max", "s", t_big, t_small,
        1.5, details=st))
    w_small, w_big = (st.get(f"next_batch_s_with_{k}_keys") for k in (k_small, k_big))
    rows.append(Target(
        "batch_vs_state_next", "the same, a run's second batch (its state cache loaded)",
        "info", "s", w_big, w_small, note="the row above times a run's first batch"))
    rows.append(Target(
        "restart_first_batch",
        f"a restart's first {human(p['state_batch'])}-event batch over {human(k_big)} keys on "
        "the machine that ran the table before vs a later batch of one run (driver path)",
        "ratio_max", "s", st.get(f"restart_batch_s_with_{k_big}_keys"), w_big, 1.2,
        note="the same two files of bids each way: a run of the first, then a run of the "
             "second (its batch timed), vs one run of both (its second batch timed)",
        details={k: v for k, v in st.items() if k.startswith(("restart_", "next_"))}))
    e_small, e_big = (st.get(f"distinct_batch_s_with_{k}_keys") for k in (k_small, k_big))
    rows.append(Target(
        "batch_vs_state_equal_change", "the same first batch with the change held equal: "
        f"{human(p['state_batch'])} events on as many distinct keys", "ratio_max", "s", e_big,
        e_small, 1.5, note=f"the row two above draws its keys with replacement: "
        f"{human(p['state_batch'])} draws are {_distinct_share(p['state_batch'], k_big):.1%} "
        f"distinct keys over {human(k_big)} and {_distinct_share(p['state_batch'], k_small):.1%}"
        f" over {human(k_small)}, so there the larger state's batch also changes more rows; "
        "here both change as many (not the issue's row)", details=st))
    run_jobs, idle = st.get(f"jobs_one_batch_run_{k_small}_keys"), st.get("jobs_idle_run")
    native = a.get("spark_jobs")
    own = st.get(f"runtime_jobs_{k_small}_keys")
    rows.append(Target(
        "jobs_keyed_agg", "Spark jobs per batch, keyed aggregation (octo vs Spark native)",
        "info", "jobs", None if run_jobs is None or idle is None else run_jobs - idle,
        None if native is None or not a["batches"] else round(native / a["batches"], 1),
        note=f"octo: a run of one {human(p['state_batch'])}-event batch started {run_jobs} "
             f"jobs, a run with nothing to do {idle} (the difference is the batch's"
             + (f"; the runtime's own count for the batch: {own[0]}" if own else "")
             + f"); Spark native: {native} jobs in a {a['batches']}-batch run, divided by its "
             "batches",
        details={"octo_one_batch_run": run_jobs, "octo_idle_run": idle, "octo_runtime": own,
                 "native_run": native, "native_batches": a["batches"]}))
    return rows


def _distinct_share(draws: int, keys: int) -> float:
    """The expected share of distinct keys among ``draws`` drawn with replacement from
    ``keys``."""
    return keys * (1 - (1 - 1 / keys) ** draws) / draws


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bids", type=int, default=2_000_000)
    ap.add_argument("--auctions", type=int, default=120_000)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--state-keys", default="100000,2000000",
                    help="comma-separated state sizes (keys); the first and last are compared")
    ap.add_argument("--state-batch", type=int, default=100_000)
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench/keyed_agg"))
    args = ap.parse_args(argv)

    spark = session()  # octo's local defaults (local[2], 2 shuffle partitions)
    try:
        env = env_info(spark)
        res = measure(spark, args.out, bids=args.bids, auctions=args.auctions, files=args.files,
                      seed=args.seed, state_batch=args.state_batch,
                      state_keys=tuple(int(k) for k in args.state_keys.split(",")))
    finally:
        spark.stop()
    print(f"\nkeyed_agg: {args.bids} bids, {args.auctions} auctions, {args.files} files "
          f"(spark {env['spark']}, local[2])\n")
    print(_markdown(res["results"]))
    print("\nbatch_vs_state:", json.dumps(res["batch_vs_state"]))
    return finish(args.out, res, env, targets(res), "issue 9 targets (keyed aggregation)")


if __name__ == "__main__":
    sys.exit(main())

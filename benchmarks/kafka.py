"""Kafka source and sink vs. files: events/s of one keyed aggregation through each (issue 11).

    PYSPARK_PYTHON=$(which python) python benchmarks/kafka.py \
        [--events 200000 --keys 10000 --batches 4 --seed 5 --out /tmp/octo-bench/kafka] \
        [--quick] [--no-warmup]

One run, one local[2] SparkSession (octo's defaults), one broker: tansu (``tests/kafka_broker``,
in memory on a loopback port). ``--events`` JSON events ``{"k": <one of --keys keys>, "v":
<int>}`` (append-only, seeded) go both to a 3-partition topic and to ``--batches`` JSON-lines
files, and two octo projects maintain

    SELECT k, COUNT(*) AS n, SUM(v) AS s FROM src GROUP BY k

  kafka   a Kafka source (format 'json', ``max_records_per_batch`` = events / batches) ->
          Delta, plus ``CREATE SINK ... (connector='kafka', format='debezium-json')`` of the
          table to a 3-partition sink topic, published after each batch;
  files   a files source (format 'json', ``max_files_per_batch = '1'``) -> Delta, no sink.

Each catches up in one ``run_tables(until_idle=True)`` (``common.run_octo``), timed on the wall
clock, start-up included: the figure is events / that time. The batches hold as many events
(a Kafka batch's record budget is shared by the partitions, ``runtime/offsets.kafka_ranges``;
partition p holds the p-th third of the events), not the same ones. Not timed: generating
and producing the events (each message in a request of its own, since tansu reports a
partition's high watermark as the first offset of its last record batch + 1; checked against
the count sent), and a warm-up of both projects on a small separate input (``--no-warmup``
skips it). Checks after the runs: both current tables equal the aggregate computed in numpy,
and the sink topic holds as many messages as the table's changelog has events. Prints a
small table (stdout; progress on stderr), everything to ``<out>/results.json``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.kafka_broker

from common import (  # noqa: E402
    batch_seconds,
    batches,
    delta_rows,
    env_info,
    human,
    jsonable,
    log,
    run_octo,
    session,
    write_json,
)
from tests.kafka_broker import create_topic, read_topic, tansu  # noqa: E402

PARTITIONS = 3
TABLE = "agg"
QUERY = "SELECT k, COUNT(*) AS n, SUM(v) AS s FROM src GROUP BY k"
DEFAULTS = {"events": 200_000, "keys": 10_000, "batches": 4}
QUICK = {"events": 20_000, "keys": 2_000, "batches": 2}
WARMUP = {"events": 10_000, "batches": 2}  # per project, before the timed runs


def generate(events: int, keys: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded keys (uniform over ``keys``) and values."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, keys, events, dtype=np.int64),
            rng.integers(0, 1000, events, dtype=np.int64))


def json_lines(k: np.ndarray, v: np.ndarray) -> list[str]:
    return [f'{{"k": {a}, "v": {b}}}' for a, b in zip(k.tolist(), v.tolist())]


def produce(address: str, topic: str, lines: list[str]) -> None:
    """Send ``lines`` to ``topic``, partition p getting the p-th third of them in order, one
    message per request (tansu would hide the tail of a multi-message batch); one flush at
    the end. Fails unless every partition's high watermark equals what was sent to it."""
    from confluent_kafka import Producer

    from connectors.kafka import KafkaTopic, watermarks

    producer = Producer({"bootstrap.servers": address, "linger.ms": 0,
                         "batch.num.messages": 1, "enable.idempotence": False,
                         "queue.buffering.max.messages": 1_000_000})
    bounds = np.linspace(0, len(lines), PARTITIONS + 1).astype(int).tolist()
    for p in range(PARTITIONS):
        for line in lines[bounds[p]:bounds[p + 1]]:
            while True:
                try:
                    producer.produce(topic, value=line, partition=p)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
    if producer.flush(120):
        raise RuntimeError(f"{topic}: messages still undelivered after 120 s")
    want = {p: bounds[p + 1] - bounds[p] for p in range(PARTITIONS)}
    got = {p: high - low for p, (low, high) in
           watermarks(KafkaTopic("bench", topic, address)).items()}
    if got != want:
        raise RuntimeError(f"{topic}: high watermarks show {got} messages, sent {want}")


def write_files(directory: Path, lines: list[str], per_batch: int) -> None:
    """``lines`` as JSON-lines files of ``per_batch`` lines each (the last may hold fewer)."""
    directory.mkdir(parents=True)
    for i, lo in enumerate(range(0, len(lines), per_batch)):
        (directory / f"part-{i:05d}.json").write_text("\n".join(lines[lo:lo + per_batch]) + "\n")


def write_project(root: Path, source_options: str, sink: str | None = None) -> Path:
    """A project with source ``src`` (options ``source_options``), the streaming table and,
    given a sink topic's ``connector='kafka'`` options, a sink of the table."""
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "tables.sql").write_text(
        f"CREATE SOURCE src (k BIGINT, v BIGINT) WITH ({source_options});\n\n"
        f"CREATE STREAMING TABLE {TABLE} AS {QUERY};\n")
    if sink is not None:
        (root / "sql" / "sinks.sql").write_text(
            f"CREATE SINK {TABLE}_out FROM {TABLE} WITH ({sink}, format = 'debezium-json');\n")
    return root


def prepare(address: str, workdir: Path, k: np.ndarray, v: np.ndarray, n_batches: int,
            prefix: str = "") -> dict[str, Any]:
    """Topics, the events in the source topic and in files, the two projects (``kafka``,
    ``files``) and the sink topic's name (``sink_topic``)."""
    source_topic, sink_topic = f"{prefix}events", f"{prefix}{TABLE}"
    for topic in (source_topic, sink_topic):
        create_topic(address, topic, PARTITIONS)
    lines = json_lines(k, v)
    per_batch = -(-len(lines) // n_batches)
    produce(address, source_topic, lines)
    write_files(workdir / "input", lines, per_batch)
    servers = f"bootstrap_servers = '{address}'"
    return {
        "kafka": write_project(
            workdir / "kafka", f"connector = 'kafka', {servers}, topic = '{source_topic}', "
            f"format = 'json', max_records_per_batch = '{per_batch}'",
            f"connector = 'kafka', {servers}, topic = '{sink_topic}'"),
        "files": write_project(
            workdir / "files", f"connector = 'files', path = '{workdir / 'input'}', "
            "format = 'json', max_files_per_batch = '1'"),
        "sink_topic": sink_topic}


def run_timed(spark: Any, project: Path) -> dict[str, Any]:
    """One catch-up run of ``project``: wall seconds, the batches' own seconds (start to last
    commit), the sink publishes' seconds, and the changelog events and messages published."""
    t0 = time.perf_counter()
    report = run_octo(spark, project, project / "warehouse")
    wall = time.perf_counter() - t0
    done = batches(report, TABLE)
    secs = batch_seconds(report, TABLE)
    sinks = list(getattr(report, "published", []))
    return {"wall_s": wall, "batches": len(done), "batch_s": secs,
            "rows_in": sum(b.rows_in for b in done),
            "changelog_events": sum(sum(b.events.values()) for b in done),
            "spark_jobs": [getattr(b, "spark_jobs", None) for b in done],
            "sink_s": [s.seconds for s in sinks],
            "published": sum(s.counts.get("published", 0) for s in sinks)}


def current(project: Path) -> list[tuple[int, int, int]]:
    """The table's current rows (k, n, s), sorted."""
    t = delta_rows(project / "warehouse" / "_current" / TABLE, ["k", "n", "s"])
    return sorted(zip(*(t[c].to_pylist() for c in ("k", "n", "s"))))


def expected(k: np.ndarray, v: np.ndarray, keys: int) -> list[tuple[int, int, int]]:
    n, s = np.bincount(k, minlength=keys), np.bincount(k, weights=v, minlength=keys)
    return [(i, int(n[i]), int(s[i])) for i in np.flatnonzero(n).tolist()]


def measure(spark: Any, out: Path, *, events: int, keys: int, n_batches: int, seed: int = 5,
            warmup: bool = True) -> dict[str, Any]:
    workdir = out / "runs"
    shutil.rmtree(workdir, ignore_errors=True)
    durations: dict[str, float] = {}
    res: dict[str, Any] = {"params": {"events": events, "keys": keys, "batches": n_batches,
                                      "seed": seed, "partitions": PARTITIONS,
                                      "warmup": WARMUP if warmup else None}}
    with tansu() as address:
        if warmup:  # JIT, Python workers, producers: neither timed run pays for them
            t0 = time.perf_counter()
            wk, wv = generate(WARMUP["events"], min(keys, WARMUP["events"]), seed + 1)
            wp = prepare(address, workdir / "warmup", wk, wv, WARMUP["batches"], "warmup-")
            for name in ("kafka", "files"):
                run_timed(spark, wp[name])
            durations["warmup"] = time.perf_counter() - t0
            log(f"[kafka] warm-up ({human(WARMUP['events'])} events per project) "
                f"{durations['warmup']:.1f}s")
        t0 = time.perf_counter()
        k, v = generate(events, keys, seed)
        projects = prepare(address, workdir, k, v, n_batches)
        durations["produce_and_files"] = time.perf_counter() - t0
        log(f"[kafka] {human(events)} events over {human(keys)} keys in the topic "
            f"({PARTITIONS} partitions, high watermarks checked) and in {n_batches} files: "
            f"{durations['produce_and_files']:.1f}s")
        for name in ("kafka", "files"):
            r = run_timed(spark, projects[name])
            if r["batches"] != n_batches or r["rows_in"] != events:
                raise RuntimeError(f"{name}: {r['batches']} batches of {r['rows_in']} rows, "
                                   f"expected {n_batches} of {events} in all")
            r["events_per_s"] = events / r["wall_s"]
            res[name] = r
            log(f"[kafka] {name}: {r['wall_s']:.1f}s, {r['events_per_s']:,.0f} ev/s, batches "
                f"{[round(s, 2) for s in r['batch_s']]}"
                + (f", sink publishes {[round(s, 2) for s in r['sink_s']]}"
                   if r["sink_s"] else ""))
        t0 = time.perf_counter()
        res["sink_messages"] = len(read_topic(address, projects["sink_topic"]))
        want = expected(k, v, keys)
        res["correct"] = {name: current(projects[name]) == want for name in ("kafka", "files")}
        durations["checks"] = time.perf_counter() - t0
    res["ratio"] = res["kafka"]["events_per_s"] / res["files"]["events_per_s"]
    res["durations_s"] = {k: round(s, 1) for k, s in durations.items()}
    return res


def report(res: dict[str, Any], total_s: float) -> str:
    """The table and the lines under it."""
    p = res["params"]
    lines = [f"keyed aggregation `{QUERY}`: {human(p['events'])} events, {human(p['keys'])} keys, "
             f"{p['batches']} batches, {PARTITIONS}-partition topics", "",
             "| path | events/s | run wall | batches (sum) | sink publish (sum) | rest of run "
             "| changelog events | result |",
             "|---|---|---|---|---|---|---|---|"]
    for name, label in (("kafka", "Kafka topic -> Delta + Kafka sink"),
                        ("files", "JSON files -> Delta")):
        r = res[name]
        batch, sink = sum(r["batch_s"]), sum(r["sink_s"])
        lines.append(f"| {label} | {r['events_per_s']:,.0f} ev/s | {r['wall_s']:.1f} s "
                     f"| {batch:.1f} s | {sink:.1f} s | {r['wall_s'] - batch - sink:.1f} s "
                     f"| {r['changelog_events']:,} | "
                     f"{'ok' if res['correct'][name] else 'WRONG'} |")
    k = res["kafka"]
    lines += ["", f"- Kafka / files: {res['ratio']:.2f}×",
              f"- sink topic: {res['sink_messages']:,} messages, table changelog "
              f"{k['changelog_events']:,} events, published {k['published']:,} "
              f"({'equal' if res['sink_messages'] == k['changelog_events'] else 'DIFFERENT'})",
              "- run wall: one run_tables(until_idle=True), start-up included; batches: the "
              "runtime's BatchStats.seconds (start to last commit, the Kafka read included); "
              "sink publish: SinkStats.seconds; rest: planning (watermarks, file listing), "
              "start-up, offsets commits",
              f"- total wall time {total_s:.0f} s (untimed parts: "
              + ", ".join(f"{n} {s:.0f} s" for n, s in res["durations_s"].items()) + ")"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, help=f"default {DEFAULTS['events']}")
    ap.add_argument("--keys", type=int, help=f"default {DEFAULTS['keys']}")
    ap.add_argument("--batches", type=int, help=f"default {DEFAULTS['batches']}")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help=f"tiny sizes ({QUICK}): checks the harness only")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("/tmp/octo-bench/kafka"))
    args = ap.parse_args(argv)
    sizes = {**DEFAULTS, **(QUICK if args.quick else {}),
             **{k: getattr(args, k) for k in DEFAULTS if getattr(args, k) is not None}}
    started = time.perf_counter()
    spark = session()
    try:
        env = env_info(spark)
        log(f"[kafka] {sizes}, out {args.out}; load average {env['loadavg'][0]:.1f}")
        res = measure(spark, args.out, events=sizes["events"], keys=sizes["keys"],
                      n_batches=sizes["batches"], seed=args.seed, warmup=not args.no_warmup)
    finally:
        spark.stop()
    total = time.perf_counter() - started
    env["loadavg_end"] = os.getloadavg()
    path = write_json(args.out / "results.json",
                      {"params": jsonable(vars(args)), "env": env, **res, "total_s": total})
    quick = ", QUICK sizes (harness check only)" if args.quick else ""
    changed = env["runtime_changed_files"]
    octo = f"octo {env['commit']}" + (f" + {changed} changed runtime files" if changed else "")
    print(f"\nissue 11: Kafka source + sink vs files{quick}; {octo}, spark {env['spark']}, "
          f"local[2], load average {env['loadavg'][0]:.1f} → {env['loadavg_end'][0]:.1f}\n")
    print(report(res, total))
    print(f"\nresults: {path}")
    ok = all(res["correct"].values()) and res["sink_messages"] == res["kafka"]["changelog_events"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

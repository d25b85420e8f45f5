"""Helpers shared by the benchmark scripts: the session, octo runs through the public entry
point, Spark job counting, and the targets table (issue 9) every script prints.

Only public entry points of the runtime are used (``run_tables`` with
``octo_platform.wiring.default_options``, ``spark_session``, ``RunReport.batches`` /
``BatchStats.seconds``), and keyword arguments neither takes (the runtime is being rewritten)
are dropped rather than failing.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
# Settings for every benchmark session, on top of octo's local defaults (local[2], 2 shuffle
# partitions): keep the progress of every batch of a native streaming query.
BENCH_CONF = {"spark.sql.streaming.numRecentProgressUpdates": "10000"}


# -- logging and environment ------------------------------------------------------------------
def log(line: str) -> None:
    """Progress on stderr (stdout carries the results), with seconds since start."""
    print(f"[{time.perf_counter() - STARTED:7.1f}s] {line}", file=sys.stderr, flush=True)


def session(conf: dict[str, str] | None = None) -> Any:
    """octo's SparkSession (``octo_platform.runtime.session.spark_session``) for benchmarks."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from octo_platform.runtime.session import spark_session

    return spark_session(conf={**BENCH_CONF, **(conf or {})})


def _git(args: list[str], cwd: Path) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd,
                              check=False, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def env_info(spark: Any | None = None) -> dict[str, Any]:
    """Versions, cores, load average, and which octo runtime was measured (its directory,
    and for a git checkout its commit and whether its runtime sources had local changes)."""
    import deltalake

    import octo_platform

    root = Path(octo_platform.__file__).resolve().parent.parent
    commit = _git(["rev-parse", "--short", "HEAD"], root)
    changed = _git(["status", "--porcelain", "--", "octo_platform", "state", "connectors"], root)
    return {"commit": commit or "?", "runtime": str(root),
            "runtime_changed_files": len(changed.splitlines()) if commit else None,
            "spark": spark.version if spark is not None else None,
            "deltalake": deltalake.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count(), "loadavg": os.getloadavg()}


def jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return round(obj, 4) if math.isfinite(obj) else None
    return obj


def write_json(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(obj), indent=2))
    return path


def repeated(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``fn``, after one call not timed (warm-up)."""
    fn()
    secs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        secs.append(time.perf_counter() - start)
    return secs


def human(n: int) -> str:
    """1000000 -> '1M', 10000 -> '10K'."""
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}K" if n >= 1000 else str(n)


def stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "min": None, "max": None}
    return {"n": len(xs), "mean": round(statistics.fmean(xs), 3),
            "p50": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3)}


# -- octo through its public entry point ------------------------------------------------------
def run_octo(spark: Any, project: Path, warehouse: Path, names: list[str] | None = None,
             **kwargs: Any) -> Any:
    """``run_tables(..., options=default_options(warehouse=..., progress=None),
    until_idle=True)``; returns its RunReport.

    Keyword arguments go to ``default_options`` (e.g. ``buckets``) or ``run_tables``; those
    neither takes are dropped.
    """
    from octo_platform.runtime.runner import run_tables
    from octo_platform.wiring import default_options

    settings = inspect.signature(default_options).parameters
    params = inspect.signature(run_tables).parameters
    options = default_options(warehouse=str(warehouse), progress=None,
                              **{k: v for k, v in kwargs.items() if k in settings})
    opts = {"until_idle": True,
            **{k: v for k, v in kwargs.items() if k in params and k not in settings}}
    if names is not None:
        opts["names"] = names
    return run_tables(spark, project, options=options, **opts)


def generated(out_dir: Path, params: dict[str, Any]) -> bool:
    """Whether ``out_dir`` holds input generated with ``params`` (its marker, beside the
    directory, says so); if not, ``out_dir`` is made empty for the generator, which calls
    ``mark_generated`` once it has written everything."""
    marker = _marker(out_dir)
    if marker.exists() and json.loads(marker.read_text()) == params:
        return True
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    return False


def mark_generated(out_dir: Path, params: dict[str, Any]) -> None:
    _marker(out_dir).write_text(json.dumps(params))


def _marker(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + ".params.json")  # outside the dir readers scan


def delta_rows(path: str | Path, columns: list[str] | None = None) -> Any:
    """A Delta table's rows as an Arrow table (``columns``: those only), read as octo reads
    its tables (``state.delta.DeltaStore``): ``DeltaTable.to_pyarrow_table`` left a process
    aborting as it exited (``terminate called without an active exception``, exit 134;
    benchmarks/README.md, "Processes that aborted as they exited")."""
    from state.delta import DeltaStore

    rows = DeltaStore().read(str(path))
    if rows is None:
        raise FileNotFoundError(f"no Delta table at {path}")
    return rows if columns is None else rows.select(columns)


def batches(report: Any, table: str | None = None) -> list[Any]:
    """The batches a run processed (skipped ones, already committed before, excluded)."""
    out = []
    for b in getattr(report, "batches", []):
        if getattr(b, "skipped", False):
            continue
        if table is not None and str(getattr(b, "table", "")).lower() != table.lower():
            continue
        out.append(b)
    return out


def batch_seconds(report: Any, table: str | None = None) -> list[float]:
    """Each batch's seconds from its start to its last commit, as the runtime reports them."""
    return [float(b.seconds) for b in batches(report, table)]


def batch_jobs(report: Any, table: str | None = None) -> list[int] | None:
    """Spark jobs per batch as the runtime counts them (``BatchStats.spark_jobs``), if it
    does."""
    got = [getattr(b, "spark_jobs", None) for b in batches(report, table)]
    return None if not got or any(j is None for j in got) else got


# -- Spark jobs -------------------------------------------------------------------------------
class JobCounter:
    """Spark jobs started while the ``with`` block ran (any thread, e.g. a streaming query's
    foreachBatch), as a difference of job ids: a one-partition probe job runs at entry and at
    exit in its own job group, and Spark numbers jobs consecutively per SparkContext. Only
    valid while nothing else uses the SparkContext."""

    GROUP = "octo-bench-job-probe"

    def __init__(self, spark: Any) -> None:
        self.sc = spark.sparkContext
        self.jobs: int | None = None

    def _probe(self) -> int:
        sc = self.sc
        sc.setJobGroup(self.GROUP, "benchmark job counter probe")
        try:
            sc.parallelize([0], 1).count()
        finally:
            for key in ("spark.jobGroup.id", "spark.job.description",
                        "spark.job.interruptOnCancel"):
                sc.setLocalProperty(key, None)  # type: ignore[arg-type]
        return max(sc.statusTracker().getJobIdsForGroup(self.GROUP))

    def __enter__(self) -> JobCounter:
        self._first = self._probe()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.jobs = self._probe() - self._first - 1


def count_jobs(spark: Any, fn: Callable[[], Any]) -> tuple[int | None, Any]:
    with JobCounter(spark) as jc:
        result = fn()
    return jc.jobs, result


# -- the targets table ------------------------------------------------------------------------
@dataclass
class Target:
    """One row of the table: octo's figure vs. the baseline's and the goal.

    ``kind``: "ratio_min" (octo/baseline ≥ goal; throughput), "ratio_max" (octo/baseline ≤
    goal; times), "max" (octo ≤ goal, absolute), "info" (no goal), "na" (not measured here).
    """

    key: str
    name: str
    kind: str
    unit: str = ""           # of octo and baseline: "ev/s", "s", "jobs"
    octo: float | None = None
    baseline: float | None = None
    goal: float | None = None
    status: str = "ok"       # "ok", "not run: ...", "error: ...", "wrong result"
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.octo is None or not self.baseline or self.kind not in ("ratio_min", "ratio_max"):
            return None
        return self.octo / self.baseline

    @property
    def met(self) -> bool | None:
        if self.status != "ok":
            return False if self.status == "wrong result" else None
        if self.kind == "ratio_min":
            return None if self.ratio is None else self.ratio >= self.goal
        if self.kind == "ratio_max":
            return None if self.ratio is None else self.ratio <= self.goal
        if self.kind == "max":
            return None if self.octo is None else self.octo <= self.goal
        return None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "met": self.met}


def not_run(key: str, name: str, kind: str, goal: float | None, why: str) -> Target:
    return Target(key, name, kind, goal=goal, status=why)


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "ev/s":
        return f"{v:,.0f} ev/s"
    if unit == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    if unit == "jobs":
        return f"{v:g} job" + ("" if v == 1 else "s")
    return f"{v:g} {unit}".strip()


def _goal(t: Target) -> str:
    if t.goal is None:
        return "—"
    if t.kind == "ratio_min":
        return f"≥ {t.goal:g}×"
    if t.kind == "ratio_max":
        return f"≤ {t.goal:g}×"
    if t.kind == "max":
        return f"≤ {t.goal:g} {t.unit}"
    if t.kind == "na" and t.goal is not None:
        return f"≤ {t.goal:g} min"
    return "—"


def _met(t: Target) -> str:
    if t.kind == "info":
        return "info" if t.status == "ok" else t.status
    if t.status != "ok":
        return "no (wrong result)" if t.status == "wrong result" else t.status
    return {True: "yes", False: "no", None: "—"}[t.met]


def table(rows: Iterable[Target]) -> str:
    """The markdown table: target, octo, baseline, ratio, target ratio, met."""
    cols = ["target", "octo", "baseline", "ratio", "target", "met"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for t in rows:
        ratio = f"{t.ratio:.2f}×" if t.ratio is not None else "—"
        lines.append("| " + " | ".join([t.name, _num(t.octo, t.unit), _num(t.baseline, t.unit),
                                         ratio, _goal(t), _met(t)]) + " |")
    return "\n".join(lines)


def print_targets(rows: list[Target], title: str = "issue 9 targets") -> None:
    print(f"\n{title}\n", flush=True)
    print(table(rows))
    notes = [f"- {t.name}: {t.note}" for t in rows if t.note]
    if notes:
        print("\n" + "\n".join(notes))
    sys.stdout.flush()


def finish(out: Path, res: dict[str, Any], env: dict[str, Any], rows: list[Target],
           title: str, **extra: Any) -> int:
    """Write ``out``/results.json (``extra``, the results, ``env`` with the load average at
    the end, the targets), print the targets and where the file is. The exit status: 0 when
    every target is met."""
    env["loadavg_end"] = os.getloadavg()
    write_json(out / "results.json", {**extra, **res, "env": env,
                                      "targets": [t.to_json() for t in rows]})
    print_targets(rows, title)
    print(f"\nresults: {out / 'results.json'}")
    return 0 if all(t.status == "ok" for t in rows) else 1


def guarded(key: str, name: str, kind: str, goal: float | None,
            fn: Callable[[], list[Target]]) -> list[Target]:
    """``fn()``, or one row saying it failed (the runtime is being rewritten: one broken
    measurement must not lose the others)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported in the table and the JSON
        import traceback

        log(f"{name}: FAILED {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return [Target(key, name, kind, goal=goal, status=f"error ({type(e).__name__})",
                       note=f"failed: {first[:300]} (traceback on stderr)")]

"""Backfills and full refreshes: recompute a streaming table from the history it has read.

**Backfill** (``backfill``; ``octo backfill``; a Dagster partition backfill): recompute the
table from all the input its batch log says it has read (the files as they are now, the
upstream changelogs and Delta versions up to where it stopped), into a scratch warehouse,
with empty state, in one batch. The difference between that result and the current table
is then published as one ordinary batch of change events (``c``/``u``/``d``), and the
table's operator state and current snapshot become the recomputed ones. Downstream tables
read those events like any other batch: they see corrections as updates.

With an event-time ``window`` (partitions of a partitioned table), the difference must lie
inside it: if the recomputed table also differs in other partitions, nothing is written and
the error names them (backfill those too, or run a full refresh). So after every backfill
the table is exactly what processing its history from scratch gives.

The publishing batch is exactly once like any other: its intent is logged once the scratch
result is complete, every write is idempotent, and a run that finds the intent pending
finishes it from the scratch result.

**Full refresh** (``refresh``; ``octo refresh``): delete the table and everything downstream
of it (changelog, current snapshot, state, batch log, dead letters) and run them again from
all input: their changelogs are rebuilt, not corrected.

**Rescale** (``rescale``; ``octo rescale``): move a table's state to another number of
buckets as one batch that changes no row (``runtime/rescale.py``); nothing is recomputed.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection

from octo_platform.errors import RunError
from octo_platform.frontend.options import MAX_BUCKETS
from octo_platform.project import Project, load_project
from octo_platform.runtime.layout import Layout, ScratchLayout
from octo_platform.runtime.environment import Environment
from octo_platform.runtime.options import RunOptions, resolve_warehouse
from octo_platform.runtime.pipeline import Pipeline
from octo_platform.runtime.stats import BatchStats
from octo_platform.runtime.publish import RECOMPUTED, recompute_diff
from octo_platform.runtime.rescale import RESCALE
from octo_platform.runtime.locks import lock_tables
from octo_platform.runtime.runner import RunReport, open_project, run_tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["backfill", "BackfillReport", "refresh", "rescale", "reset_tables", "downstream_of"]

SHOW_PARTITIONS = 10  # partitions named in the error of a backfill that would spill over


@dataclass
class BackfillReport:
    table: str
    what: str  # the partitions recomputed, or "all"
    rows_recomputed: int = 0  # rows of the recomputed current snapshot
    rows_changed: int = 0  # weighted rows of the difference
    batch: BatchStats | None = None  # the publishing batch (None: nothing differed)
    seconds: float = 0.0
    partitions: list[str] = field(default_factory=list)  # keys of the rows that changed


def backfill(
    spark: SparkSession,
    project: str | Path | Project,
    name: str,
    *,
    options: RunOptions,
    window: tuple[datetime, datetime] | None = None,
) -> BackfillReport:
    """Recompute ``name`` from the history it has read; publish the difference (inside
    ``window`` when given: ``[start, end)`` of its event-time column). See module docstring.

    The query may have changed since the table's state was written: the recomputation uses
    the current query, so a change whose effect lies inside ``window`` is backfilled.
    """
    started = time.monotonic()
    proj, layout = open_project(project, options)
    env, buckets, progress = options.env, options.buckets, options.progress
    table = proj.table(name)
    part = table.definition.partitioning
    if window is not None and part is None:
        raise RunError(f"streaming table {table.name!r} declares no partitions (WITH "
                       "partition_by = ...): backfill it without a partition range")
    what = "all" if window is None else part.describe(*window)
    say = progress or (lambda _msg: None)
    with lock_tables(layout, [table.name]):
        live = Pipeline(spark, proj, table, layout, env, buckets=buckets, progress=progress,
                        check_plan=False)
        pending = live.log.pending()
        if pending is not None:  # finish what a crashed run left, with the query it had
            if RECOMPUTED not in pending[1]:
                live.check_fingerprint()
            live.run_batch(pending[0], pending[1])
        last = live.log.last_committed
        if last < 0:
            raise RunError(f"streaming table {table.name!r} has not run yet: run it first, "
                           "then backfill what it has read")
        batch = last + 1
        scratch = ScratchLayout.for_batch(layout, table.name, batch)
        _remove(scratch.warehouse)  # a recomputation that crashed before it was published
        history = _history(live, env)
        say(f"[{table.name}] recomputing {what} from the history of batches 0..{last} "
            f"({_describe_history(history)})")
        try:
            report = _recompute(spark, proj, table, live, scratch, history, window, what)
        except BaseException:
            _remove(scratch.warehouse)  # nothing was published: leave nothing behind
            raise
        if not report.rows_changed:
            _remove(scratch.warehouse)
            say(f"[{table.name}] recomputed {what}: {report.rows_recomputed} rows, nothing "
                "differs; no batch published")
        else:
            report.batch = live.run_batch(batch, {RECOMPUTED: {
                "what": what, "history_through": last,
                "window": None if window is None else [t.isoformat() for t in window]}})
    report.seconds = time.monotonic() - started
    return report


def rescale(spark: SparkSession, project: str | Path | Project, name: str, buckets: int, *,
            options: RunOptions) -> BatchStats | None:
    """Move streaming table ``name``'s operator state and current state to ``buckets``
    buckets, as one batch (None: it has that many already). A batch a crashed run left
    half done (a rescale among them) is finished first."""
    if not 1 <= buckets <= MAX_BUCKETS:
        raise RunError(f"buckets must be a whole number from 1 to {MAX_BUCKETS}, not {buckets}")
    proj, layout = open_project(project, options)
    table = proj.table(name)
    say = options.progress or (lambda _msg: None)
    with lock_tables(layout, [table.name]):
        live = Pipeline(spark, proj, table, layout, options.env, progress=options.progress)
        pending = live.log.pending()
        if pending is not None:
            live.run_batch(pending[0], pending[1])
        last = live.log.last_committed
        if last < 0:
            raise RunError(f"streaming table {table.name!r} has not run yet: its first run "
                           "chooses its buckets (--buckets, or WITH (buckets = ...))")
        if live.buckets == buckets:
            say(f"[{table.name}] has {buckets} buckets already: nothing to do")
            return None
        say(f"[{table.name}] rescaling from {live.buckets} to {buckets} buckets")
        return live.run_batch(last + 1, {RESCALE: buckets})


def refresh(
    spark: SparkSession,
    project: str | Path | Project,
    names: list[str],
    *,
    options: RunOptions,
) -> RunReport:
    """Full refresh: reset ``names`` and every table downstream of them, then run them all
    until idle (upstream first)."""
    proj = project if isinstance(project, Project) else load_project(project)
    affected = downstream_of(proj, names)
    reset_tables(proj, affected, warehouse=options.warehouse, progress=options.progress)
    return run_tables(spark, proj, options=options, names=affected, until_idle=True)


def downstream_of(project: Project, names: list[str], *,
                  skip: Collection[str] = ()) -> list[str]:
    """``names`` and every streaming table that reads them, directly or not, in run order;
    a table in ``skip`` is left out and the walk does not go on through it."""
    skipped = {n.lower() for n in skip}
    wanted = {project.table(n).name.lower() for n in names} - skipped
    out = []
    for t in project.order():
        if t.name.lower() in skipped:
            continue
        if t.name.lower() in wanted or {d.lower() for d in t.definition.deps} & wanted:
            wanted.add(t.name.lower())
            out.append(t.name)
    return out


def reset_tables(project: Project, names: list[str], *, warehouse: str | None = None,
                 progress: Callable[[str], None] | None = print) -> None:
    """Delete the tables' changelogs, current snapshots, state, batch logs and dead letters
    (local warehouses only), so their next run rebuilds them from all input. A table's
    sinks are reset with it; a sink named alone forgets what it published, so its table's
    next run publishes the whole changelog again."""
    layout = Layout(resolve_warehouse(project.root, warehouse))
    if "://" in layout.warehouse:
        raise RunError(f"resetting tables in {layout.warehouse} is not supported: delete "
                       "their folders with the storage's own tools")
    sinks = [project.sink(n) for n in names if n.lower() in project.sinks]
    tables = [project.table(n).name for n in names if n.lower() not in project.sinks]
    with lock_tables(layout, sorted({*tables, *(s.table for s in sinks)})):
        for t in tables:
            for path in (layout.changelog(t), layout.current(t), layout.dead_letters(t)):
                _remove(path)
            _clear(layout.internal(t))
            sinks.extend(project.sinks_of(t))
            if progress:
                progress(f"reset {t}: its next run rebuilds it from all input")
        for sink in {s.name: s for s in sinks}.values():
            _clear(layout.internal(sink.name))
            if progress:
                progress(f"reset sink {sink.name}: the next run of {sink.table} publishes its "
                         f"changelog to {sink.target} from the start")


def _clear(folder: str) -> None:
    """Delete what a table's or sink's internal folder holds, but its lock (held now)."""
    internal = Path(folder)
    for child in internal.iterdir() if internal.exists() else ():
        if child.name != "lock":
            _remove(str(child))


def _recompute(spark: SparkSession, project: Project, table, live: Pipeline,
               scratch: ScratchLayout, history: dict[str, Any],
               window: tuple[datetime, datetime] | None, what: str) -> BackfillReport:
    """Run the query over ``history`` into ``scratch``; measure (and for a ``window``,
    check) its difference from the live table."""
    part = table.definition.partitioning
    Pipeline(spark, project, table, scratch, live.env, buckets=live.buckets,
             progress=None).run_batch(0, history)
    pinned = (live.log.commit_payload(live.log.last_committed) or {}).get("versions", {})
    diff = recompute_diff(live, scratch, pinned).persist()
    try:
        report = BackfillReport(
            table.name, what, rows_changed=diff.count(),
            rows_recomputed=live.env.store.num_rows(scratch.current(table.name)) or 0)
        if part is not None and report.rows_changed:
            key = part.key_sql()
            if window is not None:
                _check_inside(diff, part.within_sql(*window), key, table.name, what)
            report.partitions = sorted(
                r[0] or "NULL" for r in diff.selectExpr(f"{key} AS k").distinct().collect())
    finally:
        diff.unpersist()
    return report


def _history(live: Pipeline, env: Environment) -> dict[str, Any]:
    """Inputs of one batch holding everything the table has read: the files it read that
    still exist (as they are now), every upstream / Delta version up to the last it read."""
    got: dict[str, Any] = {}
    for spec in live.inputs:
        if spec.kind == "files":
            existing = set(env.list_files(spec.path))
            files = sorted(f for f in live.log.processed_files(spec.key) if f in existing)
            if files:
                got[spec.key] = {"files": files}
        elif (to := live.log.last_version(spec.key)) is not None:
            got[spec.key] = {"from": None, "to": to}
    return got


def _describe_history(history: dict[str, Any]) -> str:
    parts = []
    for key, got in sorted(history.items()):
        name = key.split(":", 1)[1]
        parts.append(f"{name}: {len(got['files'])} file(s)" if "files" in got
                     else f"{name}: through version {got['to']}")
    return ", ".join(parts) or "no input"


def _check_inside(diff, inside: str, key: str, table: str, what: str) -> None:
    outside = (diff.filter(f"NOT coalesce({inside}, false)")
               .selectExpr(f"coalesce({key}, 'NULL') AS k").groupBy("k").count()
               .orderBy("k").collect())
    if outside:
        shown = ", ".join(f"{r['k']} ({r['count']} rows)" for r in outside[:SHOW_PARTITIONS])
        more = f" and {len(outside) - SHOW_PARTITIONS} more" if len(outside) > SHOW_PARTITIONS \
            else ""
        raise RunError(
            f"backfill of {table!r} for {what}: recomputing from its history also changes "
            f"partitions outside that range: {shown}{more}. Nothing was written; backfill a "
            "range that includes them, or run a full refresh.")


def _remove(path: str) -> None:
    if "://" not in path:
        shutil.rmtree(path, ignore_errors=True)

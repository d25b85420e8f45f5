"""The driver path: a small batch runs in the driver, its operators as Arrow kernels.

A batch whose input holds at most ``driver_rows`` rows (a run option; counted from
metadata before anything is read: Parquet footers, Kafka offsets, Delta file statistics,
lines of small text files) and ``arrow.DRIVER_BYTES``, whose plan the kernels cover
(filters, projections, unions, GROUP BY (windows that close and EMIT ON WINDOW CLOSE too),
joins, top-N, SESSION windows and sliding OVER ranges, ``state_ttl`` too), and whose
table's state the driver may hold (``held_rows``: at most ``driver_state_rows``, a run
option) runs here instead of in a Spark job:

1. each input's rows are read into Arrow (``toArrow``: the path's one Spark job per input
   read; record counts and dead letters are observed by it as on the Spark path);
2. stateless steps run as Spark SQL over the batch's rows (Spark's semantics: over a few
   thousand rows a local relation, no job; over more, one small job: ``local_frames``) and
   stateful operators as their Arrow steps over the run's state cache
   (``operators/kernels.py``, ``operators/partition_kernel.py``);
3. the change events, the operators' state changes and the current-state buckets the
   events fall in are written with Arrow and committed with delta-rs, each table once
   with the batch's app transaction, exactly as the Spark path commits them.

Anything the kernels do not cover raises ``Unsupported`` before a file is written, and the
batch runs on the Spark path. A batch that resumes a half-finished attempt runs here too:
the tables that attempt committed are left as they are (``writes.finished``), the others
get what it would have written (the same inputs and pinned state give the same rows).
"""
from __future__ import annotations

import os
from functools import reduce
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, WEIGHT
from octo_platform.errors import in_operator
from octo_platform.physical.plan import PAggregate, PhysicalPlan, PJoin, PSource, PStateless, \
    POver, PSession, PTopN, PUnion
from octo_platform.runtime.operators import BatchContext, apply_steps, bucket_cache
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.operators.arrow import DRIVER_BYTES, concat, key_join, primitive, \
    safe_keys
from octo_platform.runtime.operators.kernels import (
    HELD,
    AggregateKernel,
    JoinKernel,
    LocalContext,
    Unsupported,
    kernel_supports,
)
from octo_platform.runtime.operators.partition_kernel import OverKernel, SessionKernel, \
    TopNKernel
from octo_platform.runtime.operators.value_filter import ValueFilter
from octo_platform.runtime.events import arrow_buckets, change_events, event_buckets
from octo_platform.runtime.driver_inputs import LocalInputs, read_local
from octo_platform.runtime.inputs import read_inputs, set_watermarks, settle_inputs
from octo_platform.runtime.metrics import read_observed
from octo_platform.runtime.current import current_key, files_by_bucket, kernel_covers, \
    merge_current, merge_keyed
from octo_platform.runtime.operators.keyed_rows import KeyedRows
from octo_platform.runtime.operators.tasks import read_bucket
from octo_platform.runtime.sink import appends_current, event_bucket, write_dead_letters
from octo_platform.runtime.writes import LocalOutput, by_bucket, threaded, write_local
from octo_platform.sqltext import quote, unquote

if TYPE_CHECKING:
    from octo_platform.runtime.stats import BatchStats
    from octo_platform.runtime.table_run import TableRun

__all__ = ["DEFAULT_DRIVER_ROWS", "DEFAULT_DRIVER_STATE_ROWS", "plan_runs_in_driver",
           "input_rows", "held_rows", "forget_held", "keep_held", "run_in_driver",
           "Unsupported"]

# Measured (benchmarks/README.md, "The driver path's bounds"): on 2 local cores the driver
# path beat the Spark path at every batch size up to 1M rows, 2-9x.
DEFAULT_DRIVER_ROWS = 1_000_000
# The state the driver path holds in the driver's memory, per row: a run of one 100K-event
# batch over 2M keys of GROUP BY state (and 2M current rows) peaked ~290 MB above the same
# over 100K keys, ~150 bytes a row; Nexmark q4's 10.7M rows of join and GROUP BY state
# ~80 bytes a row (benchmarks/README.md).
HELD_ROW_BYTES = 150
DRIVER_STATE_SHARE = 8  # the driver may hold state up to 1/8 of its machine's memory


def memory_bytes() -> int | None:
    """The memory this process may use: the machine's, or its cgroup's limit when lower
    (a container's); None when unknown."""
    try:
        found = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit, encoding="ascii") as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit():
            found = min(found, int(value))
    return found


def default_driver_state_rows(memory: int | None = None) -> int:
    """``driver_state_rows``'s default: an eighth of the memory (``memory_bytes``) at
    ``HELD_ROW_BYTES`` a row (21M rows on a 24 GiB machine), at least 1M; 10M when the
    memory is not known."""
    memory = memory_bytes() if memory is None else memory
    if not memory:
        return 10_000_000
    return max(1_000_000, memory // DRIVER_STATE_SHARE // HELD_ROW_BYTES)


DEFAULT_DRIVER_STATE_ROWS = default_driver_state_rows()
_KAFKA_RECORD_BYTES = 1024  # a Kafka record's bytes are not known before it is fetched
_TEXT_BYTES_PER_ROW = 4096  # a text file bigger than this per allowed row is not counted
_W = quote(WEIGHT)
_CURRENT = f"{HELD}current"  # the run's current-state rows by bucket, and their version


def plan_runs_in_driver(plan: PhysicalPlan) -> bool:
    """Whether every operator of the plan has a driver-path kernel."""
    return all(isinstance(n, (PSource, PStateless, PUnion)) or kernel_supports(n)
               for n in plan.operators)


def held_rows(pipe: TableRun, state_log: Callable[[str], list[dict[str, Any]]],
              pinned: dict[str, int | None], memo: dict[str, Any]) -> int | None:
    """Rows the driver path would hold for the batch. Once the run holds state (``memo``'s
    ``kernels.HELD`` entries), what it holds, counted in memory (the Delta logs would cost a
    snapshot of every state table each batch, ~3 ms a table, where a batch whose cache is
    current reads none). Before that, from the Delta logs (no data read; the batch lists
    them anyway): every state table's pinned files (``state_log``; the run's state cache
    loads each table whole) and, unless the batch only appends to it, the current-state
    table's (the buckets the batch touches are read, then kept for the run); None when a
    file's count is unknown."""
    held = [entry[1] for key, entry in memo.items() if key.startswith(HELD)]
    if held:
        return sum(_num_rows(rows) for rows in held)
    files = [f for t in pipe.table.physical.state_tables for f in state_log(t)]
    if not appends_current(pipe, pinned):
        files += pipe.env.store.data_files(pipe.layout.current(pipe.name),
                                           pinned.get("current"))
    if any(f["rows"] is None for f in files):
        return None
    return sum(int(f["rows"]) for f in files)


def _num_rows(held: Any) -> int:
    """Rows of a held entry: a state table's rows (``KeyedRows`` or Arrow), or the
    current-state rows by bucket."""
    if isinstance(held, dict):
        return sum(_num_rows(rows) for rows in held.values())
    return held.num_rows


def keep_held(pipe: TableRun) -> None:
    """At the end of a run: what the driver path holds (``kernels.HELD`` entries of the
    memo), kept in this machine's state cache (``bucket_cache``) under the files of the
    version it stands for, so that the next run's first batch here maps it instead of
    reading the state from Delta: each state table whole, each current-state bucket."""
    store = pipe.env.store
    last = (pipe.log.commit_payload(pipe.log.last_committed) or {}).get("versions", {})
    for key, entry in list(pipe.memo.items()):
        if not key.startswith(HELD):
            continue
        (version, held), name = entry, key.removeprefix(HELD)
        if version is None or last.get(name if key == _CURRENT else f"state/{name}") != version:
            continue  # held since a later batch ran on the Spark path: stale
        if key == _CURRENT:
            path = pipe.layout.current(pipe.name)
            files = files_by_bucket(store, path, version)
            for b, rows in held.items():
                bucket_cache.keep(path, b, [f["path"] for f in files.get(b, [])],
                                  rows.table() if isinstance(rows, KeyedRows) else rows)
        else:
            path = pipe.layout.state(pipe.name, name)
            bucket_cache.keep(path, bucket_cache.WHOLE,
                              [f["path"] for f in store.data_files(path, version)], held.table())


def forget_held(memo: dict[str, Any]) -> None:
    """Drop what the driver path holds for the run (the state cache and the current-state
    rows: the memo's ``kernels.HELD`` entries)."""
    for key in [k for k in memo if k.startswith(HELD)]:
        del memo[key]


def _file_system(path: str) -> tuple[Any, str]:
    """pyarrow's file system of a local path or an object's URI (``s3://``, ``s3a://``),
    and the path in it."""
    from pyarrow import fs

    if "://" not in path:
        return fs.LocalFileSystem(), os.path.abspath(path)
    return fs.FileSystem.from_uri(path.replace("s3a://", "s3://", 1))


def input_rows(pipe: TableRun, inputs: dict[str, Any], limit: int) -> int | None:
    """Rows the batch reads, from metadata (no data read but small text files' lines);
    None when unknown, clearly above ``limit``, or more than ``DRIVER_BYTES``."""
    import pyarrow.parquet as pq

    rows = size = 0
    for spec in pipe.inputs:
        got = inputs.get(spec.key)
        if not got:
            continue
        if spec.kind == "kafka":
            records = sum(b - a for a, b in got["ranges"].values())
            rows, size = rows + records, size + records * _KAFKA_RECORD_BYTES
        elif spec.kind == "files":
            parquet = pipe.project.source(spec.name).format == "parquet"
            for f in got["files"]:
                try:
                    store, path = _file_system(f)
                    if parquet:
                        with store.open_input_file(path) as fh:
                            meta = pq.ParquetFile(fh).metadata
                        rows += meta.num_rows
                        size += sum(meta.row_group(i).total_byte_size
                                    for i in range(meta.num_row_groups))
                    else:
                        bytes_ = store.get_file_info(path).size or 0
                        size += bytes_
                        if size > DRIVER_BYTES or bytes_ > _TEXT_BYTES_PER_ROW * max(limit, 1):
                            return None
                        with store.open_input_stream(path) as fh:
                            rows += fh.read().count(b"\n") + 1
                except (OSError, pa.ArrowException):  # gone or unreadable: Spark reports it
                    return None
        else:  # a Delta table's versions: the rows of the files added between them
            store = pipe.env.store
            before = {f["path"] for f in store.data_files(spec.path, got.get("from"))}
            added = [f for f in store.data_files(spec.path, got["to"])
                     if f["path"] not in before]
            if any(f["rows"] is None for f in added):
                return None
            rows += 2 * sum(int(f["rows"]) for f in added)  # an update is two rows
            size += sum(int(f["size"]) for f in added)
        if rows > limit or size > DRIVER_BYTES:
            return None
    return rows


def run_in_driver(pipe: TableRun, ctx: BatchContext, inputs: dict[str, Any], rows: int,
                  pinned: dict[str, int | None], ts_ms: int, stats: BatchStats, *,
                  resumed: bool) -> dict[str, int | None]:
    """Run the batch (``rows``: its input rows, ``input_rows``; ``resumed``: it finishes an
    earlier attempt) in the driver: the new versions of the tables it wrote (``stats`` gets
    the batch's counts). Raises ``Unsupported`` (before writing anything) for what the
    kernels lack."""
    plan = pipe.table.physical
    lc = LocalContext(ctx, pinned)
    try:
        local: LocalInputs | None = read_local(pipe, lc, inputs, rows, stats)
        tables, lc.kept = local.tables, local.kept
        set_watermarks(pipe, ctx, stats.watermarks, local.watermarks)
    except Unsupported:  # read with Spark: a job per input
        local, observed = None, read_inputs(pipe, ctx, inputs, stats)
        tables = {}
        for src in plan.sources:
            df = ctx.inputs[src.name.lower()]
            tables[src.name.lower()] = (df.toArrow() if inputs.get(_key(src))
                                        else arrow_schema(df.schema).empty_table())
        ctx.observed.update(read_observed(ctx.watched))  # their counts
    if not all(primitive(f.type) for t in tables.values() for f in t.schema):
        raise Unsupported("nested types")
    delta = evaluate(plan.root, lc, tables)
    delta = delta.rename_columns([*plan.root.columns, WEIGHT])
    if plan.restarts_keys:
        delta = restarted(pipe, lc, delta, pinned)
    events = with_bucket(pipe, lc, encode(pipe, delta, ctx.batch, ts_ms))
    lay = pipe.layout
    outputs = [LocalOutput(f"state/{w.table}", lay.state(pipe.name, w.table), w.rows,
                           remove=w.remove, prefix=w.prefix, bucketed=w.bucketed,
                           replace=None if w.replace is None else set(w.replace))
               for w in lc.writes]
    outputs.append(LocalOutput("changelog", lay.changelog(pipe.name),
                               events.drop_columns([BUCKET])))
    now, kept = current(pipe, ctx, events, pinned)
    outputs.append(now)
    if local is not None and local.dead:
        dead = pa.concat_tables(local.dead)
        n = dead.num_rows
        outputs.append(LocalOutput("dead_letters", lay.dead_letters(pipe.name), dead.append_column(
            "table", pa.repeat(pa.scalar(pipe.name, pa.string()), n)).append_column(
            "batch_id", pa.repeat(pa.scalar(ctx.batch, pa.int64()), n)).append_column(
            "ts_ms", pa.repeat(pa.scalar(ts_ms, pa.int64()), n))))
    versions = write_local(outputs, batch=ctx.batch, store=pipe.env.store, resumed=resumed)
    lc.settle(versions)
    if kept is not None:
        ctx.memo[_CURRENT] = (versions.get("current"), kept)
    else:  # appended to: buckets an earlier batch rewrote and kept are out of date
        ctx.memo.pop(_CURRENT, None)
    stats.events = {c["values"]: c["counts"]
                    for c in pc.value_counts(events.column("op")).to_pylist()}
    if local is not None:
        local.settle(stats)
    else:
        settle_inputs(observed, stats, ctx.observed)
        if stats.dead_letters:
            write_dead_letters(pipe, ctx.dead_letters, ctx.batch, ts_ms, resumed=resumed)
    return versions


def restarted(pipe: TableRun, lc: LocalContext, delta: pa.Table,
              pinned: dict[str, int | None]) -> pa.Table:
    """``sink.restarted`` in Arrow: a key whose group ``state_ttl`` forgot gets the
    retraction of the row the current-state table holds for it (its insert becomes a ``u``,
    never a second row)."""
    keys = list(pipe.table.physical.pk or ())
    path, store = pipe.layout.current(pipe.name), pipe.env.store
    files = files_by_bucket(store, path, pinned.get("current"))
    if not keys or not files:
        return delta
    w = delta[WEIGHT]
    ins, dels = (safe_keys(delta.filter(cond).select(keys), keys, "_k")
                 for cond in (pc.greater(w, 0), pc.less(w, 0)))
    lone = key_join(ins[0], dels[0].select(dels[1]), ins[1], dels[1], "left anti")
    if not lone.num_rows:
        return delta
    lone = lone.select(keys).append_column(BUCKET, lc.bucket(lone, keys))
    schema = delta.schema.remove(delta.schema.get_field_index(WEIGHT))
    reader = store.reader()
    held = concat([read_bucket(reader, path, files.get(b, []), schema)
                   for b in pc.unique(lone[BUCKET]).to_pylist()], schema)
    held, cols = safe_keys(held, keys, "_k")
    held = key_join(held, safe_keys(lone, keys, "_k")[0].select(cols), cols, cols, "left semi")
    old = held.select(schema.names).append_column(
        WEIGHT, pa.array(np.full(held.num_rows, -1, np.int64)))
    return concat([delta, old], delta.schema)


def with_bucket(pipe: TableRun, lc: LocalContext, events: pa.Table) -> pa.Table:
    """``events`` with each event's current-state bucket (``sink.event_bucket``): computed
    in Arrow for keys of the types ``spark_hash`` covers, else by Spark."""
    keys = current_key(pipe)
    if arrow_buckets(events.schema.field("after").type, keys):
        return events.append_column(BUCKET, event_buckets(events, keys, pipe.buckets))
    return lc.sql("events", events, lambda df: df.selectExpr(
        "*", f"{event_bucket(pipe)} AS {BUCKET}"))


def _key(src: PSource) -> str:
    from octo_platform.runtime.offsets import source_key

    return source_key(src.kind, src.name)


def evaluate(node: Any, lc: LocalContext, tables: dict[str, pa.Table]) -> pa.Table:
    """The output Δ of ``node`` as Arrow (the driver-path twin of ``operators.evaluate``);
    an error carries the operator's name (``errors.in_operator``)."""
    with in_operator(node.located()):
        return _evaluate(node, lc, tables)


def _evaluate(node: Any, lc: LocalContext, tables: dict[str, pa.Table]) -> pa.Table:
    if isinstance(node, PSource):
        return tables[node.name.lower()]
    if isinstance(node, PStateless):
        table, steps = evaluate(node.input, lc, tables), node.steps
        if node.id in lc.kept:  # its first filter was evaluated with the read
            table, steps = table.filter(lc.kept[node.id]), steps[1:]
        while steps:  # what needs no Spark call, or one about a few values only
            if (picked := _columns(steps[0], table)) is not None:
                table = table.select(picked).rename_columns([*steps[0][1], WEIGHT])
            elif steps[0][0] == "filter" and \
                    (by_value := ValueFilter.of(lc, table, steps[0][2][0])) is not None \
                    and (kept := by_value.apply(lc, table)) is not None:
                table = kept
            else:
                break
            steps = steps[1:]
        if not steps:
            return table
        return lc.sql(f"{node.id}:{len(steps)}", table,
                      lambda df: apply_steps(df, steps, _W))
    if isinstance(node, PUnion):
        names = [*node.columns, WEIGHT]
        parts = [evaluate(c, lc, tables).rename_columns(names) for c in node.children]

        def widened() -> pa.Schema:  # Spark's UNION ALL types
            frames = [lc.frame(p) for p in parts]
            return arrow_schema(reduce(lambda a, b: a.union(b), frames).schema)
        return concat(parts, lc.once(f"{node.id}:{[p.schema for p in parts]}", widened))
    if isinstance(node, PAggregate):
        return AggregateKernel(node, lc).run(evaluate(node.input, lc, tables))
    if isinstance(node, PJoin):
        return JoinKernel(node, lc).run(evaluate(node.left, lc, tables),
                                        evaluate(node.right, lc, tables))
    if isinstance(node, PTopN):
        return TopNKernel(node, lc).run(evaluate(node.input, lc, tables))
    if isinstance(node, PSession):
        return SessionKernel(node, lc).run(evaluate(node.input, lc, tables))
    if isinstance(node, POver):
        return OverKernel(node, lc).run(evaluate(node.input, lc, tables))
    raise Unsupported(type(node).__name__)


def _columns(step: tuple, table: pa.Table) -> list[str] | None:
    """The columns a projection of bare column references picks (then the weight), or
    None for a step that needs Spark (a filter, any other expression)."""
    kind, _, exprs = step
    if kind != "project":
        return None
    picked = [unquote(e) for e in exprs]
    if any(p is None or p not in table.column_names for p in picked):
        return None
    return [*picked, WEIGHT]  # type: ignore[list-item]


def encode(pipe: TableRun, delta: pa.Table, batch: int, ts_ms: int) -> pa.Table:
    """The change events of the batch's Δ (``change_events``)."""
    plan = pipe.table.physical
    return change_events(delta, plan.root.columns, plan.pk, table=pipe.name, batch=batch,
                         ts_ms=ts_ms)


def current(pipe: TableRun, ctx: BatchContext, events: pa.Table, pinned: dict[str, int | None]
            ) -> tuple[LocalOutput, dict[int, Any] | None]:
    """The current-state rows of the buckets the events fall in (``_bucket``), as
    ``sink.update_current`` makes them; an append-only table appends its new rows. Also
    every bucket's rows the run holds after the batch (None: none held): a bucket is read
    once per run, then kept (a keyed table's found by key, ``merge_keyed``) while the
    table's version is the one the next batch pins."""
    path = pipe.layout.current(pipe.name)
    if appends_current(pipe, pinned):
        after = events.filter(pc.is_valid(events["after"]))
        new = pa.Table.from_struct_array(after["after"]).append_column(BUCKET, after[BUCKET])
        return LocalOutput("current", path, new, bucketed=True), None
    changes = dict(by_bucket(events))  # each touched bucket's events
    store, image = pipe.env.store, events.schema.field("after").type
    schema = pa.schema(list(image))
    if not kernel_covers(pipe, schema):
        raise Unsupported("current-state columns of nested types")
    keyed, keys = pipe.table.physical.keyed_changes, current_key(pipe)
    files, reader = files_by_bucket(store, path, pinned.get("current")), store.reader()
    held = ctx.memo.get(_CURRENT)
    kept = dict(held[1]) if held is not None and held[0] == pinned.get("current") else {}

    def bucket(b: int) -> tuple[Any, pa.Table]:  # the bucket's rows, kept and as written
        rows = kept.get(b)
        if rows is None:  # this machine's entry (the Spark path's, a run's end), or Delta
            rows = bucket_cache.cached(path, b, [f["path"] for f in files.get(b, [])])
            if rows is None:
                rows = read_bucket(reader, path, files.get(b, []), schema)
            rows = KeyedRows(rows, keys, kept=True) if keyed else rows
        if keyed:
            rows = merge_keyed(rows, changes[b])
            return rows, rows.table()
        rows = merge_current(rows, changes[b], keys, keyed=False)
        return rows, rows
    done = threaded(bucket, list(changes))
    kept.update((b, rows) for b, (rows, _) in done)
    out = concat([rows.append_column(BUCKET, pa.array(np.full(rows.num_rows, b, np.int32)))
                  for b, (_, rows) in done], schema.append(pa.field(BUCKET, pa.int32())))
    return LocalOutput("current", path, out, bucketed=True, replace=set(changes)), kept

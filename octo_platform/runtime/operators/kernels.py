"""Operator kernels over Arrow for the driver path (``runtime/driver.py``): a small batch's
Δ and the state of the keys it touches -> output Δ and state changes, with no Spark job.

State is found by key: each state table's rows live in a cache that lasts the whole run
(``LocalContext.cached``, indexed by the operator's key: ``keyed_rows.KeyedRows``), loaded
once from the versions the batch log pins and then updated from each batch's own state
changes, so a batch reaches the rows of the keys it touches and no others; an entry whose
version is not the pinned one (a Spark-path batch ran in between, or a retry) is reloaded,
never trusted. The kernels write the same state tables, in the same format, as the Spark
path (``aggregate_tasks``, ``join_tasks``), so a run may switch paths between any two
batches; GROUP BY's and joins' steps (``aggregate``, ``join``) are the ones
the Spark path runs in its tasks. Result types come from Spark's analysis (once per run),
and the SQL expressions left (join keys, residual conditions) are evaluated by Spark over
local relations (``arrow.spark_eval``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import BUCKET, COUNT
from octo_platform.errors import TooManyPairs
from octo_platform.local_frames import arrow_schema, arrow_type, local_frame
from octo_platform.physical.plan import PAggregate, PJoin, POver, PSession, PTopN
from octo_platform.runtime.operators import bucket_cache
from octo_platform.runtime.operators.arrow import concat, local_path, read_parquet, spark_eval
from octo_platform.runtime.operators.aggregate import aggregate_step, \
    live_rows, newest, with_batch_column
from octo_platform.runtime.operators.aggregate import shape as aggregate_shape
from octo_platform.runtime.operators.context import BatchContext, bucket_sql
from octo_platform.runtime.operators.join import Join, summed
from octo_platform.runtime.operators.keyed_rows import KeyedRows
from octo_platform.runtime.operators.spark_hash import hashable, spark_hash, spark_pmod
from octo_platform.runtime.state_log import BATCH, StateFile, compaction, latest, \
    read_log, unexpired, with_batch
from octo_platform.runtime.writes import threaded
from octo_platform.sqltext import unquote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["LocalContext", "StagedRows", "AggregateKernel", "JoinKernel", "kernel_supports",
           "Unsupported", "HELD"]

# The pipeline memo's keys of what a run holds in the driver: each state table's rows (``HELD``
# + the table, ``LocalContext.cached``) and the current-state buckets (``driver.current``).
HELD = "cache:"


class Unsupported(Exception):
    """A batch the kernels do not cover (raised before anything is written): it runs on
    the Spark path instead."""


def kernel_supports(node: object) -> bool:
    """Whether the driver path has a kernel for a stateful node (others run on Spark)."""
    return isinstance(node, (PAggregate, PJoin, PTopN, PSession, POver))


@dataclass
class StagedRows:
    """Rows for a state table, written by the driver: a ``delta`` file of the batch's
    changes, or ``base`` rows of a full compaction replacing the files in ``remove``; or
    the new contents of the ``replace`` buckets (top-N, SESSION: ``partition_kernel``)."""

    table: str
    rows: pa.Table
    prefix: str = "delta"
    remove: tuple[str, ...] = ()
    bucketed: bool = False  # ``rows`` has a ``_bucket`` column: the table is partitioned
    replace: tuple[int, ...] | None = None


@dataclass
class LocalContext:
    """What the kernels of one driver-path batch share: the batch (``ctx``: Spark, batch
    number, the state logs' pinned files, the pipeline's memo), the versions the batch log
    pins, the staged state writes and each state table's rows after the batch."""

    ctx: BatchContext
    pinned: dict[str, int | None]
    writes: list[StagedRows] = field(default_factory=list)
    fresh: dict[str, KeyedRows] = field(default_factory=dict)
    # by stateless node right above a source: which of the source's rows its first filter
    # keeps, evaluated as the inputs were read (``driver_inputs.first_filters``)
    kept: dict[str, pa.Array] = field(default_factory=dict)

    @property
    def spark(self):
        return self.ctx.spark

    def frame(self, table: pa.Table) -> DataFrame:
        """An empty local relation of ``table``'s columns: for Spark's analysis only."""
        return local_frame(self.spark, table.schema.empty_table())

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per run (what Spark's analysis says about a schema)."""
        memo = self.ctx.memo
        if key not in memo:
            memo[key] = make()
        return memo[key]

    def sql(self, what: str, table: pa.Table, build: Callable[[DataFrame], DataFrame]
            ) -> pa.Table:
        """``arrow.spark_eval``; once its result's columns are known, not asked again, and
        for an empty table, no call to Spark at all."""
        key = f"sql:{what}:{table.schema}"
        known = self.ctx.memo.get(key)
        if not table.num_rows and known is not None:
            return known.empty_table()
        out = spark_eval(self.spark, table, build, known)
        self.ctx.memo[key] = out.schema
        return out

    def cached(self, table: str, load: Callable[[], DataFrame],
               local: Callable[[list[StateFile]], pa.Table | None],
               keys: list[str]) -> KeyedRows:
        """State table ``table``'s rows as of the pinned version, found by the columns
        ``keys``: from the run's cache when it holds that version, else from this machine's
        cache when an earlier run kept them (``driver.keep_held``), else loaded: with Arrow
        from local files (``local``, given the pinned files, none for an empty log; None
        when one is remote), else by Spark (``load``: the rows as a Spark frame)."""
        version = self.pinned.get(f"state/{table}")
        got = self.ctx.memo.get(f"{HELD}{table}")
        if got is not None and got[0] == version:
            return got[1]
        files = self.ctx.state_log(table)
        rows = bucket_cache.cached(self.ctx.state_path(table), bucket_cache.WHOLE,
                                   [f["path"] for f in files])  # an earlier run's, here
        if rows is None:
            rows = local(files)
        cache = KeyedRows(load().toArrow() if rows is None else rows, keys, kept=True)
        self.ctx.memo[f"{HELD}{table}"] = (version, cache)
        return cache

    def settle(self, versions: dict[str, int | None]) -> None:
        """After the commits: the cache holds each state table's rows at its new version."""
        for table, rows in self.fresh.items():
            self.ctx.memo[f"{HELD}{table}"] = (versions.get(f"state/{table}"), rows)

    def stage(self, table: str, changes: pa.Table, before: Callable[[], pa.Table],
              base: Callable[[pa.Table], pa.Table],
              merge: Callable[[pa.Table], pa.Table],
              bucket_keys: list[str] | None = None) -> None:
        """Stage the batch's ``changes`` for the end of a state log (its ``base`` when the log
        is empty), and the log's compaction when it is due (``state_log.compaction``): a full
        one is ``base(before())``, the rows before the batch, replacing every pinned file; a
        partial one is ``merge`` of the rows of the delta files it merges (read with Arrow;
        from a remote warehouse, a full one instead), replacing them. ``bucket_keys``: the
        log is partitioned by the bucket of these columns (an aggregate's group key)."""
        files = self.ctx.state_log(table)

        def staged(rows: pa.Table, prefix: str, remove: tuple[str, ...] = ()) -> StagedRows:
            if bucket_keys is None:
                return StagedRows(table, rows, prefix, remove)
            return StagedRows(table, rows.append_column(BUCKET, self.bucket(rows, bucket_keys)),
                              prefix, remove, bucketed=True)

        due = compaction(files)
        if due is not None:
            merging, full = due
            rows = None if full else _read_files(merging, changes.schema)
            if rows is None:
                self.writes.append(staged(base(before()), "base",
                                          tuple(f["path"] for f in files)))
            else:
                self.writes.append(staged(merge(rows), "delta",
                                          tuple(f["path"] for f in merging)))
        self.writes.append(staged(changes, "delta" if files else "base"))

    def bucket(self, table: pa.Table, keys: list[str]) -> pa.Array:
        """Each row's bucket of ``keys`` (``context.bucket_sql``): in Arrow for the types
        ``spark_hash`` covers, else by Spark."""
        if not keys:
            return pa.repeat(pa.scalar(0, pa.int32()), table.num_rows)
        if all(hashable(table.schema.field(k).type) for k in keys):
            return spark_pmod(spark_hash([table[k] for k in keys]), self.ctx.buckets)
        got = self.sql(f"bucket:{keys}", table.select(keys), lambda df: df.selectExpr(
            f"{bucket_sql(keys, self.ctx.buckets)} AS {BUCKET}"))
        return got[BUCKET]


def _latest(files: list[StateFile], schema: pa.Schema, keys: list[str], alive: str | None
            ) -> pa.Table | None:
    """``state_log.latest`` (with ``_batch``) in Arrow over local files: each key's newest
    row; with ``alive``, those whose count column ``alive`` is not 0. None when a file is
    remote."""
    rows = _read_files(files, schema)
    return None if rows is None else live_rows(rows, files, keys, alive)


def _read_files(files: list[dict], schema: pa.Schema) -> pa.Table | None:
    """The rows of local state files, as ``schema``; None when one is remote."""
    paths = [local_path(f["uri"]) for f in files]
    if any(p is None for p in paths):
        return None
    return concat([read_parquet(p, schema) for p in paths], schema)


class AggregateKernel:
    """GROUP BY with retractions: ``aggregate.AggregateStep`` over the run's cache of the
    state."""

    def __init__(self, node: PAggregate, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.keys = list(node.keys)

    def run(self, delta: pa.Table) -> pa.Table:
        node, lc, keys = self.node, self.lc, self.keys
        shape = lc.once(f"shape:{node.id}:{delta.schema}",
                        lambda: aggregate_shape(node, lc.ctx, lc.frame(delta)))
        step = aggregate_step(node, shape, lc.ctx.batch)
        if step is None:
            raise Unsupported("nested types")
        # the state and its multisets loaded side by side (without a change, the multisets
        # only if the batch goes on: a window closes)
        got = dict(threaded(lambda i: self.state(shape, i),
                            [None, *shape.ms_schemas] if delta.num_rows else [None]))
        state = got[None]
        marks = (lc.ctx.watermark_before, lc.ctx.watermark)
        closing = node.emit_on_close and lc.ctx.watermark_moved
        if not delta.num_rows and (keys or state.num_rows) and not closing:  # no change
            return step.out.empty_table()
        ms_state = {i: got[i] if i in got else self.state(shape, i) for i in shape.ms_schemas}
        # Every row is wanted where groups leave without being touched (a window closes)
        # or there is one group; else only the touched groups' rows, found by key.
        whole = not keys or node.emit_on_close or step.closes is not None
        cut = lc.ctx.cut(node)  # ``state_ttl``: a forgotten group starts afresh
        if whole:
            before = unexpired(state.table(), cut)
            ms_before = {i: s.table() for i, s in ms_state.items()}
        else:
            found = dict(threaded(lambda i: ms_state[i].find(delta) if i is not None
                                  else state.find(delta), [None, *ms_state]))
            before = unexpired(found[None].rows, cut)
            ms_before = {i: f.rows for i, f in found.items() if i is not None}
        done = step.run(delta, before, ms_before, keep_after=whole, forgets=cut is not None)

        def kept(rows: pa.Table, groups: pa.Table | None = None) -> pa.Table:
            return step.kept(rows, marks[1], cut, groups)
        lc.fresh[node.id] = KeyedRows(kept(done.after), keys) if whole else state.replace(
            found[None], done.changes.filter(pc.not_equal(done.changes[COUNT], 0)))
        lc.stage(node.id, done.changes, state.table, kept, newest(keys), keys)
        for i, (changes, after) in done.ms.items():
            table = node.multiset_table(i)
            lc.fresh[table] = KeyedRows(kept(after, done.after), keys) if whole else \
                ms_state[i].replace(found[i], after)
            lc.stage(table, changes, ms_state[i].table,
                     lambda rows: kept(rows, state.table()), newest([*keys, "v"]), keys)
        if node.emit_on_close:  # the final rows of the groups whose window closes
            return step.output(step.closing(done.table, before, *marks))
        return step.output(done.table)

    def state(self, shape: Any, i: int | None) -> KeyedRows:
        """The rows of the aggregate's state (``i`` None), or of its ``i``-th value
        multiset, found by the group key (``LocalContext.cached``)."""
        node, lc, keys = self.node, self.lc, self.keys
        table = node.id if i is None else node.multiset_table(i)
        schema = shape.state_schema if i is None else shape.ms_schemas[i]
        key, alive = (keys, COUNT if keys else None) if i is None else ([*keys, "v"], "cnt")
        return lc.cached(table, lambda: latest(
            lc.spark, lc.ctx.state_log(table), schema, key,
            alive=None if alive is None else f"{alive} != 0", keep_batch=True),
            lambda files: _latest(files, arrow_schema(with_batch(schema)), key, alive), keys)

class JoinKernel:
    """Delta-rule joins: ``join.JoinStep`` over the run's cache of each side's state
    (``join.Join``'s layout); the residual condition, join keys and casts are Spark SQL
    over local relations."""

    def __init__(self, node: PJoin, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.op = Join(node, lc.ctx)
        self.step = self.op.step()

    def run(self, ldelta: pa.Table, rdelta: pa.Table) -> pa.Table:
        op, lc, node = self.op, self.lc, self.node
        frames = {"l": ldelta.rename_columns([*op.names["l"], "_lw"]),
                  "r": rdelta.rename_columns([*op.names["r"], "_rw"])}
        if not ldelta.num_rows and not rdelta.num_rows:
            return self.step.out_schema(frames).empty_table()
        types = lc.once(f"keys:{node.id}", lambda: op.key_types(
            lc.frame(frames["l"]), lc.frame(frames["r"])))
        keyed = {s: self.keyed(s, frames[s], types) for s in "lr"}
        kcols = self.step.kcols
        state = {s: self.before(s, keyed[s]) for s in "lr"}
        # each side's rows of the join keys the other side's rows touch (what an inner
        # join matches), or of those either side touches (outer, semi, anti: a row's
        # matches before and after the batch)
        found = {s: state[s].find(concat([keyed[x].select(list(kcols[x])).rename_columns(
            list(kcols[s])) for x in "lr" if x != s or self.step.kind != "inner"],
            keyed[s].select(list(kcols[s])).schema)) for s in "lr"}

        def on(what: str, rows: pa.Table) -> pa.Table:
            return lc.sql(f"{node.id}:{what}", rows, lambda df: df.filter(node.residual))

        cut, names = lc.ctx.cut(node), {s: self.step.row(s) for s in "lr"}  # a forgotten row
        try:  # no longer matches
            out, delta, _ = self.step.run(keyed, {s: unexpired(found[s].rows, cut).select(
                names[s]) for s in "lr"}, on)
        except TooManyPairs as e:
            raise Unsupported(str(e)) from e
        for s in "lr":
            self.stage(s, state[s], delta[s])
        return out

    def keyed(self, s: str, rows: pa.Table, types: list[str]) -> pa.Table:
        """``rows`` of side ``s`` with its join key columns (``Join.with_keys``): in Arrow
        when each key is a column that already has its key type (the cast is the
        identity), else by Spark."""
        op = self.op
        picked = [unquote(k) for k in op.keys[s]]
        if all(p in rows.column_names and rows.schema.field(p).type == arrow_type(t)
               for p, t in zip(picked, types)):
            for p, c in zip(picked, op.kcols(s)):
                rows = rows.append_column(c, rows[p])
            return rows
        return self.lc.sql(f"{self.node.id}:{s}", rows,
                           lambda df: op.with_keys(df, s, types))

    def stored(self, s: str, keyed: pa.Table) -> Any:
        """Side ``s``'s stored Spark schema (``Join.stored_schema``; with ``state_ttl``,
        each row's ``_batch``)."""
        lc = self.lc

        def schema() -> Any:
            got = self.op.stored_schema(s, lc.frame(keyed.select(self.step.row(s))).schema)
            return with_batch(got) if self.node.ttl_us else got
        return lc.once(f"side:{self.node.id}:{s}:{keyed.schema}", schema)

    def row(self, s: str) -> list[str]:
        """Side ``s``'s row as the cache holds it (``JoinStep.row``, then ``_batch`` with
        ``state_ttl``)."""
        return [*self.step.row(s), *([BATCH] if self.node.ttl_us else [])]

    def before(self, s: str, keyed: pa.Table) -> KeyedRows:
        """Side ``s``'s rows (``Join.row``) before the batch, from the run's cache, found
        by join key."""
        table = self.node.side_table(self.op.SIDES[s])
        stored = self.stored(s, keyed)
        names = self.row(s)

        def local(files: list[StateFile]) -> pa.Table | None:
            rows = _read_files(files, arrow_schema(stored))
            return None if rows is None else rows.rename_columns(names)
        return self.lc.cached(table, lambda: read_log(
            self.lc.spark, self.lc.ctx.state_log(table), stored).toDF(*names), local,
            list(self.step.kcols[s]))

    def stage(self, s: str, state: KeyedRows, delta: pa.Table) -> None:
        """Stage the batch's rows of side ``s`` (``delta``, consolidated) for its log, and
        keep the side's rows after the batch for the cache (the batch's rows added: a
        retraction is a row of negative weight, as in the log)."""
        op, lc, ttl = self.op, self.lc, self.node.ttl_us
        cut = lc.ctx.cut(self.node)
        table = self.node.side_table(op.SIDES[s])
        if ttl:  # each row's batch (a compaction sums multiplicities per batch)
            delta = with_batch_column(delta, lc.ctx.batch)
        lc.fresh[table] = state.add(delta)
        names = [*op.stored_names(s), *([BATCH] if ttl else [])]
        kept = arrow_schema(self.stored(s, delta))
        merge = functools.partial(summed, schema=kept)
        lc.stage(table, delta.rename_columns(names).cast(kept), state.table,
                 lambda rows: unexpired(merge(rows.rename_columns(names)), cut), merge,
                 op.stored_keys(s))

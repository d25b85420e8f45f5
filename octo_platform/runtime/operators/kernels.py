"""Operator kernels over Arrow for the driver path (``runtime/driver.py``): a small batch's
Δ and the state of the keys it touches -> output Δ and state changes, with no Spark job.

State is found by key: each state table's rows live in a cache that lasts the whole run
(``LocalContext.cached``), loaded once from the versions the batch log pins and then
updated from each batch's own state changes; an entry whose version is not the pinned one
(a Spark-path batch ran in between, or a retry) is reloaded, never trusted. The kernels
write the same state tables, in the same format, as the Spark operators (``aggregate``,
``join``), so a run may switch paths between any two batches. Accumulator types and every
SQL expression (output values, join keys, residual conditions) come from those operators
and are evaluated by Spark over local relations (``arrow.spark_eval``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import COUNT, WEIGHT
from octo_platform.local_frames import arrow_type, local_frame
from octo_platform.physical.plan import PAggregate, PJoin
from octo_platform.runtime.operators.aggregate import Aggregate
from octo_platform.runtime.operators.arrow import (
    arrow_schema,
    concat,
    key_join,
    local_path,
    safe_keys,
    spark_eval,
)
from octo_platform.runtime.operators.context import BatchContext, positional, side_schema
from octo_platform.runtime.operators.join import Join
from octo_platform.runtime.state_log import BATCH, compaction, latest, read_log
from octo_platform.sqltext import unquote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["LocalContext", "StagedRows", "AggregateKernel", "JoinKernel", "kernel_supports",
           "Unsupported"]


class Unsupported(Exception):
    """A batch the kernels do not cover (raised before anything is written): it runs on
    the Spark path instead."""


def kernel_supports(node: object) -> bool:
    """Whether the driver path has a kernel for a stateful node (others run on Spark)."""
    if isinstance(node, PAggregate):
        return node.closes is None and not node.emit_on_close and node.ttl_us is None
    if isinstance(node, PJoin):
        return node.ttl_us is None
    return False


@dataclass
class StagedRows:
    """Rows for a state table, written by the driver: a ``delta`` file of the batch's
    changes, or ``base`` rows of a full compaction replacing the files in ``remove``."""

    table: str
    rows: pa.Table
    prefix: str = "delta"
    remove: tuple[str, ...] = ()


@dataclass
class LocalContext:
    """What the kernels of one driver-path batch share: the batch (``ctx``: Spark, batch
    number, the state logs' pinned files, the pipeline's memo), the versions the batch log
    pins, the staged state writes and each state table's rows after the batch."""

    ctx: BatchContext
    pinned: dict[str, int | None]
    writes: list[StagedRows] = field(default_factory=list)
    fresh: dict[str, pa.Table] = field(default_factory=dict)

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

    def cached(self, table: str, load: Callable[[], DataFrame]) -> pa.Table:
        """State table ``table``'s rows as of the pinned version: from the run's cache when
        it holds that version, else loaded (``load``: the rows as a Spark frame)."""
        version = self.pinned.get(f"state/{table}")
        got = self.ctx.memo.get(f"cache:{table}")
        if got is not None and got[0] == version:
            return got[1]
        df = load()
        rows = df.toArrow() if self.ctx.state_log(table) else \
            arrow_schema(df.schema).empty_table()
        self.ctx.memo[f"cache:{table}"] = (version, rows)
        return rows

    def settle(self, versions: dict[str, int | None]) -> None:
        """After the commits: the cache holds each state table's rows at its new version."""
        for table, rows in self.fresh.items():
            self.ctx.memo[f"cache:{table}"] = (versions.get(f"state/{table}"), rows)

    def stage(self, table: str, changes: pa.Table, before: pa.Table,
              base: Callable[[pa.Table], pa.Table],
              merge: Callable[[pa.Table], pa.Table]) -> None:
        """Stage the batch's ``changes`` for the end of a state log (its ``base`` when the log
        is empty), and the log's compaction when it is due (``state_log.compaction``): a full
        one is ``base(before)``, the rows before the batch, replacing every pinned file; a
        partial one is ``merge`` of the rows of the delta files it merges (read with Arrow;
        from a remote warehouse, a full one instead), replacing them."""
        files = self.ctx.state_log(table)
        due = compaction(files)
        if due is not None:
            merging, full = due
            rows = None if full else _read_files(merging, changes.schema)
            if rows is None:
                self.writes.append(StagedRows(table, base(before), "base",
                                              tuple(f["path"] for f in files)))
            else:
                self.writes.append(StagedRows(table, merge(rows), "delta",
                                              tuple(f["path"] for f in merging)))
        self.writes.append(StagedRows(table, changes, "delta" if files else "base"))


def _read_files(files: list[dict], schema: pa.Schema) -> pa.Table | None:
    """The rows of local state files, as ``schema``; None when one is remote."""
    import pyarrow.parquet as pq

    paths = [local_path(f["uri"]) for f in files]
    if any(p is None for p in paths):
        return None
    return concat([pq.read_table(p).select(schema.names).cast(schema) for p in paths], schema)


def _newest(keys: list[str]) -> Callable[[pa.Table], pa.Table]:
    """A keyed log's partial merge: the newest row (by ``_batch``) of each key, tombstones
    (count 0) kept, as ``state_log.merge_keyed`` with ``full=False``."""
    def merge(rows: pa.Table) -> pa.Table:
        if not keys:
            return rows.sort_by([(BATCH, "descending")]).slice(0, 1)
        others = [c for c in rows.column_names if c not in keys]
        newest = rows.sort_by([(BATCH, "descending")]).group_by(
            keys, use_threads=False).aggregate([(c, "first") for c in others])
        return newest.rename_columns([_unsuffix(c, [(o, "first") for o in others])
                                      for c in newest.column_names]).select(
            rows.column_names).cast(rows.schema)
    return merge


def _batch_column(table: pa.Table, batch: int) -> pa.Table:
    return table.append_column(BATCH, pa.array([batch] * table.num_rows, pa.int64()))


def _prefixed(table: pa.Table, prefix: str) -> pa.Table:
    return table.rename_columns([prefix + c for c in table.column_names])


class AggregateKernel:
    """GROUP BY with retractions (``aggregate.Aggregate``'s state and output, in Arrow)."""

    def __init__(self, node: PAggregate, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.op = Aggregate(node, lc.ctx)
        self.keys = list(node.keys)

    def run(self, delta: pa.Table) -> pa.Table:
        node, lc, keys = self.node, self.lc, self.keys
        shape = lc.once(f"shape:{node.id}:{delta.schema}",
                        lambda: self.op.shape(lc.frame(delta)))
        state = arrow_schema(shape.state_schema)
        if any(pa.types.is_decimal(state.field(f).type) for f in state.names[len(keys) + 1:]
               if f[0] == "s"):
            raise Unsupported("SUM/AVG of decimals")  # Arrow's decimal arithmetic differs
        alive = f"{COUNT} != 0" if keys else None
        before = lc.cached(node.id, lambda: latest(
            lc.spark, lc.ctx.state_log(node.id), shape.state_schema, keys, alive=alive,
            keep_batch=True))
        if not delta.num_rows and (keys or before.num_rows):  # no group changes
            return self.out_schema(shape).empty_table()
        d = self.delta_groups(delta, shape, state)
        for i, schema in shape.ms_schemas.items():
            d = self.with_multiset(d, i, delta, schema)
        dk, dcols = safe_keys(_prefixed(d, "d."), [f"d.{k}" for k in keys], "_d")
        ok, ocols = safe_keys(_prefixed(before, "o."), [f"o.{k}" for k in keys], "_o")
        old = key_join(ok, dk.select(dcols), ocols, dcols, "left semi")
        both = key_join(dk, old, dcols, ocols, "left outer")
        table = self.accumulators(both, state)
        new_state = table.select([*keys, f"n{COUNT}", *[f"n{f.name}" for f in
                                                        state][len(keys) + 1:]])
        new_state = _batch_column(new_state.rename_columns(state.names), lc.ctx.batch)
        new_state = new_state.cast(pa.schema([*state, pa.field(BATCH, pa.int64())]))
        kept = before if not keys else key_join(
            ok, dk.select(dcols), ocols, dcols, "left anti").select(
            [f"o.{c}" for c in before.column_names]).rename_columns(before.column_names)
        live = new_state.filter(pc.not_equal(new_state[COUNT], 0)) if keys else new_state
        lc.fresh[node.id] = concat([kept, live], before.schema) if keys else live.cast(
            before.schema)
        lc.stage(node.id, new_state, before, lambda rows: rows, _newest(keys))
        return self.output(table, shape)

    def delta_groups(self, delta: pa.Table, shape, state: pa.Schema) -> pa.Table:
        """The batch per group: ``d_n`` and per aggregate ``dc<i>``/``ds<i>``/``dm<i>``
        (as the Spark operator's ``delta_exprs``)."""
        w = delta[WEIGHT]
        cols = {k: delta[k] for k in self.keys}
        cols[f"d{COUNT}"] = w
        aggs = [(f"d{COUNT}", "sum")]
        zero = pa.scalar(0, pa.int64())
        for i, a in enumerate(self.node.aggs):
            x = delta[a.arg] if a.arg else None
            if a.strategy in ("count", "sum") and x is not None:
                cols[f"dc{i}"] = pc.if_else(pc.is_valid(x), w, zero)
                aggs.append((f"dc{i}", "sum"))
            if a.strategy == "sum":
                t = state.field(f"s{i}").type
                cols[f"ds{i}"] = pc.multiply(x.cast(t), w.cast(t))
                aggs.append((f"ds{i}", "sum"))
            elif a.strategy == "running":
                cols[f"dm{i}"] = x
                aggs.append((f"dm{i}", a.func))
        grouped = pa.table(cols).group_by(self.keys, use_threads=False).aggregate(aggs)
        return grouped.rename_columns([_unsuffix(c, aggs) for c in grouped.column_names])

    def with_multiset(self, d: pa.Table, i: int, delta: pa.Table, schema) -> pa.Table:
        """Update aggregate ``i``'s (keys, value) -> count state; ``d`` gains ``r<i>``: the
        result over every value of each group the batch touched."""
        node, lc, keys = self.node, self.lc, self.keys
        a, table = node.aggs[i], node.multiset_table(i)
        names = [*keys, "v"]
        before = lc.cached(table, lambda: latest(lc.spark, lc.ctx.state_log(table), schema,
                                                 names, alive="cnt != 0", keep_batch=True))
        x = delta[a.arg]
        dv = pa.table({**{k: delta[k] for k in keys}, "v": x, "dcnt": delta[WEIGHT]}).filter(
            pc.is_valid(x)).group_by(names, use_threads=False).aggregate([("dcnt", "sum")])
        dv = dv.rename_columns([_unsuffix(c, [("dcnt", "sum")]) for c in dv.column_names])
        ok, ocols = safe_keys(_prefixed(before, "o."), [f"o.{c}" for c in names], "_o")
        dk, dcols = safe_keys(_prefixed(dv, "d."), [f"d.{c}" for c in names], "_d")
        both = key_join(dk, key_join(ok, dk.select(dcols), ocols, dcols, "left semi"),
                        dcols, ocols, "left outer")
        cnt = pc.add(pc.fill_null(both["o.cnt"], 0), both["d.dcnt"])
        changed = pa.table({**{c: pc.coalesce(both[f"d.{c}"], both[f"o.{c}"]) for c in names},
                            "cnt": cnt})
        changed = _batch_column(changed, lc.ctx.batch).cast(before.schema)
        kept = key_join(ok, dk.select(dcols), ocols, dcols, "left anti").select(
            [f"o.{c}" for c in before.column_names]).rename_columns(before.column_names)
        after = concat([kept, changed.filter(pc.not_equal(changed["cnt"], 0))], before.schema)
        lc.fresh[table] = after
        lc.stage(table, changed, before, lambda rows: rows, _newest(names))
        values = after
        if keys:  # every value of the groups the batch touched
            groups, gcols = safe_keys(pa.table({k: delta[k] for k in keys}), keys, "_g")
            mine, acols = safe_keys(after, keys, "_a")
            values = key_join(mine, groups.select(gcols).group_by(gcols, use_threads=False)
                              .aggregate([]), acols, gcols, "left semi")
        fn = "count" if a.func == "count" else a.func
        r = values.select([*keys, "v"]).group_by(keys, use_threads=False).aggregate(
            [("v", fn)]).rename_columns([*keys, f"r{i}"] if keys else [f"r{i}"])
        if not keys:
            return d.append_column(f"r{i}", r[f"r{i}"])
        dk2, dcols2 = safe_keys(d, keys, "_q")
        rk, rcols = safe_keys(_prefixed(r, "r."), [f"r.{k}" for k in keys], "_r")
        joined = key_join(dk2, rk, dcols2, rcols, "left outer")
        return joined.select([*d.column_names, f"r.r{i}"]).rename_columns(
            [*d.column_names, f"r{i}"])

    def accumulators(self, both: pa.Table, state: pa.Schema) -> pa.Table:
        """Old (``o``) and new (``n``) accumulators of every touched group, named as the
        Spark operator's ``merge_exprs`` names them."""
        keys = self.keys
        cols = {k: both[f"d.{k}"] for k in keys}  # every touched group is in the batch
        o_n = both[f"o.{COUNT}"]
        cols[f"o{COUNT}"] = o_n
        cols[f"n{COUNT}"] = pc.add(pc.fill_null(o_n, 0), pc.fill_null(both[f"d.d{COUNT}"], 0))
        for f in state.names[len(keys) + 1:]:
            i, t = int(f[1:]), state.field(f).type
            a, old = self.node.aggs[i], both[f"o.{f}"]
            if f[0] in "cs":
                zero = pa.scalar(0, t) if not pa.types.is_floating(t) else pa.scalar(0.0, t)
                new = pc.add(pc.fill_null(old, zero), pc.fill_null(both[f"d.d{f}"].cast(t),
                                                                    zero)).cast(t)
            elif a.strategy == "running":
                new = _extreme(a.func, old, both[f"d.d{f}"].cast(t))
            else:
                r = both[f"d.r{i}"]
                new = (pc.fill_null(r, 0) if a.func == "count" else r).cast(t)
            cols[f"o{f}"], cols[f"n{f}"] = old, new
        cols["_touched"] = pa.array([True] * both.num_rows, pa.bool_())
        return pa.table(cols)

    @staticmethod
    def out_schema(shape) -> pa.Schema:
        return arrow_schema(shape.out_schema).append(pa.field(WEIGHT, pa.int64()))

    def output(self, table: pa.Table, shape) -> pa.Table:
        """Retractions of the old and insertions of the new result rows, where they
        differ: the values and flags are the Spark operator's SQL, run locally, unless
        ``arrow_output`` computes them (no call to Spark)."""
        fast = self.arrow_output(table, shape)
        if fast is not None:
            return fast
        n = len(self.node.columns)
        old_exists, new_exists, changed = self.op.change_flags()
        types = [f.dataType.simpleString() for f in shape.out_schema.fields]
        exprs = [f"CAST({v} AS {t}) AS _o{j}" for j, (v, t) in enumerate(
            zip(self.op.values("o"), types))]
        exprs += [f"CAST({v} AS {t}) AS _n{j}" for j, (v, t) in enumerate(
            zip(self.op.values("n"), types))]
        exprs += [f"{old_exists} AS _oe", f"{new_exists} AS _ne"]
        rows = self.lc.sql(f"{self.node.id}:out", table,
                           lambda df: df.filter(changed).selectExpr(*exprs))
        out = self.out_schema(shape)

        def side(prefix: str, flag: str, weight: int) -> pa.Table:
            part = rows.filter(rows[flag]).select([f"_{prefix}{j}" for j in range(n)])
            return part.append_column(WEIGHT, pa.array([weight] * part.num_rows, pa.int64())
                                      ).rename_columns(out.names)
        return concat([side("o", "_oe", -1), side("n", "_ne", 1)], out)

    def arrow_output(self, table: pa.Table, shape) -> pa.Table | None:
        """``output`` in Arrow, with ``Aggregate.values``' and ``change_flags``' meaning,
        when every value already has its output column's type (the final CAST is the
        identity; an AVG of integers divides as DOUBLE, as Spark's ``/``); else None."""
        out = self.out_schema(shape)

        def values(side: str) -> list[pa.ChunkedArray] | None:
            got = [table[k] for k in self.keys]
            for i, a in enumerate(self.node.aggs):
                if a.strategy == "count":
                    got.append(table[f"{side}{COUNT}" if a.arg is None else f"{side}c{i}"])
                elif a.strategy == "sum":
                    total, count = table[f"{side}s{i}"], table[f"{side}c{i}"]
                    if a.func != "sum":
                        if not (pa.types.is_integer(total.type)
                                or pa.types.is_floating(total.type)):
                            return None
                        total = pc.divide(total.cast(pa.float64()), count.cast(pa.float64()))
                    got.append(pc.if_else(pc.greater(count, 0), total,
                                          pa.scalar(None, total.type)))
                else:  # running or multiset: the value itself
                    got.append(table[f"{side}m{i}"])
            if any(v.type != f.type for v, f in zip(got, out)):
                return None
            return got

        old_v, new_v = values("o"), values("n")
        if old_v is None or new_v is None:
            return None
        if self.keys:
            old_exists = pc.fill_null(pc.greater(table[f"o{COUNT}"], 0), False)
            new_exists = pc.greater(table[f"n{COUNT}"], 0)
        else:
            old_exists = pc.is_valid(table[f"o{COUNT}"])
            new_exists = pa.array([True] * table.num_rows, pa.bool_())
        same = pc.and_(old_exists, new_exists)
        for a, b in zip(old_v, new_v):
            same = pc.and_(same, _same(a, b))
        changed = pc.and_(table["_touched"], pc.invert(same))
        parts = []
        for vals, exists, weight in ((old_v, old_exists, -1), (new_v, new_exists, 1)):
            pick = pc.and_(changed, exists)
            part = pa.table([v.filter(pick) for v in vals], names=out.names[:-1])
            parts.append(part.append_column(
                WEIGHT, pa.array([weight] * part.num_rows, pa.int64())))
        return concat(parts, out)


def _same(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """Spark's ``a <=> b``: both NULL, or equal (NaN equals NaN, as Spark compares)."""
    equal = pc.equal(a, b)
    if pa.types.is_floating(a.type):
        equal = pc.or_(equal, pc.and_(pc.is_nan(a), pc.is_nan(b)))
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(pc.fill_null(equal, False), both_null)


def _extreme(func: str, a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """Element-wise ``least``/``greatest`` skipping NULLs, as Spark's (for every ordered
    type: Arrow's ``min_element_wise`` has no kernel for zoned timestamps)."""
    pick_b = pc.less(b, a) if func == "min" else pc.greater(b, a)
    return pc.if_else(pc.is_null(a), b, pc.if_else(pc.fill_null(pick_b, False), b, a))


def _unsuffix(name: str, aggs: list[tuple[str, str]]) -> str:
    """A ``group_by().aggregate`` column's name without its ``_<function>`` suffix."""
    for col, fn in aggs:
        if name == f"{col}_{fn}":
            return col
    return name


class JoinKernel:
    """Delta-rule joins (``join.Join``'s state and formulas): the matched part is
    Δ(L⋈R) = ΔL⋈R_old + L_new⋈ΔR; outer, semi and anti joins also compare, for the keys the
    batch touched, each row's matches before and after the batch."""

    def __init__(self, node: PJoin, lc: LocalContext) -> None:
        self.node, self.lc = node, lc
        self.op = Join(node, lc.ctx)

    def run(self, ldelta: pa.Table, rdelta: pa.Table) -> pa.Table:
        op, lc = self.op, self.lc
        frames = {"l": ldelta.rename_columns([*op.names["l"], "_lw"]),
                  "r": rdelta.rename_columns([*op.names["r"], "_rw"])}
        fields = {"l": [f.with_name(n) for f, n in zip(ldelta.schema, op.names["l"])],
                  "r": [f.with_name(n) for f, n in zip(rdelta.schema, op.names["r"])]}
        kind = self.node.kind
        weight = pa.field(WEIGHT, pa.int64())
        schema = pa.schema([*fields["l"], *fields["r"], weight])
        out = pa.schema([*fields["l"], weight]) if kind in ("semi", "anti") else schema
        if not ldelta.num_rows and not rdelta.num_rows:
            return out.empty_table()
        types = lc.once(f"keys:{self.node.id}", lambda: op.key_types(
            lc.frame(frames["l"]), lc.frame(frames["r"])))
        delta, old = {}, {}
        for s in "lr":
            names = op.names[s]
            grouped = frames[s].group_by(names, use_threads=False).aggregate(
                [(f"_{s}w", "sum")]).rename_columns([*names, f"_{s}w"])
            grouped = grouped.filter(pc.not_equal(grouped[f"_{s}w"], 0))
            delta[s] = self.keyed(s, grouped, types)
            old[s] = self.side(s, frames[s], delta[s], types)
        parts = []
        if kind in ("inner", "left", "right", "full"):
            parts.append(self.matched(old, delta, schema))
        if kind != "inner":
            rows = self.affected(old, delta)
            counts = self.key_counts(rows)
            sides = {"left": "l", "semi": "l", "anti": "l", "right": "r"}.get(kind, "lr")
            parts += [self.unmatched(s, rows, counts, fields, out) for s in sides]
        return concat(parts, out)

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

    def matched(self, old: dict[str, pa.Table], delta: dict[str, pa.Table],
                schema: pa.Schema) -> pa.Table:
        """ΔL⋈R_old + L_new⋈ΔR, the residual condition applied."""
        op, lc = self.op, self.lc
        lk, rk = op.kcols("l"), op.kcols("r")
        parts = [key_join(old["r"], delta["l"], rk, lk, "inner"),
                 key_join(concat([old["l"], delta["l"]], delta["l"].schema), delta["r"],
                          lk, rk, "inner")]
        names = [*op.names["l"], *op.names["r"]]
        rows = concat([p.select(names).append_column(WEIGHT, pc.multiply(p["_lw"], p["_rw"]))
                       for p in parts], schema)
        if self.node.residual:
            rows = lc.sql(f"{self.node.id}:on", rows, lambda df: df.filter(self.node.residual))
        return rows

    def affected(self, old: dict[str, pa.Table], delta: dict[str, pa.Table]
                 ) -> dict[str, pa.Table]:
        """Per side, the distinct rows whose join key the batch touched (on either side),
        with their old and new multiplicity (``_<s>o``, ``_<s>n``) and whether the batch
        changed them (``_<s>d``)."""
        op = self.op
        ak = [f"_ak{i}" for i in range(len(op.kcols("l")))]
        touched = concat([delta[s].select(op.kcols(s)).rename_columns(ak) for s in "lr"],
                         delta["l"].select(op.kcols("l")).rename_columns(ak).schema)
        touched, tcols = safe_keys(touched, ak, "_t")
        touched = touched.select(tcols).group_by(tcols, use_threads=False).aggregate([])
        rows = {}
        for s in "lr":
            kc, w = op.kcols(s), f"_{s}w"
            mine, mcols = safe_keys(old[s], kc, "_m")
            mine = key_join(mine, touched, mcols, tcols, "left semi").select(
                old[s].column_names)
            n_old, n_new = mine.num_rows, delta[s].num_rows
            both = concat([
                mine.append_column(f"_{s}o", mine[w]).append_column(
                    f"_{s}d", pa.array([0] * n_old, pa.int8())),
                delta[s].append_column(f"_{s}o", pa.array([0] * n_new, pa.int64()))
                .append_column(f"_{s}d", pa.array([1] * n_new, pa.int8()))],
                delta[s].schema.append(pa.field(f"_{s}o", pa.int64())).append(
                    pa.field(f"_{s}d", pa.int8())))
            cols = op.names[s] + kc
            aggs = [(f"_{s}o", "sum"), (w, "sum"), (f"_{s}d", "max")]
            rows[s] = both.group_by(cols, use_threads=False).aggregate(aggs).rename_columns(
                [*cols, f"_{s}o", f"_{s}n", f"_{s}d"])
        return rows

    def key_counts(self, rows: dict[str, pa.Table]) -> pa.Table:
        """Per join key the batch touched: each side's old and new row count (zero for a
        key with a NULL part: it matches nothing), keys as ``_ck<i>``."""
        op = self.op
        ck = [f"_ck{i}" for i in range(len(op.kcols("l")))]
        per = {}
        for s in "lr":
            kc = op.kcols(s)
            g = rows[s].group_by(kc, use_threads=False).aggregate(
                [(f"_{s}o", "sum"), (f"_{s}n", "sum"), (f"_{s}d", "max")])
            g = g.rename_columns([_unsuffix(c, [(f"_{s}o", "sum"), (f"_{s}n", "sum"),
                                                (f"_{s}d", "max")]) for c in g.column_names])
            null = pa.array([False] * g.num_rows, pa.bool_())
            for c in kc:
                null = pc.or_(null, pc.is_null(g[c]))
            zero = pa.scalar(0, pa.int64())
            g = pa.table({**{f"{s}.{c}": g[k] for c, k in zip(ck, kc)},
                          f"_{s}co": pc.if_else(null, zero, g[f"_{s}o"]),
                          f"_{s}cn": pc.if_else(null, zero, g[f"_{s}n"]),
                          f"_{s}t": g[f"_{s}d"]})
            per[s] = safe_keys(g, [f"{s}.{c}" for c in ck], f"_x{s}")
        both = key_join(per["l"][0], per["r"][0], per["l"][1], per["r"][1], "full outer")
        zero = pa.scalar(0, pa.int64())
        out = {c: pc.coalesce(both[f"l.{c}"], both[f"r.{c}"]) for c in ck}
        for s in "lr":
            for c in ("co", "cn"):
                out[f"_{s}{c}"] = pc.fill_null(both[f"_{s}{c}"], zero)
        t = pc.or_(pc.fill_null(pc.equal(both["_lt"], 1), False),
                   pc.fill_null(pc.equal(both["_rt"], 1), False))
        return pa.table(out).filter(t)

    def unmatched(self, s: str, rows: dict[str, pa.Table], counts: pa.Table,
                  fields: dict[str, list[pa.Field]], out: pa.Schema) -> pa.Table:
        """Changes to side ``s``'s rows that appear without a match (null-padded, anti) or
        only with one (semi), for the keys the batch touched."""
        op, lc, node = self.op, self.lc, self.node
        o = "r" if s == "l" else "l"
        kc = op.kcols(s)
        ck = [f"_ck{i}" for i in range(len(kc))]
        mine, mcols = safe_keys(rows[s], kc, "_m")
        keys, kcols = safe_keys(counts, ck, "_q")
        if node.residual is None:  # matches depend on the key only
            mine = key_join(mine, keys, mcols, kcols, "inner")
            m_old, m_new = mine[f"_{o}co"], mine[f"_{o}cn"]
        else:  # count matching rows of the other side, per row
            mine = key_join(mine, keys.select(kcols), mcols, kcols, "left semi").select(
                rows[s].column_names)
            mine = mine.append_column("_id", pa.array(range(mine.num_rows), pa.int64()))
            pairs = key_join(mine, rows[o], kc, op.kcols(o), "inner")
            pairs = pairs.select([*op.names["l"], *op.names["r"], "_id", f"_{o}o", f"_{o}n"])
            pairs = lc.sql(f"{node.id}:on{s}", pairs, lambda df: df.filter(node.residual))
            per = pairs.group_by(["_id"], use_threads=False).aggregate(
                [(f"_{o}o", "sum"), (f"_{o}n", "sum")]).rename_columns(["_id", "_mo", "_mn"])
            mine = key_join(mine, per, ["_id"], ["_id"], "left outer")
            m_old, m_new = pc.fill_null(mine["_mo"], 0), pc.fill_null(mine["_mn"], 0)

        def test(m):
            return pc.greater(m, 0) if node.kind == "semi" else pc.equal(m, 0)

        zero = pa.scalar(0, pa.int64())
        weight = pc.subtract(pc.if_else(test(m_new), mine[f"_{s}n"], zero),
                             pc.if_else(test(m_old), mine[f"_{s}o"], zero))
        values = {f.name: mine[f.name] for f in fields[s]}
        if node.kind not in ("semi", "anti"):
            values.update({f.name: pa.nulls(mine.num_rows, f.type) for f in fields[o]})
        values[WEIGHT] = weight
        got = pa.table({f.name: values[f.name] for f in out}, schema=out)
        return got.filter(pc.not_equal(got[WEIGHT], 0))

    def side(self, s: str, frame: pa.Table, delta: pa.Table, types: list[str]) -> pa.Table:
        """Side ``s``'s rows (with multiplicity and keys) before the batch; stages the
        batch's Δ for the side's log and keeps the side's rows after it for the cache."""
        op, lc, names = self.op, self.lc, self.op.names[s]
        table = self.node.side_table(op.SIDES[s])
        stored = lc.once(f"side:{table}:{frame.schema}",
                         lambda: side_schema(lc.frame(frame).schema, names))

        def load() -> DataFrame:
            rows = read_log(lc.spark, lc.ctx.state_log(table), stored)
            return op.with_keys(rows.toDF(*names, f"_{s}w"), s, types)

        before = lc.cached(table, load)
        lc.fresh[table] = concat([before, delta], before.schema)
        positions = [*positional(names), COUNT]
        changes = delta.select([*names, f"_{s}w"]).rename_columns(positions)
        kept = arrow_schema(stored)

        def merge(rows: pa.Table) -> pa.Table:  # stored rows: multiplicities summed
            cols = positions[:-1]
            merged = rows.group_by(cols, use_threads=False).aggregate(
                [(COUNT, "sum")]).rename_columns(positions)
            return merged.filter(pc.not_equal(merged[COUNT], 0)).cast(kept)

        def base(rows: pa.Table) -> pa.Table:
            return merge(rows.select([*names, f"_{s}w"]).rename_columns(positions))

        lc.stage(table, changes.cast(kept), before, base, merge)
        return before


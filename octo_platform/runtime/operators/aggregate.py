"""GROUP BY with retractions: its formula, its state and its step, in Arrow.

**Formula.** A batch Δ (rows with weights ``_w``: +1 an insert, -1 a retraction) changes
each group ``g`` it touches by Δ(g): the row count ``_n`` by the sum of the weights; per
aggregate, the non-null count ``c<i>`` and the sum ``s<i>`` (SUM, AVG) by the weighted
counts and sums of the group's rows in Δ (exact: decimals in 256 bits); MIN/MAX over
append-only input (``running``) ``m<i>`` by the extreme of the old value and Δ's. MIN/MAX
over updating input and COUNT(DISTINCT) keep each group's values with their counts (a
*value multiset*, a state table of its own: (keys, ``v``) -> ``cnt``) and take ``m<i>``
from all the group's values after the batch. Each touched group has its old accumulators
``o`` and new ones ``n = o + Δ(g)`` side by side (``AggregateStep.accumulators``); its result
row is computed from each side (AVG = sum / count as Spark rounds it), and where they differ
the output retracts the old row and inserts the new one (``arrow_output``; a group whose
count reaches 0 is gone; without keys the one group always has a row). The cost follows the
groups a batch touches: the others' state is never read or rewritten.

**State.** One keyed log (``state_log``): per group its keys, ``_n`` and the accumulators,
stamped with the batch that wrote them (``_batch``), partitioned by the bucket of the group
key; a batch appends the rows of the groups it changed (count 0: a tombstone); a group's
newest row is its state (``live_rows``); a compaction keeps each group's newest live row.
The types are Spark's own aggregation's (``shape``, derived once per run).

**Windows.** A windowed GROUP BY whose window closes (``closes``) drops a closed window's
groups at compaction; with EMIT ON WINDOW CLOSE the output is the final rows of the groups
whose window the batch's watermark closes, touched or not (``AggregateStep.closing``).

**state_ttl.** A group whose state row is older than the cut (``BatchContext.cut``) is not
read: it starts afresh, its values forgotten with it (``AggregateStep.run``'s ``forgets``).

The step runs in the driver (``kernels.AggregateKernel``, small batches, over the run's
state cache) and in Spark tasks (``aggregate_tasks``, one per bucket of the state). Groups of
types Arrow cannot group (nested types) run as ``aggregate_frames.AggregateFrames``' Spark
SQL over the same state.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import COUNT, WEIGHT
from octo_platform.local_frames import arrow_schema
from octo_platform.runtime.operators.arrow import concat, key_join, primitive, safe_keys, \
    zero_of
from octo_platform.runtime.operators.keyed_rows import same_values
from octo_platform.runtime.state_log import BATCH, StateFile, generation, unexpired
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Shape", "shape", "result_frame", "AggregateStep", "Stepped", "aggregate_step",
           "arrow_output", "arrow_changes", "arrow_rows", "newest", "live_rows", "unsuffix",
           "with_batch_column", "decimal_mean"]

_ROW = "__octo_row"  # a state row's position, kept through a join


@dataclass(frozen=True)
class Shape:
    """A GROUP BY's Spark types for given input types: its state table's (keys, ``_n``,
    ``c<i>``/``s<i>``/``m<i>``), each value multiset's (keys, ``v``, ``cnt``) and its
    result rows'."""

    state_schema: Any
    out_schema: Any
    ms_schemas: dict[int, Any]


def shape(node: Any, ctx: Any, delta: DataFrame) -> Shape:
    """GROUP BY ``node``'s ``Shape`` over input ``delta`` (computed once per run:
    ``ctx.memo``)."""
    key = f"{node.id}:{delta.schema.simpleString()}"
    if key not in ctx.memo:
        ctx.memo[key] = _shape(node, delta)
    return ctx.memo[key]


def _shape(node: Any, delta: DataFrame) -> Shape:
    from pyspark.sql.types import LongType, StructField, StructType

    types = {f.name: f.dataType for f in delta.schema.fields}
    acc: list[StructField] = []
    ms: dict[int, Any] = {}
    for i, a in enumerate(node.aggs):
        if a.strategy == "count":
            if a.arg is not None:
                acc.append(StructField(f"c{i}", LongType()))
        elif a.strategy == "sum":
            st = delta.selectExpr(f"sum({quote(a.arg)})").schema.fields[0].dataType
            acc += [StructField(f"c{i}", LongType()), StructField(f"s{i}", st)]
        elif a.strategy == "running":
            acc.append(StructField(f"m{i}", types[a.arg]))
        else:
            acc.append(StructField(f"m{i}", LongType() if a.func == "count" else
                                   types[a.arg]))
            ms[i] = StructType([*[StructField(k, types[k]) for k in node.keys],
                                StructField("v", types[a.arg]), StructField("cnt", LongType())])
    state = StructType([*[StructField(k, types[k]) for k in node.keys],
                        StructField(COUNT, LongType()), *acc])
    return Shape(state, result_frame(node, delta).schema, ms)


def result_frame(node: Any, delta: DataFrame) -> DataFrame:
    """An empty frame of GROUP BY ``node``'s result rows over ``delta`` (no weight): their
    types are Spark's own aggregation's of ``delta``'s."""
    keys, exprs = [quote(k) for k in node.keys], []
    for i, a in enumerate(node.aggs):
        name = quote(node.columns[len(keys) + i])
        arg = "1" if a.arg is None else f"DISTINCT {quote(a.arg)}" if a.distinct \
            else quote(a.arg)
        exprs.append(f"{'count' if a.arg is None else a.func}({arg}) AS {name}")
    empty = delta.limit(0)
    return empty.groupBy(*keys).agg(*[sql_expr(e) for e in exprs]) if exprs else \
        empty.selectExpr(*keys)


@dataclass
class Stepped:
    """What a step made: the accumulators of every touched group (``table``), the state
    log's new rows (``changes``, tombstones included, stamped with the batch) and its live
    rows afterwards (``after``); per multiset aggregate ``i``, the same (``ms[i]``)."""

    table: pa.Table
    changes: pa.Table
    after: pa.Table | None
    ms: dict[int, tuple[pa.Table, pa.Table]]


@dataclass(frozen=True)
class AggregateStep:
    """One GROUP BY's step (picklable: Spark ships it to tasks). ``state``: the state
    table's schema (keys, ``_n``, accumulators) and ``ms``: each multiset table's
    (keys, ``v``, ``cnt``), all without ``_batch``."""

    keys: tuple[str, ...]
    aggs: tuple[Any, ...]
    state: pa.Schema
    ms: dict[int, pa.Schema]
    batch: int
    out: pa.Schema  # the output rows: the GROUP BY's columns and ``_w``
    closes: tuple[str, int] | None = None  # ``PAggregate.closes``: (window key, offset µs)

    @property
    def logged(self) -> pa.Schema:
        """The state log's rows: the state and the batch that wrote them."""
        return self.state.append(pa.field(BATCH, pa.int64()))

    def ms_logged(self, i: int) -> pa.Schema:
        return self.ms[i].append(pa.field(BATCH, pa.int64()))

    @property
    def accumulated(self) -> pa.Schema:
        """The schema of ``accumulators``' tables: the keys, then each accumulator's old
        (``o``) and new (``n``) value, then ``_touched``."""
        fields = list(self.state)
        keys = len(self.keys)
        out = [*fields[:keys], pa.field(f"o{COUNT}", pa.int64()),
               pa.field(f"n{COUNT}", pa.int64())]
        for f in fields[keys + 1:]:
            out += [pa.field(f"o{f.name}", f.type), pa.field(f"n{f.name}", f.type)]
        return pa.schema([*out, pa.field("_touched", pa.bool_())])

    def output(self, table: pa.Table) -> pa.Table:
        """The output Δ of the accumulators ``table`` (``arrow_output``)."""
        got = arrow_output(self.keys, self.aggs, table, self.out)
        assert got is not None, "aggregate_step covers only what arrow_output computes"
        return got

    def run(self, delta: pa.Table, before: pa.Table, ms_before: dict[int, pa.Table],
            keep_after: bool = True, forgets: bool = False) -> Stepped:
        """``delta``: the batch's rows (keys, aggregate arguments, ``_w``); ``before``: the
        live state rows (``logged``) of at least the groups it touches; ``ms_before``: the
        same of each multiset. ``keep_after=False``: the state's rows afterwards are not
        wanted (``Stepped.after`` is None). ``forgets`` (``state_ttl``): ``before`` lacks
        the groups whose state expired, and their values are forgotten with them: left out,
        and, for the groups the batch starts afresh, tombstoned in the multiset's log."""
        keys = list(self.keys)
        d = self.delta_groups(delta)
        ms = {}
        for i in self.ms:
            values, stale = ms_before[i], None
            if forgets:
                live = self.in_groups(values, before)
                values, stale = values.filter(live), values.filter(~live)
            d, ms[i] = self.with_multiset(d, i, delta, values, stale)
        dk, dcols = safe_keys(_prefixed(d, "d."), [f"d.{k}" for k in keys], "_d")
        ok, ocols = safe_keys(_prefixed(before, "o."), [f"o.{k}" for k in keys], "_o")
        both, hit = _beside(ok, dk, ocols, dcols)
        table = self.accumulators(both)
        changes = table.select([*keys, f"n{COUNT}", *[f"n{f}" for f in
                                                      self.state.names[len(keys) + 1:]]])
        changes = with_batch_column(changes.rename_columns(self.state.names), self.batch)
        changes = changes.cast(self.logged)
        if not keys:
            return Stepped(table, changes, changes, ms)
        if not keep_after:
            return Stepped(table, changes, None, ms)
        kept = before.filter(pa.array(~hit))
        live = changes.filter(pc.not_equal(changes[COUNT], 0))
        return Stepped(table, changes, concat([kept, live], self.logged), ms)

    def in_groups(self, rows: pa.Table, groups: pa.Table) -> np.ndarray:
        """Per row of ``rows`` (of a multiset), whether its group has a row in ``groups``."""
        keys = list(self.keys)
        if not keys:
            return np.full(rows.num_rows, bool(groups.num_rows))
        mine, mcols = safe_keys(rows.select(keys).append_column(
            _ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64))), keys, "_m")
        live, lcols = safe_keys(groups.select(keys), keys, "_g")
        found = np.zeros(rows.num_rows, bool)
        found[key_join(mine, live.select(lcols), mcols, lcols, "left semi")[_ROW]
              .to_numpy()] = True
        return found

    def of_groups(self, rows: pa.Table, groups: pa.Table) -> pa.Table:
        """``rows`` (of a multiset) of the groups that have a row in ``groups``."""
        return rows.filter(pa.array(self.in_groups(rows, groups)))

    def kept(self, rows: pa.Table, mark: int | None, cut: int | None,
             groups: pa.Table | None = None) -> pa.Table:
        """What a compaction (and the driver's cache) keeps of live state rows ``rows``, or,
        given ``groups`` (the live state rows), of a multiset's: those of windows the
        watermark ``mark`` has not closed; with ``state_ttl``'s ``cut``, of the groups it
        has not forgotten."""
        rows = self.open_rows(rows, mark)
        if cut is None:
            return rows
        if groups is None:
            return unexpired(rows, cut)
        return self.of_groups(rows, self.kept(groups, mark, cut))

    def open_rows(self, rows: pa.Table, mark: int | None) -> pa.Table:
        """``rows`` (of the state or a multiset) whose window the watermark ``mark`` has not
        closed: what a compaction keeps (a closed window's group is never touched again)."""
        if self.closes is None or mark is None:
            return rows
        return rows.filter(pc.invert(self.closed(rows, mark)))

    def closed(self, rows: pa.Table, mark: int) -> pa.ChunkedArray:
        """Per row, whether its window is closed at ``mark`` (``PAggregate.closed_sql``)."""
        assert self.closes is not None
        key, offset = self.closes
        micros = rows[key].cast(pa.timestamp("us", rows.schema.field(key).type.tz)).cast(
            pa.int64())
        return pc.fill_null(pc.less_equal(pc.add(micros, offset), mark), False)

    def closing(self, table: pa.Table, before: pa.Table, mark_before: int | None,
                mark: int | None) -> pa.Table:
        """EMIT ON WINDOW CLOSE: the accumulators of the groups whose window ``mark`` closes
        and ``mark_before`` did not, touched by the batch (``table``, the step's) or not
        (``before``: live state rows), each once, with rows only; as insertions of their
        final values (the ``o`` side NULL: no row before)."""
        if mark is None or mark == mark_before:
            return table.slice(0, 0)
        keys, schema = list(self.keys), table.schema
        olds = [f.name for f in schema if f.name[0] == "o" and f.name not in keys]
        table = table.drop_columns(olds)

        def newly(rows: pa.Table) -> pa.Table:
            now = self.closed(rows, mark)
            if mark_before is not None:
                now = pc.and_(now, pc.invert(self.closed(rows, mark_before)))
            return rows.filter(now)

        touched = newly(table)
        tk, tcols = safe_keys(table.select(keys), keys, "_t")
        bk, bcols = safe_keys(newly(before), keys, "_b")
        untouched = key_join(bk, tk.select(tcols), bcols, tcols, "left anti")
        n = untouched.num_rows
        cols = {}
        for f in table.schema:
            name = f.name
            if name in keys:
                cols[name] = untouched[name]
            elif name == f"n{COUNT}" or (name[0] == "n" and name[1:] in before.column_names):
                cols[name] = untouched[name[1:]]
            elif name == "_touched":
                cols[name] = pa.repeat(pa.scalar(True), n)
        rows = concat([touched, pa.table(cols)], table.schema)
        rows = rows.filter(pc.greater(rows[f"n{COUNT}"], 0))
        for name in olds:
            rows = rows.append_column(name, pa.nulls(rows.num_rows, schema.field(name).type))
        return rows.select(schema.names)

    def delta_groups(self, delta: pa.Table) -> pa.Table:
        """The batch per group: ``d_n`` and per aggregate ``dc<i>``/``ds<i>``/``dm<i>``
        (as the Spark operator's ``delta_exprs``)."""
        w = delta[WEIGHT]
        cols = {k: delta[k] for k in self.keys}
        cols[f"d{COUNT}"] = w
        aggs = [(f"d{COUNT}", "sum")]
        zero = pa.scalar(0, pa.int64())
        for i, a in enumerate(self.aggs):
            x = delta[a.arg] if a.arg else None
            if a.strategy in ("count", "sum") and x is not None:
                cols[f"dc{i}"] = pc.if_else(pc.is_valid(x), w, zero)
                aggs.append((f"dc{i}", "sum"))
            if a.strategy == "sum":
                t = self.state.field(f"s{i}").type
                if pa.types.is_decimal(t):  # exact, wide enough for any weight
                    cols[f"ds{i}"] = pc.multiply(x.cast(pa.decimal256(t.precision, t.scale)),
                                                 w.cast(pa.decimal256(19, 0)))
                else:
                    cols[f"ds{i}"] = pc.multiply(x.cast(t), w.cast(t))
                aggs.append((f"ds{i}", "sum"))
            elif a.strategy == "running":
                cols[f"dm{i}"] = x
                aggs.append((f"dm{i}", a.func))
        grouped = pa.table(cols).group_by(list(self.keys), use_threads=False).aggregate(aggs)
        return grouped.rename_columns([unsuffix(c, aggs) for c in grouped.column_names])

    def with_multiset(self, d: pa.Table, i: int, delta: pa.Table, before: pa.Table,
                      stale: pa.Table | None = None
                      ) -> tuple[pa.Table, tuple[pa.Table, pa.Table]]:
        """Aggregate ``i``'s (keys, value) -> count state updated; ``d`` gains ``r<i>``: the
        result over every value of each group the batch touched. ``stale``: values of
        forgotten groups (``run``'s ``forgets``), tombstoned where the batch touches their
        group."""
        keys, a = list(self.keys), self.aggs[i]
        names = [*keys, "v"]
        x = delta[a.arg]
        dv = pa.table({**{k: delta[k] for k in keys}, "v": x, "dcnt": delta[WEIGHT]}).filter(
            pc.is_valid(x)).group_by(names, use_threads=False).aggregate([("dcnt", "sum")])
        dv = dv.rename_columns([unsuffix(c, [("dcnt", "sum")]) for c in dv.column_names])
        ok, ocols = safe_keys(_prefixed(before, "o."), [f"o.{c}" for c in names], "_o")
        dk, dcols = safe_keys(_prefixed(dv, "d."), [f"d.{c}" for c in names], "_d")
        both, hit = _beside(ok, dk, ocols, dcols)
        cnt = pc.add(pc.fill_null(both["o.cnt"], 0), both["d.dcnt"])
        changed = pa.table({**{c: pc.coalesce(both[f"d.{c}"], both[f"o.{c}"]) for c in names},
                            "cnt": cnt})
        changed = with_batch_column(changed, self.batch).cast(self.ms_logged(i))
        if stale is not None and stale.num_rows:
            gone = self.of_groups(stale, delta)
            gk, gcols = safe_keys(gone, names, "_s")
            ck, ccols = safe_keys(changed.select(names), names, "_c")
            gone = key_join(gk, ck.select(ccols), gcols, ccols, "left anti").select(names)
            gone = gone.append_column("cnt", pa.repeat(pa.scalar(0, pa.int64()), gone.num_rows))
            changed = concat([changed, with_batch_column(gone, self.batch)], self.ms_logged(i))
        kept = before.filter(pa.array(~hit))
        after = concat([kept, changed.filter(pc.not_equal(changed["cnt"], 0))],
                       self.ms_logged(i))
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
            return d.append_column(f"r{i}", r[f"r{i}"]), (changed, after)
        dk2, dcols2 = safe_keys(d, keys, "_q")
        rk, rcols = safe_keys(_prefixed(r, "r."), [f"r.{k}" for k in keys], "_r")
        joined = key_join(dk2, rk, dcols2, rcols, "left outer")
        return joined.select([*d.column_names, f"r.r{i}"]).rename_columns(
            [*d.column_names, f"r{i}"]), (changed, after)

    def accumulators(self, both: pa.Table) -> pa.Table:
        """Old (``o``) and new (``n``) accumulators of every touched group (``accumulated``;
        ``AggregateFrames.merge_exprs`` names them alike)."""
        keys, state = self.keys, self.state
        cols = {k: both[f"d.{k}"] for k in keys}  # every touched group is in the batch
        o_n = both[f"o.{COUNT}"]
        cols[f"o{COUNT}"] = o_n
        cols[f"n{COUNT}"] = pc.add(pc.fill_null(o_n, 0), pc.fill_null(both[f"d.d{COUNT}"], 0))
        for f in state.names[len(keys) + 1:]:
            i, t = int(f[1:]), state.field(f).type
            a, old = self.aggs[i], both[f"o.{f}"]
            if f[0] in "cs":
                new = _plus(old, both[f"d.d{f}"], t)
            elif a.strategy == "running":
                new = _extreme(a.func, old, both[f"d.d{f}"].cast(t))
            else:
                r = both[f"d.r{i}"]
                new = (pc.fill_null(r, 0) if a.func == "count" else r).cast(t)
            cols[f"o{f}"], cols[f"n{f}"] = old, new
        cols["_touched"] = pa.array([True] * both.num_rows, pa.bool_())
        return pa.table(cols)


def aggregate_step(node: Any, shape: Any, batch: int) -> AggregateStep | None:
    """The step of GROUP BY ``node`` (a ``PAggregate``) in batch ``batch``, for the state
    ``shape`` (``shape``); None when the kernel does not
    cover it: keys and values Arrow cannot group."""
    state = arrow_schema(shape.state_schema)
    ms = {i: arrow_schema(s) for i, s in shape.ms_schemas.items()}
    if not all(primitive(f.type) for t in (state, *ms.values()) for f in t):
        return None
    out = arrow_schema(shape.out_schema).append(pa.field(WEIGHT, pa.int64()))
    step = AggregateStep(tuple(node.keys), tuple(node.aggs), state, ms, batch, out,
                         node.closes)
    if arrow_output(step.keys, step.aggs, step.accumulated.empty_table(), out) is None:
        return None  # a result of a type the kernel does not compute
    return step


def newest(keys: list[str]) -> Callable[[pa.Table], pa.Table]:
    """A keyed log's merge: the newest row (by ``_batch``) of each key, tombstones (count
    0) kept, as ``state_log.merge_keyed`` with ``full=False``. The rows are picked by
    position (the first of each key after sorting by batch), so any value type goes."""
    def merge(rows: pa.Table) -> pa.Table:
        rows = rows.sort_by([(BATCH, "descending")])
        if not keys:
            return rows.slice(0, 1)
        at = rows.select(keys).append_column(_ROW, pa.array(np.arange(rows.num_rows)))
        first = at.group_by(keys, use_threads=False).aggregate([(_ROW, "min")])
        return rows.take(first[f"{_ROW}_min"])
    return merge


def live_rows(stored: pa.Table, files: list[StateFile], keys: list[str], alive: str | None
              ) -> pa.Table:
    """A keyed log's rows ``stored`` (read from ``files``) as ``state_log.latest`` keeps
    them: each key's newest row; with ``alive``, only those whose count column ``alive`` is
    not 0 (tombstones dropped)."""
    # One write holds each key once: only several need the newest row per key.
    if len({generation(f) for f in files}) > 1:
        stored = newest(keys)(stored)
    if not alive:
        return stored
    dropped = pc.fill_null(pc.equal(stored[alive], 0), True)
    return stored.filter(pc.invert(dropped)) if pc.any(dropped).as_py() else stored


def _beside(state: pa.Table, batch: pa.Table, skeys: list[str], bkeys: list[str]
            ) -> tuple[pa.Table, np.ndarray]:
    """Each row of ``batch`` (the groups or values a batch touches) beside its ``state``
    row, if any (both with ``safe_keys``' columns ``bkeys`` / ``skeys``): one join, hashing
    the batch's side (the smaller) and probing the state; and per state row whether the
    batch touches it."""
    state = state.append_column(_ROW, pa.array(np.arange(state.num_rows, dtype=np.int64)))
    both = key_join(state, batch, skeys, bkeys, "right outer")
    hit = np.zeros(state.num_rows, bool)
    hit[pc.drop_null(both[_ROW]).to_numpy()] = True
    return both.drop_columns([_ROW]), hit


def with_batch_column(table: pa.Table, batch: int) -> pa.Table:
    return table.append_column(BATCH, pa.repeat(pa.scalar(batch, pa.int64()), table.num_rows))


def _prefixed(table: pa.Table, prefix: str) -> pa.Table:
    return table.rename_columns([prefix + c for c in table.column_names])


def _plus(old: pa.ChunkedArray, change: pa.ChunkedArray, t: pa.DataType) -> pa.ChunkedArray:
    """A sum or count accumulator ``old`` plus the batch's ``change`` (NULL as 0), as
    ``t``: decimals added exactly (in 256 bits), a result beyond ``t``'s precision an
    error."""
    zero = zero_of(t)
    old, change = pc.fill_null(old, zero), pc.fill_null(change.cast(t), zero)
    if pa.types.is_decimal(t):
        wide = pa.decimal256(t.precision, t.scale)
        old, change = old.cast(wide), change.cast(wide)
    return pc.add(old, change).cast(t)


def _extreme(func: str, a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """Element-wise ``least``/``greatest`` skipping NULLs, as Spark's (for every ordered
    type: Arrow's ``min_element_wise`` has no kernel for zoned timestamps)."""
    pick_b = pc.less(b, a) if func == "min" else pc.greater(b, a)
    return pc.if_else(pc.is_null(a), b, pc.if_else(pc.fill_null(pick_b, False), b, a))


def unsuffix(name: str, aggs: list[tuple[str, str]]) -> str:
    """A ``group_by().aggregate`` column's name without its ``_<function>`` suffix."""
    for col, fn in aggs:
        if name == f"{col}_{fn}":
            return col
    return name


def arrow_output(keys: list[str] | tuple[str, ...], aggs: tuple[Any, ...], table: pa.Table,
                 out: pa.Schema) -> pa.Table | None:
    """The GROUP BY's output Δ (``out``: its columns and ``_w``) from the step's
    accumulators (``table``): retractions of the old and insertions of the new result rows
    where they differ, when every
    value already has its output column's type (the Spark operator's final CAST is the
    identity; an AVG of integers divides as DOUBLE, as Spark's ``/``); else None."""
    results = _results(keys, aggs, table, out)
    if results is None:
        return None
    old_v, new_v, old_exists, new_exists, changed = results
    parts = []
    for vals, exists, weight in ((old_v, old_exists, -1), (new_v, new_exists, 1)):
        pick = pc.and_(changed, exists)
        part = pa.table([v.filter(pick) for v in vals], names=out.names[:-1])
        parts.append(part.append_column(
            WEIGHT, pa.array([weight] * part.num_rows, pa.int64())))
    return concat(parts, out)


def arrow_changes(keys: list[str] | tuple[str, ...], aggs: tuple[Any, ...], table: pa.Table,
                  out: pa.Schema) -> tuple[pa.Table, pa.Table, pa.Array, pa.Array] | None:
    """The change events of ``arrow_output``'s Δ, read off the accumulators: a group's row
    holds both its old and its new result, so its retraction and insertion pair up without
    grouping or sorting the rows (``events.change_events``' work). Per group whose result
    changed: its old row and its new row (``out``'s columns but ``_w``), and where each is
    missing (the group was new, or is gone); None where ``arrow_output`` is."""
    results = _results(keys, aggs, table, out)
    if results is None:
        return None
    old_v, new_v, old_exists, new_exists, changed = results
    names = out.names[:-1]
    changed, old_exists, new_exists = (
        a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
        for a in (changed, old_exists, new_exists))
    return (pa.table([v.filter(changed) for v in old_v], names=names),
            pa.table([v.filter(changed) for v in new_v], names=names),
            pc.invert(old_exists.filter(changed)), pc.invert(new_exists.filter(changed)))


def arrow_rows(keys: list[str] | tuple[str, ...], aggs: tuple[Any, ...], state: pa.Table,
               out: pa.Schema) -> pa.Table | None:
    """The GROUP BY's result rows (``out``'s columns but ``_w``) of its groups' state rows
    ``state`` (``AggregateStep.logged``'s columns, those of live groups: a bucket's
    ``Stepped.after``); None where ``arrow_output`` is."""
    values = _values(list(keys), aggs, state, out, "")
    return None if values is None else pa.table(values, names=out.names[:-1])


def _values(keys: list[str], aggs: tuple[Any, ...], table: pa.Table, out: pa.Schema,
            side: str) -> list[pa.ChunkedArray] | None:
    """The result values of the groups of ``table`` (in ``out``'s columns), of its
    accumulators' ``side`` (``o``: old, ``n``: new; empty: ``table`` is state rows)."""
    got = [table[k] for k in keys]
    for i, a in enumerate(aggs):
        if a.strategy == "count":
            got.append(table[f"{side}{COUNT}" if a.arg is None else f"{side}c{i}"])
        elif a.strategy == "sum":
            total, count = table[f"{side}s{i}"], table[f"{side}c{i}"]
            if a.func != "sum":
                t = out.field(len(got)).type
                if pa.types.is_decimal(total.type) and pa.types.is_decimal(t):
                    total = decimal_mean(total, count, t)
                elif pa.types.is_integer(total.type) or pa.types.is_floating(total.type):
                    total = pc.divide(total.cast(pa.float64()), count.cast(pa.float64()))
                else:
                    return None
            got.append(pc.if_else(pc.greater(count, 0), total, pa.scalar(None, total.type)))
        else:  # running or multiset: the value itself
            got.append(table[f"{side}m{i}"])
    if any(v.type != f.type for v, f in zip(got, out)):
        return None
    return got


def decimal_mean(total: pa.Array | pa.ChunkedArray, count: pa.Array | pa.ChunkedArray,
                 t: pa.DataType) -> pa.Array:
    """Spark's AVG of decimals from their sum and count, as ``t`` (its result type): the
    quotient rounded half up to 38 places (Spark's ``Decimal./``), then to ``t``'s scale
    (``DecimalDivideWithOverflowCheck``); NULL for a count of 0."""
    places, step = Decimal(1).scaleb(-38), Decimal(1).scaleb(-t.scale)
    values = []
    with localcontext() as c:
        c.prec = 160
        for s, n in zip(total.to_pylist(), count.to_pylist()):
            values.append(None if s is None or not n else (s / n).quantize(
                places, ROUND_HALF_UP).quantize(step, ROUND_HALF_UP))
    return pa.array(values, t)


def _results(keys: list[str] | tuple[str, ...], aggs: tuple[Any, ...], table: pa.Table,
             out: pa.Schema) -> tuple[list, list, Any, Any, Any] | None:
    """Each group's old and new result values (in ``out``'s columns), whether it existed
    before and after, and whether its result changed (``arrow_output``)."""
    keys = list(keys)
    old_v, new_v = _values(keys, aggs, table, out, "o"), _values(keys, aggs, table, out, "n")
    if old_v is None or new_v is None:
        return None
    if keys:
        old_exists = pc.fill_null(pc.greater(table[f"o{COUNT}"], 0), False)
        new_exists = pc.fill_null(pc.greater(table[f"n{COUNT}"], 0), False)
    else:
        old_exists = pc.is_valid(table[f"o{COUNT}"])
        new_exists = pa.repeat(pa.scalar(True), table.num_rows)
    same = pc.and_(old_exists, new_exists)
    for a, b in zip(old_v, new_v):
        same = pc.and_(same, same_values(a, b))
    changed = pc.and_(table["_touched"], pc.invert(same))
    # a group that neither existed before nor exists after changes nothing
    changed = pc.and_(changed, pc.or_(old_exists, new_exists))
    return old_v, new_v, old_exists, new_exists, changed

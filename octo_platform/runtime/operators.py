"""Incremental operators: each turns its input's weighted rows (Δ) into output Δ with Spark.

Stateful operators read the state of the keys a batch touches (pinned to the versions the
previous batch committed), compute new state and output, and stage their state changes;
the pipeline writes all staged changes in one job and commits them after the batch.
Aggregates and joins keep their state as a log of changes (``state_log``); top-N rewrites
the hash buckets its partitions fall in.

Expressions are built as Spark SQL text (one JVM call per projection, not one per column):
on a small machine the Python-to-JVM round trips otherwise cost more than the data work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any, Callable, Protocol

from octo_platform.logical.plan import quote
from octo_platform.physical.plan import (
    PAggregate,
    PJoin,
    PNode,
    PSource,
    PStateless,
    PTopN,
    PUnion,
)
from octo_platform.runtime.columns import BUCKET, COUNT, WEIGHT
from octo_platform.runtime.state_log import (
    BATCH,
    StateFile,
    compaction,
    latest,
    merge_keyed,
    merge_weighted,
    read_log,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["StateReader", "StagedWrite", "BatchContext", "evaluate", "bucket_sql",
           "apply_steps", "sql_expr"]

W = quote(WEIGHT)


class StateReader(Protocol):
    def __call__(self, table: str, buckets: set[int]) -> list[str]:
        """Files holding the given buckets of a state table, as of the previous batch."""


@dataclass
class StagedWrite:
    """Rows for a state table: with ``buckets``, the new contents of those ``_bucket``
    partitions; without, rows appended to a state log (``prefix`` ``delta``, or ``base``
    for a full compaction), with ``remove`` naming the files a compaction replaces."""

    table: str
    data: DataFrame
    buckets: list[int] | None
    remove: tuple[str, ...] = ()
    prefix: str = "delta"


@dataclass
class BatchContext:
    spark: SparkSession
    batch: int
    buckets: int
    inputs: dict[str, DataFrame]
    state_files: StateReader
    state_log: Callable[[str], list[StateFile]] = lambda table: []  # a log's pinned files
    memo: dict[str, Any] = field(default_factory=dict)  # per-pipeline, survives batches
    all_buckets: bool = False  # a large batch touches every bucket: skip finding which
    writes: list[StagedWrite] = field(default_factory=list)
    persisted: list[DataFrame] = field(default_factory=list)

    def persist(self, df: DataFrame) -> DataFrame:
        df = df.persist()
        self.persisted.append(df)
        return df

    def release(self) -> None:
        for df in self.persisted:
            df.unpersist()
        self.persisted.clear()

    def read_state(self, table: str, schema: StructType, buckets: set[int]) -> DataFrame:
        files = self.state_files(table, buckets)
        if not files:
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(*files)

    def compact(self, table: str, merge: Callable[[list[StateFile], bool], DataFrame]) -> None:
        """Stage this batch's compaction of a state log, if it is due (``state_log``)."""
        due = compaction(self.state_log(table))
        if due is not None:
            files, full = due
            self.writes.append(StagedWrite(table, merge(files, full), None,
                                           tuple(f["path"] for f in files),
                                           "base" if full else "delta"))


def bucket_sql(keys: list[str] | tuple[str, ...], buckets: int) -> str:
    """SQL of the bucket a row's key falls in (0 for an empty key)."""
    if not keys:
        return "0"
    return f"pmod(hash({', '.join(quote(k) for k in keys)}), {buckets})"


def apply_steps(df: DataFrame, steps: tuple, carry: str) -> DataFrame:
    """Filters and projections of a stateless stage; ``carry`` (a column) passes through."""
    for kind, names, exprs in steps:
        if kind == "filter":
            df = df.filter(exprs[0])
        else:
            df = df.selectExpr(*[f"{e} AS {quote(n)}" for n, e in zip(names, exprs)], carry)
    return df


def evaluate(node: PNode, ctx: BatchContext) -> DataFrame:
    """The output Δ of ``node`` for this batch: its columns plus the weight column."""
    if isinstance(node, PSource):
        return ctx.inputs[node.name.lower()]
    if isinstance(node, PStateless):
        return apply_steps(evaluate(node.input, ctx), node.steps, W)
    if isinstance(node, PUnion):
        parts = [evaluate(c, ctx).toDF(*node.columns, WEIGHT) for c in node.children]
        return reduce(lambda a, b: a.union(b), parts)
    if isinstance(node, PAggregate):
        return _Aggregate(node, ctx).run(evaluate(node.input, ctx))
    if isinstance(node, PJoin):
        return _Join(node, ctx).run(evaluate(node.left, ctx), evaluate(node.right, ctx))
    if isinstance(node, PTopN):
        return _TopN(node, ctx).run(evaluate(node.input, ctx))
    raise TypeError(f"no runtime for {type(node).__name__}")


@dataclass(frozen=True)
class _AggShape:
    """What an aggregate's SQL looks like for given input types (computed once per run)."""

    state_schema: Any
    out_schema: Any
    delta_exprs: tuple[str, ...]
    ms_schemas: dict[int, Any]


class _Aggregate:
    """GROUP BY with retractions.

    State row per group: keys, ``_n`` (row count), per aggregate ``c<i>`` (non-null count),
    ``s<i>`` (sum) or ``m<i>`` (last MIN/MAX/COUNT DISTINCT result); multiset aggregates keep
    (keys, value) -> count in a table of their own.
    """

    def __init__(self, node: PAggregate, ctx: BatchContext) -> None:
        self.node = node
        self.ctx = ctx
        self.keys = [quote(k) for k in node.keys]

    def shape(self, delta: DataFrame) -> _AggShape:
        key = f"{self.node.id}:{delta.schema.simpleString()}"
        if key not in self.ctx.memo:
            self.ctx.memo[key] = self._shape(delta)
        return self.ctx.memo[key]

    def _shape(self, delta: DataFrame) -> _AggShape:
        from pyspark.sql.types import LongType, StructField, StructType

        node = self.node
        types = {f.name: f.dataType for f in delta.schema.fields}
        out_exprs: list[str] = []
        acc: list[StructField] = []
        d_exprs = [f"sum({W}) AS d{COUNT}"]
        ms: dict[int, Any] = {}
        for i, a in enumerate(node.aggs):
            x = quote(a.arg) if a.arg else None
            if a.arg is None:
                out_exprs.append(f"count(1) AS {quote(node.columns[len(self.keys) + i])}")
            else:
                inner = f"DISTINCT {x}" if a.distinct else x
                out_exprs.append(f"{a.func}({inner}) AS {quote(node.columns[len(self.keys) + i])}")
            w_if = f"CASE WHEN {x} IS NOT NULL THEN {W} ELSE 0 END"
            if a.strategy == "count":
                if x is not None:
                    acc.append(StructField(f"c{i}", LongType()))
                    d_exprs.append(f"sum({w_if}) AS dc{i}")
            elif a.strategy == "sum":
                st = delta.selectExpr(f"sum({x})").schema.fields[0].dataType
                acc += [StructField(f"c{i}", LongType()), StructField(f"s{i}", st)]
                t = st.simpleString()
                d_exprs += [f"sum({w_if}) AS dc{i}",
                            f"CAST(sum(CAST({x} AS {t}) * {W}) AS {t}) AS ds{i}"]
            elif a.strategy == "running":
                acc.append(StructField(f"m{i}", types[a.arg]))
                d_exprs.append(f"{a.func}({x}) AS dm{i}")
            else:
                acc.append(StructField(f"m{i}", LongType() if a.func == "count" else
                                       types[a.arg]))
                ms[i] = StructType([*[StructField(k, types[k]) for k in node.keys],
                                    StructField("v", types[a.arg]), StructField("cnt", LongType())])
        state = StructType([*[StructField(k, types[k]) for k in node.keys],
                            StructField(COUNT, LongType()), *acc])
        probe = delta.limit(0).groupBy(*self.keys)
        probe = probe.agg(*[sql_expr(e) for e in out_exprs]) if out_exprs else \
            delta.limit(0).selectExpr(*self.keys)
        return _AggShape(state, probe.schema, tuple(d_exprs), ms)

    def run(self, delta: DataFrame) -> DataFrame:
        node, ctx = self.node, self.ctx
        shape = self.shape(delta)
        if shape.ms_schemas:
            delta = ctx.persist(delta)  # read by the multisets too
        grouped = delta.groupBy(*self.keys).agg(*[sql_expr(e) for e in shape.delta_exprs])
        dagg = ctx.persist(grouped)
        names = list(node.keys)
        alive = f"{COUNT} != 0" if self.keys else None  # a group whose count is 0 is gone
        old = latest(ctx.spark, ctx.state_log(node.id), shape.state_schema, names,
                     wanted=dagg.select(*self.keys) if self.keys else None, alive=alive)
        ctx.compact(node.id, lambda files, full: merge_keyed(
            ctx.spark, files, shape.state_schema, names, full=full, alive=alive))
        d = dagg
        for i in shape.ms_schemas:
            result = self.multiset(i, delta, shape.ms_schemas[i])
            on = " AND ".join(f"d.{k} <=> r.{k}" for k in self.keys) or "true"
            d = (d.alias("d").join(result.alias("r"), sql_expr(on), "left")
                 .selectExpr("d.*", f"r.r{i} AS r{i}"))
        on = " AND ".join(f"o.{k} <=> d.{k}" for k in self.keys) or "true"
        joined = old.alias("o").join(d.alias("d"), sql_expr(on), "full_outer")
        table = ctx.persist(joined.selectExpr(*self.merge_exprs(shape)))
        # Every group the batch touched gets its new row (count 0: a tombstone).
        new_state = table.filter("_touched").selectExpr(
            *self.keys, f"n{COUNT} AS {COUNT}",
            *[f"n{f.name} AS {f.name}" for f in shape.state_schema.fields[len(self.keys) + 1:]],
            f"CAST({ctx.batch} AS BIGINT) AS {BATCH}")
        ctx.writes.append(StagedWrite(node.id, new_state, None))
        return self.output(table, shape)

    def merge_exprs(self, shape: _AggShape) -> list[str]:
        """Old and new accumulators side by side for every row of the touched buckets."""
        node = self.node
        touched = f"(d.d{COUNT} IS NOT NULL OR {str(not self.keys).lower()})"
        exprs = [f"coalesce(o.{k}, d.{k}) AS {k}" for k in self.keys]
        exprs += [f"{touched} AS _touched", f"o.{COUNT} AS o{COUNT}",
                  f"coalesce(o.{COUNT}, 0) + coalesce(d.d{COUNT}, 0) AS n{COUNT}"]
        for f in shape.state_schema.fields[len(self.keys) + 1:]:
            name, i = f.name, int(f.name[1:])
            a, t = node.aggs[i], f.dataType.simpleString()
            if name[0] in "cs":
                new = (f"CAST(coalesce(o.{name}, CAST(0 AS {t})) + "
                       f"coalesce(d.d{name}, CAST(0 AS {t})) AS {t})")
            elif a.strategy == "running":
                new = f"{'least' if a.func == 'min' else 'greatest'}(o.{name}, d.d{name})"
            else:  # multiset: the group's new result if the batch touched it, else unchanged
                result = f"coalesce(d.r{i}, 0)" if a.func == "count" else f"d.r{i}"
                new = f"CASE WHEN {touched} THEN {result} ELSE o.{name} END"
            exprs += [f"o.{name} AS o{name}", f"{new} AS n{name}"]
        return exprs

    def multiset(self, i: int, delta: DataFrame, schema: Any) -> DataFrame:
        """Update the (keys, value) -> count log of aggregate ``i``; per-group result over
        every value of the groups the batch touched."""
        node, ctx = self.node, self.ctx
        a = node.aggs[i]
        table = node.multiset_table(i)
        x = quote(a.arg)
        dv = ctx.persist(delta.filter(f"{x} IS NOT NULL")
                         .groupBy(*self.keys, sql_expr(f"{x} AS v"))
                         .agg(sql_expr(f"sum({W}) AS dcnt")))
        names = [*node.keys, "v"]
        # Every value of every group the batch touches (also groups whose Δ values are NULL).
        old = latest(ctx.spark, ctx.state_log(table), schema, names,
                     wanted=delta.select(*self.keys) if self.keys else None, alive="cnt != 0")
        ctx.compact(table, lambda files, full: merge_keyed(
            ctx.spark, files, schema, names, full=full, alive="cnt != 0"))
        on = " AND ".join(f"o.{c} <=> d.{c}" for c in [*self.keys, "v"])
        merged = ctx.persist(old.alias("o").join(dv.alias("d"), sql_expr(on), "full_outer")
                             .selectExpr(*[f"coalesce(o.{c}, d.{c}) AS {c}"
                                           for c in [*self.keys, "v"]],
                                         "coalesce(o.cnt, 0) + coalesce(d.dcnt, 0) AS cnt",
                                         "d.dcnt IS NOT NULL AS _changed"))
        ctx.writes.append(StagedWrite(table, merged.filter("_changed").selectExpr(
            *self.keys, "v", "cnt", f"CAST({ctx.batch} AS BIGINT) AS {BATCH}"), None))
        fn = "count" if a.func == "count" else a.func
        return merged.filter("cnt > 0").groupBy(*self.keys).agg(sql_expr(f"{fn}(v) AS r{i}"))

    def values(self, side: str) -> list[str]:
        """Output values (keys, then aggregates) from the ``o``/``n`` accumulators."""
        out = list(self.keys)
        for i, a in enumerate(self.node.aggs):
            if a.strategy == "count":
                out.append(f"{side}{COUNT}" if a.arg is None else f"{side}c{i}")
            elif a.strategy == "sum":
                s = f"{side}s{i}" if a.func == "sum" else f"{side}s{i} / {side}c{i}"
                out.append(f"CASE WHEN {side}c{i} > 0 THEN {s} END")
            else:
                out.append(f"{side}m{i}")
        return out

    def output(self, table: DataFrame, shape: _AggShape) -> DataFrame:
        names = [quote(c) for c in self.node.columns]
        types = [f.dataType.simpleString() for f in shape.out_schema.fields]
        old_v, new_v = self.values("o"), self.values("n")
        if self.keys:
            old_exists, new_exists = f"coalesce(o{COUNT} > 0, false)", f"n{COUNT} > 0"
        else:
            old_exists, new_exists = f"o{COUNT} IS NOT NULL", "true"
        same = " AND ".join(f"({a}) <=> ({b})" for a, b in zip(old_v, new_v)) or "true"
        changed = f"_touched AND NOT ({old_exists} AND {new_exists} AND {same})"

        def side(values: list[str], exists: str, weight: int) -> list[str]:
            cols = [f"CAST({v} AS {t}) AS {n}" for v, t, n in zip(values, types, names)]
            return [f"CASE WHEN {exists} THEN struct({', '.join(cols)}, "
                    f"CAST({weight} AS BIGINT) AS {W}) END"]

        rows = table.filter(changed).selectExpr(
            f"explode(filter(array({side(old_v, old_exists, -1)[0]}, "
            f"{side(new_v, new_exists, 1)[0]}), x -> x IS NOT NULL)) AS r")
        return rows.selectExpr("r.*")


def consolidate(df: DataFrame, columns: list[str], weight: str = W) -> DataFrame:
    """One row per distinct value of ``columns`` with its summed weight (zeros dropped)."""
    return df.groupBy(*columns).agg(sql_expr(f"sum({weight}) AS {weight}")).filter(
        f"{weight} != 0")


def touched_buckets(ctx: BatchContext, df: DataFrame, keyed: bool) -> set[int]:
    """Buckets the rows of ``df`` fall in. Any superset is correct (untouched rows are
    rewritten as they were), so a large batch takes every bucket and skips the job."""
    if ctx.all_buckets and keyed:
        return set(range(ctx.buckets))
    return {r[0] for r in df.select(BUCKET).distinct().collect()}


def positional(names: list[str] | tuple[str, ...]) -> list[str]:
    """State tables store columns as ``c0, c1, ...``: any user column name is safe there."""
    return [f"c{i}" for i in range(len(names))]


class _Join:
    """Delta-rule join over updating inputs.

    Each side's state is a log of its rows with multiplicity (``_n``); a batch appends its
    Δ, and reads only the rows that join its keys (a broadcast join or semi-join when the
    batch is small, so the state is scanned, never shuffled). Per side, one
    aggregate lines up every row of those buckets with its old and new multiplicity
    (``_lo``/``_ln``, ``_ro``/``_rn``); the matched part is Δ(L⋈R) = ΔL⋈R_old + L_new⋈ΔR.
    Outer, semi and anti joins also compare, for the keys the batch touched, each row's
    matches before and after the batch: a null-padded row is retracted when its first match
    arrives and comes back when the last one leaves (semi: a row is there while it has a
    match, anti: while it has none). Without a residual condition matches are counted per
    key; with one, per row.
    """

    def __init__(self, node: PJoin, ctx: BatchContext) -> None:
        self.node = node
        self.ctx = ctx
        nl = len(node.left.columns)
        self.names = {"l": list(node.names[:nl]), "r": list(node.names[nl:])}
        self.keys = {"l": list(node.left_keys), "r": list(node.right_keys)}

    def kcols(self, s: str) -> list[str]:
        return [f"_{s}k{i}" for i in range(len(self.keys[s]))]

    def cols(self, s: str) -> list[str]:
        """A side's row: its columns and its key columns."""
        return [*(quote(n) for n in self.names[s]), *self.kcols(s)]

    def key_types(self, ldf: DataFrame, rdf: DataFrame) -> list[str]:
        """One type per key pair, so equal keys hash (and bucket) alike on both sides."""
        memo = f"{self.node.id}:keys"
        if memo not in self.ctx.memo:
            lt = [f.dataType.simpleString() for f in ldf.selectExpr(*self.keys["l"]).schema]
            rt = [f.dataType.simpleString() for f in rdf.selectExpr(*self.keys["r"]).schema]
            common = [a if a == b else self.ctx.spark.range(0).selectExpr(
                f"coalesce(CAST(NULL AS {a}), CAST(NULL AS {b}))").schema[0].dataType
                .simpleString() for a, b in zip(lt, rt)]
            self.ctx.memo[memo] = common
        return self.ctx.memo[memo]

    def with_keys(self, df: DataFrame, s: str, types: list[str]) -> DataFrame:
        keys = [f"CAST(({k}) AS {t}) AS {c}"
                for k, t, c in zip(self.keys[s], types, self.kcols(s))]
        return df.selectExpr("*", *keys)

    def run(self, ldelta: DataFrame, rdelta: DataFrame) -> DataFrame:
        node, ctx = self.node, self.ctx
        frames = {"l": ldelta.toDF(*self.names["l"], "_lw"),
                  "r": rdelta.toDF(*self.names["r"], "_rw")}
        types = self.key_types(frames["l"], frames["r"])
        schemas = {s: frames[s].schema for s in "lr"}
        delta = {s: ctx.persist(self.with_keys(consolidate(
            frames[s], [quote(n) for n in self.names[s]], f"_{s}w"), s, types)) for s in "lr"}
        old = {}
        for s, side in (("l", "left"), ("r", "right")):
            table = node.side_table(side)
            names = self.names[s]
            schema = _side_schema(schemas[s], names)
            stored = read_log(ctx.spark, ctx.state_log(table), schema)
            old[s] = self.with_keys(stored.toDF(*names, f"_{s}w"), s, types)
            store = [f"{quote(n)} AS {c}" for n, c in zip(names, positional(names))]
            ctx.writes.append(StagedWrite(table, delta[s].selectExpr(*store, f"_{s}w AS {COUNT}"),
                                          None))
            ctx.compact(table, lambda files, _full, schema=schema: merge_weighted(
                ctx.spark, files, schema, COUNT))
        parts = []
        if node.kind in ("inner", "left", "right", "full"):  # ΔL⋈R_old + L_new⋈ΔR
            new_l = old["l"].unionByName(delta["l"])
            parts += [self.matched(delta["l"], old["r"]), self.matched(new_l, delta["r"])]
        if node.kind != "inner":
            rows = self.affected_rows(old, delta)
            counts = self.key_counts(rows)
            sides = {"left": "l", "semi": "l", "anti": "l", "right": "r"}.get(node.kind, "lr")
            parts += [self.unmatched(s, rows, counts, schemas) for s in sides]
        return reduce(lambda a, b: a.union(b), parts)

    def affected_rows(self, old: dict[str, DataFrame], delta: dict[str, DataFrame]
                      ) -> dict[str, DataFrame]:
        """Per side, the distinct rows whose join key the batch touched, with their old and
        new multiplicity (``_<s>o``, ``_<s>n``) and whether the batch changed them."""
        keys = delta["l"].select(*self.kcols("l")).union(delta["r"].select(*self.kcols("r")))
        keys = keys.toDF(*[f"_ak{i}" for i in range(len(self.kcols("l")))]).distinct()
        rows = {}
        for s in "lr":
            same = " AND ".join(f"{k} <=> _ak{i}" for i, k in enumerate(self.kcols(s)))
            mine = old[s].join(keys, sql_expr(same), "left_semi")
            both = mine.selectExpr("*", f"_{s}w AS _{s}o", "false AS _d").unionByName(
                delta[s].selectExpr("*", f"0 AS _{s}o", "true AS _d"))
            rows[s] = self.ctx.persist(both.groupBy(*self.cols(s)).agg(
                sql_expr(f"sum(_{s}o) AS _{s}o"), sql_expr(f"sum(_{s}w) AS _{s}n"),
                sql_expr(f"max(_d) AS _{s}d")))
        return rows

    def out_columns(self) -> list[str]:
        names = self.names["l"] + ([] if self.node.kind in ("semi", "anti") else self.names["r"])
        return [quote(n) for n in names]

    def condition(self) -> str:
        on = [f"{a} = {b}" for a, b in zip(self.kcols("l"), self.kcols("r"))]
        if self.node.residual:
            on.append(f"({self.node.residual})")
        return " AND ".join(on)

    def matched(self, left: DataFrame, right: DataFrame) -> DataFrame:
        names = [quote(n) for n in self.names["l"] + self.names["r"]]
        return left.join(right, sql_expr(self.condition())).selectExpr(
            *names, f"_lw * _rw AS {W}")

    def key_counts(self, rows: dict[str, DataFrame]) -> DataFrame:
        """Per join key the batch touched (on either side): each side's old and new row
        count. Keys with a NULL part match nothing, so their counts are zero."""
        per = {}
        for s in "lr":
            null = " OR ".join(f"{k} IS NULL" for k in self.kcols(s))
            per[s] = rows[s].groupBy(*self.kcols(s)).agg(*[sql_expr(e) for e in (
                f"CASE WHEN {null} THEN 0 ELSE sum(_{s}o) END AS _{s}co",
                f"CASE WHEN {null} THEN 0 ELSE sum(_{s}n) END AS _{s}cn",
                f"max(_{s}d) AS _{s}t")])
        same = " AND ".join(f"{a} <=> {b}" for a, b in zip(self.kcols("l"), self.kcols("r")))
        keys = [f"coalesce({a}, {b}) AS _ck{i}"
                for i, (a, b) in enumerate(zip(self.kcols("l"), self.kcols("r")))]
        return per["l"].join(per["r"], sql_expr(same), "full_outer").selectExpr(
            *keys, *[f"coalesce(_{s}{c}, 0) AS _{s}{c}" for s in "lr" for c in ("co", "cn")],
            "coalesce(_lt, false) OR coalesce(_rt, false) AS _t").filter("_t")

    def unmatched(self, s: str, rows: dict[str, DataFrame], counts: DataFrame,
                  schemas: dict[str, Any]) -> DataFrame:
        """Changes to side ``s``'s rows that appear without a match (null-padded, anti) or
        only with one (semi), for the keys the batch touched."""
        o = "r" if s == "l" else "l"
        same = " AND ".join(f"{k} <=> _ck{i}" for i, k in enumerate(self.kcols(s)))
        mine = rows[s].join(counts, sql_expr(same), "left_semi" if
                            self.node.residual else "inner")
        if self.node.residual is None:  # matches depend on the key only
            m_old, m_new = f"_{o}co", f"_{o}cn"
        else:  # count matching rows of the other side, per row
            mine = mine.join(rows[o], sql_expr(self.condition()), "left").groupBy(
                *self.cols(s), f"_{s}o", f"_{s}n").agg(
                sql_expr(f"coalesce(sum(_{o}o), 0) AS _mo"),
                sql_expr(f"coalesce(sum(_{o}n), 0) AS _mn"))
            m_old, m_new = "_mo", "_mn"
        test = "> 0" if self.node.kind == "semi" else "= 0"
        weight = (f"CASE WHEN {m_new} {test} THEN _{s}n ELSE 0 END - "
                  f"CASE WHEN {m_old} {test} THEN _{s}o ELSE 0 END")
        values = [quote(n) for n in self.names[s]]
        if self.node.kind not in ("semi", "anti"):
            pad = [f"CAST(NULL AS {f.dataType.simpleString()}) AS {quote(n)}"
                   for n, f in zip(self.names[o], schemas[o].fields)]
            values = values + pad if s == "l" else pad + values
        return mine.selectExpr(*values, f"{weight} AS {W}").filter(f"{W} != 0")


def _side_schema(schema: Any, names: list[str]) -> Any:
    """Stored schema of a join side or top-N: positional columns, then ``_n``."""
    from pyspark.sql.types import LongType, StructField, StructType

    fields = [StructField(c, f.dataType) for c, f in zip(positional(names), schema.fields)]
    return StructType([*fields, StructField(COUNT, LongType())])


class _TopN:
    """Top-N per partition, re-ranking only the partitions a batch touches.

    State: the input's rows with multiplicity, bucketed by hash of the partition key; over
    append-only input only each partition's current top ``n`` rows (the rest can never
    re-enter). Output: the touched partitions' new top rows minus their old ones, so a
    deleted leader is replaced by the next row (and ranks shift as updates).
    """

    def __init__(self, node: PTopN, ctx: BatchContext) -> None:
        self.node = node
        self.ctx = ctx
        self.names = list(node.input.columns)
        self.cols = [quote(c) for c in self.names]

    def rank(self, rows: DataFrame) -> DataFrame:
        """Each partition's first ``n`` rows (one per unit of multiplicity) with ``_rn``."""
        node = self.node
        part = ", ".join(quote(p) for p in node.partition)
        order = [k.render() for k in node.order] + [f"{c} ASC NULLS FIRST" for c in self.cols]
        over = (f"PARTITION BY {part} " if part else "") + f"ORDER BY {', '.join(order)}"
        units = rows.filter(f"{W} > 0").selectExpr(
            *self.cols, f"explode(sequence(1, CAST({W} AS INT))) AS _unit")
        return units.selectExpr(*self.cols, f"row_number() OVER ({over}) AS _rn") \
            .filter(f"_rn <= {node.n}")

    def run(self, delta: DataFrame) -> DataFrame:
        node, ctx = self.node, self.ctx
        bucket = bucket_sql(node.partition, ctx.buckets)
        d = ctx.persist(consolidate(delta, self.cols).selectExpr("*", f"{bucket} AS {BUCKET}"))
        touched = touched_buckets(ctx, d, keyed=bool(node.partition))
        d = d.drop(BUCKET)
        if not touched:
            return self.emit(self.rank(d.limit(0)), "")
        stored = ctx.read_state(node.id, _side_schema(delta.schema, self.names), touched)
        old = stored.toDF(*self.names, WEIGHT)
        new = ctx.persist(consolidate(old.unionByName(d), self.cols))
        keep = new
        if node.pruned:
            keep = self.rank(new).groupBy(*self.cols).agg(sql_expr(f"count(1) AS {W}"))
        ctx.writes.append(StagedWrite(node.id, keep.selectExpr(
            *[f"{c} AS {p}" for c, p in zip(self.cols, positional(self.names))],
            f"{W} AS {COUNT}", f"{bucket} AS {BUCKET}"), sorted(touched)))
        if node.partition:
            parts = d.select(*[quote(p) for p in node.partition]).distinct()
            same = " AND ".join(f"a.{quote(p)} <=> k.{quote(p)}" for p in node.partition)
            old, new = (f.alias("a").join(parts.alias("k"), sql_expr(same), "left_semi")
                        for f in (old, new))
        return self.emit(self.rank(new), "").union(self.emit(self.rank(old), "-"))

    def emit(self, ranked: DataFrame, sign: str) -> DataFrame:
        """Ranked rows as output rows with weight +1 (``sign`` "") or -1 (``sign`` "-")."""
        rank = [f"CAST(_rn AS INT) AS {quote(self.node.rank)}"] if self.node.rank else []
        return ranked.selectExpr(*self.cols, *rank, f"CAST({sign}1 AS BIGINT) AS {W}")


def sql_expr(sql: str):
    """A Column from Spark SQL text."""
    from pyspark.sql import functions as F

    return F.expr(sql)

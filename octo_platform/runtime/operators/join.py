"""Delta-rule joins (inner, outer, semi, anti) over updating inputs."""
from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Any

from octo_platform.columns import BUCKET, COUNT
from octo_platform.physical.plan import PJoin
from octo_platform.runtime.operators.context import (
    BatchContext,
    W,
    bucket_sql,
    consolidate,
    positional,
    touched_buckets,
)
from octo_platform.runtime.operators.join_kernel import JoinStep
from octo_platform.runtime.state_log import BATCH, merge_weighted, read_log, unexpired_sql, \
    with_batch
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Join"]


class Join:
    """Delta-rule join over updating inputs.

    Each side's state is a log of its rows with multiplicity (``_n``) and join key,
    partitioned by the key's bucket; a batch appends its Δ. The kernel (``join_kernel``,
    run in Spark tasks by ``join_tasks`` and in the driver by ``kernels``) reads only the
    buckets a batch touches; so does this operator, which serves joins over columns Arrow
    does not group (nested types): it reads the files of the buckets the batch's join keys
    fall in (and keeps the rows whose key the batch touched). Per side,
    one aggregate lines up every row of those keys with its old and new multiplicity
    (``_lo``/``_ln``, ``_ro``/``_rn``); the matched part is Δ(L⋈R) = ΔL⋈R_old + L_new⋈ΔR.
    Outer, semi and anti joins also compare, for the keys the batch touched, each row's
    matches before and after the batch: a null-padded row is retracted when its first match
    arrives and comes back when the last one leaves (semi: a row is there while it has a
    match, anti: while it has none). Without a residual condition matches are counted per
    key; with one, per row. With ``state_ttl`` (inner joins over append-only input only) a
    stored row is forgotten once its batch expires: later rows of the other side no longer
    match it, and what it already matched stays in the result.
    """

    SIDES = {"l": "left", "r": "right"}

    def __init__(self, node: PJoin, ctx: BatchContext) -> None:
        self.node = node
        self.ctx = ctx
        nl = len(node.left.columns)
        self.names = {"l": list(node.names[:nl]), "r": list(node.names[nl:])}
        self.keys = {"l": list(node.left_keys), "r": list(node.right_keys)}

    def step(self) -> JoinStep:
        """The join's kernel (``join_kernel``): its columns, keys and kind."""
        return JoinStep(self.node.kind, {s: tuple(self.names[s]) for s in "lr"},
                        {s: tuple(self.kcols(s)) for s in "lr"}, bool(self.node.residual))

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
        delta = {s: ctx.checkpoint(self.with_keys(consolidate(
            frames[s], [quote(n) for n in self.names[s]], f"_{s}w"), s, types)) for s in "lr"}
        keys = delta["l"].select(*self.kcols("l")).union(delta["r"].select(*self.kcols("r")))
        touched = touched_buckets(ctx, keys.selectExpr(
            f"{bucket_sql(self.kcols('l'), ctx.buckets)} AS {BUCKET}"), keyed=True)
        old = {s: self.side_state(s, delta[s], touched) for s in "lr"}
        parts = []
        if node.kind in ("inner", "left", "right", "full"):  # ΔL⋈R_old + L_new⋈ΔR
            new_l = old["l"].unionByName(delta["l"])
            parts += [self.matched(delta["l"], old["r"]), self.matched(new_l, delta["r"])]
        if node.kind != "inner":
            rows = self.affected_rows(old, delta)
            counts = self.key_counts(rows)
            parts += [self.unmatched(s, rows, counts, schemas)
                      for s in self.step().unmatched_sides()]
        return reduce(lambda a, b: a.union(b), parts)

    def stored_names(self, s: str) -> list[str]:
        """A side's stored row (``JoinStep.row``'s order): positional columns, ``_n``, the
        keys."""
        return [*positional(self.names[s]), COUNT, *self.stored_keys(s)]

    def stored_keys(self, s: str) -> list[str]:
        """The stored join key columns: the log is partitioned by their bucket."""
        return [f"k{i}" for i in range(len(self.keys[s]))]

    def stored_schema(self, s: str, keyed: Any) -> Any:
        """The stored schema of a side whose rows (``JoinStep.row``) have the Spark schema
        ``keyed``."""
        from pyspark.sql.types import StructField, StructType

        return StructType([StructField(n, f.dataType)
                           for n, f in zip(self.stored_names(s), keyed.fields)])

    def side_state(self, s: str, delta: DataFrame, buckets: set[int]) -> DataFrame:
        """Side ``s``'s rows of the ``buckets`` the batch's keys fall in, as the batch began
        (``JoinStep.row``); stages the batch's Δ (``delta``, consolidated, with keys) for the
        side's log (and its compaction). With ``state_ttl`` each stored row carries the
        batch that wrote it, and rows of expired batches are neither read nor kept."""
        ctx, row = self.ctx, self.step().row(s)
        table = self.node.side_table(self.SIDES[s])
        stored_schema = self.stored_schema(s, delta.schema)
        store = [f"{quote(n)} AS {c}" for n, c in zip(row, self.stored_names(s))]
        cut = ctx.cut(self.node)
        if self.node.ttl_us:
            stored_schema = with_batch(stored_schema)
            store.append(f"CAST({ctx.batch} AS BIGINT) AS {BATCH}")
        stored = read_log(ctx.spark, [f for f in ctx.state_log(table)
                                      if int(f["partition"][BUCKET]) in buckets], stored_schema)
        if cut is not None:
            stored = stored.filter(unexpired_sql(cut))
        ctx.append_log(table, delta.selectExpr(*store), self.stored_keys(s))

        def merge(files: list, full: bool) -> DataFrame:
            rows = merge_weighted(ctx.spark, files, stored_schema, COUNT)  # per batch
            return rows.filter(unexpired_sql(cut)) if full and cut is not None else rows

        ctx.compact(table, merge, self.stored_keys(s))
        return stored.selectExpr(*self.stored_names(s)).toDF(*row)

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
            rows[s] = self.ctx.checkpoint(both.groupBy(*self.cols(s)).agg(
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
        return self.weighed(s, mine, m_old, m_new, schemas)

    def counted(self, s: str, found: DataFrame, schemas: dict[str, Any]) -> DataFrame:
        """Changes to side ``s``'s rows that appear without a match (or, semi, only with
        one), from its candidates (``JoinStep.candidates``, made in Spark tasks): the
        residual condition keeps the pairs that match, and each row's matches before and
        after the batch are summed."""
        o = "r" if s == "l" else "l"
        kept = found.filter(f"_self OR ({self.node.residual})")
        mine = [f"first({c}) AS {c}"
                for c in (*(quote(n) for n in self.names[s]), f"_{s}o", f"_{s}n")]
        rows = kept.groupBy("_id").agg(*[sql_expr(e) for e in (
            *mine, f"sum(_{o}o) AS _mo", f"sum(_{o}n) AS _mn")])
        return self.weighed(s, rows, "_mo", "_mn", schemas)

    def weighed(self, s: str, mine: DataFrame, m_old: str, m_new: str,
                schemas: dict[str, Any]) -> DataFrame:
        """Side ``s``'s rows with their old and new multiplicity (``_<s>o``, ``_<s>n``) and
        matches (``m_old``, ``m_new``) -> their changes in the output."""
        o = "r" if s == "l" else "l"
        test = "> 0" if self.node.kind == "semi" else "= 0"
        weight = (f"CASE WHEN {m_new} {test} THEN _{s}n ELSE 0 END - "
                  f"CASE WHEN {m_old} {test} THEN _{s}o ELSE 0 END")
        values = [quote(n) for n in self.names[s]]
        if self.node.kind not in ("semi", "anti"):
            pad = [f"CAST(NULL AS {f.dataType.simpleString()}) AS {quote(n)}"
                   for n, f in zip(self.names[o], schemas[o].fields)]
            values = values + pad if s == "l" else pad + values
        return mine.selectExpr(*values, f"{weight} AS {W}").filter(f"{W} != 0")



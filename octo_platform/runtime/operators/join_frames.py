"""Delta-rule joins over columns Arrow does not group (nested types), in Spark SQL:
``join``'s formula over the same state.

It reads the files of the buckets the batch's join keys fall in (and keeps the rows whose
key the batch touched). Per side, one aggregate lines up every row of those keys with its
old and new multiplicity (``_lo``/``_ln``, ``_ro``/``_rn``); the matched part is
ΔL⋈R_old + L_new⋈ΔR; outer, semi and anti joins count each touched row's matches before and
after the batch.
"""
from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Any

from octo_platform.columns import BUCKET, COUNT
from octo_platform.runtime.operators.context import (
    W,
    bucket_sql,
    consolidate,
    touched_buckets,
)
from octo_platform.runtime.operators.join import Join
from octo_platform.runtime.state_log import BATCH, merge_weighted, read_log, unexpired_sql, \
    with_batch
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["JoinFrames"]


class JoinFrames(Join):
    """A delta-rule join as Spark operators (``join``'s formula and state)."""

    def cols(self, s: str) -> list[str]:
        """A side's row: its columns and its key columns."""
        return [*(quote(n) for n in self.names[s]), *self.kcols(s)]

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

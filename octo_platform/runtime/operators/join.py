"""Delta-rule joins (inner, outer, semi, anti) over updating inputs: the formula, the
state layout and the step, in Arrow.

**Formula.** The matched part of a batch's change is Δ(L⋈R) = ΔL⋈R_old + L_new⋈ΔR (each
pair weighted by the product of its rows' weights). Outer, semi and anti joins also compare,
for the join keys the batch touched (on either side), each row's matches before and after
the batch: a null-padded row is retracted when its first match arrives and comes back when
the last one leaves (semi: a row is there while it has a match, anti: while it has none).
Without a residual condition matches are counted per key; with one, per row.

**State.** Per side a log of its rows with their multiplicity (``_n``) and join key
(``k<i>``, one type per key pair so equal keys bucket alike on both sides: ``key_types``),
positional columns (``stored_names``), partitioned by the key's bucket; a batch appends its
consolidated Δ; a compaction sums each row's multiplicities (``summed``). With
``state_ttl`` (inner joins over append-only input) each stored row carries the batch that
wrote it (``_batch``) and is forgotten once that batch's cut passes (``BatchContext.cut``):
later rows of the other side no longer match it, and what it already matched stays.

**The step** (``JoinStep``): (the batch's rows of both sides, each side's rows before it, at
least for the join keys the batch touches) -> (output Δ, each side's state changes). It runs
in the driver (``kernels.JoinKernel``, small batches, over the run's state cache) and in
Spark tasks (``join_tasks``, one per bucket of both sides' logs). A residual condition is
SQL: the caller passes ``on`` (Spark over a local relation in the driver); without it (in
Spark tasks), the step returns the matched pairs unfiltered, and an outer, semi or anti
join's rows of the touched keys as candidates (``JoinStep.candidates``): Spark SQL filters
both and counts each row's matches (``Join.counted``). Joins over columns Arrow does not
group (nested types) run as ``join_frames.JoinFrames``' Spark SQL over the same state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.columns import COUNT, WEIGHT
from octo_platform.errors import TooManyPairs
from octo_platform.physical.plan import PJoin
from octo_platform.runtime.operators.aggregate import unsuffix
from octo_platform.runtime.operators.arrow import concat, key_join, safe_keys
from octo_platform.runtime.operators.context import BatchContext, W, positional
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Join", "JoinStep", "Filter", "summed", "CROSS_PAIRS"]

# ``on(what, rows)``: ``rows`` (a side's or both sides' columns) that satisfy the residual
# condition; ``what`` names the call (its schema is remembered per name).
Filter = Callable[[str, pa.Table], pa.Table]
# The pairs a cross join's step may make at once (in the driver, or in the one Spark task
# that holds all its rows: a cross join's key is constant); a batch over it runs on the
# Spark path, and there fails, naming the join, rather than exhaust a process's memory.
CROSS_PAIRS = 10_000_000


@dataclass(frozen=True)
class JoinStep:
    """One join's step (picklable: Spark ships it to tasks). Per side ``s`` (``l``, ``r``):
    its column names, and its key columns (``_<s>k<i>``, already computed by the caller).
    A side's rows are its columns, its weight ``_<s>w`` and its key columns."""

    kind: str
    names: dict[str, tuple[str, ...]]
    kcols: dict[str, tuple[str, ...]]
    residual: bool
    pairs: int | None = None  # a cross join's bound (``CROSS_PAIRS``); None: keyed

    def run(self, deltas: dict[str, pa.Table], old: dict[str, pa.Table],
            on: Filter | None = None, first_id: int = 0
            ) -> tuple[pa.Table, dict[str, pa.Table], dict[str, pa.Table]]:
        """The output Δ (both sides' columns, or the left's for semi and anti, and
        ``_w``); each side's batch rows with their weights summed (net zero dropped): its
        state log's new rows; and, for an outer, semi or anti join with a residual
        condition but no ``on``, per side its ``candidates`` (their ``_id`` from
        ``first_id``) instead of its unmatched rows."""
        delta = {s: self.consolidated(s, deltas[s]) for s in "lr"}
        if self.pairs is not None:
            self.bound(delta, old)
        fields = {s: [delta[s].schema.field(n) for n in self.names[s]] for s in "lr"}
        schema = self.out_schema(delta, both=True)
        out = self.out_schema(delta)
        parts, found = [], {}
        if self.kind in ("inner", "left", "right", "full"):
            parts.append(self.matched(old, delta, schema, on))
        if self.kind != "inner":
            rows = self.affected(old, delta)
            counts = self.key_counts(rows)
            for s in self.unmatched_sides():
                if self.residual and on is None:
                    found[s] = self.candidates(s, rows, counts, first_id + (len(found) << 31))
                else:
                    parts.append(self.unmatched(s, rows, counts, fields, out, on))
        return concat(parts, out), delta, found

    def bound(self, delta: dict[str, pa.Table], old: dict[str, pa.Table]) -> None:
        """Raise ``TooManyPairs`` if this cross join's batch pairs more rows than its
        bound (ΔL × R_old + L_new × ΔR), and more than twice the rows it reads: a side of
        one row (a global aggregate's) pairs as many rows as the other side has, never
        refused."""
        n = {s: (delta[s].num_rows, old[s].num_rows) for s in "lr"}
        pairs = n["l"][0] * n["r"][1] + (n["l"][0] + n["l"][1]) * n["r"][0]
        if pairs > max(self.pairs or 0, 2 * sum(a + b for a, b in n.values())):
            raise TooManyPairs(
                f"a cross join (no equality between its inputs) would pair {pairs:,} rows in "
                f"one batch, more than {self.pairs:,}: each change of one input pairs with "
                "every row of the other, so a batch costs as much as the other input's "
                "state. Join the inputs on a key (an equality between them), or filter them "
                "to fewer rows first.")

    def unmatched_sides(self) -> str:
        """The sides whose rows may appear unmatched (or, semi, only matched)."""
        return {"left": "l", "semi": "l", "anti": "l", "right": "r", "full": "lr"}.get(
            self.kind, "")

    def out_schema(self, sides: dict[str, pa.Table], both: bool = False) -> pa.Schema:
        """The output's columns (each side's rows as ``sides`` type them, every one
        nullable: an outer join pads a side's non-nullable COUNT with NULLs; the left's
        only for semi and anti joins, unless ``both``) and ``_w``."""
        fields = [sides["l"].schema.field(n) for n in self.names["l"]]
        if both or self.kind not in ("semi", "anti"):
            fields += [sides["r"].schema.field(n) for n in self.names["r"]]
        return pa.schema([*(f.with_nullable(True) for f in fields),
                          pa.field(WEIGHT, pa.int64())])

    def row(self, s: str) -> list[str]:
        """A side's stored row: its columns, weight and keys (``Join.side_state``'s order)."""
        return [*self.names[s], f"_{s}w", *self.kcols[s]]

    def consolidated(self, s: str, rows: pa.Table) -> pa.Table:
        cols, w = [*self.names[s], *self.kcols[s]], f"_{s}w"
        grouped = rows.group_by(cols, use_threads=False).aggregate([(w, "sum")])
        grouped = grouped.rename_columns([*cols, w]).select(self.row(s))
        return grouped.filter(pc.not_equal(grouped[w], 0)).cast(rows.select(self.row(s)).schema)

    def matched(self, old: dict[str, pa.Table], delta: dict[str, pa.Table],
                schema: pa.Schema, on: Filter | None) -> pa.Table:
        """ΔL⋈R_old + L_new⋈ΔR, the residual condition applied when ``on`` is given."""
        lk, rk = list(self.kcols["l"]), list(self.kcols["r"])
        parts = [key_join(old["r"], delta["l"], rk, lk, "inner"),
                 key_join(concat([old["l"], delta["l"]], delta["l"].schema), delta["r"],
                          lk, rk, "inner")]
        names = [*self.names["l"], *self.names["r"]]
        rows = concat([p.select(names).append_column(WEIGHT, pc.multiply(p["_lw"], p["_rw"]))
                       for p in parts], schema)
        return on("on", rows) if self.residual and on is not None else rows

    def affected(self, old: dict[str, pa.Table], delta: dict[str, pa.Table]
                 ) -> dict[str, pa.Table]:
        """Per side, the distinct rows whose join key the batch touched (on either side),
        with their old and new multiplicity (``_<s>o``, ``_<s>n``) and whether the batch
        changed them (``_<s>d``)."""
        ak = [f"_ak{i}" for i in range(len(self.kcols["l"]))]
        touched = concat([delta[s].select(list(self.kcols[s])).rename_columns(ak)
                          for s in "lr"],
                         delta["l"].select(list(self.kcols["l"])).rename_columns(ak).schema)
        touched, tcols = safe_keys(touched, ak, "_t")
        touched = touched.select(tcols).group_by(tcols, use_threads=False).aggregate([])
        rows = {}
        for s in "lr":
            kc, w = list(self.kcols[s]), f"_{s}w"
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
            cols = [*self.names[s], *kc]
            aggs = [(f"_{s}o", "sum"), (w, "sum"), (f"_{s}d", "max")]
            rows[s] = both.group_by(cols, use_threads=False).aggregate(aggs).rename_columns(
                [*cols, f"_{s}o", f"_{s}n", f"_{s}d"])
        return rows

    def key_counts(self, rows: dict[str, pa.Table]) -> pa.Table:
        """Per join key the batch touched: each side's old and new row count (zero for a
        key with a NULL part: it matches nothing), keys as ``_ck<i>``."""
        ck = [f"_ck{i}" for i in range(len(self.kcols["l"]))]
        per = {}
        for s in "lr":
            kc = list(self.kcols[s])
            aggs = [(f"_{s}o", "sum"), (f"_{s}n", "sum"), (f"_{s}d", "max")]
            g = rows[s].group_by(kc, use_threads=False).aggregate(aggs)
            g = g.rename_columns([unsuffix(c, aggs) for c in g.column_names])
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
                  fields: dict[str, list[pa.Field]], out: pa.Schema,
                  on: Filter | None) -> pa.Table:
        """Changes to side ``s``'s rows that appear without a match (null-padded, anti) or
        only with one (semi), for the keys the batch touched."""
        o = "r" if s == "l" else "l"
        if not self.residual:  # matches depend on the key only
            ck = [f"_ck{i}" for i in range(len(self.kcols[s]))]
            mine, mcols = safe_keys(rows[s], list(self.kcols[s]), "_m")
            keys, kcols = safe_keys(counts, ck, "_q")
            mine = key_join(mine, keys, mcols, kcols, "inner")
            m_old, m_new = mine[f"_{o}co"], mine[f"_{o}cn"]
        else:  # count matching rows of the other side, per row
            if on is None:
                raise ValueError("an outer join's residual condition needs ``on``")
            found = self.candidates(s, rows, counts, 0)
            alone = found["_self"]
            pairs = on(f"on{s}", found.filter(pc.invert(alone)).select(
                [*self.names["l"], *self.names["r"], "_id", f"_{o}o", f"_{o}n"]))
            per = pairs.group_by(["_id"], use_threads=False).aggregate(
                [(f"_{o}o", "sum"), (f"_{o}n", "sum")]).rename_columns(["_id", "_mo", "_mn"])
            mine = key_join(found.filter(alone), per, ["_id"], ["_id"], "left outer")
            m_old, m_new = pc.fill_null(mine["_mo"], 0), pc.fill_null(mine["_mn"], 0)

        def test(m):
            return pc.greater(m, 0) if self.kind == "semi" else pc.equal(m, 0)

        zero = pa.scalar(0, pa.int64())
        weight = pc.subtract(pc.if_else(test(m_new), mine[f"_{s}n"], zero),
                             pc.if_else(test(m_old), mine[f"_{s}o"], zero))
        values = {f.name: mine[f.name] for f in fields[s]}
        if self.kind not in ("semi", "anti"):
            values.update({f.name: pa.nulls(mine.num_rows, f.type) for f in fields[o]})
        values[WEIGHT] = weight
        got = pa.table({f.name: values[f.name] for f in out}, schema=out)
        return got.filter(pc.not_equal(got[WEIGHT], 0))

    def candidates(self, s: str, rows: dict[str, pa.Table], counts: pa.Table,
                   first_id: int) -> pa.Table:
        """Side ``s``'s rows of the keys the batch touched (``affected``), numbered
        (``_id`` from ``first_id``), each alone (``_self``: the other side's columns NULL)
        and with each row of the other side of its key (what the residual condition then
        keeps): both sides' columns, ``_lo``, ``_ln``, ``_ro``, ``_rn``, ``_id``, ``_self``
        (``candidate_names``)."""
        o = "r" if s == "l" else "l"
        kc, ck = list(self.kcols[s]), [f"_ck{i}" for i in range(len(self.kcols[s]))]
        mine, mcols = safe_keys(rows[s], kc, "_m")
        keys, kcols = safe_keys(counts, ck, "_q")
        mine = key_join(mine, keys.select(kcols), mcols, kcols, "left semi").select(
            rows[s].column_names)
        mine = mine.append_column("_id", pa.array(np.arange(
            first_id, first_id + mine.num_rows, dtype=np.int64)))
        pairs = key_join(mine, rows[o], kc, list(self.kcols[o]), "inner")
        names = self.candidate_names()
        types = {**{f.name: f.type for f in rows[o].schema}, "_self": pa.bool_()}
        n, zero = mine.num_rows, pa.scalar(0, pa.int64())
        alone = {c: (mine[c] if c in mine.column_names else pa.nulls(n, types[c]))
                 for c in names}
        alone.update({f"_{o}o": pa.repeat(zero, n), f"_{o}n": pa.repeat(zero, n),
                      "_self": pa.repeat(pa.scalar(True), n)})
        pairs = pairs.append_column("_self", pa.repeat(pa.scalar(False), pairs.num_rows))
        first = pa.table([alone[c] for c in names], names=names)
        return concat([first, pairs], first.schema)

    def candidate_names(self) -> list[str]:
        """The columns of ``candidates``."""
        return [*self.names["l"], *self.names["r"], "_lo", "_ln", "_ro", "_rn", "_id",
                "_self"]


def summed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """A join side's stored rows (``schema``) with their multiplicities (``_n``) summed,
    net-zero rows dropped: its log compacted."""
    cols = [c for c in schema.names if c != COUNT]
    got = rows.group_by(cols, use_threads=False).aggregate([(COUNT, "sum")])
    got = got.rename_columns([*cols, COUNT]).select(schema.names)
    return got.filter(pc.not_equal(got[COUNT], 0)).cast(schema)


class Join:
    """A join's layout: its sides' columns and keys, their stored rows, its step
    (``JoinStep``), and the Spark SQL of a residual condition's match counts on the Spark
    path (``counted``)."""

    SIDES = {"l": "left", "r": "right"}

    def __init__(self, node: PJoin, ctx: BatchContext) -> None:
        self.node = node
        self.ctx = ctx
        nl = len(node.left.columns)
        self.names = {"l": list(node.names[:nl]), "r": list(node.names[nl:])}
        self.keys = {"l": list(node.left_keys), "r": list(node.right_keys)}

    def step(self) -> JoinStep:
        """The join's step: its columns, keys and kind."""
        return JoinStep(self.node.kind, {s: tuple(self.names[s]) for s in "lr"},
                        {s: tuple(self.kcols(s)) for s in "lr"}, bool(self.node.residual),
                        CROSS_PAIRS if self.node.cross else None)

    def kcols(self, s: str) -> list[str]:
        return [f"_{s}k{i}" for i in range(len(self.keys[s]))]

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

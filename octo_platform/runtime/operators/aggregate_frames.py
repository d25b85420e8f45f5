"""GROUP BY over types Arrow cannot group (nested types), in Spark SQL: ``aggregate``'s
formula over the same state, for the groups the batch touches (a semi-join reads their
rows from the log)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from octo_platform.columns import COUNT
from octo_platform.physical.plan import PAggregate
from octo_platform.runtime.operators.aggregate import Shape
from octo_platform.runtime.operators.aggregate import shape as aggregate_shape
from octo_platform.runtime.operators.context import BatchContext, W
from octo_platform.runtime.state_log import BATCH, latest, merge_keyed, unexpired_sql
from octo_platform.sqltext import quote, sql_expr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["AggregateFrames"]


class AggregateFrames:
    """GROUP BY with retractions as Spark operators (``aggregate``'s formula and state)."""

    def __init__(self, node: PAggregate, ctx: BatchContext) -> None:
        self.node = node
        self.ctx = ctx
        self.keys = [quote(k) for k in node.keys]

    def run(self, delta: DataFrame) -> DataFrame:
        node, ctx = self.node, self.ctx
        shape = aggregate_shape(node, ctx, delta)
        if shape.ms_schemas:
            delta = ctx.checkpoint(delta)  # read by the multisets too
        grouped = delta.groupBy(*self.keys).agg(*[sql_expr(e) for e in self.delta_exprs(shape)])
        dagg = ctx.checkpoint(grouped)
        names = list(node.keys)
        alive = f"{COUNT} != 0" if self.keys else None  # a group whose count is 0 is gone
        old = latest(ctx.spark, ctx.state_log(node.id), shape.state_schema, names,
                     wanted=dagg.select(*self.keys) if self.keys else None, alive=alive,
                     newer_than=self.ctx.cut(node))
        ctx.compact(node.id, lambda files, full: merge_keyed(
            ctx.spark, files, shape.state_schema, names, full=full,
            alive=self.kept(alive)), names)
        d = dagg
        groups = None if self.ctx.cut(node) is None else old  # a forgotten group's values
        for i in shape.ms_schemas:
            result = self.multiset(i, delta, shape.ms_schemas[i], groups)
            on = " AND ".join(f"d.{k} <=> r.{k}" for k in self.keys) or "true"
            d = (d.alias("d").join(result.alias("r"), sql_expr(on), "left")
                 .selectExpr("d.*", f"r.r{i} AS r{i}"))
        on = " AND ".join(f"o.{k} <=> d.{k}" for k in self.keys) or "true"
        joined = old.alias("o").join(d.alias("d"), sql_expr(on), "full_outer")
        table = ctx.checkpoint(joined.selectExpr(*self.merge_exprs(shape)))
        # Every group the batch touched gets its new row (count 0: a tombstone).
        new_state = table.filter("_touched").selectExpr(
            *self.keys, f"n{COUNT} AS {COUNT}",
            *[f"n{f.name} AS {f.name}" for f in shape.state_schema.fields[len(self.keys) + 1:]],
            f"CAST({ctx.batch} AS BIGINT) AS {BATCH}")
        ctx.append_log(node.id, new_state, names)
        if node.emit_on_close:
            return self.closing(table, shape)
        return self.output(table, shape)

    def kept(self, alive: str | None, expires: bool = True) -> str | None:
        """What a full compaction keeps: live groups; of a windowed aggregate only those of
        windows still open (a closed window's group is never touched again); with
        ``state_ttl`` (and ``expires``: rows of the groups' own table) only those not
        expired."""
        node, mark = self.node, self.ctx.watermark
        cut = unexpired_sql(self.ctx.cut(node) if expires else None)
        conditions = [f"({alive})"] if alive else []
        if node.closes is not None and mark is not None:
            conditions.append(f"NOT ({node.closed_sql(mark)})")
        if cut is not None:
            conditions.append(cut)
        return " AND ".join(conditions) or None

    def delta_exprs(self, shape: Shape) -> list[str]:
        """The batch per group, as the state's accumulators change: ``d_n`` and per
        aggregate ``dc<i>``/``ds<i>``/``dm<i>`` (``AggregateStep.delta_groups``)."""
        exprs = [f"sum({W}) AS d{COUNT}"]
        for f in shape.state_schema.fields[len(self.keys) + 1:]:
            i = int(f.name[1:])
            a = self.node.aggs[i]
            x = quote(a.arg) if a.arg else None
            if f.name[0] == "c":
                exprs.append(f"sum(CASE WHEN {x} IS NOT NULL THEN {W} ELSE 0 END) AS dc{i}")
            elif f.name[0] == "s":
                t = f.dataType.simpleString()
                exprs.append(f"CAST(sum(CAST({x} AS {t}) * {W}) AS {t}) AS ds{i}")
            elif a.strategy == "running":
                exprs.append(f"{a.func}({x}) AS dm{i}")
        return exprs

    def closing(self, table: DataFrame, shape: Shape) -> DataFrame:
        """EMIT ON WINDOW CLOSE: the final rows of the groups whose window this batch's
        watermark closes (touched by the batch or not), each once, as inserts."""
        node, ctx = self.node, self.ctx
        if not ctx.watermark_moved:
            return self.rows(table.limit(0), shape, "n")
        closes = node.closed_sql(ctx.watermark)
        if ctx.watermark_before is not None:
            closes += f" AND NOT ({node.closed_sql(ctx.watermark_before)})"
        accs = [f.name for f in shape.state_schema.fields[len(self.keys) + 1:]]
        cols = [*self.keys, f"n{COUNT}", *[f"n{a}" for a in accs]]
        touched = table.filter("_touched").filter(closes).selectExpr(*cols)
        on = " AND ".join(f"o.{k} <=> t.{k}" for k in self.keys)
        untouched = (latest(ctx.spark, ctx.state_log(node.id), shape.state_schema,
                            list(node.keys), alive=f"{COUNT} != 0").filter(closes).alias("o")
                     .join(table.filter("_touched").alias("t"), sql_expr(on), "left_anti")
                     .selectExpr(*[f"o.{k}" for k in self.keys], f"o.{COUNT} AS n{COUNT}",
                                 *[f"o.{a} AS n{a}" for a in accs]))
        final = touched.unionByName(untouched).filter(f"n{COUNT} > 0")
        return self.rows(final, shape, "n")

    def merge_exprs(self, shape: Shape) -> list[str]:
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

    def multiset(self, i: int, delta: DataFrame, schema: Any,
                 groups: DataFrame | None = None) -> DataFrame:
        """Update the (keys, value) -> count log of aggregate ``i``; per-group result over
        every value of the groups the batch touched. ``groups``: the live state rows of
        those groups where ``state_ttl`` forgets some (the others' values are left out)."""
        node, ctx = self.node, self.ctx
        a = node.aggs[i]
        table = node.multiset_table(i)
        x = quote(a.arg)
        dv = ctx.checkpoint(delta.filter(f"{x} IS NOT NULL")
                            .groupBy(*self.keys, sql_expr(f"{x} AS v"))
                            .agg(sql_expr(f"sum({W}) AS dcnt")))
        names = [*node.keys, "v"]
        # Every value of every group the batch touches (also groups whose Δ values are NULL).
        old = latest(ctx.spark, ctx.state_log(table), schema, names,
                     wanted=delta.select(*self.keys) if self.keys else None, alive="cnt != 0")
        stale = None
        if groups is not None:  # the values of forgotten groups: tombstoned where touched
            on = " AND ".join(f"o.{k} <=> g.{k}" for k in self.keys)
            stale = old.alias("o").join(groups.alias("g"), sql_expr(on), "left_anti")
            old = old.alias("o").join(groups.alias("g"), sql_expr(on), "left_semi")
        # (a compaction keeps a forgotten group's values: the group's rows tell which)
        ctx.compact(table, lambda files, full: merge_keyed(
            ctx.spark, files, schema, names, full=full, alive=self.kept("cnt != 0", False)),
            list(node.keys))
        on = " AND ".join(f"o.{c} <=> d.{c}" for c in [*self.keys, "v"])
        merged = ctx.checkpoint(old.alias("o").join(dv.alias("d"), sql_expr(on), "full_outer")
                                .selectExpr(*[f"coalesce(o.{c}, d.{c}) AS {c}"
                                              for c in [*self.keys, "v"]],
                                            "coalesce(o.cnt, 0) + coalesce(d.dcnt, 0) AS cnt",
                                            "d.dcnt IS NOT NULL AS _changed"))
        changed = merged.filter("_changed").selectExpr(*self.keys, "v", "cnt")
        if stale is not None:
            same = " AND ".join(f"s.{c} <=> d.{c}" for c in [*self.keys, "v"])
            changed = changed.unionByName(stale.alias("s").join(dv.alias("d"), sql_expr(same),
                                                                "left_anti")
                                          .selectExpr(*self.keys, "v", "0L AS cnt"))
        ctx.append_log(table, changed.selectExpr(
            "*", f"CAST({ctx.batch} AS BIGINT) AS {BATCH}"), list(node.keys))
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

    def casted(self, shape: Shape, side: str) -> list[str]:
        """The output columns, typed, from the ``side`` (``o``/``n``) accumulators."""
        names = [quote(c) for c in self.node.columns]
        types = [f.dataType.simpleString() for f in shape.out_schema.fields]
        return [f"CAST({v} AS {t}) AS {n}" for v, t, n in zip(self.values(side), types, names)]

    def change_flags(self) -> tuple[str, str, str]:
        """SQL over the accumulators of ``merge_exprs``: the group had a result row before
        the batch, has one after it, and the batch changed it."""
        old_v, new_v = self.values("o"), self.values("n")
        if self.keys:
            old_exists, new_exists = f"coalesce(o{COUNT} > 0, false)", f"n{COUNT} > 0"
        else:
            old_exists, new_exists = f"o{COUNT} IS NOT NULL", "true"
        same = " AND ".join(f"({a}) <=> ({b})" for a, b in zip(old_v, new_v)) or "true"
        return (old_exists, new_exists,
                f"_touched AND NOT ({old_exists} AND {new_exists} AND {same})")

    def output(self, table: DataFrame, shape: Shape) -> DataFrame:
        old_exists, new_exists, changed = self.change_flags()

        def side(name: str, exists: str, weight: int) -> str:
            return (f"CASE WHEN {exists} THEN struct({', '.join(self.casted(shape, name))}, "
                    f"CAST({weight} AS BIGINT) AS {W}) END")

        rows = table.filter(changed).selectExpr(
            f"explode(filter(array({side('o', old_exists, -1)}, "
            f"{side('n', new_exists, 1)}), x -> x IS NOT NULL)) AS r")
        return rows.selectExpr("r.*")

    def rows(self, accs: DataFrame, shape: Shape, side: str) -> DataFrame:
        """Output rows (weight 1) of the ``side`` accumulators of ``accs``' groups."""
        return accs.selectExpr(*self.casted(shape, side), f"CAST(1 AS BIGINT) AS {W}")

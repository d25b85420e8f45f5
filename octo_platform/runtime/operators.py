"""Incremental operators: each turns its input's weighted rows (Δ) into output Δ with Spark.

Stateful operators read the state rows of the buckets a batch touches (pinned to the
versions the previous batch committed), compute new state and output, and stage the new
contents of those buckets; the pipeline commits all staged writes after the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Protocol

from octo_platform.logical.plan import quote
from octo_platform.physical.plan import PAggregate, PNode, PSource, PStateless, PUnion
from octo_platform.runtime.columns import BUCKET, COUNT, WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["StateReader", "StagedWrite", "BatchContext", "evaluate"]


class StateReader(Protocol):
    def __call__(self, table: str, buckets: set[int]) -> list[str]:
        """Files holding the given buckets of a state table, as of the previous batch."""


@dataclass
class StagedWrite:
    """New contents of some buckets of a state table (or the whole table)."""

    table: str
    data: DataFrame
    buckets: list[int]


@dataclass
class BatchContext:
    spark: SparkSession
    batch: int
    buckets: int
    inputs: dict[str, DataFrame]
    state_files: StateReader
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


def evaluate(node: PNode, ctx: BatchContext) -> DataFrame:
    """The output Δ of ``node`` for this batch: its columns plus the weight column."""
    if isinstance(node, PSource):
        return ctx.inputs[node.name.lower()]
    if isinstance(node, PStateless):
        return _stateless(node, evaluate(node.input, ctx))
    if isinstance(node, PUnion):
        parts = [evaluate(c, ctx).toDF(*node.columns, WEIGHT) for c in node.children]
        return reduce(lambda a, b: a.union(b), parts)
    if isinstance(node, PAggregate):
        return _Aggregate(node, ctx).run(evaluate(node.input, ctx))
    raise TypeError(f"no runtime for {type(node).__name__}")


def _stateless(node: PStateless, df: DataFrame) -> DataFrame:
    for kind, names, exprs in node.steps:
        if kind == "filter":
            df = df.filter(exprs[0])
        else:
            df = df.selectExpr(*[f"{e} AS {quote(n)}" for n, e in zip(names, exprs)], WEIGHT)
    return df


def bucket_of(keys: list[str], buckets: int) -> Column:
    from pyspark.sql import functions as F

    if not keys:
        return F.lit(0)
    return F.pmod(F.hash(*[F.col(quote(k)) for k in keys]), F.lit(buckets))


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

    def run(self, delta: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql.types import LongType, StructField, StructType

        node, ctx = self.node, self.ctx
        types = {f.name: f.dataType for f in delta.schema.fields}
        key_fields = [StructField(k, types[k]) for k in node.keys]
        acc_fields: list[StructField] = []
        d_exprs: list[Column] = [F.sum(WEIGHT).alias(f"d{COUNT}")]
        for i, a in enumerate(node.aggs):
            x = F.col(quote(a.arg)) if a.arg else None
            w_if = F.when(x.isNotNull(), F.col(WEIGHT)).otherwise(0) if x is not None else None
            if a.strategy == "count" and x is not None:
                acc_fields.append(StructField(f"c{i}", LongType()))
                d_exprs.append(F.sum(w_if).alias(f"dc{i}"))
            elif a.strategy == "sum":
                sum_type = delta.select(F.sum(x)).schema.fields[0].dataType
                acc_fields += [StructField(f"c{i}", LongType()), StructField(f"s{i}", sum_type)]
                d_exprs += [F.sum(w_if).alias(f"dc{i}"),
                            F.sum(x.cast(sum_type) * F.col(WEIGHT)).cast(sum_type).alias(f"ds{i}")]
            elif a.strategy == "running":
                acc_fields.append(StructField(f"m{i}", types[a.arg]))
                d_exprs.append((F.min(x) if a.func == "min" else F.max(x)).alias(f"dm{i}"))
            elif a.strategy == "multiset":
                out_type = LongType() if a.func == "count" else types[a.arg]
                acc_fields.append(StructField(f"m{i}", out_type))
        state_schema = StructType([*key_fields, StructField(COUNT, LongType()), *acc_fields])
        self.out_schema = self.output_schema(delta)

        grouped = delta.groupBy(*self.keys).agg(*d_exprs)
        dagg = ctx.persist(grouped.withColumn(BUCKET, bucket_of(list(node.keys), ctx.buckets)))
        touched = {r[0] for r in dagg.select(BUCKET).distinct().collect()}
        if not touched:
            return self.empty_output(delta)
        old = ctx.read_state(node.id, state_schema, touched)
        old = old.withColumn(BUCKET, bucket_of(list(node.keys), ctx.buckets))
        multisets = {i: self.multiset(i, delta, touched) for i, a in enumerate(node.aggs)
                     if a.strategy == "multiset"}

        d = dagg.alias("d")
        for i, result in multisets.items():
            # Attach each multiset's per-group result to the Δ side before the join.
            on = [F.col(f"d.{k}").eqNullSafe(F.col(f"r{i}.{k}")) for k in self.keys]
            d = (d.join(result.alias(f"r{i}"), on or F.lit(True), "left")
                 .select("d.*", F.col(f"r{i}.r{i}").alias(f"r{i}")).alias("d"))
        o = old.alias("o")
        cond = [F.col(f"o.{k}").eqNullSafe(F.col(f"d.{k}")) for k in self.keys]
        joined = o.join(d, cond or F.lit(True), "full_outer")
        key_cols = [F.coalesce(F.col(f"o.{k}"), F.col(f"d.{k}")).alias(n)
                    for k, n in zip(self.keys, node.keys)]
        z = F.lit(0)
        new_n = F.coalesce(F.col(f"o.{COUNT}"), z) + F.coalesce(F.col(f"d.d{COUNT}"), z)
        cols = [*key_cols,
                F.coalesce(F.col(f"o.{BUCKET}"), F.col(f"d.{BUCKET}")).alias(BUCKET),
                (F.col(f"d.d{COUNT}").isNotNull() | F.lit(not self.keys)).alias("_touched"),
                F.col(f"o.{COUNT}").alias(f"o{COUNT}"), new_n.alias(f"n{COUNT}")]
        for f in acc_fields:
            name, old_c = f.name, F.col(f"o.{f.name}")
            i = int(name[1:])
            a = node.aggs[i]
            if name[0] in "cs":
                new = (F.coalesce(old_c, F.lit(0).cast(f.dataType))
                       + F.coalesce(F.col(f"d.d{name}"), F.lit(0).cast(f.dataType)))
                new = new.cast(f.dataType)
            elif a.strategy == "running":
                pick = F.least if a.func == "min" else F.greatest
                new = pick(old_c, F.col(f"d.d{name}"))
            else:  # multiset: the group's result if the batch touched it, else unchanged
                result = F.col(f"d.r{i}") if a.func != "count" else \
                    F.coalesce(F.col(f"d.r{i}"), z)
                new = F.when(F.col(f"d.d{COUNT}").isNotNull() | F.lit(not self.keys),
                             result).otherwise(old_c)
            cols += [old_c.alias(f"o{name}"), new.alias(f"n{name}")]
        table = ctx.persist(joined.select(*cols))

        keep = F.lit(True) if not self.keys else F.col(f"n{COUNT}") != 0
        new_state = table.filter(keep).select(
            *[quote(k) for k in node.keys], F.col(f"n{COUNT}").alias(COUNT),
            *[F.col(f"n{f.name}").alias(f.name) for f in acc_fields], BUCKET)
        ctx.writes.append(StagedWrite(node.id, new_state, sorted(touched)))
        return self.output(table)

    def multiset(self, i: int, delta: DataFrame, touched: set[int]) -> DataFrame:
        """Update the (keys, value) -> count table of aggregate ``i``; per-group result."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import LongType, StructField, StructType

        node, ctx = self.node, self.ctx
        a = node.aggs[i]
        table = node.multiset_table(i)
        vtype = delta.schema[a.arg].dataType
        schema = StructType([*[delta.schema[k] for k in node.keys], StructField("v", vtype),
                             StructField("cnt", LongType())])
        dv = (delta.filter(F.col(quote(a.arg)).isNotNull())
              .groupBy(*self.keys, F.col(quote(a.arg)).alias("v"))
              .agg(F.sum(WEIGHT).alias("dcnt")))
        old = ctx.read_state(table, schema, touched)
        on = [*self.keys, "v"]
        cond = [F.col(f"o.{c}").eqNullSafe(F.col(f"d.{c}")) for c in on]
        merged = old.alias("o").join(dv.alias("d"), cond, "full_outer").select(
            *[F.coalesce(F.col(f"o.{c}"), F.col(f"d.{c}")).alias(c.strip("`")) for c in on],
            (F.coalesce(F.col("o.cnt"), F.lit(0)) + F.coalesce(F.col("d.dcnt"), F.lit(0)))
            .alias("cnt"))
        merged = ctx.persist(merged.filter("cnt != 0")
                             .withColumn(BUCKET, bucket_of(list(node.keys), ctx.buckets)))
        ctx.writes.append(StagedWrite(table, merged, sorted(touched)))
        live = merged.filter("cnt > 0")
        agg = {"min": F.min("v"), "max": F.max("v"), "count": F.count("v")}[a.func]
        return live.groupBy(*self.keys).agg(agg.alias(f"r{i}"))

    def values(self, side: str) -> list[Column]:
        """Output columns (keys, then aggregates) computed from the ``o``/``n`` accumulators."""
        from pyspark.sql import functions as F

        out = [F.col(quote(k)) for k in self.node.keys]
        for i, a in enumerate(self.node.aggs):
            c = F.col(f"{side}c{i}")
            if a.strategy == "count":
                v = F.col(f"{side}{COUNT}") if a.arg is None else c
            elif a.strategy == "sum":
                s = F.col(f"{side}s{i}")
                v = F.when(c > 0, s if a.func == "sum" else s / c)
            else:
                v = F.col(f"{side}m{i}")
            out.append(v)
        return out

    def output(self, table: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        node = self.node
        names = list(node.columns)
        old_exists = F.col(f"o{COUNT}").isNotNull() & (
            F.lit(True) if not self.keys else F.col(f"o{COUNT}") > 0)
        new_exists = F.lit(True) if not self.keys else F.col(f"n{COUNT}") > 0
        old_v, new_v = self.values("o"), self.values("n")
        same = reduce(lambda x, y: x & y, [a.eqNullSafe(b) for a, b in zip(old_v, new_v)],
                      F.lit(True))
        changed = ~(old_exists & new_exists & same)
        touched = table.filter(F.col("_touched") & changed)
        types = [f.dataType for f in self.out_schema.fields[: len(names)]]
        old_rows = touched.filter(old_exists).select(
            *[v.cast(t).alias(n) for v, n, t in zip(old_v, names, types)],
            F.lit(-1).cast("bigint").alias(WEIGHT))
        new_rows = touched.filter(new_exists).select(
            *[v.cast(t).alias(n) for v, n, t in zip(new_v, names, types)],
            F.lit(1).cast("bigint").alias(WEIGHT))
        return old_rows.union(new_rows)

    def empty_output(self, delta: DataFrame) -> DataFrame:
        return self.ctx.spark.createDataFrame([], self.out_schema)

    def output_schema(self, delta: DataFrame):
        from pyspark.sql import functions as F
        from pyspark.sql.types import LongType, StructField, StructType

        # Build the output schema by analysing a zero-row aggregate (no job runs).
        aggs = []
        for a, n in zip(self.node.aggs, self.node.columns[len(self.node.keys):]):
            if a.arg is None:
                aggs.append(F.count(F.lit(1)).alias(n))
                continue
            x = F.col(quote(a.arg))
            fn = {"count": F.count, "sum": F.sum, "avg": F.avg, "min": F.min, "max": F.max}
            aggs.append((F.count_distinct(x) if a.distinct else fn[a.func](x)).alias(n))
        probe = delta.limit(0).groupBy(*self.keys).agg(*aggs) if aggs else \
            delta.limit(0).select(*self.keys)
        return StructType([*probe.schema.fields, StructField(WEIGHT, LongType())])


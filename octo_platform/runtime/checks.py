"""Spark's analysis of a project's expressions before a run's first batch.

octo binds names and checks what it maintains; what each expression means is Spark's (its
functions, types and casts). An expression Spark cannot analyse, ``date_add(ts, name)`` with
a STRING ``name``, would fail the first batch that has rows, maybe hours later, with a
message about a generated query (``line 1 pos 0``). ``check_expressions`` gives each
stateless stage over a table's sources (filters, projections, the arguments of aggregates
and the sides of joins) an empty DataFrame of the sources' declared columns, so Spark's
analyser (no job) raises the error when the run starts, and the error points at the
statement, or at the call Spark names when the query and its views hold exactly one.

Stages above a stateful operator, or over an upstream table's changelog, are left to the
first batch: their input types are the operators' (octo's kernels), not declared.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from octo_platform.columns import WEIGHT
from octo_platform.errors import SqlError
from octo_platform.physical.plan import PNode, PSource, PStateless, PUnion
from octo_platform.runtime.operators import apply_steps
from octo_platform.sqltext import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from octo_platform.project import CompiledTable, Project

__all__ = ["check_expressions"]

# A table's plan and its sources' types that passed in a session (a test suite's or a
# Dagster process's later runs skip the analysis: ~40 ms a stage here).
_PASSED: set[tuple[int, str, tuple]] = set()
_CALL = re.compile(r'^"?(\w+)\(')  # the function an expression Spark names calls


def check_expressions(spark: SparkSession, proj: Project, tables: list[CompiledTable]) -> None:
    """Raise ``SqlError`` for the first expression of ``tables`` Spark cannot analyse (a
    table that passed in this session before, with the same plan and source types, is
    not analysed again)."""
    from pyspark.errors import AnalysisException

    for t in tables:
        key = (id(spark), t.physical.fingerprint, tuple(
            (s.name, proj.source(s.name).types) for s in t.physical.sources if s.kind == "source"))
        if key in _PASSED:
            continue
        try:
            _frame(spark, proj, t.physical.root)
            _PASSED.add(key)
        except AnalysisException as e:
            params = e.getMessageParameters() or {}
            call = _CALL.match(params.get("sqlExpr", ""))
            raise SqlError(f"streaming table {t.name}: {_message(e)}",
                           proj.catalog.locate(t.name, call and call.group(1))) from None


def _frame(spark: SparkSession, proj: Project, node: PNode) -> DataFrame | None:
    """An empty DataFrame of ``node``'s output (its columns, then the weight) where its
    input types are declared ones, analysed by Spark; None above a stateful operator (whose
    inputs are checked all the same)."""
    if isinstance(node, PSource):
        return _source(spark, proj, node) if node.kind == "source" else None
    frames = [_frame(spark, proj, n) for n in node.inputs]
    if any(f is None for f in frames):
        return None
    if isinstance(node, PStateless):
        return apply_steps(frames[0], node.steps, quote(WEIGHT))
    if isinstance(node, PUnion):
        parts = [f.toDF(*node.columns, WEIGHT) for f in frames]  # type: ignore[union-attr]
        out = parts[0]
        for p in parts[1:]:
            out = out.union(p)
        return out
    return None


def _source(spark: SparkSession, proj: Project, node: PSource) -> DataFrame | None:
    source = proj.source(node.name)
    types = {c.lower(): t for c, t in zip(source.columns, source.types)}
    if any(c.lower() not in types for c in node.columns):  # not all declared: unknown
        return None
    ddl = ", ".join(f"{quote(c)} {types[c.lower()]}" for c in node.columns)
    return spark.createDataFrame([], f"{ddl}, {quote(WEIGHT)} BIGINT")


def _message(e: Any) -> str:
    """Spark's message without its plan, position in the generated query, or SQLSTATE."""
    text = str(e).split("\n", 1)[0]
    return re.split(r" SQLSTATE: | ?; line \d+ pos \d+", text, maxsplit=1)[0].rstrip(" ;")

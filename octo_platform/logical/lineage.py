"""Column lineage and output types of a logical plan (pure: no Spark, no sqlglot).

Views and CTEs are already inlined by the binder, so a plan's leaves are the scans of
sources and streaming tables. Every column reference in a plan expression is quoted with
backticks, which is how the inputs of an expression are found.

>>> column_lineage(plan)                     # doctest: +SKIP
{'name': frozenset({('persons', 'name')}), 'auction': frozenset({('auctions_cdc', 'id')})}
"""
from __future__ import annotations

import re
from typing import Callable, Mapping

from octo_platform.logical.plan import (
    Aggregate,
    Filter,
    Join,
    Node,
    Project,
    Scan,
    WINDOW_COLUMNS,
    Over,
    TopN,
    UnionAll,
    Window,
)
from octo_platform.sqltext import referenced_columns, unquote

__all__ = ["Origin", "column_lineage", "column_types"]

Origin = tuple[str, str]  # (scan name: a source or streaming table, column)

_CAST = re.compile(r"^(?:CAST|TRY_CAST)\((.*) AS ([A-Za-z][A-Za-z0-9_(), ]*)\)$", re.S)
_ROUND = re.compile(r"^(?:ROUND|BROUND)\(`((?:[^`]|``)+)`(?:, -?\d+)?\)$")
_INTEGRAL = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_FLOATING = ("FLOAT", "DOUBLE")


def column_lineage(node: Node) -> dict[str, frozenset[Origin]]:
    """For each output column of ``node``, the ``(scan, column)`` inputs its value is
    computed from.

    Only value derivation counts: a filter, a join condition or a GROUP BY key does not make
    a column depend on the columns it tests. ``COUNT(*)`` derives from no column (empty set);
    a ROW_NUMBER rank derives from its partition and order columns.
    """
    return dict(zip(node.columns, _origins(node)))


def _origins(node: Node) -> list[frozenset[Origin]]:
    if isinstance(node, Scan):
        return [frozenset({(node.name, c)}) for c in node.columns]
    if isinstance(node, Filter):
        return _origins(node.input)
    if isinstance(node, Window):
        inner = _origins(node.input)
        return inner + [inner[node.input.columns.index(node.time)]] * len(WINDOW_COLUMNS)
    if isinstance(node, Over):
        inner = _origins(node.input)
        by = dict(zip(node.input.columns, inner))
        return inner + [by[a.arg] if a.arg is not None else frozenset() for a in node.aggs]
    if isinstance(node, Project):
        inner = dict(zip(node.input.columns, _origins(node.input)))
        return [_union(inner.get(c, frozenset()) for c in referenced_columns(e))
                for e in node.exprs]
    if isinstance(node, Aggregate):
        inner = dict(zip(node.input.columns, _origins(node.input)))
        keys = [inner[k] for k in node.keys]
        aggs = [inner[a.arg] if a.arg is not None else frozenset() for a in node.aggs]
        return keys + aggs
    if isinstance(node, Join):
        both = dict(zip(node.names, _origins(node.left) + _origins(node.right)))
        return [both[c] for c in node.columns]
    if isinstance(node, TopN):
        inner = _origins(node.input)
        if node.rank is None:
            return inner
        by = dict(zip(node.input.columns, inner))
        used = [*node.partition, *(k.column for k in node.order)]
        return inner + [_union(by[c] for c in used)]
    if isinstance(node, UnionAll):
        children = [_origins(c) for c in node.children]
        return [_union(parts) for parts in zip(*children)]
    raise TypeError(f"column lineage: unknown plan node {type(node).__name__}")


def _union(parts) -> frozenset[Origin]:
    out: set[Origin] = set()
    for p in parts:
        out |= p
    return frozenset(out)


def column_types(node: Node, *,
                 table_types: Callable[[str], Mapping[str, str | None]] | None = None
                 ) -> dict[str, str | None]:
    """Spark SQL type of each output column where the plan alone determines it, else None.

    Known: source columns (declared), columns passed through, ``CAST(... AS t)``, ``ROUND``
    of a numeric column, ``COUNT`` (BIGINT), ``MIN``/``MAX`` (the argument's type), ``SUM``
    and ``AVG`` of integral or floating columns, ROW_NUMBER (INT). Scans of streaming tables
    ask ``table_types`` (by table name) for the upstream table's types.
    """
    return dict(zip(node.columns, _types(node, table_types)))


def _types(node: Node, table_types) -> list[str | None]:
    if isinstance(node, Scan):
        if node.types:
            return [t.upper() for t in node.types]
        known = dict(table_types(node.name)) if table_types is not None else {}
        return [known.get(c) for c in node.columns]
    if isinstance(node, Filter):
        return _types(node.input, table_types)
    if isinstance(node, Window):
        return _types(node.input, table_types) + ["TIMESTAMP"] * len(WINDOW_COLUMNS)
    if isinstance(node, Over):
        inner = _types(node.input, table_types)
        by = dict(zip(node.input.columns, inner))
        return inner + [_agg_type(a.func, by.get(a.arg) if a.arg is not None else None)
                        for a in node.aggs]
    if isinstance(node, Project):
        inner = dict(zip(node.input.columns, _types(node.input, table_types)))
        return [_expr_type(e, inner) for e in node.exprs]
    if isinstance(node, Aggregate):
        inner = dict(zip(node.input.columns, _types(node.input, table_types)))
        return [inner[k] for k in node.keys] + [
            _agg_type(a.func, inner.get(a.arg) if a.arg is not None else None)
            for a in node.aggs]
    if isinstance(node, Join):
        both = dict(zip(node.names, _types(node.left, table_types)
                        + _types(node.right, table_types)))
        return [both[c] for c in node.columns]
    if isinstance(node, TopN):
        inner = _types(node.input, table_types)
        return inner + (["INT"] if node.rank is not None else [])
    if isinstance(node, UnionAll):
        children = [_types(c, table_types) for c in node.children]
        return [ts[0] if len(set(ts)) == 1 else None for ts in zip(*children)]
    raise TypeError(f"column types: unknown plan node {type(node).__name__}")


def _expr_type(expr: str, inner: Mapping[str, str | None]) -> str | None:
    column = unquote(expr)
    if column is not None:
        return inner.get(column)
    if (cast := _CAST.match(expr)) is not None and _one_call(expr):
        return cast.group(2).strip().upper()
    if (rnd := _ROUND.match(expr)) is not None:
        t = inner.get(rnd.group(1).replace("``", "`"))
        return t if t in _INTEGRAL + _FLOATING else None
    return None


def _one_call(expr: str) -> bool:
    """True when ``f(...)`` is one call: its first parenthesis closes at the very end (so
    ``CAST(a AS INT) + CAST(b AS INT)`` is not taken for a cast)."""
    depth, quoted = 0, ""
    for i, ch in enumerate(expr):
        if quoted:
            quoted = "" if ch == quoted else quoted
        elif ch in "`'":
            quoted = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i == len(expr) - 1
    return False


def _agg_type(func: str, arg: str | None) -> str | None:
    if func == "count":
        return "BIGINT"
    if func in ("min", "max"):
        return arg
    if func == "sum":
        return "BIGINT" if arg in _INTEGRAL else "DOUBLE" if arg in _FLOATING else None
    if func == "avg":
        return "DOUBLE" if arg in _INTEGRAL + _FLOATING else None
    return None


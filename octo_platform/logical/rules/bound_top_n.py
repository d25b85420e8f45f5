"""Fold ``WHERE rank <= n`` into the ROW_NUMBER that produces ``rank`` (a top-N query).

The binder plans ``ROW_NUMBER() OVER (...) AS rank`` as a top-N without a bound; a filter
above it that keeps ``rank <= n`` (or ``rank < n + 1``, ``rank = 1``, mirrored) gives the
bound, so the operator keeps only ``n`` rows per partition instead of ranking every row.
"""
from __future__ import annotations

import re
from dataclasses import replace

from octo_platform.logical.plan import Filter, Node, Project, TopN, transform
from octo_platform.logical.rules.conditions import take_conditions
from octo_platform.sqltext import quote

__all__ = ["bound_top_n"]

_NAME = r"`((?:[^`]|``)+)`"
_BOUND = re.compile(rf"{_NAME} (<=|<|=) (\d+)")
_MIRRORED = re.compile(rf"(\d+) (>=|>|=) {_NAME}")


def bound_top_n(plan: Node) -> Node:
    """``plan`` with each unbounded top-N bounded by the filter above it, where one has a
    ``rank <= n`` condition (which the bound replaces)."""
    return transform(plan, _fold)


def _fold(node: Node) -> Node:
    return take_conditions(node, _fold_bound) if isinstance(node, Filter) else node


def _fold_bound(child: Node, cond: str) -> Node | None:
    bound = _rank_bound(cond)
    return _bounded(child, *bound) if bound is not None else None


def _rank_bound(cond: str) -> tuple[str, int] | None:
    """``(column, n)`` when ``cond`` keeps the rows whose ``column`` is at most ``n > 0``."""
    if (m := _BOUND.fullmatch(cond)) is not None:
        name, op, value = m.groups()
    elif (m := _MIRRORED.fullmatch(cond)) is not None:
        value, mirrored, name = m.groups()
        op = {">=": "<=", ">": "<", "=": "="}[mirrored]
    else:
        return None
    v = int(value)
    n = {"<=": v, "<": v - 1, "=": 1 if v == 1 else None}[op]
    return (name.replace("``", "`"), n) if n is not None and n > 0 else None


def _bounded(node: Node, column: str, n: int) -> Node | None:
    """``node`` with the unbounded ROW_NUMBER producing ``column`` limited to ``n`` rows,
    looking through projections that pass the rank column on unchanged."""
    if isinstance(node, TopN) and node.n is None and node.rank == column:
        return replace(node, n=n)
    if isinstance(node, Project) and quote(column) in node.exprs:
        inner = node.exprs.index(quote(column))
        if node.columns[inner] == column:
            child = _bounded(node.input, column, n)
            return None if child is None else replace(node, input=child)
    return None

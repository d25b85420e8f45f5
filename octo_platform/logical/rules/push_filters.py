"""Move filter conditions below joins, into the one input each condition reads.

A condition over the left input of an inner, left, semi or anti join (or the right input
of an inner or right join) gives the same join result when applied to that input first,
and the join then keeps less state. Conditions reading both inputs stay above the join.
"""
from __future__ import annotations

from dataclasses import replace

from octo_platform.logical.plan import Filter, Join, Node, transform
from octo_platform.logical.rules.conditions import take_conditions
from octo_platform.sqltext import referenced_columns, rename_columns

__all__ = ["push_filters"]


def push_filters(plan: Node) -> Node:
    """``plan`` with each filter's conditions moved as far down into joins as they go."""
    return transform(plan, _push_filter)


def _push_filter(node: Node) -> Node:
    if not isinstance(node, Filter) or not isinstance(node.input, Join):
        return node
    return take_conditions(node, _into)


def _into(node: Node, cond: str) -> Node | None:
    """``node`` with ``cond`` (over its columns) applied below a join, on the one input
    it reads, where that keeps the join's result the same; None when it cannot move."""
    if not isinstance(node, Join):
        return None
    refs = referenced_columns(cond)
    if not refs:
        return None
    at = [node.names.index(r) for r in refs]
    nl = len(node.left.columns)
    sides = (("left", node.left, 0, node.kind in ("inner", "left", "semi", "anti")),
             ("right", node.right, nl, node.kind in ("inner", "right")))
    for side, child, offset, allowed in sides:
        if not (allowed and all(offset <= i < offset + len(child.columns) for i in at)):
            continue
        moved = rename_columns(cond, {node.names[i]: child.columns[i - offset] for i in at})
        inner = _into(child, moved) or Filter(child.columns, input=child, conditions=(moved,))
        return replace(node, **{side: inner})
    return None

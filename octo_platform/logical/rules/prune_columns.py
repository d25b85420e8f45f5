"""Drop the columns nothing above reads before they reach a join, so join state keeps
only what the query uses."""
from __future__ import annotations

from dataclasses import replace

from octo_platform.logical.plan import (
    Aggregate,
    Filter,
    Join,
    Node,
    Project,
    WINDOW_COLUMNS,
    TopN,
    UnionAll,
    Window,
    generates,
    project,
)
from octo_platform.sqltext import quote, referenced_columns

__all__ = ["prune_columns"]


def prune_columns(plan: Node) -> Node:
    """``plan`` computing only the columns its output needs (its own columns stay)."""
    return _prune(plan, set(plan.columns))


def _prune(node: Node, needed: set[str]) -> Node:
    """``node`` keeping at least ``needed`` (a subset of its columns)."""
    if isinstance(node, Project):
        # a generator's column stays: it decides how many rows each input row makes
        keep = [(c, e) for c, e in zip(node.columns, node.exprs) if c in needed or generates(e)]
        child = _prune(node.input, referenced_columns(*(e for _, e in keep)))
        return replace(node, columns=tuple(c for c, _ in keep), exprs=tuple(e for _, e in keep),
                       input=child)
    if isinstance(node, Filter):
        child = _prune(node.input, needed | referenced_columns(*node.conditions))
        return replace(node, columns=child.columns, input=child)
    if isinstance(node, Window):  # every row counts (a hop repeats it): keep its windows
        child = _prune(node.input, (needed - set(WINDOW_COLUMNS)) | {node.time}
                       | set(node.partition or ()))
        return replace(node, input=child, columns=child.columns + WINDOW_COLUMNS)
    if isinstance(node, Aggregate):
        args = {a.arg for a in node.aggs if a.arg is not None}
        return replace(node, input=_prune(node.input, set(node.keys) | args))
    if isinstance(node, Join):
        needed = needed | referenced_columns(*node.left_keys, *node.right_keys, node.residual)
        nl = len(node.left.columns)
        sides = []
        for child, names in ((node.left, node.names[:nl]), (node.right, node.names[nl:])):
            want = [c for c, n in zip(child.columns, names) if n in needed]
            if not want:  # keep one column: a side must have a row shape
                want = [child.columns[0]]
            pruned = project(_prune(child, set(want)), tuple(want), tuple(quote(c) for c in want))
            sides.append((pruned, tuple(n for c, n in zip(child.columns, names) if c in want)))
        (left, lnames), (right, rnames) = sides
        columns = lnames + (rnames if node.kind not in ("semi", "anti") else ())
        return replace(node, left=left, right=right, names=lnames + rnames, columns=columns)
    if isinstance(node, TopN):  # ties are broken by every column: keep them all
        return replace(node, input=_prune(node.input, set(node.input.columns)))
    if isinstance(node, UnionAll):  # positional: children keep their columns
        return replace(node, children=tuple(_prune(c, set(c.columns)) for c in node.children))
    return node

"""The logical optimizer: named rewrite rules applied in order, each ``plan -> plan``.

``bound_top_n`` first (a top-N needs its bound before anything moves the filter holding
it), then ``push_filters`` (conditions into join inputs, also below outer joins onto
their cross-joined inputs), ``join_conditions`` (equalities between cross-joined inputs
become join keys) and ``prune_columns`` (which sees the pushed conditions' columns).
"""
from __future__ import annotations

from typing import Callable

from octo_platform.logical.plan import Node
from octo_platform.logical.rules import (
    bound_top_n,
    join_conditions,
    prune_columns,
    push_filters,
)

__all__ = ["Rule", "RULES", "optimize"]

Rule = Callable[[Node], Node]

RULES: tuple[Rule, ...] = (bound_top_n, push_filters, join_conditions, prune_columns)


def optimize(plan: Node, rules: tuple[Rule, ...] = RULES) -> Node:
    """``plan`` rewritten by each of ``rules`` in turn; a node a rule made is marked as
    written where the node above it is (``Node.at``)."""
    for rule in rules:
        plan = rule(plan)
    todo = [(plan, "")]
    while todo:
        node, above = todo.pop()
        if not node.at and above:
            object.__setattr__(node, "at", above)  # an annotation, as the binder's
        todo.extend((child, node.at) for child in node.inputs)
    return plan

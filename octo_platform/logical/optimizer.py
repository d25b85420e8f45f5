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
    """``plan`` rewritten by each of ``rules`` in turn."""
    for rule in rules:
        plan = rule(plan)
    return plan

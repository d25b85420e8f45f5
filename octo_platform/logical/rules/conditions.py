"""What the filter rules share: taking a filter's conditions, one by one, into its input."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from octo_platform.logical.plan import Filter, Node

__all__ = ["take_conditions"]


def take_conditions(node: Filter, take: Callable[[Node, str], Node | None]) -> Node:
    """``node`` after ``take(input, condition)`` took each condition it can into the
    input (returning the new input, or None): the filter keeps the rest, or goes."""
    child, kept = node.input, []
    for cond in node.conditions:
        taken = take(child, cond)
        if taken is None:
            kept.append(cond)
        else:
            child = taken
    if child is node.input:
        return node
    return replace(node, input=child, conditions=tuple(kept)) if kept else child

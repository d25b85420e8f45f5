"""What the filter rules share: taking a filter's conditions, one by one, into its input,
and reading a condition that is an equality."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable

from octo_platform.logical.plan import Filter, Node

__all__ = ["take_conditions", "equality_sides"]

# Spark SQL text, token by token: a quoted name, a string, a parenthesis, a word, a
# comparison operator (longest first), or any other character.
_TOKEN = re.compile(r"`(?:[^`]|``)+`|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|(?P<paren>[()])"
                    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<op><=>|<=|>=|<>|!=|==|=|<|>)|.",
                    re.S)


def equality_sides(sql: str) -> tuple[str, str] | None:
    """``(a, b)`` when ``sql`` is ``a = b``: one ``=`` outside parentheses and ``CASE``, and
    no other comparison or word (``AND``, ``NOT``, ``IS``, ...) beside it."""
    depth, at = 0, None
    for m in _TOKEN.finditer(sql):
        paren, word, op = m.group("paren"), (m.group("word") or "").upper(), m.group("op")
        if paren == "(" or word == "CASE":
            depth += 1
        elif paren == ")" or word == "END":
            depth -= 1
        elif depth == 0 and word and sql[m.end():].lstrip().startswith("("):
            continue  # a function's name
        elif depth == 0 and (word or op):
            if op not in ("=", "==") or at is not None:
                return None
            at = m
    if at is None:
        return None
    left, right = sql[:at.start()].strip(), sql[at.end():].strip()
    return (left, right) if left and right else None


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

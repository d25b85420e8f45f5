"""Spark SQL text: the vocabulary every stage shares (ground floor: imports no octo stage).

Plans carry expressions as Spark SQL text over their input's column names, each column
quoted with backticks, so the runtime hands them to Spark unchanged. This module writes and
reads that text: ``quote`` a name, find the ``referenced_columns`` of an expression (string
literals ignored), AND conditions together, and turn text into a Spark ``Column``.

>>> sorted(referenced_columns("concat(`name`, '`qty`') > `a``b`"))
['a`b', 'name']
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["DIALECT", "quote", "string", "unquote", "referenced_columns", "rename_columns", "and_",
           "sql_expr"]

DIALECT = "spark"  # sqlglot's name for the SQL we parse and generate

# One token of Spark SQL text that matters here: a quoted name, a string literal, a
# parenthesis, or a word. Everything else (operators, numbers, blanks) is skipped.
_TOKEN = re.compile(
    r"`(?P<name>(?:[^`]|``)+)`"
    r"|(?P<string>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
    r"|(?P<paren>[()])"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)",
    re.S,
)


def quote(name: str) -> str:
    """A Spark SQL identifier: ``quote("a`b") == "`a``b`"``."""
    return "`" + name.replace("`", "``") + "`"


def string(value: str) -> str:
    """A Spark SQL string literal (backslash escapes): ``string("it's") == r"'it\'s'"``."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def unquote(sql: str) -> str | None:
    """The column a bare reference (``"`a``b`"``) names, or None for any other expression."""
    m = _TOKEN.fullmatch(sql)
    return m.group("name").replace("``", "`") if m is not None and m.group("name") else None


def referenced_columns(*sql: str | None) -> set[str]:
    """Columns the expressions read: every quoted name outside a string literal."""
    return {m.group("name").replace("``", "`") for text in sql if text
            for m in _TOKEN.finditer(text) if m.group("name")}


def rename_columns(sql: str, rename: dict[str, str]) -> str:
    """``sql`` with each quoted column reference ``c`` replaced by ``rename[c]``."""

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        return m.group(0) if not name else quote(rename[name.replace("``", "`")])

    return _TOKEN.sub(sub, sql)


def and_(conditions: Sequence[str]) -> str:
    """The conjunction of conditions, a disjunction put in parentheses (as sqlglot's
    ``exp.and_`` writes it, so a plan's text does not depend on how it was built)."""
    if len(conditions) == 1:
        return conditions[0]
    return " AND ".join(f"({c})" if _top_level_or(c) else c for c in conditions)


def _top_level_or(sql: str) -> bool:
    """True when ``sql`` is an OR (or XOR) of conditions: the word outside any
    parentheses, ``CASE ... END``, quoted name or string."""
    depth = 0
    for m in _TOKEN.finditer(sql):
        paren, word = m.group("paren"), (m.group("word") or "").upper()
        if paren == "(" or word == "CASE":
            depth += 1
        elif paren == ")" or word == "END":
            depth -= 1
        elif depth == 0 and word in ("OR", "XOR"):
            return True
    return False


def sql_expr(sql: str) -> Column:
    """A Spark ``Column`` from Spark SQL text (pyspark is imported on first use)."""
    from pyspark.sql import functions as F

    return F.expr(sql)

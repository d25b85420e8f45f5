"""Logical plan: changelog operators with derived changelog mode and primary key.

Pure data (no Spark, no sqlglot). Expressions are Spark SQL text over the input's column
names, quoted with backticks, so the runtime hands them to Spark unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from octo_platform.sqltext import quote

__all__ = [
    "Mode",
    "Node",
    "Scan",
    "Filter",
    "Project",
    "AggCall",
    "Aggregate",
    "UnionAll",
    "Join",
    "TopN",
    "SortKey",
    "JoinKind",
    "explain",
]

Mode = Literal["append-only", "updating"]
JoinKind = Literal["inner", "left", "right", "full", "semi", "anti"]
AGG_FUNCS = ("count", "sum", "avg", "min", "max")


@dataclass(frozen=True)
class Node:
    """Base of logical nodes: output ``columns``, ``mode`` and ``pk`` (None = bag)."""

    columns: tuple[str, ...]
    mode: Mode
    pk: tuple[str, ...] | None

    @property
    def inputs(self) -> tuple[Node, ...]:
        return ()

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Scan(Node):
    """Read a source (``kind='source'``) or another streaming table's changelog."""

    name: str = ""
    kind: Literal["source", "table"] = "source"
    types: tuple[str, ...] = ()

    def describe(self) -> str:
        types = self.types or ("",) * len(self.columns)
        cols = ", ".join(f"{c} {t}".strip() for c, t in zip(self.columns, types))
        return f"Scan {self.kind} {self.name} [{cols}]"


@dataclass(frozen=True)
class Filter(Node):
    input: Node = field(default=None)  # type: ignore[assignment]
    condition: str = ""

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)

    def describe(self) -> str:
        return f"Filter {self.condition}"


@dataclass(frozen=True)
class Project(Node):
    input: Node = field(default=None)  # type: ignore[assignment]
    exprs: tuple[str, ...] = ()

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)

    def describe(self) -> str:
        items = ", ".join(
            e if e == quote(c) else f"{e} AS {quote(c)}" for c, e in zip(self.columns, self.exprs)
        )
        return f"Project {items}"


@dataclass(frozen=True)
class AggCall:
    """``func([DISTINCT] arg)``; ``arg`` is an input column name, None for COUNT(*)."""

    func: str
    arg: str | None
    distinct: bool = False

    def render(self) -> str:
        if self.arg is None:
            return f"{self.func.upper()}(*)"
        inner = ("DISTINCT " if self.distinct else "") + quote(self.arg)
        return f"{self.func.upper()}({inner})"


@dataclass(frozen=True)
class Aggregate(Node):
    """GROUP BY ``keys`` (input columns) computing ``aggs``; output = keys then aggs.

    With no keys it is a global aggregate (exactly one output row, even over empty input);
    with no aggs it is DISTINCT.
    """

    input: Node = field(default=None)  # type: ignore[assignment]
    keys: tuple[str, ...] = ()
    aggs: tuple[AggCall, ...] = ()

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)

    def describe(self) -> str:
        keys = ", ".join(quote(k) for k in self.keys) or "()"
        aggs = ", ".join(
            f"{a.render()} AS {quote(c)}"
            for a, c in zip(self.aggs, self.columns[len(self.keys) :])
        )
        return f"Aggregate keys=[{keys}] aggs=[{aggs}]"


@dataclass(frozen=True)
class UnionAll(Node):
    children: tuple[Node, ...] = ()

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.children

    def describe(self) -> str:
        return f"UnionAll ({len(self.children)} inputs)"


@dataclass(frozen=True)
class Join(Node):
    """An equi-join (plus an optional residual condition) of two inputs.

    ``names`` renames the left then the right input's columns (positionally) so both sides
    are addressable in one namespace; ``left_keys``/``right_keys`` (pairwise equal) and
    ``residual`` are Spark SQL over those names. Output: ``names`` for inner/outer joins,
    the left names only for semi/anti joins (``IN``/``EXISTS``/``NOT EXISTS``).
    """

    left: Node = field(default=None)  # type: ignore[assignment]
    right: Node = field(default=None)  # type: ignore[assignment]
    kind: JoinKind = "inner"
    names: tuple[str, ...] = ()
    left_keys: tuple[str, ...] = ()
    right_keys: tuple[str, ...] = ()
    residual: str | None = None

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    def condition(self) -> str:
        keys = [f"{a} = {b}" for a, b in zip(self.left_keys, self.right_keys)]
        return " AND ".join(keys + ([f"({self.residual})"] if self.residual else []))

    def describe(self) -> str:
        return f"Join {self.kind} on {self.condition()}"


@dataclass(frozen=True)
class SortKey:
    """One ORDER BY item: an input column, direction and null placement."""

    column: str
    desc: bool = False
    nulls_first: bool = True

    def render(self) -> str:
        return (f"{quote(self.column)} {'DESC' if self.desc else 'ASC'} "
                f"NULLS {'FIRST' if self.nulls_first else 'LAST'}")


@dataclass(frozen=True)
class TopN(Node):
    """The first ``n`` rows per ``partition`` by ``order`` (ties broken by the other
    columns); ``rank`` names an output ROW_NUMBER column, appended after the input's.

    ``n`` None is a ROW_NUMBER without a bound yet: the binder folds the enclosing
    ``WHERE rank <= n`` into it and rejects it when there is none.
    """

    input: Node = field(default=None)  # type: ignore[assignment]
    partition: tuple[str, ...] = ()
    order: tuple[SortKey, ...] = ()
    n: int | None = None
    rank: str | None = None

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)

    def describe(self) -> str:
        part = ", ".join(quote(p) for p in self.partition) or "()"
        order = ", ".join(k.render() for k in self.order)
        rank = f" rank={quote(self.rank)}" if self.rank else ""
        return f"TopN n={self.n} partition=[{part}] order=[{order}]{rank}"


def explain(node: Node) -> str:
    """Deterministic indented text of a plan, one node per line, with mode and key."""
    lines: list[str] = []

    def visit(n: Node, depth: int) -> None:
        pk = "bag" if n.pk is None else "(" + ", ".join(n.pk) + ")"
        lines.append(f"{'  ' * depth}{n.describe()}  mode={n.mode} pk={pk}")
        for child in n.inputs:
            visit(child, depth + 1)

    visit(node, 0)
    return "\n".join(lines)

"""Logical plan: changelog operators with derived changelog mode and primary key.

Pure data (no Spark, no sqlglot). Expressions are Spark SQL text over the input's column
names, quoted with backticks, so the runtime hands them to Spark unchanged. A node's
changelog mode and primary key are not stored but derived from its inputs, in one place:
``changelog_mode`` and ``primary_key`` (only a scan declares them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, Literal

from octo_platform.sqltext import and_, quote
from octo_platform.timeunits import span_text

__all__ = [
    "Mode",
    "Node",
    "Unary",
    "Scan",
    "Filter",
    "Project",
    "AggCall",
    "Aggregate",
    "UnionAll",
    "Join",
    "TopN",
    "Window",
    "Over",
    "WINDOW_COLUMNS",
    "SortKey",
    "JoinKind",
    "CROSS_KEY",
    "changelog_mode",
    "primary_key",
    "project",
    "generates",
    "transform",
    "explain",
]

Mode = Literal["append-only", "updating"]
JoinKind = Literal["inner", "left", "right", "full", "semi", "anti"]
AGG_FUNCS = ("count", "sum", "avg", "min", "max")
# The join key of a cross join, on both sides: every row matches every row of the other
# side, so a change of one side joins the other side's whole state.
CROSS_KEY = "0"


@dataclass(frozen=True)
class Node:
    """Base of logical nodes: output ``columns``; ``mode`` and ``pk`` (None = bag) follow
    from the inputs."""

    columns: tuple[str, ...]
    # where the SQL that made it is written (``file:line:col``: its SELECT), for errors;
    # not part of the plan's meaning (nor of its fingerprint)
    at: str = field(default="", compare=False, kw_only=True)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return ()

    @property
    def mode(self) -> Mode:
        return changelog_mode(self)

    @property
    def pk(self) -> tuple[str, ...] | None:
        return primary_key(self)

    def with_inputs(self, inputs: tuple[Node, ...]) -> Node:
        """This node reading ``inputs`` instead (same arity, same columns)."""
        return self

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Unary(Node):
    """A node of one ``input``."""

    input: Node = field(default=None)  # type: ignore[assignment]

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)

    def with_inputs(self, inputs: tuple[Node, ...]) -> Node:
        return replace(self, input=inputs[0])


@dataclass(frozen=True)
class Scan(Node):
    """Read a source (``kind='source'``) or another streaming table's changelog, whose
    ``changelog`` mode and primary ``key`` the catalog declares."""

    name: str = ""
    kind: Literal["source", "table"] = "source"
    types: tuple[str, ...] = ()
    changelog: Mode = "append-only"
    key: tuple[str, ...] | None = None
    # A streaming table's column whose values stay above its watermark (its window_end):
    # a table that reads it inherits the watermark through that column.
    event_time: str | None = None

    def describe(self) -> str:
        types = self.types or ("",) * len(self.columns)
        cols = ", ".join(f"{c} {t}".strip() for c, t in zip(self.columns, types))
        return f"Scan {self.kind} {self.name} [{cols}]"


@dataclass(frozen=True)
class Filter(Unary):
    """Keep the rows for which every one of ``conditions`` (AND-ed) holds."""

    conditions: tuple[str, ...] = ()

    @property
    def condition(self) -> str:
        return and_(self.conditions)

    def describe(self) -> str:
        return f"Filter {self.condition}"


@dataclass(frozen=True)
class Project(Unary):
    """``exprs`` of each input row, named ``columns``. A generator among them (``explode``)
    makes several rows of one: such a projection keeps no key."""

    exprs: tuple[str, ...] = ()

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
class Aggregate(Unary):
    """GROUP BY ``keys`` (input columns) computing ``aggs``; output = keys then aggs.

    With no keys it is a global aggregate (exactly one output row, even over empty input).
    ``distinct`` marks a ``SELECT DISTINCT`` / ``UNION`` (keys = every input column, no aggs).
    ``emit_on_close``: grouped by a window, it emits each group once, when the watermark
    closes its window (append-only output).
    """

    keys: tuple[str, ...] = ()
    aggs: tuple[AggCall, ...] = ()
    distinct: bool = False
    emit_on_close: bool = False  # EMIT ON WINDOW CLOSE: each window's result once, final
    ttl_us: int | None = None  # state_ttl: a group's state is forgotten this long after

    def describe(self) -> str:
        keys = ", ".join(quote(k) for k in self.keys) or "()"
        aggs = ", ".join(
            f"{a.render()} AS {quote(c)}"
            for a, c in zip(self.aggs, self.columns[len(self.keys) :])
        )
        emit = " emit=on window close" if self.emit_on_close else ""
        ttl = f" state_ttl={span_text(self.ttl_us)}" if self.ttl_us else ""
        return f"Aggregate keys=[{keys}] aggs=[{aggs}]{emit}{ttl}"


@dataclass(frozen=True)
class UnionAll(Node):
    children: tuple[Node, ...] = ()

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.children

    def with_inputs(self, inputs: tuple[Node, ...]) -> Node:
        return replace(self, children=inputs)

    def describe(self) -> str:
        return f"UnionAll ({len(self.children)} inputs)"


@dataclass(frozen=True)
class Join(Node):
    """An equi-join (plus an optional residual condition) of two inputs.

    ``names`` renames the left then the right input's columns (positionally) so both sides
    are addressable in one namespace; ``left_keys``/``right_keys`` (pairwise equal) and
    ``residual`` are Spark SQL over those names. Output: ``names`` for inner/outer joins,
    the left names only for semi/anti joins (``IN``/``EXISTS``/``NOT EXISTS``).
    A cross join (no equality between the sides) has the constant key ``CROSS_KEY``.
    """

    left: Node = field(default=None)  # type: ignore[assignment]
    right: Node = field(default=None)  # type: ignore[assignment]
    kind: JoinKind = "inner"
    names: tuple[str, ...] = ()
    left_keys: tuple[str, ...] = ()
    right_keys: tuple[str, ...] = ()
    residual: str | None = None
    ttl_us: int | None = None  # state_ttl: a side's row is forgotten this long after

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    def with_inputs(self, inputs: tuple[Node, ...]) -> Node:
        return replace(self, left=inputs[0], right=inputs[1])

    @property
    def cross(self) -> bool:
        """A cross join: each change of one side joins all rows of the other."""
        return self.left_keys == (CROSS_KEY,) and self.right_keys == (CROSS_KEY,)

    def condition(self) -> str:
        keys = [f"{a} = {b}" for a, b in zip(self.left_keys, self.right_keys)]
        return " AND ".join(keys + ([f"({self.residual})"] if self.residual else []))

    def describe(self) -> str:
        ttl = f" state_ttl={span_text(self.ttl_us)}" if self.ttl_us else ""
        cross = (" (cross join: a change of one side joins all rows of the other)"
                 if self.cross else "")
        return f"Join {self.kind} on {self.condition()}{ttl}{cross}"


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
class TopN(Unary):
    """The first ``n`` rows per ``partition`` by ``order`` (ties broken by the other
    columns); ``rank`` names an output ROW_NUMBER column, appended after the input's.

    ``n`` None is a ROW_NUMBER without a bound yet: the ``bound_top_n`` rule folds the
    enclosing ``WHERE rank <= n`` into it and the binder rejects it when there is none.
    """

    partition: tuple[str, ...] = ()
    order: tuple[SortKey, ...] = ()
    n: int | None = None
    rank: str | None = None

    def describe(self) -> str:
        part = ", ".join(quote(p) for p in self.partition) or "()"
        order = ", ".join(k.render() for k in self.order)
        rank = f" rank={quote(self.rank)}" if self.rank else ""
        return f"TopN n={self.n} partition=[{part}] order=[{order}]{rank}"


WINDOW_COLUMNS = ("window_start", "window_end")


@dataclass(frozen=True)
class Window(Unary):
    """``TUMBLE`` / ``HOP``: each input row once per window of ``size_us`` microseconds
    (one starting every ``slide_us``, aligned to the epoch; a tumble's slide is its size)
    that contains its ``time``, half-open ``[start, end)``. ``SESSION``: each row in its
    session among the rows of its ``partition``: rows less than the gap (``size_us``) apart
    share one, ``[first time, last time + gap)``. Output: the input's columns, then
    ``window_start`` and ``window_end``. A row whose time is NULL is in no window."""

    kind: Literal["tumble", "hop", "session"] = "tumble"
    time: str = ""
    size_us: int = 0  # a session's: its gap
    slide_us: int = 0
    # A session's partition: the other GROUP BY columns over it (None: not bound yet).
    partition: tuple[str, ...] | None = None

    def describe(self) -> str:
        if self.kind == "session":
            part = ", ".join(quote(p) for p in self.partition or ())
            return (f"Window SESSION({quote(self.time)}, gap {span_text(self.size_us)}) "
                    f"partition=[{part}]")
        if self.kind == "tumble":
            return f"Window TUMBLE({quote(self.time)}, size {span_text(self.size_us)})"
        return (f"Window HOP({quote(self.time)}, slide {span_text(self.slide_us)}, "
                f"size {span_text(self.size_us)})")


@dataclass(frozen=True)
class Over(Unary):
    """Aggregates over a sliding time range (``SUM(x) OVER (PARTITION BY p ORDER BY t RANGE
    BETWEEN INTERVAL ... PRECEDING AND CURRENT ROW)``): per input row, each of ``aggs``
    over the rows of its ``partition`` whose ``time`` is within ``range_us`` before its own
    (inclusive, peers included). Output: the input's columns, then one per aggregate."""

    partition: tuple[str, ...] = ()
    time: str = ""
    range_us: int = 0
    aggs: tuple[AggCall, ...] = ()

    def describe(self) -> str:
        part = ", ".join(quote(p) for p in self.partition) or "()"
        aggs = ", ".join(f"{a.render()} AS {quote(c)}" for a, c in
                         zip(self.aggs, self.columns[len(self.input.columns):]))
        return (f"Over [{aggs}] partition=[{part}] order={quote(self.time)} range "
                f"{span_text(self.range_us)} preceding to current row")


def changelog_mode(node: Node) -> Mode:
    """``updating`` when ``node`` may retract a row it emitted, else ``append-only``.

    A scan declares it; filters and projections keep their input's; DISTINCT over
    append-only input and inner or semi joins of append-only inputs stay append-only (a row
    once emitted stays); any other aggregate, an outer or anti join, a top-N and a session
    window (sessions merge) retract.
    """
    if isinstance(node, Scan):
        return node.changelog
    if isinstance(node, Window) and node.kind == "session":
        return "updating"  # a row can move to a merged session
    if isinstance(node, (Filter, Project, Window)):
        return node.input.mode
    if isinstance(node, UnionAll):
        return "updating" if any(c.mode == "updating" for c in node.children) else "append-only"
    appends = all(i.mode == "append-only" for i in node.inputs)
    if isinstance(node, Aggregate):
        return "append-only" if node.distinct and appends or node.emit_on_close \
            else "updating"
    if isinstance(node, Join):
        return "append-only" if node.kind in ("inner", "semi") and appends else "updating"
    if isinstance(node, (TopN, Over)):  # a row out of order changes its successors'
        return "updating"
    raise TypeError(f"changelog mode: unknown plan node {type(node).__name__}")


def primary_key(node: Node) -> tuple[str, ...] | None:
    """The columns that identify an output row of ``node``, or None (a bag).

    A scan declares it; an aggregate's is its group keys; a top-N's its partition and
    rank (or its input's, without a rank column); a projection carries its input's key
    through bare column references, a tumble or session keeps it, a hop adds its window's
    start; a join's is both inputs' keys (the left's for a semi or
    anti join); a union's rows have no key.
    """
    if isinstance(node, Scan):
        return node.key
    if isinstance(node, (Filter, Over)):
        return node.input.pk
    if isinstance(node, Window):  # a hop puts a row in several windows
        key = node.input.pk
        return key if key is None or node.kind != "hop" else (*key, WINDOW_COLUMNS[0])
    if isinstance(node, Aggregate):
        return node.keys
    if isinstance(node, TopN):
        return (*node.partition, node.rank) if node.rank is not None else node.input.pk
    if isinstance(node, UnionAll):
        return None
    if isinstance(node, Project):
        if any(generates(e) for e in node.exprs):
            return None  # a row repeated
        return _carried(node.input.pk, node.input.columns, node.columns, node.exprs)
    if isinstance(node, Join):
        nl = len(node.left.columns)
        left = _carried(node.left.pk, node.left.columns, node.names[:nl],
                        tuple(quote(c) for c in node.left.columns))
        if node.kind in ("semi", "anti"):
            return left
        right = _carried(node.right.pk, node.right.columns, node.names[nl:],
                         tuple(quote(c) for c in node.right.columns))
        return None if left is None or right is None else left + right
    raise TypeError(f"primary key: unknown plan node {type(node).__name__}")


def _carried(pk: tuple[str, ...] | None, inputs: tuple[str, ...], names: tuple[str, ...],
             exprs: tuple[str, ...]) -> tuple[str, ...] | None:
    """``pk`` (of ``inputs``) under the output ``names`` of ``exprs``: each key column must
    be passed on as a bare reference (the first one names it)."""
    if pk is None:
        return None
    mapping: dict[str, str] = {}
    for name, e in zip(names, exprs):
        for c in inputs:
            if e == quote(c) and c not in mapping:
                mapping[c] = name
    return tuple(mapping[k] for k in pk) if all(k in mapping for k in pk) else None


_QUOTED = re.compile(r"`(?:[^`]|``)+`|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)
_GENERATOR = re.compile(r"\b(?:pos)?explode(?:_outer)?\s*\(|\binline(?:_outer)?\s*\(|"
                        r"\bstack\s*\(", re.I)


def generates(sql: str) -> bool:
    """Whether the expression ``sql`` calls a generator (``explode``, ``inline``, ``stack``),
    which makes rows of one."""
    return _GENERATOR.search(_QUOTED.sub("", sql)) is not None


def project(node: Node, names: tuple[str, ...], exprs: tuple[str, ...]) -> Node:
    """``exprs`` of ``node`` named ``names``; ``node`` itself when that passes every column
    through unchanged."""
    if names == node.columns and exprs == tuple(quote(c) for c in node.columns):
        return node
    return Project(names, input=node, exprs=exprs)


def transform(node: Node, rule: Callable[[Node], Node]) -> Node:
    """``node`` rebuilt bottom-up: ``rule`` applied to each node after its inputs."""
    inputs = tuple(transform(c, rule) for c in node.inputs)
    if any(a is not b for a, b in zip(inputs, node.inputs)):
        node = node.with_inputs(inputs)
    return rule(node)


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

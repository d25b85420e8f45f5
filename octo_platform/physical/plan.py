"""Physical plan: the operators the runtime executes, with stable ids and their state.

``lower`` fuses chains of filters and projections into one stateless stage, picks an
algorithm per aggregate (running MIN/MAX over append-only input, a value multiset over
updating input) and names every state table. Pure data, deterministic ``explain``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Literal

from octo_platform.logical import plan as lp
from octo_platform.logical.plan import Mode
from octo_platform.logical.windows import closing_key, final_when_closed
from octo_platform.sqltext import quote
from octo_platform.timeunits import span_text

__all__ = [
    "PNode",
    "PSource",
    "PStateless",
    "PAgg",
    "PAggregate",
    "PUnion",
    "PJoin",
    "PTopN",
    "PSession",
    "POver",
    "PhysicalPlan",
    "lower",
    "explain",
]


@dataclass(frozen=True)
class PNode:
    id: str
    columns: tuple[str, ...]
    mode: Mode
    at: str = field(default="", compare=False, kw_only=True)  # its SQL: ``lp.Node.at``

    @property
    def inputs(self) -> tuple[PNode, ...]:
        return ()

    def describe(self) -> str:
        raise NotImplementedError

    def located(self) -> str:
        """``describe()`` and where its SQL is written: what an error in it names."""
        return self.describe() + (f" (SQL at {self.at})" if self.at else "")

    def state_tables(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class PSource(PNode):
    """The batch's rows of one source or upstream streaming table, as weighted rows."""

    name: str = ""
    kind: Literal["source", "table"] = "source"

    def describe(self) -> str:
        how = "ReadChangelog table" if self.kind == "table" else "ReadSource"
        return f"{how} {self.name} -> [{', '.join(self.columns)}]"


Step = tuple[str, tuple[str, ...], tuple[str, ...]]  # ("filter"|"project", names, exprs)


@dataclass(frozen=True)
class PStateless(PNode):
    """Filters and projections applied in order to each weighted row; weights pass through."""

    input: PNode = field(default=None)  # type: ignore[assignment]
    steps: tuple[Step, ...] = ()

    @property
    def inputs(self) -> tuple[PNode, ...]:
        return (self.input,)

    def describe(self) -> str:
        parts = []
        for kind, names, exprs in self.steps:
            if kind == "filter":
                parts.append(f"filter({exprs[0]})")
            else:
                cols = ", ".join(e if e == quote(n) else f"{e} AS {quote(n)}"
                                 for n, e in zip(names, exprs))
                parts.append(f"project({cols})")
        return "Stateless " + " -> ".join(parts)


@dataclass(frozen=True)
class PAgg:
    """One aggregate and how it is maintained.

    ``strategy``: ``count`` (row count), ``sum`` (sum and non-null count; AVG divides),
    ``running`` (MIN/MAX over append-only input), ``multiset`` (a (group, value) -> count
    state table: MIN/MAX over updating input and COUNT(DISTINCT)).
    """

    func: str
    arg: str | None
    distinct: bool
    strategy: Literal["count", "sum", "running", "multiset"]
    name: str

    def render(self) -> str:
        return lp.AggCall(self.func, self.arg, self.distinct).render()


@dataclass(frozen=True)
class PAggregate(PNode):
    """Group by ``keys`` with accumulators in a keyed change log (``runtime/state_log``)."""

    input: PNode = field(default=None)  # type: ignore[assignment]
    keys: tuple[str, ...] = ()
    aggs: tuple[PAgg, ...] = ()
    # (key, µs): a group is final once the watermark reaches ``key + µs`` (its window's
    # end); its state is then dropped. Only where nothing retracts from a closed window
    # (``final_when_closed``: append-only input, or sessions over it).
    closes: tuple[str, int] | None = None
    emit_on_close: bool = False  # emit each group once, final, when its window closes
    ttl_us: int | None = None  # state_ttl: a group's state is forgotten this long after

    @property
    def inputs(self) -> tuple[PNode, ...]:
        return (self.input,)

    @property
    def is_global(self) -> bool:
        return not self.keys

    def closed_sql(self, watermark: int) -> str:
        """SQL: the group's window is closed at ``watermark`` (µs since the epoch)."""
        assert self.closes is not None
        key, offset = self.closes
        return f"unix_micros({quote(key)}) + {offset} <= {watermark}"

    def multiset_table(self, i: int) -> str:
        return f"{self.id}_values{i}"

    def state_tables(self) -> tuple[str, ...]:
        ms = [self.multiset_table(i) for i, a in enumerate(self.aggs) if a.strategy == "multiset"]
        return (self.id, *ms)

    def describe(self) -> str:
        keys = ", ".join(quote(k) for k in self.keys) or "() global"
        aggs = ", ".join(f"{a.render()}:{a.strategy}" for a in self.aggs) or "none (distinct)"
        closes = "" if self.closes is None else (
            f" closes when watermark >= {quote(self.closes[0])} + "
            f"{span_text(self.closes[1]) if self.closes[1] else '0'} (state dropped)")
        emit = " emit=on window close" if self.emit_on_close else ""
        ttl = "" if self.ttl_us is None else (
            f" state_ttl={span_text(self.ttl_us)} (a group's state is forgotten once the "
            "watermark passes its last change plus the TTL; its result row stays)")
        return (f"HashAggregate keys=[{keys}] aggs=[{aggs}] input={self.input.mode} "
                f"state=[{', '.join(self.state_tables())}] as keyed change logs"
                f"{closes}{emit}{ttl}")


@dataclass(frozen=True)
class PUnion(PNode):
    children: tuple[PNode, ...] = ()

    @property
    def inputs(self) -> tuple[PNode, ...]:
        return self.children

    def describe(self) -> str:
        return f"UnionAll ({len(self.children)} inputs)"


@dataclass(frozen=True)
class PJoin(PNode):
    """Delta-rule join: each side's rows with multiplicity in a log (``runtime/state_log``);
    outer/semi/anti joins count matches per row."""

    left: PNode = field(default=None)  # type: ignore[assignment]
    right: PNode = field(default=None)  # type: ignore[assignment]
    kind: lp.JoinKind = "inner"
    names: tuple[str, ...] = ()
    left_keys: tuple[str, ...] = ()
    right_keys: tuple[str, ...] = ()
    residual: str | None = None
    ttl_us: int | None = None  # state_ttl: a side's row is forgotten this long after

    @property
    def inputs(self) -> tuple[PNode, ...]:
        return (self.left, self.right)

    @property
    def cross(self) -> bool:
        """A cross join (``logical.plan.Join.cross``): every row matches every row of the
        other side."""
        return self.left_keys == (lp.CROSS_KEY,) and self.right_keys == (lp.CROSS_KEY,)

    def side_table(self, side: str) -> str:
        return f"{self.id}_{side}"

    def state_tables(self) -> tuple[str, ...]:
        return (self.side_table("left"), self.side_table("right"))

    def describe(self) -> str:
        keys = ", ".join(f"{a} = {b}" for a, b in zip(self.left_keys, self.right_keys))
        residual = f" residual=({self.residual})" if self.residual else ""
        ttl = "" if self.ttl_us is None else (
            f" state_ttl={span_text(self.ttl_us)} (a row is forgotten once the watermark "
            "passes the batch that stored it plus the TTL; later rows no longer match it)")
        return (f"{self.kind.capitalize()}Join strategy=delta-rule keys=[{keys}]{residual} "
                f"inputs={self.left.mode}/{self.right.mode} "
                f"state=[{', '.join(self.state_tables())}] as logs of weighted rows{ttl}")


@dataclass(frozen=True)
class PPartitioned(PNode):
    """An operator that recomputes the partitions a batch touches: its state is its
    input's rows with multiplicity, bucketed by hash of the ``partition`` key
    (``runtime/operators/context.PartitionRows``)."""

    input: PNode = field(default=None)  # type: ignore[assignment]
    partition: tuple[str, ...] = ()

    @property
    def inputs(self) -> tuple[PNode, ...]:
        return (self.input,)

    @property
    def closes(self) -> bool:
        """Append-only input: rows that no later row can reach leave the state."""
        return self.input.mode == "append-only"

    def state_tables(self) -> tuple[str, ...]:
        return (self.id,)

    def partition_text(self) -> str:
        return ", ".join(quote(p) for p in self.partition) or "() global"

    def state_text(self, kept: str) -> str:
        return f"state=[{self.id}: {kept if self.closes else 'all rows'} by hash(partition)]"


@dataclass(frozen=True)
class PSession(PPartitioned):
    """SESSION windows: the partitions a batch touches get their sessions again, and the
    rows whose session changed move (a retraction from the old session, an insert into
    the new). Over append-only input the rows of closed sessions leave the state."""

    time: str = ""
    gap_us: int = 0

    def describe(self) -> str:
        return (f"SessionWindow time={quote(self.time)} gap {span_text(self.gap_us)} "
                f"partition=[{self.partition_text()}] {self.state_text('rows of open sessions')}")


@dataclass(frozen=True)
class POver(PPartitioned):
    """Sliding-range aggregates: for the partitions a batch touches, the rows from the
    earliest changed time on get their aggregates again, and those whose values changed
    are retracted and inserted. Over append-only input, rows older than the watermark
    minus the range leave the state."""

    time: str = ""
    range_us: int = 0
    aggs: tuple[lp.AggCall, ...] = ()

    def describe(self) -> str:
        aggs = ", ".join(a.render() for a in self.aggs)
        return (f"OverRange [{aggs}] partition=[{self.partition_text()}] order="
                f"{quote(self.time)} range {span_text(self.range_us)} "
                f"{self.state_text('rows within the range of the watermark')}")


@dataclass(frozen=True)
class PTopN(PPartitioned):
    """Top-N per partition: touched partitions re-ranked. Over append-only input only the
    current top ``n`` per partition stay in the state (the rest can never re-enter)."""

    order: tuple[lp.SortKey, ...] = ()
    n: int = 1
    rank: str | None = None

    def describe(self) -> str:
        order = ", ".join(k.render() for k in self.order)
        rank = f" rank={quote(self.rank)}" if self.rank else ""
        return (f"TopN n={self.n} partition=[{self.partition_text()}] order=[{order}]{rank} "
                f"{self.state_text('top-n rows')}")


@dataclass(frozen=True)
class PhysicalPlan:
    """A streaming table's operators plus what its changelog sink needs."""

    table: str
    root: PNode
    pk: tuple[str, ...] | None
    keyed_changes: bool = False  # each key changes at most once per batch (aggregate output)

    @property
    def sources(self) -> tuple[PSource, ...]:
        found: dict[str, PSource] = {}
        for node in _walk(self.root):
            if isinstance(node, PSource):
                found.setdefault(node.name.lower(), node)
        return tuple(found[k] for k in sorted(found))

    @property
    def operators(self) -> tuple[PNode, ...]:
        return tuple(_walk(self.root))

    @property
    def state_tables(self) -> tuple[str, ...]:
        return tuple(t for n in _walk(self.root) for t in n.state_tables())

    @property
    def state_ttl(self) -> int | None:
        """The TTL of the plan's GROUP BY and join state (``state_ttl``), if any."""
        return next((n.ttl_us for n in _walk(self.root)
                     if isinstance(n, (PAggregate, PJoin)) and n.ttl_us), None)

    @property
    def restarts_keys(self) -> bool:
        """A GROUP BY forgets groups (``state_ttl``): a forgotten key's next row is an
        insert the sink turns into an update of the row the table holds."""
        return any(isinstance(n, PAggregate) and n.ttl_us for n in _walk(self.root))

    @property
    def closes_windows(self) -> bool:
        """An aggregate closes windows: a batch needs its new watermark before it runs."""
        return any(isinstance(n, PAggregate) and n.closes or isinstance(n, (PSession, POver))
                   and n.closes for n in _walk(self.root))

    @property
    def fingerprint(self) -> str:
        """Changes whenever the plan (and so the meaning of its state) changes."""
        return hashlib.sha256(explain(self).encode()).hexdigest()[:16]


def _walk(node: PNode):
    for child in node.inputs:
        yield from _walk(child)
    yield node


def lower(table: str, root: lp.Node, pk: tuple[str, ...] | None) -> PhysicalPlan:
    """Turn a logical plan into operators with stable ids (post-order numbering)."""
    counter = {"n": 0}

    def next_id(kind: str) -> str:
        counter["n"] += 1
        return f"{kind}{counter['n']}"

    def go(node: lp.Node) -> PNode:
        op = operator(node)
        return replace(op, at=node.at) if node.at and not op.at else op

    def operator(node: lp.Node) -> PNode:
        if isinstance(node, lp.Scan):
            return PSource(next_id("source"), node.columns, node.mode, name=node.name,
                           kind=node.kind)
        if isinstance(node, lp.Window) and node.kind == "session":
            child = go(node.input)
            return PSession(next_id("session"), node.columns, node.mode, input=child,
                            time=node.time, gap_us=node.size_us,
                            partition=node.partition or ())
        if _stateless(node):
            steps: list[Step] = []
            cur: lp.Node = node
            while _stateless(cur):
                if isinstance(cur, lp.Filter):
                    steps.append(("filter", cur.columns, (cur.condition,)))
                elif isinstance(cur, lp.Window):
                    steps.extend(reversed(_window_steps(cur)))
                else:
                    steps.append(("project", cur.columns, cur.exprs))
                cur = cur.input
            child = go(cur)
            return PStateless(next_id("map"), node.columns, node.mode, input=child,
                              steps=tuple(reversed(steps)))
        if isinstance(node, lp.Aggregate):
            child = go(node.input)
            aggs = tuple(
                PAgg(a.func, a.arg, a.distinct, _strategy(a, child.mode), name)
                for a, name in zip(node.aggs, node.columns[len(node.keys):])
            )
            closing = closing_key(node)
            if closing is not None and not final_when_closed(node, closing):
                closing = None
            return PAggregate(next_id("agg"), node.columns, node.mode, input=child,
                              keys=node.keys, aggs=aggs,
                              closes=None if closing is None else (closing.key,
                                                                   closing.offset_us),
                              emit_on_close=node.emit_on_close, ttl_us=node.ttl_us)
        if isinstance(node, lp.UnionAll):
            kids = tuple(go(c) for c in node.children)
            return PUnion(next_id("union"), node.columns, node.mode, children=kids)
        if isinstance(node, lp.Join):
            left, right = go(node.left), go(node.right)
            return PJoin(next_id("join"), node.columns, node.mode, left=left, right=right,
                         kind=node.kind, names=node.names, left_keys=node.left_keys,
                         right_keys=node.right_keys, residual=node.residual,
                         ttl_us=node.ttl_us)
        if isinstance(node, lp.Over):
            child = go(node.input)
            return POver(next_id("over"), node.columns, node.mode, input=child,
                         partition=node.partition, time=node.time, range_us=node.range_us,
                         aggs=node.aggs)
        if isinstance(node, lp.TopN):
            child = go(node.input)
            assert node.n is not None, "the binder bounds every top-N"
            return PTopN(next_id("topn"), node.columns, node.mode, input=child,
                         partition=node.partition, order=node.order, n=node.n, rank=node.rank)
        raise TypeError(f"cannot lower {type(node).__name__}")

    physical = go(root)
    return PhysicalPlan(table, physical, pk, _keyed_changes(root, pk))


def _stateless(node: lp.Node) -> bool:
    return isinstance(node, (lp.Filter, lp.Project)) or (
        isinstance(node, lp.Window) and node.kind != "session")


def _window_steps(w: lp.Window) -> list[Step]:
    """A tumble or hop as stateless steps: each row's windows (microseconds since the
    epoch: starts aligned to the slide, those whose ``[start, start + size)`` holds the
    row's time), one output row per window."""
    cols = w.input.columns
    passed = tuple(quote(c) for c in cols)
    t = f"unix_micros({quote(w.time)})"
    size, slide = w.size_us, w.slide_us
    if w.kind == "tumble":
        start = f"{t} - pmod({t}, {size})"
        return [("filter", cols, (f"{quote(w.time)} IS NOT NULL",)),
                ("project", w.columns, (*passed, f"timestamp_micros({start})",
                                        f"timestamp_micros({start} + {size})"))]
    count = -(-size // slide)  # windows that may hold a time
    starts = (f"filter(transform(sequence(0, {count - 1}), _wi -> {t} - pmod({t}, {slide}) "
              f"- _wi * {slide}), _ws -> _ws + {size} > {t})")
    return [("project", (*cols, "_window"), (*passed, f"explode({starts})")),
            ("project", w.columns, (*passed, "timestamp_micros(`_window`)",
                                   f"timestamp_micros(`_window` + {size})"))]


def _keyed_changes(root: lp.Node, pk: tuple[str, ...] | None) -> bool:
    """True when the output key is an aggregate's group key carried through filters and
    projections: then a batch retracts and inserts at most one row per key."""
    if pk is None or pk != root.pk:
        return False
    node = root
    while isinstance(node, (lp.Filter, lp.Project)):
        node = node.input
    return isinstance(node, lp.Aggregate)


def _strategy(a: lp.AggCall, input_mode: Mode) -> Literal["count", "sum", "running", "multiset"]:
    if a.func == "count" and not a.distinct:
        return "count"
    if a.func in ("sum", "avg"):
        return "sum"
    if a.func in ("min", "max") and input_mode == "append-only":
        return "running"
    return "multiset"


def explain(plan: PhysicalPlan) -> str:
    pk = "none (bag: no u events)" if plan.pk is None else "(" + ", ".join(plan.pk) + ")"
    how = "pairs-by-key" if plan.keyed_changes else "consolidate-per-batch"
    lines = [f"ChangelogSink {plan.table} pk={pk} encode={how}"]

    def visit(n: PNode, depth: int) -> None:
        lines.append(f"{'  ' * depth}{n.id}: {n.describe()}  mode={n.mode}")
        for child in n.inputs:
            visit(child, depth + 1)

    visit(plan.root, 1)
    return "\n".join(lines)

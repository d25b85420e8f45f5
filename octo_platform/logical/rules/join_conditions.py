"""Turn equalities between the inputs of cross joins into join keys (comma joins).

``FROM a, b, c WHERE a.x = b.x AND b.y = c.y`` binds as cross joins under a filter. A
tree of inner joins that holds a cross join (with the filters between and above its
joins) is one *region*: its inputs (leaves, in FROM order) and its conditions. The rule
rebuilds the region as a tree of equi-joins: the inputs connected by equalities form
groups; each group is joined in FROM order, each time with the first input that an
equality connects to what is joined so far (all such equalities are that join's keys);
the groups are then cross-joined, left to right. A condition over one input is a filter
on it; one over several becomes the residual of the lowest join that holds them all; one
over none stays a filter above. Only a join with no equality between its sides stays a
cross join. Regions without a cross join (explicit ``JOIN ... ON``) are left as written.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from octo_platform.logical.plan import CROSS_KEY, Filter, Join, Node, project
from octo_platform.logical.rules.conditions import equality_sides
from octo_platform.sqltext import and_, quote, referenced_columns, rename_columns

__all__ = ["join_conditions"]


def join_conditions(plan: Node) -> Node:
    """``plan`` with each region of inner joins holding a cross join rebuilt as equi-joins
    keyed by the equalities between its inputs."""
    return _rewrite(plan)


def _rewrite(node: Node) -> Node:
    if _in_region(node) and _has_cross(node):
        region = _Region()
        region.add(node, node.columns)
        return region.rebuild(node.columns, _rewrite)
    inputs = tuple(_rewrite(c) for c in node.inputs)
    if any(a is not b for a, b in zip(inputs, node.inputs)):
        node = node.with_inputs(inputs)
    return node


def _in_region(node: Node) -> bool:
    """An inner join, or a filter over one (through filters)."""
    while isinstance(node, Filter):
        node = node.input
    return isinstance(node, Join) and node.kind == "inner"


def _has_cross(node: Node) -> bool:
    if isinstance(node, Filter):
        return _has_cross(node.input)
    if isinstance(node, Join) and node.kind == "inner":
        return node.cross or any(_in_region(c) and _has_cross(c) for c in node.inputs)
    return False


Part = tuple[Node, tuple[str, ...], frozenset[int]]  # a tree, its names, its leaves


@dataclass
class _Region:
    leaves: list[tuple[Node, tuple[str, ...]]] = field(default_factory=list)  # node, names
    conditions: list[str] = field(default_factory=list)  # over the region's names

    def add(self, node: Node, names: tuple[str, ...]) -> None:
        """Take ``node`` (its columns named ``names`` in the region) apart."""
        if isinstance(node, Filter):
            rename = dict(zip(node.columns, names))
            self.conditions += [rename_columns(c, rename) for c in node.conditions]
            self.add(node.input, names)
        elif _in_region(node):
            assert isinstance(node, Join)
            own = dict(zip(node.names, names))
            nl = len(node.left.columns)
            self.add(node.left, names[:nl])
            self.add(node.right, names[nl:])
            if not node.cross:
                self.conditions += [f"{rename_columns(a, own)} = {rename_columns(b, own)}"
                                    for a, b in zip(node.left_keys, node.right_keys)]
            if node.residual:
                self.conditions.append(rename_columns(node.residual, own))
        else:
            self.leaves.append((node, names))

    def at(self, sql: str) -> frozenset[int]:
        """The leaves ``sql`` reads."""
        refs = referenced_columns(sql)
        return frozenset(i for i, (_, names) in enumerate(self.leaves) if refs & set(names))

    def rebuild(self, columns: tuple[str, ...], inner: Callable[[Node], Node]) -> Node:
        """The region as equi-joins (``inner`` rewrites each input first), its output
        ``columns`` in their order."""
        above: list[str] = []
        below: dict[int, list[str]] = {}
        pending: list[tuple[str, frozenset[int]]] = []
        for cond in dict.fromkeys(self.conditions):  # each once, in order
            at = self.at(cond)
            if not at:
                above.append(cond)
            elif len(at) == 1:
                below.setdefault(min(at), []).append(cond)
            else:
                pending.append((cond, at))
        parts: list[Part] = []
        for i, (leaf, names) in enumerate(self.leaves):
            node = inner(leaf)
            if i in below:
                back = dict(zip(names, node.columns))
                node = Filter(node.columns, input=node,
                              conditions=tuple(rename_columns(c, back) for c in below[i]))
            parts.append((node, names, frozenset({i})))
        trees = []
        for group in self.groups(pending):
            todo = [parts[i] for i in group]
            tree = todo.pop(0)
            while todo:
                found = next(((p, k) for p in todo if (k := self.keys(pending, tree, p))),
                             None)
                part, keys = found if found is not None else (todo[0], [])
                todo.remove(part)
                tree = _join(tree, part, keys, pending)
            trees.append(tree)
        root = trees[0]
        for tree in trees[1:]:
            root = _join(root, tree, [], pending)
        node = project(root[0], columns, tuple(quote(c) for c in columns))
        return Filter(node.columns, input=node, conditions=tuple(above)) if above else node

    def groups(self, pending: list[tuple[str, frozenset[int]]]) -> list[list[int]]:
        """The leaves connected by equalities, each group in FROM order, ordered by its
        first leaf."""
        group = list(range(len(self.leaves)))

        def find(i: int) -> int:
            while group[i] != i:
                i = group[i]
            return i

        for cond, at in pending:
            if self.sides(cond) is not None:
                first = min(at)
                for i in at:
                    group[find(i)] = find(first)
        out: dict[int, list[int]] = {}
        for i in range(len(self.leaves)):
            out.setdefault(find(i), []).append(i)
        return sorted(out.values())

    def sides(self, cond: str) -> tuple[str, frozenset[int], str, frozenset[int]] | None:
        """An equality's two sides and the leaves each reads, when they read disjoint,
        non-empty sets of leaves."""
        eq = equality_sides(cond)
        if eq is None:
            return None
        a, b = eq
        la, lb = self.at(a), self.at(b)
        return (a, la, b, lb) if la and lb and not la & lb else None

    def keys(self, pending: list[tuple[str, frozenset[int]]], left: Part, right: Part
             ) -> list[tuple[str, str, str]]:
        """``(condition, left key, right key)`` of each pending equality between the
        two parts."""
        out = []
        for cond, _ in pending:
            if (s := self.sides(cond)) is None:
                continue
            a, la, b, lb = s
            if la <= left[2] and lb <= right[2]:
                out.append((cond, a, b))
            elif lb <= left[2] and la <= right[2]:
                out.append((cond, b, a))
        return out


def _join(left: Part, right: Part, keys: list[tuple[str, str, str]],
          pending: list[tuple[str, frozenset[int]]]) -> Part:
    """``left`` joined with ``right`` on ``keys`` (a cross join without), the pending
    conditions they now cover as its residual."""
    covered = left[2] | right[2]
    used = {k[0] for k in keys}
    residual = [c for c, at in pending if at <= covered and c not in used]
    pending[:] = [(c, at) for c, at in pending if not at <= covered]
    names = left[1] + right[1]
    node = Join(names, left=left[0], right=right[0], kind="inner", names=names,
                left_keys=tuple(k[1] for k in keys) or (CROSS_KEY,),
                right_keys=tuple(k[2] for k in keys) or (CROSS_KEY,),
                residual=and_(residual) if residual else None)
    return node, names, covered

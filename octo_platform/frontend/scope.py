"""Name resolution: which plan column a column reference of a query names.

A scope is what a SELECT reads from (a plan node) and the relations (tables, aliases,
subqueries, join sides) its columns can be named by.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from octo_platform.errors import PlanError
from octo_platform.frontend.parser import SqlFile
from octo_platform.logical.plan import Node
from octo_platform.sqltext import DIALECT

__all__ = ["Rel", "Scope"]


@dataclass
class Rel:
    """One relation visible in a scope: its names and, per column as written, the column
    of the scope's node that holds it."""

    aliases: set[str]
    columns: list[tuple[str, str]]
    hidden: bool = False  # a scalar subquery's: not in SELECT *
    # columns of a JOIN ... USING, lower case: named without a qualifier (and in an
    # unqualified SELECT *) only as the join's merged column, another relation of the scope
    merged: frozenset[str] = frozenset()

    def find(self, name: str) -> str | None:
        name = name.lower()
        for written, col in self.columns:
            if written.lower() == name:
                return col
        for _, col in self.columns:  # internal names (expanded stars, qualified join columns)
            if col.lower() == name:
                return col
        return None


@dataclass
class Scope:
    """What a SELECT reads from: a plan node and the relations its columns can be named by.

    ``outer`` is the enclosing query's scope (for correlated EXISTS subqueries); ``joined``
    marks a scope whose node columns are already qualified join columns.
    """

    node: Node
    rels: list[Rel]
    outer: Scope | None = None
    joined: bool = False

    @classmethod
    def of(cls, node: Node, aliases: set[str]) -> Scope:
        return cls(node, [Rel(aliases, [(c, c) for c in node.columns])])

    def with_node(self, node: Node) -> Scope:
        return Scope(node, self.rels, self.outer, self.joined)

    def has_column(self, name: str) -> bool:
        return any(r.find(name) is not None for r in self.rels)

    def lookup(self, col: exp.Column, file: SqlFile) -> str | None:
        """The node column ``col`` names in this scope (not the outer one), or None."""
        table = col.table.lower()
        rels = [r for r in self.rels if table in r.aliases or not table
                and col.name.lower() not in r.merged]
        hits = {c for r in rels if (c := r.find(col.name)) is not None}
        if len(hits) > 1:
            raise PlanError(f"column {col.sql(DIALECT)!r} is ambiguous: qualify it with its "
                            "table or alias", file.location_of(col))
        return hits.pop() if hits else None

    def resolve(self, col: exp.Column, file: SqlFile) -> str:
        found = self.lookup(col, file)
        if found is not None:
            return found
        if self.outer is not None:
            return self.outer.resolve(col, file)
        table = col.table
        if table and not any(table.lower() in r.aliases for r in self.rels):
            raise PlanError(f"unknown table or alias {table!r} in column {col.sql(DIALECT)!r}",
                            file.location_of(col))
        available = ", ".join(w for r in self.rels for w, _ in r.columns)
        raise PlanError(f"unknown column {col.name!r} (available: {available})",
                        file.location_of(col))

    def qualified(self, label: str) -> tuple[tuple[str, ...], list[Rel]]:
        """Column names unique across a join (``label.column``) and relations naming them."""
        if self.joined:
            return self.node.columns, self.rels
        rename = {c: f"{label}.{c}" for c in self.node.columns}
        rels = [Rel(r.aliases, [(w, rename[c]) for w, c in r.columns], r.hidden, r.merged)
                for r in self.rels]
        return tuple(rename[c] for c in self.node.columns), rels

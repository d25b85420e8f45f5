"""Bind parsed statements into a catalog and build each streaming table's logical plan.

The entry point of binding (``build_catalog``); its jobs live beside it: ``options``
checks the ``WITH`` options, ``queries`` binds a query into a plan (resolving names with
``scope``, rejecting what ``shapes`` cannot maintain), the logical optimizer rewrites the
plan, and the result is a ``definitions.TableDef``.
"""
from __future__ import annotations

from octo_platform.errors import CatalogError, SqlError
from octo_platform.frontend.definitions import SinkDef, SourceDef, TableDef
from octo_platform.frontend.options import sink_def, source_def, table_options
from octo_platform.frontend.parser import SinkStmt, SourceStmt, Statement, TableStmt, ViewStmt
from octo_platform.frontend.queries import QueryBinder
from octo_platform.frontend.shapes import check_bounded
from octo_platform.logical.optimizer import RULES, Rule, optimize

__all__ = ["Catalog", "build_catalog"]


class Catalog:
    """Every source, view and streaming table of a project, bound lazily and memoized;
    each table's plan rewritten by the optimizer's ``rules``."""

    def __init__(self, statements: list[Statement], rules: tuple[Rule, ...] = RULES) -> None:
        self.rules = rules
        self.sources: dict[str, SourceDef] = {}
        self.views: dict[str, ViewStmt] = {}
        self._sink_stmts: dict[str, SinkStmt] = {}
        self._sinks: list[SinkDef] | None = None
        self._table_stmts: dict[str, TableStmt] = {}
        self._tables: dict[str, TableDef] = {}
        self._binding: list[str] = []
        seen: dict[str, Statement] = {}
        for stmt in statements:
            key = stmt.name.lower()
            if key in seen:
                other = seen[key]
                raise SqlError(
                    f"{stmt.name!r} is already defined at "
                    f"{other.file.location(other.offset).render().splitlines()[0]}",
                    stmt.file.location(stmt.offset),
                )
            seen[key] = stmt
            if isinstance(stmt, SourceStmt):
                self.sources[key] = source_def(stmt)
            elif isinstance(stmt, ViewStmt):
                self.views[key] = stmt
            elif isinstance(stmt, SinkStmt):
                self._sink_stmts[key] = stmt
            else:
                self._table_stmts[key] = stmt

    @property
    def table_names(self) -> list[str]:
        return [s.name for s in self._table_stmts.values()]

    def table(self, name: str) -> TableDef:
        key = name.lower()
        if key in self._tables:
            return self._tables[key]
        if key not in self._table_stmts:
            known = ", ".join(sorted(self.table_names)) or "none"
            raise CatalogError(f"unknown streaming table {name!r} (known: {known})")
        if key in self._binding:
            cycle = " -> ".join([*self._binding, key])
            stmt = self._table_stmts[key]
            raise SqlError(f"streaming tables read each other in a cycle: {cycle}",
                           stmt.file.location(stmt.offset))
        self._binding.append(key)
        try:
            self._tables[key] = _bind_table(self, self._table_stmts[key])
        finally:
            self._binding.pop()
        return self._tables[key]

    def tables(self) -> list[TableDef]:
        return [self.table(n) for n in self.table_names]

    def sinks(self) -> list[SinkDef]:
        """Every ``CREATE SINK``, its table checked to be a streaming table (bound once)."""
        if self._sinks is None:
            self._sinks = self._bind_sinks()
        return self._sinks

    def _bind_sinks(self) -> list[SinkDef]:
        out = []
        for stmt in self._sink_stmts.values():
            sink = sink_def(stmt)
            if stmt.table.lower() not in self._table_stmts:
                what = ("a source" if stmt.table.lower() in self.sources else "a view"
                        if stmt.table.lower() in self.views else "not defined")
                known = ", ".join(sorted(self.table_names)) or "none"
                raise SqlError(f"sink {stmt.name!r}: {stmt.table!r} is {what}; a sink "
                               f"publishes a streaming table (known: {known})",
                               stmt.file.location(stmt.table_offset))
            out.append(SinkDef(sink.name, self.table(stmt.table).name, sink.options,
                               sink.file))
        return out

    def relation(self, name: str) -> SourceDef | TableDef | ViewStmt | None:
        """The source, streaming table (bound now if need be) or view called ``name``."""
        key = name.lower()
        if key in self._table_stmts:
            return self.table(name)
        return self.sources.get(key) or self.views.get(key)

    def names(self) -> list[str]:
        return [*self.sources, *self.views, *self._table_stmts, *self._sink_stmts]


def build_catalog(statements: list[Statement], *, rules: tuple[Rule, ...] = RULES) -> Catalog:
    """Bind all statements; raises on the first error so nothing runs with a broken project."""
    catalog = Catalog(statements, rules)
    catalog.tables()
    catalog.sinks()
    return catalog


def _bind_table(catalog: Catalog, stmt: TableStmt) -> TableDef:
    binder = QueryBinder(catalog, stmt.file)
    plan = optimize(binder.query(stmt.query, {}), catalog.rules)
    check_bounded(plan, stmt)
    pk, partitioning = table_options(stmt, plan.columns)
    return TableDef(stmt.name, plan, dict(stmt.options), stmt.sql, stmt.file.path,
                    pk if pk is not None else plan.pk, tuple(sorted(binder.deps)),
                    partitioning)

"""Bind parsed statements into a catalog and build each streaming table's logical plan.

The entry point of binding (``build_catalog``); its jobs live beside it: ``options``
checks the ``WITH`` options, ``queries`` binds a query into a plan (resolving names with
``scope``, rejecting what ``shapes`` cannot maintain), the logical optimizer rewrites the
plan, and the result is a ``definitions.TableDef``.
"""
from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from octo_platform.errors import CatalogError, Location, SqlError
from octo_platform.frontend.definitions import SinkDef, SourceDef, TableDef
from octo_platform.frontend.options import sink_def, source_def, table_options
from octo_platform.frontend.parser import SinkStmt, SourceStmt, Statement, TableStmt, ViewStmt
from octo_platform.frontend.queries import QueryBinder
from octo_platform.frontend.shapes import check_bounded, check_sessions
from octo_platform.logical.lineage import column_lineage
from octo_platform.logical.optimizer import RULES, Rule, optimize
from octo_platform.logical.plan import (
    WINDOW_COLUMNS,
    Aggregate,
    Filter,
    Join,
    Node,
    Project,
    Scan,
    Window,
    transform,
)
from octo_platform.sqltext import DIALECT
from octo_platform.timeunits import parse_span
from octo_platform.logical.windows import closing_key, final_when_closed, window_bound

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

    def function_calls(self) -> list[tuple[str, Location]]:
        """Each call, in a view or a streaming table's query, of a function sqlglot does not
        know (Spark may: ``Project.check_functions``), and where it is written; not the
        window functions in FROM (``TUMBLE``, ``HOP``, ``SESSION``), which octo binds."""
        return [(call.name, stmt.file.location_of(call))
                for stmt in [*self.views.values(), *self._table_stmts.values()]
                for call in stmt.query.find_all(exp.Anonymous)
                if not isinstance(call.parent, exp.Table)]

    def locate(self, table: str, function: str | None = None) -> Location:
        """Where streaming table ``table`` is written; or the call of ``function`` in its
        query and the views it reads, if there is exactly one (an error Spark raised about
        an expression points there)."""
        stmt = self._table_stmts[table.lower()]
        if function:
            calls = [(s.file, call) for s in [stmt, *self._views_read(stmt.query)]
                     for call in s.query.find_all(exp.Func)
                     if _call_name(call).lower() == function.lower()]
            if len(calls) == 1:
                file, call = calls[0]
                return file.call_location(call, stmt.offset)
        return stmt.file.location(stmt.offset)

    def _views_read(self, query: exp.Query) -> list[ViewStmt]:
        """The views ``query`` reads, and those they read (each once)."""
        found: dict[str, ViewStmt] = {}
        todo = [query]
        while todo:
            for t in todo.pop().find_all(exp.Table):
                view = self.views.get(t.name.lower())
                if view is not None and t.name.lower() not in found:
                    found[t.name.lower()] = view
                    todo.append(view.query)
        return list(found.values())

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


def _emit_on_close(catalog: Catalog, stmt: TableStmt, plan: Node) -> Node:
    """``plan`` with its windowed GROUP BY emitting each window once, when it closes; an
    error at the clause when the query cannot."""
    at = stmt.file.location(stmt.emit_offset or 0)
    what = f"streaming table {stmt.name!r}: EMIT ON WINDOW CLOSE"
    agg = plan
    while isinstance(agg, (Filter, Project)):
        agg = agg.input
    closing = closing_key(agg) if isinstance(agg, Aggregate) else None
    if not isinstance(agg, Aggregate) or closing is None:
        raise SqlError(f"{what} needs a query that ends in a GROUP BY window_start or "
                       "window_end of a TUMBLE or HOP (optionally filtered or projected): "
                       "a window's result is what closes", at)
    if not final_when_closed(agg, closing):
        raise SqlError(f"{what} needs an append-only input to the windowed GROUP BY (an "
                       "updating input could change a window after it closed)", at)
    unmarked = _unwatermarked(catalog, closing.window)
    if unmarked is not None:
        scan, column = unmarked
        raise SqlError(f"{what} needs a watermark on the window's time column "
                       f"{closing.window.time!r}: declare WATERMARK FOR {column} on source "
                       f"{scan} (a window closes when the watermark passes its end)", at)
    return transform(plan, lambda n: replace(n, emit_on_close=True) if n is agg else n)


def _state_ttl(catalog: Catalog, stmt: TableStmt, plan: Node) -> Node:
    """``plan`` with its GROUP BY forgetting a group's state ``state_ttl`` after the
    group's last change, and its inner joins a row that long after the batch that stored
    it (by the watermark); an error at the option when it cannot."""
    at = stmt.location("state_ttl")
    what = f"streaming table {stmt.name!r}: state_ttl"
    ttl = parse_span(stmt.options["state_ttl"])
    if ttl is None:
        raise SqlError(f"{what} must be '<n> <unit>' (unit microsecond to week), e.g. "
                       f"'1 hour' (got {stmt.options['state_ttl']!r})", at)
    agg = plan
    while isinstance(agg, (Filter, Project)):
        agg = agg.input
    below = agg.input if isinstance(agg, Aggregate) else plan

    def forgettable(n: Node) -> bool:  # stateless steps and inner joins, append-only
        ok = isinstance(n, (Scan, Filter, Project)) or isinstance(n, Window) and \
            n.kind != "session" or isinstance(n, Join) and n.kind == "inner"
        return ok and n.mode == "append-only" and all(forgettable(c) for c in n.inputs)

    final = agg if isinstance(agg, Aggregate) else None
    has_join = any(isinstance(n, Join) for n in _walk(below))
    usable = forgettable(below) and (final is not None or has_join) and (
        final is None or bool(final.keys))
    if not usable:
        raise SqlError(f"{what} applies to the state of a GROUP BY at the end of the query "
                       "and of inner joins, over append-only input: "
                       "no outer joins, SESSION windows, top-N or other GROUP BYs below (the "
                       "state it can forget safely in this version)", at)
    scans = [n for n in _walk(below) if isinstance(n, Scan)]
    if not any((catalog.sources[s.name.lower()].watermark if s.kind == "source"
                else catalog.table(s.name).event_time) is not None for s in scans):
        raise SqlError(f"{what} needs a watermark (WATERMARK FOR on a source it reads): the "
                       "state is forgotten when the watermark passes its last change plus "
                       "the TTL", at)
    return transform(plan, lambda n: replace(n, ttl_us=ttl) if isinstance(n, (Aggregate, Join))
                     else n)  # the checks above: the final GROUP BY and inner joins only


def _call_name(call: exp.Func) -> str:
    """A call's function name as Spark SQL spells it (as Spark's errors name it)."""
    return call.sql(dialect=DIALECT).split("(", 1)[0]


def _walk(node: Node):
    yield node
    for child in node.inputs:
        yield from _walk(child)


def _unwatermarked(catalog: Catalog, window: Window | None) -> tuple[str, str] | None:
    """A ``(relation, column)`` the window's time comes from that has no watermark (a
    source's WATERMARK column, or a streaming table's window_end that carries its
    watermark), if any."""
    if window is None:  # an upstream table's window_end: it has a watermark
        return None
    for scan, column in sorted(column_lineage(window.input)[window.time]):
        source = catalog.sources.get(scan.lower())
        if source is not None:
            ok = source.watermark is not None and \
                source.watermark.column.lower() == column.lower()
        else:
            ok = catalog.table(scan).event_time == column
        if not ok:
            return scan, column
    return None


def _event_time(catalog: Catalog, plan: Node) -> str | None:
    """The table's column that carries its watermark downstream: ``window_end`` of a
    closing window whose time has a watermark."""
    end = WINDOW_COLUMNS[1]
    found = window_bound(plan, end) if end in plan.columns else None
    if found is None or _unwatermarked(catalog, found[0]) is not None:
        return None
    return end


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
    check_sessions(plan, stmt)
    if stmt.emit_offset is not None:
        plan = _emit_on_close(catalog, stmt, plan)
    if "state_ttl" in stmt.options:
        plan = _state_ttl(catalog, stmt, plan)
    pk, partitioning = table_options(stmt, plan.columns)
    return TableDef(stmt.name, plan, dict(stmt.options), stmt.sql, stmt.file.path,
                    pk if pk is not None else plan.pk, tuple(sorted(binder.deps)),
                    partitioning, _event_time(catalog, plan))

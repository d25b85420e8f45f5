"""Bind parsed statements into a catalog and build each streaming table's logical plan.

Name resolution, aggregate extraction and the plan-time checks for shapes we cannot
maintain incrementally live here, next to the AST, so every error can point at the SQL.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sqlglot import exp

from octo_platform.errors import CatalogError, PlanError, SqlError
from octo_platform.frontend.parser import (
    DIALECT,
    SourceStmt,
    SqlFile,
    Statement,
    TableStmt,
    ViewStmt,
)
from octo_platform.logical.plan import (
    AggCall,
    Aggregate,
    Filter,
    Mode,
    Node,
    Project,
    Scan,
    UnionAll,
    quote,
)

__all__ = ["SourceDef", "TableDef", "Catalog", "build_catalog"]

FORMATS = ("json", "csv", "parquet", "debezium-json")
CONNECTORS = ("files",)
NONDETERMINISTIC = {
    "rand", "randn", "random", "uuid", "shuffle", "now", "current_timestamp", "current_date",
    "current_time", "localtimestamp", "unix_timestamp", "monotonically_increasing_id",
    "spark_partition_id", "input_file_name", "input_file_block_start",
    "input_file_block_length", "rand_str", "randstr", "uniform", "try_reflect", "reflect",
    "java_method", "current_timezone",
}
SUPPORTED_AGGS = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min",
                  exp.Max: "max"}


@dataclass(frozen=True)
class SourceDef:
    """A bound ``CREATE SOURCE``."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    options: dict[str, str]
    mode: Mode
    pk: tuple[str, ...] | None
    file: str = ""

    @property
    def connector(self) -> str:
        return self.options.get("connector", "")

    @property
    def format(self) -> str:
        return self.options.get("format", "")


@dataclass(frozen=True)
class TableDef:
    """A bound ``CREATE STREAMING TABLE`` with its logical plan."""

    name: str
    plan: Node
    options: dict[str, str]
    sql: str
    file: str
    pk: tuple[str, ...] | None
    deps: tuple[str, ...] = field(default=())

    @property
    def columns(self) -> tuple[str, ...]:
        return self.plan.columns


class Catalog:
    """Every source, view and streaming table of a project, bound lazily and memoized."""

    def __init__(self, statements: list[Statement]) -> None:
        self.sources: dict[str, SourceDef] = {}
        self.views: dict[str, ViewStmt] = {}
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
                self.sources[key] = _bind_source(stmt)
            elif isinstance(stmt, ViewStmt):
                self.views[key] = stmt
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


def build_catalog(statements: list[Statement]) -> Catalog:
    """Bind all statements; raises on the first error so nothing runs with a broken project."""
    catalog = Catalog(statements)
    catalog.tables()
    return catalog


def _bind_source(stmt: SourceStmt) -> SourceDef:
    opts = {k: v for k, v in stmt.options.items()}
    here = stmt.file.location(stmt.offset)
    connector = opts.get("connector")
    if connector not in CONNECTORS:
        raise SqlError(f"source {stmt.name!r}: connector must be one of {', '.join(CONNECTORS)}"
                       f" (got {connector!r})", here)
    if "path" not in opts:
        raise SqlError(f"source {stmt.name!r}: option 'path' is required", here)
    fmt = opts.get("format", "")
    if fmt not in FORMATS:
        raise SqlError(f"source {stmt.name!r}: format must be one of {', '.join(FORMATS)}"
                       f" (got {fmt!r})", here)
    columns = tuple(c for c, _ in stmt.columns)
    pk = _key_option(opts, columns, f"source {stmt.name!r}", here)
    mode: Mode = "updating" if fmt == "debezium-json" else "append-only"
    return SourceDef(stmt.name, columns, tuple(t for _, t in stmt.columns), opts, mode, pk,
                     stmt.file.path)


def _key_option(opts: dict[str, str], columns: tuple[str, ...], what: str,
                here) -> tuple[str, ...] | None:
    raw = opts.get("primary_key")
    if raw is None:
        return None
    lower = {c.lower(): c for c in columns}
    key = []
    for part in raw.split(","):
        name = part.strip()
        if name.lower() not in lower:
            raise SqlError(f"{what}: primary_key column {name!r} is not one of "
                           f"{', '.join(columns)}", here)
        key.append(lower[name.lower()])
    return tuple(key)


def _bind_table(catalog: Catalog, stmt: TableStmt) -> TableDef:
    binder = _Binder(catalog, stmt.file)
    plan = binder.query(stmt.query, {})
    here = stmt.file.location(stmt.offset)
    pk = _key_option(stmt.options, plan.columns, f"streaming table {stmt.name!r}", here)
    unknown = set(stmt.options) - {"primary_key"}
    if unknown:
        raise SqlError(f"streaming table {stmt.name!r}: unknown option(s) "
                       f"{', '.join(sorted(unknown))} (known: primary_key)", here)
    return TableDef(stmt.name, plan, dict(stmt.options), stmt.sql, stmt.file.path,
                    pk if pk is not None else plan.pk, tuple(sorted(binder.deps)))


@dataclass
class _Scope:
    """The single input a SELECT reads from: its plan and the names it may be called by."""

    node: Node
    aliases: set[str]

    def resolve(self, col: exp.Column, file: SqlFile) -> str:
        table = col.table
        if table and table.lower() not in self.aliases:
            raise PlanError(f"unknown table or alias {table!r} in column {col.sql(DIALECT)!r}",
                            file.location_of(col))
        lower = {c.lower(): c for c in self.node.columns}
        name = col.name
        if name.lower() not in lower:
            raise PlanError(f"unknown column {name!r} (available: "
                            f"{', '.join(self.node.columns)})", file.location_of(col))
        return lower[name.lower()]


class _Binder:
    def __init__(self, catalog: Catalog, file: SqlFile) -> None:
        self.catalog = catalog
        self.file = file
        self.deps: set[str] = set()

    def error(self, message: str, node: exp.Expression) -> PlanError:
        return PlanError(message, self.file.location_of(node))

    # -- queries ---------------------------------------------------------------------------
    def query(self, q: exp.Expression, ctes: dict[str, Node]) -> Node:
        ctes = dict(ctes)
        with_ = q.args.get("with_")
        if with_ is not None:
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = self.query(cte.this, ctes)
        if isinstance(q, exp.Subquery):
            return self.query(q.this, ctes)
        if isinstance(q, exp.Union):
            return self.union(q, ctes)
        if isinstance(q, (exp.Except, exp.Intersect)):
            raise self.error(f"{type(q).__name__.upper()} is not supported yet", q)
        if not isinstance(q, exp.Select):
            raise self.error(f"expected a SELECT, found {q.key.upper()}", q)
        return self.select(q, ctes)

    def union(self, q: exp.Union, ctes: dict[str, Node]) -> Node:
        for arg in ("order", "limit"):
            if q.args.get(arg) is not None:
                raise self.error(f"{arg.upper()} on a UNION is not supported", q.args[arg])
        left, right = self.query(q.this, ctes), self.query(q.expression, ctes)
        if len(left.columns) != len(right.columns):
            raise self.error(f"UNION inputs have {len(left.columns)} and {len(right.columns)}"
                             " columns", q)
        children = [left, right]
        flat: list[Node] = []
        for child in children:
            flat.extend(child.children if isinstance(child, UnionAll) else (child,))
        mode: Mode = "updating" if any(c.mode == "updating" for c in flat) else "append-only"
        node: Node = UnionAll(left.columns, mode, None, children=tuple(flat))
        if q.args.get("distinct"):
            node = _distinct(node)
        return node

    def from_(self, select: exp.Select, ctes: dict[str, Node]) -> _Scope:
        from_ = select.args.get("from_")
        if from_ is None:
            raise self.error("a streaming table needs a FROM clause", select)
        if select.args.get("joins"):
            raise self.error("joins are not supported yet", select.args["joins"][0])
        src = from_.this
        if isinstance(src, exp.Subquery):
            return _Scope(self.query(src.this, ctes), {src.alias.lower()} if src.alias else set())
        if not isinstance(src, exp.Table) or not src.name:
            raise self.error(f"unsupported FROM item {src.sql(DIALECT)!r}", src)
        name = src.name
        aliases = {name.lower(), (src.alias or name).lower()}
        return _Scope(self.relation(name, src, ctes), aliases)

    def relation(self, name: str, where: exp.Expression, ctes: dict[str, Node]) -> Node:
        key = name.lower()
        if key in ctes:
            return ctes[key]
        cat = self.catalog
        if key in cat.views:
            view = cat.views[key]
            return _Binder(cat, view.file)._view(view, self)
        if key in cat._table_stmts:
            table = cat.table(name)
            self.deps.add(table.name)
            return Scan(table.columns, table.plan.mode, table.pk, name=table.name, kind="table")
        if key in cat.sources:
            s = cat.sources[key]
            self.deps.add(s.name)
            return Scan(s.columns, s.mode, s.pk, name=s.name, kind="source", types=s.types)
        known = sorted([*cat.sources, *cat.views, *cat._table_stmts, *ctes])
        raise self.error(f"unknown source, view or table {name!r} (known: "
                         f"{', '.join(known) or 'none'})", where)

    def _view(self, view: ViewStmt, outer: _Binder) -> Node:
        node = self.query(view.query, {})
        outer.deps |= self.deps
        return node

    def select(self, select: exp.Select, ctes: dict[str, Node]) -> Node:
        self.check_supported(select)
        scope = self.from_(select, ctes)
        node = scope.node
        where = select.args.get("where")
        if where is not None:
            if any(isinstance(n, exp.AggFunc) for n in where.this.walk()):
                raise self.error("aggregates are not allowed in WHERE (use HAVING)", where)
            node = Filter(node.columns, node.mode, node.pk, input=node,
                          condition=self.rewrite(where.this, scope))
            scope = _Scope(node, scope.aliases)
        items = self.expand_stars(select.expressions, scope)
        names = self.output_names(items)
        group = select.args.get("group")
        having = select.args.get("having")
        is_agg = group is not None or having is not None or any(
            isinstance(n, exp.AggFunc) for item in items for n in item.walk())
        if is_agg:
            node = self.aggregate(items, names, group, having, scope)
        else:
            node = _project(node, names, tuple(self.rewrite(i, scope) for i in items))
        if select.args.get("distinct") is not None:
            node = _distinct(node)
        return node

    def check_supported(self, select: exp.Select) -> None:
        order, limit = select.args.get("order"), select.args.get("limit")
        if order is not None and limit is None:
            raise self.error("ORDER BY without LIMIT has no meaning for a streaming table "
                             "(its rows have no order); remove it", order)
        if limit is not None:
            raise self.error("LIMIT / top-N is not supported yet", limit)
        for node in select.walk():
            if isinstance(node, exp.Window):
                raise self.error("window functions (OVER ...) are not supported: they cannot "
                                 "be maintained incrementally yet", node)
            fname = _function_name(node)
            if fname in NONDETERMINISTIC:
                raise self.error(f"non-deterministic function {fname}() cannot be maintained "
                                 "incrementally: a retraction must reproduce the row it "
                                 "removes", node)
            if isinstance(node, (exp.Exists, exp.In)) and (
                    node.args.get("query") is not None or isinstance(node, exp.Exists)):
                raise self.error("subqueries in expressions (IN / EXISTS) are not supported "
                                 "yet", node)
            if isinstance(node, exp.Subquery) and not isinstance(node.parent, (exp.From,)):
                if node.parent is not None and not isinstance(node.parent, exp.Union):
                    raise self.error("scalar subqueries are not supported yet", node)

    def expand_stars(self, items: list[exp.Expression], scope: _Scope) -> list[exp.Expression]:
        out: list[exp.Expression] = []
        for item in items:
            star = isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
            if not star:
                out.append(item)
                continue
            if isinstance(item, exp.Column) and item.table.lower() not in scope.aliases:
                raise self.error(f"unknown table or alias {item.table!r}", item)
            out.extend(exp.column(c, quoted=True) for c in scope.node.columns)
        return out

    def output_names(self, items: list[exp.Expression]) -> tuple[str, ...]:
        names: list[str] = []
        for i, item in enumerate(items):
            if isinstance(item, exp.Alias):
                name = item.alias
            elif isinstance(item, exp.Column):
                name = item.name
            else:
                name = f"_c{i}"
            if name.lower() in (n.lower() for n in names):
                raise self.error(f"duplicate output column {name!r}: give it an alias", item)
            names.append(name)
        return tuple(names)

    # -- expressions -----------------------------------------------------------------------
    def rewrite(self, e: exp.Expression, scope: _Scope,
                extra: Callable[[exp.Expression], exp.Expression | None] | None = None) -> str:
        """Spark SQL text of ``e`` with column references resolved against ``scope``."""
        node = e.this if isinstance(e, exp.Alias) else e

        def fix(n: exp.Expression) -> exp.Expression:
            if extra is not None and (repl := extra(n)) is not None:
                return repl
            if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
                return exp.column(scope.resolve(n, self.file), quoted=True)
            return n

        return node.copy().transform(fix).sql(dialect=DIALECT)

    def aggregate(self, items: list[exp.Expression], names: tuple[str, ...],
                  group: exp.Group | None, having: exp.Having | None, scope: _Scope) -> Node:
        aliases = {n.lower(): i for n, i in zip(names, items) if isinstance(i, exp.Alias)}
        group_exprs: list[exp.Expression] = []
        lower_cols = {c.lower() for c in scope.node.columns}
        for g in (group.expressions if group is not None else []):
            if isinstance(g, exp.Literal) and not g.is_string:
                pos = int(g.this)
                if not 1 <= pos <= len(items):
                    raise self.error(f"GROUP BY position {pos} is not in the select list", g)
                g = items[pos - 1]
            elif (isinstance(g, exp.Column) and not g.table and g.name.lower() not in lower_cols
                  and g.name.lower() in aliases):
                g = aliases[g.name.lower()]
            g = g.this if isinstance(g, exp.Alias) else g
            if any(isinstance(n, exp.AggFunc) for n in g.walk()):
                raise self.error("aggregates are not allowed in GROUP BY", g)
            group_exprs.append(g)
        key_sql = [self.rewrite(g, scope) for g in group_exprs]

        calls: list[AggCall] = []
        arg_sql: list[str] = []
        call_ids: dict[tuple[str, str, bool], int] = {}

        def agg_ref(n: exp.Expression) -> exp.Expression | None:
            if not isinstance(n, exp.AggFunc):
                return None
            func = next((f for t, f in SUPPORTED_AGGS.items() if isinstance(n, t)), None)
            if func is None:
                raise self.error(f"aggregate {_function_name(n) or n.key}() is not supported "
                                 "(supported: COUNT, SUM, AVG, MIN, MAX, COUNT(DISTINCT))", n)
            arg = n.this
            distinct = isinstance(arg, exp.Distinct)
            if distinct:
                if len(arg.expressions) != 1:
                    raise self.error("COUNT(DISTINCT ...) takes exactly one expression", n)
                if func in ("sum", "avg"):
                    raise self.error(f"{func.upper()}(DISTINCT ...) is not supported yet", n)
                arg = arg.expressions[0]
            if any(isinstance(x, exp.AggFunc) for x in arg.walk() if x is not arg) or (
                    isinstance(arg, exp.AggFunc)):
                raise self.error("aggregates cannot be nested inside aggregates; use a "
                                 "subquery or another streaming table", n)
            star = isinstance(arg, exp.Star) or arg is None
            if star and func != "count":
                raise self.error(f"{func.upper()}(*) is not valid", n)
            if func in ("min", "max"):
                distinct = False
            a_sql = "" if star else self.rewrite(arg, scope)
            ident = (func, a_sql, distinct)
            if ident not in call_ids:
                call_ids[ident] = len(calls)
                if star:
                    calls.append(AggCall(func, None))
                else:
                    if a_sql not in arg_sql:
                        arg_sql.append(a_sql)
                    calls.append(AggCall(func, f"_a{arg_sql.index(a_sql)}", distinct))
            return exp.column(f"_agg{call_ids[ident]}", quoted=True)

        def post(n: exp.Expression) -> exp.Expression | None:
            if (ref := agg_ref(n)) is not None:
                return ref
            if isinstance(n, (exp.Literal, exp.Null, exp.Boolean)):
                return None
            try:
                text = self.rewrite(n, scope)
            except PlanError:
                return None
            if text in key_sql:
                return exp.column(f"_g{key_sql.index(text)}", quoted=True)
            if isinstance(n, exp.Column):
                raise self.error(f"column {n.sql(DIALECT)!r} must appear in GROUP BY or be "
                                 "used in an aggregate", n)
            return None

        post_scope_cols = [f"_g{i}" for i in range(len(key_sql))]
        select_sql = [self.rewrite(i, scope, post) for i in items]
        having_sql = None
        if having is not None:
            # Spark lets HAVING name a select alias; substitute the aliased expression.
            def unalias(n: exp.Expression) -> exp.Expression:
                if (isinstance(n, exp.Column) and not n.table and n.name.lower() in aliases
                        and n.name.lower() not in lower_cols):
                    return aliases[n.name.lower()].this.copy()
                return n

            having_sql = self.rewrite(having.this.copy().transform(unalias), scope, post)
        agg_cols = tuple(f"_agg{i}" for i in range(len(calls)))
        pre_cols = tuple(post_scope_cols) + tuple(f"_a{i}" for i in range(len(arg_sql)))
        src = scope.node
        pre = Project(pre_cols, src.mode, None, input=src, exprs=tuple(key_sql + arg_sql))
        node: Node = Aggregate(tuple(post_scope_cols) + agg_cols, "updating",
                               tuple(post_scope_cols), input=pre,
                               keys=tuple(post_scope_cols), aggs=tuple(calls))
        if having_sql is not None:
            node = Filter(node.columns, node.mode, node.pk, input=node, condition=having_sql)
        return _project(node, names, tuple(select_sql))


def _function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def _project(node: Node, names: tuple[str, ...], exprs: tuple[str, ...]) -> Node:
    """A projection, with the primary key carried through bare column references."""
    if names == node.columns and exprs == tuple(quote(c) for c in node.columns):
        return node
    pk: tuple[str, ...] | None = None
    if node.pk is not None:
        mapping = {}
        for name, e in zip(names, exprs):
            for c in node.columns:
                if e == quote(c) and c not in mapping:
                    mapping[c] = name
        if all(k in mapping for k in node.pk):
            pk = tuple(mapping[k] for k in node.pk)
    return Project(names, node.mode, pk, input=node, exprs=exprs)


def _distinct(node: Node) -> Node:
    mode: Mode = "append-only" if node.mode == "append-only" else "updating"
    return Aggregate(node.columns, mode, node.columns, input=node, keys=node.columns, aggs=())

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
    Join,
    Mode,
    Node,
    Project,
    Scan,
    SortKey,
    TopN,
    UnionAll,
    project,
)
from octo_platform.logical.optimizer import RULES, Rule, optimize
from octo_platform.partitions import GRANULARITIES, Partitioning, parse_time
from octo_platform.sqltext import DIALECT, quote, referenced_columns

__all__ = ["SourceDef", "TableDef", "Catalog", "build_catalog"]

FORMATS = ("json", "csv", "parquet", "debezium-json")
CONNECTORS = ("files", "delta")
DELTA_OPTIONS = ("connector", "path", "primary_key", "mode")
MODES = ("updating", "append-only")
TABLE_OPTIONS = ("primary_key", "partition_by", "partitions", "partition_start")
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
    partitioning: Partitioning | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return self.plan.columns


class Catalog:
    """Every source, view and streaming table of a project, bound lazily and memoized;
    each table's plan rewritten by the optimizer's ``rules``."""

    def __init__(self, statements: list[Statement], rules: tuple[Rule, ...] = RULES) -> None:
        self.rules = rules
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


def build_catalog(statements: list[Statement], *, rules: tuple[Rule, ...] = RULES) -> Catalog:
    """Bind all statements; raises on the first error so nothing runs with a broken project."""
    catalog = Catalog(statements, rules)
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
    mode: Mode
    if connector == "delta":  # an existing Delta table: its rows may be updated and deleted
        for key in opts:
            if key not in DELTA_OPTIONS:
                raise SqlError(f"source {stmt.name!r}: option {key!r} does not apply to "
                               f"connector 'delta' (its options: {', '.join(DELTA_OPTIONS)})",
                               here)
        declared = opts.get("mode", "updating")
        if declared not in MODES:
            raise SqlError(f"source {stmt.name!r}: option 'mode' must be one of "
                           f"{', '.join(MODES)} (got {declared!r})", here)
        mode = "append-only" if declared == "append-only" else "updating"
    else:
        fmt = opts.get("format", "")
        if fmt not in FORMATS:
            raise SqlError(f"source {stmt.name!r}: format must be one of {', '.join(FORMATS)}"
                           f" (got {fmt!r})", here)
        mode = "updating" if fmt == "debezium-json" else "append-only"
    columns = tuple(c for c, _ in stmt.columns)
    pk = _key_option(opts, columns, f"source {stmt.name!r}", here)
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
    plan = optimize(binder.query(stmt.query, {}), catalog.rules)
    here = stmt.file.location(stmt.offset)
    if (top := _unbounded_top_n(plan)) is not None:
        window = stmt.query.find(exp.Window)
        raise SqlError(f"ROW_NUMBER() AS {top.rank} needs a bound: filter the subquery with "
                       f"WHERE {top.rank} <= n (a ranking of every row is not maintained)",
                       stmt.file.location_of(window) if window is not None else here)
    what = f"streaming table {stmt.name!r}"
    pk = _key_option(stmt.options, plan.columns, what, here)
    unknown = set(stmt.options) - set(TABLE_OPTIONS)
    if unknown:
        raise SqlError(f"{what}: unknown option(s) {', '.join(sorted(unknown))} "
                       f"(known: {', '.join(TABLE_OPTIONS)})", here)
    partitioning = _partitioning(stmt.options, plan.columns, what, here)
    return TableDef(stmt.name, plan, dict(stmt.options), stmt.sql, stmt.file.path,
                    pk if pk is not None else plan.pk, tuple(sorted(binder.deps)),
                    partitioning)


def _partitioning(opts: dict[str, str], columns: tuple[str, ...], what: str,
                  here) -> Partitioning | None:
    """The event-time partitions a table declares (see ``octo_platform.partitions``)."""
    column = opts.get("partition_by")
    if column is None:
        extra = sorted(set(opts) & {"partitions", "partition_start"})
        if extra:
            raise SqlError(f"{what}: option {extra[0]!r} needs partition_by (the event-time "
                           "column that decides a row's partition)", here)
        return None
    lower = {c.lower(): c for c in columns}
    if column.strip().lower() not in lower:
        raise SqlError(f"{what}: partition_by column {column!r} is not one of "
                       f"{', '.join(columns)}", here)
    granularity = opts.get("partitions", "daily").strip().lower()
    if granularity not in GRANULARITIES:
        raise SqlError(f"{what}: option 'partitions' must be one of "
                       f"{', '.join(GRANULARITIES)}, not {granularity!r}", here)
    if "partition_start" not in opts:
        raise SqlError(f"{what}: partition_by needs partition_start (the first partition, "
                       "e.g. '2026-01-01')", here)
    try:
        start = parse_time(opts["partition_start"])
    except ValueError:
        raise SqlError(f"{what}: partition_start {opts['partition_start']!r} is not a date "
                       "or timestamp (YYYY-MM-DD[ HH:MM])", here) from None
    p = Partitioning(lower[column.strip().lower()], granularity, start)
    if p.key_of(start) != start.strftime(p.key_format) or p.key_time(p.key_of(start)) != start:
        raise SqlError(f"{what}: partition_start {opts['partition_start']!r} is not the "
                       f"start of a {granularity} partition", here)
    return p


@dataclass
class _Rel:
    """One relation visible in a scope: its names and, per column as written, the column
    of the scope's node that holds it."""

    aliases: set[str]
    columns: list[tuple[str, str]]

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
class _Scope:
    """What a SELECT reads from: a plan node and the relations its columns can be named by.

    ``outer`` is the enclosing query's scope (for correlated EXISTS subqueries); ``joined``
    marks a scope whose node columns are already qualified join columns.
    """

    node: Node
    rels: list[_Rel]
    outer: _Scope | None = None
    joined: bool = False

    @classmethod
    def of(cls, node: Node, aliases: set[str]) -> _Scope:
        return cls(node, [_Rel(aliases, [(c, c) for c in node.columns])])

    def with_node(self, node: Node) -> _Scope:
        return _Scope(node, self.rels, self.outer, self.joined)

    def has_column(self, name: str) -> bool:
        return any(r.find(name) is not None for r in self.rels)

    def lookup(self, col: exp.Column, file: SqlFile) -> str | None:
        """The node column ``col`` names in this scope (not the outer one), or None."""
        table = col.table.lower()
        rels = [r for r in self.rels if not table or table in r.aliases]
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

    def qualified(self, label: str) -> tuple[tuple[str, ...], list[_Rel]]:
        """Column names unique across a join (``label.column``) and relations naming them."""
        if self.joined:
            return self.node.columns, self.rels
        rename = {c: f"{label}.{c}" for c in self.node.columns}
        rels = [_Rel(r.aliases, [(w, rename[c]) for w, c in r.columns]) for r in self.rels]
        return tuple(rename[c] for c in self.node.columns), rels


JOIN_KINDS = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}


class _Binder:
    def __init__(self, catalog: Catalog, file: SqlFile) -> None:
        self.catalog = catalog
        self.file = file
        self.deps: set[str] = set()
        self.subqueries = 0

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
        node: Node = UnionAll(left.columns, children=tuple(flat))
        if q.args.get("distinct"):
            node = _distinct(node)
        return node

    def from_(self, select: exp.Select, ctes: dict[str, Node]) -> _Scope:
        from_ = select.args.get("from_")
        if from_ is None:
            raise self.error("a streaming table needs a FROM clause", select)
        scope = self.from_item(from_.this, ctes)
        for j in select.args.get("joins") or []:
            scope = self.join(scope, j, ctes)
        return scope

    def from_item(self, src: exp.Expression, ctes: dict[str, Node]) -> _Scope:
        if isinstance(src, exp.Subquery):
            return _Scope.of(self.query(src.this, ctes), {src.alias.lower()} if src.alias
                             else set())
        if not isinstance(src, exp.Table) or not src.name:
            raise self.error(f"unsupported FROM item {src.sql(DIALECT)!r}", src)
        return _Scope.of(self.relation(src.name, src, ctes), {(src.alias or src.name).lower()})

    # -- joins -----------------------------------------------------------------------------
    def join(self, left: _Scope, j: exp.Join, ctes: dict[str, Node]) -> _Scope:
        right = self.from_item(j.this, ctes)
        what = f"JOIN {j.this.sql(DIALECT)}"
        if j.args.get("using"):
            raise self.error("JOIN ... USING is not supported: write ON a.col = b.col", j)
        side, kind_word = (j.side or "").upper(), (j.kind or "").upper()
        if kind_word in ("SEMI", "ANTI"):
            raise self.error(f"{side} {kind_word} JOIN is not supported: write WHERE ... IN / "
                             "EXISTS / NOT EXISTS (subquery)", j)
        if kind_word == "CROSS" or j.args.get("on") is None:
            raise self.error(f"{what} has no ON condition: a cross join of two unbounded "
                             "inputs cannot be maintained; join ON an equality of the two "
                             "sides", j)
        for item, scope in ((j.this, right), (j.parent_select, left)):
            if not scope.joined and not scope.rels[0].aliases:
                raise self.error("a subquery in a join needs an alias", item)
        kind = JOIN_KINDS[side]
        taken = {a for r in left.rels for a in r.aliases}
        dup = taken & right.rels[0].aliases
        if dup:
            raise self.error(f"table name or alias {sorted(dup)[0]!r} appears twice in FROM: "
                             "give each occurrence its own alias", j.this)
        lnames, lrels = left.qualified(next(iter(left.rels[0].aliases)))
        rnames, rrels = right.qualified(next(iter(right.rels[0].aliases)))
        pushable = {"l": kind in ("inner", "right"), "r": kind in ("inner", "left")}
        lnode, rnode, keys, residual = self.split_on(
            j.args["on"], what, left, right, _Scope(left.node, lrels),
            _Scope(right.node, rrels), pushable, ambiguous=True)
        node = Join(lnames + rnames, left=lnode, right=rnode, kind=kind,
                    names=lnames + rnames, left_keys=tuple(k[0] for k in keys),
                    right_keys=tuple(k[1] for k in keys), residual=residual)
        return _Scope(node, lrels + rrels, joined=True)

    def split_on(self, cond: exp.Expression, what: str, left: _Scope, right: _Scope,
                 lq: _Scope, rq: _Scope, pushable: dict[str, bool], *, ambiguous: bool):
        """Split a join condition into equi-keys, conditions pushed into one input and a
        residual. ``lq``/``rq`` resolve to the join's (qualified) names; ``left``/``right``
        to each input's own. Inner names win over outer ones unless ``ambiguous``."""

        def side_of(col: exp.Column) -> str:
            in_r = rq.lookup(col, self.file) is not None
            in_l = (not in_r or ambiguous) and lq.lookup(col, self.file) is not None
            if in_l and in_r:
                raise self.error(f"column {col.sql(DIALECT)!r} is ambiguous: qualify it with "
                                 "its table or alias", col)
            if not (in_l or in_r):
                _Scope(lq.node, lq.rels + rq.rels).resolve(col, self.file)  # raises
            return "l" if in_l else "r"

        def sides(e: exp.Expression) -> set[str]:
            return {side_of(c) for c in e.find_all(exp.Column) if not isinstance(c.this,
                                                                                 exp.Star)}

        both = _Scope(rq.node, rq.rels, outer=lq)
        keys: list[tuple[str, str]] = []
        residual: list[str] = []
        pushed: dict[str, list[exp.Expression]] = {"l": [], "r": []}
        for c in _conjuncts(cond):
            if any(isinstance(n, exp.AggFunc) for n in c.walk()):
                raise self.error("aggregates are not allowed in a join condition", c)
            where = sides(c)
            if isinstance(c, exp.EQ):
                a, b = sides(c.this), sides(c.expression)
                if a == {"l"} and b == {"r"}:
                    keys.append((self.rewrite(c.this, lq), self.rewrite(c.expression, rq)))
                    continue
                if a == {"r"} and b == {"l"}:
                    keys.append((self.rewrite(c.expression, lq), self.rewrite(c.this, rq)))
                    continue
            if len(where) == 1 and pushable[next(iter(where))]:
                pushed[next(iter(where))].append(c)
            else:
                residual.append(self.rewrite(c, both))
        if not keys:
            raise self.error(f"{what} has no equality between the two sides (like ON a.id = "
                             "b.id): a join of two unbounded inputs without one cannot be "
                             "maintained incrementally", cond)
        lnode, rnode = left.node, right.node
        if pushed["l"]:
            lnode = Filter(lnode.columns, input=lnode,
                           conditions=tuple(self.rewrite(c, left) for c in pushed["l"]))
        if pushed["r"]:
            rnode = Filter(rnode.columns, input=rnode,
                           conditions=tuple(self.rewrite(c, right) for c in pushed["r"]))
        return lnode, rnode, keys, " AND ".join(f"({r})" for r in residual) or None

    def subquery_join(self, scope: _Scope, c: exp.Expression, negated: bool,
                      ctes: dict[str, Node]) -> Node:
        """``x IN (SELECT ...)``, ``[NOT] EXISTS (SELECT ...)`` as a semi / anti join."""
        self.subqueries += 1
        label = f"_sq{self.subqueries}"
        outer = scope.node
        kind = "anti" if negated else "semi"
        if isinstance(c, exp.In):
            sub = c.args["query"].this
            inner = self.query(sub, ctes)
            if len(inner.columns) != 1:
                raise self.error(f"an IN subquery must return one column (it returns "
                                 f"{len(inner.columns)})", c)
            rnames = (f"{label}.{inner.columns[0]}",)
            keys = [(self.rewrite(c.this, scope), quote(rnames[0]))]
            residual = None
        else:
            sub = c.this
            for arg in ("group", "having", "limit", "order", "distinct"):
                if sub.args.get(arg) is not None:
                    raise self.error(f"{arg.upper()} in an EXISTS subquery is not supported",
                                     sub.args[arg])
            if any(isinstance(n, exp.AggFunc) for i in sub.expressions for n in i.walk()):
                raise self.error("aggregates in an EXISTS subquery are not supported", sub)
            self.check_supported(sub)
            right = self.from_(sub, ctes)
            rnames, rrels = right.qualified(label)
            where = sub.args.get("where")
            if where is None:
                raise self.error("an EXISTS subquery must be correlated with the outer query "
                                 "by an equality (WHERE inner.col = outer.col)", sub)
            inner_scope = _Scope(right.node, right.rels, outer=scope)
            _, inner, keys, residual = self.split_on(
                where.this, "EXISTS subquery", scope, inner_scope, scope,
                _Scope(right.node, rrels), {"l": False, "r": True}, ambiguous=False)
        return Join(outer.columns, left=outer, right=inner, kind=kind,
                    names=outer.columns + rnames, left_keys=tuple(k[0] for k in keys),
                    right_keys=tuple(k[1] for k in keys), residual=residual)

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
            return Scan(table.columns, name=table.name, kind="table",
                        changelog=table.plan.mode, key=table.pk)
        if key in cat.sources:
            s = cat.sources[key]
            self.deps.add(s.name)
            return Scan(s.columns, name=s.name, kind="source", types=s.types, changelog=s.mode,
                        key=s.pk)
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
        where = select.args.get("where")
        if where is not None:
            scope = self.where(where, scope, ctes)
        items = self.expand_stars(select.expressions, scope)
        names = self.output_names(items)
        group = select.args.get("group")
        having = select.args.get("having")
        is_agg = group is not None or having is not None or any(
            isinstance(n, exp.AggFunc) and n.find_ancestor(exp.Window) is None
            for item in items for n in item.walk())
        windows = [i for i, item in enumerate(items) if isinstance(item, exp.Alias)
                   and isinstance(item.this, exp.Window)]
        order, limit = select.args.get("order"), select.args.get("limit")
        order_cols: dict[str, str] = {}  # ORDER BY expression -> column of the node
        if windows:
            if is_agg:
                raise self.error("ROW_NUMBER() over an aggregate: compute the aggregate in a "
                                 "subquery and rank its rows in the enclosing query",
                                 items[windows[0]])
            node = self.row_number(items, names, windows, scope)
        elif is_agg:
            node = self.aggregate(items, names, group, having, scope)
        else:
            exprs = [self.rewrite(i, scope) for i in items]
            cols = list(names)
            if limit is not None and order is not None and select.args.get("distinct") is None:
                # a top-N may order by input columns the SELECT does not return
                for o in order.expressions:
                    if self.order_column(o.this, names) is None:
                        text = self.rewrite(o.this, scope)
                        if text not in exprs:
                            exprs.append(text)
                            cols.append(f"_o{len(cols)}")
                        order_cols[text] = cols[exprs.index(text)]
            node = project(scope.node, tuple(cols), tuple(exprs))
        if select.args.get("distinct") is not None:
            node = _distinct(node)
        if limit is not None:
            node = self.order_limit(node, names, order, limit, order_cols, scope)
        return node

    def where(self, where: exp.Where, scope: _Scope, ctes: dict[str, Node]) -> _Scope:
        """Filter by the plain conditions; IN / EXISTS subqueries become semi/anti joins.
        (The optimizer's rules move the conditions into joins and top-Ns.)"""
        if any(isinstance(n, exp.AggFunc) for n in where.this.walk()):
            raise self.error("aggregates are not allowed in WHERE (use HAVING)", where)
        plain: list[exp.Expression] = []
        subs: list[tuple[exp.Expression, bool]] = []
        node = scope.node
        for c in _conjuncts(where.this):
            negated = isinstance(c, exp.Not)
            inner = c.this if negated else c
            if isinstance(inner, exp.In) and inner.args.get("query") is not None:
                if negated:
                    raise self.error("NOT IN (subquery) is not supported (its NULL semantics "
                                     "cannot be maintained cheaply): write NOT EXISTS "
                                     "(SELECT ... WHERE inner.col = outer.col)", c)
                subs.append((inner, False))
            elif isinstance(inner, exp.Exists):
                subs.append((inner, negated))
            else:
                plain.append(c)
        if plain:
            node = Filter(node.columns, input=node,
                          conditions=tuple(self.rewrite(c, scope) for c in plain))
        for c, negated in subs:
            node = self.subquery_join(scope.with_node(node), c, negated, ctes)
        return scope.with_node(node)

    # -- top-N -----------------------------------------------------------------------------
    def order_column(self, e: exp.Expression, names: tuple[str, ...]) -> str | None:
        """The output column an ORDER BY item names (by name or position), if any."""
        if isinstance(e, exp.Literal) and not e.is_string:
            pos = int(e.this)
            if not 1 <= pos <= len(names):
                raise self.error(f"ORDER BY position {pos} is not in the select list", e)
            return names[pos - 1]
        if isinstance(e, exp.Column) and not e.table:
            return next((n for n in names if n.lower() == e.name.lower()), None)
        return None

    def order_limit(self, node: Node, names: tuple[str, ...], order: exp.Order | None,
                    limit: exp.Limit, order_cols: dict[str, str], scope: _Scope) -> Node:
        if order is None:
            raise self.error("LIMIT without ORDER BY keeps arbitrary rows, which cannot be "
                             "maintained: add ORDER BY", limit)
        if limit.args.get("offset") is not None:
            raise self.error("OFFSET is not supported", limit)
        value = limit.expression
        if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()
                and int(value.this) > 0):
            raise self.error("LIMIT takes a positive integer literal", limit)
        n = int(value.this)
        keys = []
        for o in order.expressions:
            col = self.order_column(o.this, names)
            if col is None and order_cols:
                col = order_cols.get(self.rewrite(o.this, scope))
            if col is None:
                raise self.error("ORDER BY of an aggregate or DISTINCT top-N query must name "
                                 "output columns (give the expression an alias)", o)
            keys.append(SortKey(col, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
        top = TopN(node.columns, input=node, order=tuple(keys), n=n)
        return project(top, names, tuple(quote(c) for c in names))

    def row_number(self, items: list[exp.Expression], names: tuple[str, ...],
                   windows: list[int], scope: _Scope) -> Node:
        """``ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rank``: an unbounded top-N that
        the enclosing query's ``WHERE rank <= n`` bounds."""
        if len(windows) > 1:
            raise self.error("only one ROW_NUMBER() per SELECT is supported",
                             items[windows[1]])
        w = items[windows[0]].this
        if not isinstance(w.this, exp.RowNumber) or w.args.get("spec") is not None:
            raise self.error("only ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) is "
                             "supported among window functions (for top-N queries)", w)
        order = w.args.get("order")
        if order is None:
            raise self.error("ROW_NUMBER() needs an ORDER BY inside OVER (...)", w)
        cols = [n for i, n in enumerate(names) if i != windows[0]]
        exprs = [self.rewrite(item, scope) for i, item in enumerate(items) if i != windows[0]]

        def column_for(e: exp.Expression) -> str:
            text = self.rewrite(e, scope)
            if text not in exprs:
                exprs.append(text)
                cols.append(f"_w{len(cols)}")
            return cols[exprs.index(text)]

        partition = tuple(column_for(p) for p in w.args.get("partition_by") or [])
        keys = tuple(SortKey(column_for(o.this), bool(o.args.get("desc")),
                             bool(o.args.get("nulls_first"))) for o in order.expressions)
        pre = project(scope.node, tuple(cols), tuple(exprs))
        rank = names[windows[0]]
        top = TopN((*pre.columns, rank), input=pre, partition=partition, order=keys, rank=rank)
        return project(top, names, tuple(quote(c) for c in names))

    def check_supported(self, select: exp.Select) -> None:
        order, limit = select.args.get("order"), select.args.get("limit")
        if order is not None and limit is None:
            raise self.error("ORDER BY without LIMIT has no meaning for a streaming table "
                             "(its rows have no order); remove it", order)
        where = select.args.get("where")
        allowed = set()
        for c in _conjuncts(where.this) if where is not None else []:
            allowed |= {id(c), id(c.this)} if isinstance(c, exp.Not) else {id(c)}
        for node in select.walk():
            if isinstance(node, exp.Select) and node is not select:
                continue  # checked when it is bound
            if node.find_ancestor(exp.Select) is not select and node is not select:
                continue
            if isinstance(node, exp.Window) and not (
                    isinstance(node.parent, exp.Alias) and node.parent.parent is select):
                raise self.error("window functions are supported only as ROW_NUMBER() OVER "
                                 "(...) AS rank in a SELECT list, bounded by WHERE rank <= n "
                                 "in the enclosing query (top-N)", node)
            fname = _function_name(node)
            if fname in NONDETERMINISTIC:
                raise self.error(f"non-deterministic function {fname}() cannot be maintained "
                                 "incrementally: a retraction must reproduce the row it "
                                 "removes", node)
            if isinstance(node, (exp.Exists, exp.In)) and (
                    node.args.get("query") is not None or isinstance(node, exp.Exists)) \
                    and id(node) not in allowed:
                raise self.error("IN / EXISTS subqueries are supported only as conditions "
                                 "AND-ed together in WHERE", node)
            if isinstance(node, exp.Subquery) and not isinstance(
                    node.parent, (exp.From, exp.Join, exp.Union, exp.In)):
                raise self.error("scalar subqueries are not supported yet", node)

    def expand_stars(self, items: list[exp.Expression], scope: _Scope) -> list[exp.Expression]:
        out: list[exp.Expression] = []
        for item in items:
            star = isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
            if not star:
                out.append(item)
                continue
            rels = scope.rels
            if isinstance(item, exp.Column):
                rels = [r for r in rels if item.table.lower() in r.aliases]
                if not rels:
                    raise self.error(f"unknown table or alias {item.table!r}", item)
            at = next((x.meta for x in item.walk() if x.meta.get("start") is not None), {})
            for r in rels:
                for written, col in r.columns:
                    ref = exp.column(col, quoted=True)
                    ref.meta.update(at)  # errors about expanded columns point at the star
                    out.append(ref if written == col else exp.alias_(ref, written, quoted=True))
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
    def resolved(self, e: exp.Expression, scope: _Scope,
                 extra: Callable[[exp.Expression], exp.Expression | None] | None = None
                 ) -> exp.Expression:
        """A copy of ``e`` with column references replaced by ``scope``'s node columns."""
        node = e.this if isinstance(e, exp.Alias) else e

        def fix(n: exp.Expression) -> exp.Expression:
            if extra is not None and (repl := extra(n)) is not None:
                return repl
            if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
                return exp.column(scope.resolve(n, self.file), quoted=True)
            return n

        return node.copy().transform(fix)

    def rewrite(self, e: exp.Expression, scope: _Scope,
                extra: Callable[[exp.Expression], exp.Expression | None] | None = None) -> str:
        """Spark SQL text of ``e`` with column references resolved against ``scope``."""
        return self.resolved(e, scope, extra).sql(dialect=DIALECT)

    def aggregate(self, items: list[exp.Expression], names: tuple[str, ...],
                  group: exp.Group | None, having: exp.Having | None, scope: _Scope) -> Node:
        aliases = {n.lower(): i for n, i in zip(names, items) if isinstance(i, exp.Alias)}
        group_exprs: list[exp.Expression] = []
        for g in (group.expressions if group is not None else []):
            if isinstance(g, exp.Literal) and not g.is_string:
                pos = int(g.this)
                if not 1 <= pos <= len(items):
                    raise self.error(f"GROUP BY position {pos} is not in the select list", g)
                g = items[pos - 1]
            elif (isinstance(g, exp.Column) and not g.table and not scope.has_column(g.name)
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
                        and not scope.has_column(n.name)):
                    return aliases[n.name.lower()].this.copy()
                return n

            having_sql = self.rewrite(having.this.copy().transform(unalias), scope, post)
        agg_cols = tuple(f"_agg{i}" for i in range(len(calls)))
        pre_cols = tuple(post_scope_cols) + tuple(f"_a{i}" for i in range(len(arg_sql)))
        src = scope.node
        pre = Project(pre_cols, input=src, exprs=tuple(key_sql + arg_sql))
        node: Node = Aggregate(tuple(post_scope_cols) + agg_cols, input=pre,
                               keys=tuple(post_scope_cols), aggs=tuple(calls))
        if having_sql is not None:
            node = Filter(node.columns, input=node, conditions=(having_sql,))
        return project(node, names, tuple(select_sql))


def _function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def _distinct(node: Node) -> Node:
    return Aggregate(node.columns, input=node, keys=node.columns, aggs=(), distinct=True)


def _conjuncts(e: exp.Expression) -> list[exp.Expression]:
    """The AND-ed parts of a condition (parentheses looked through)."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return _conjuncts(e.this) + _conjuncts(e.expression)
    return [e]


def _unbounded_top_n(node: Node) -> TopN | None:
    if isinstance(node, TopN) and node.n is None:
        return node
    return next((t for c in node.inputs if (t := _unbounded_top_n(c)) is not None), None)

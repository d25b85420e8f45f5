"""Binding of queries: a SELECT (with its joins, subqueries, aggregates and top-Ns)
becomes a logical plan whose expressions are Spark SQL over plan columns.

Names are resolved against a ``Scope``; views and CTEs are inlined; unsupported shapes
are rejected with an error pointing at the SQL (``shapes``). The plan is built
straightforwardly: the optimizer's rules then push filters, bound top-Ns and prune columns.
Set operations are here (EXCEPT / INTERSECT as a GROUP BY counting each side's copies);
the binder's other parts live beside it, mixed into ``QueryBinder``: ``joins`` (FROM,
joins, IN / EXISTS AND-ed in WHERE), ``subqueries`` (scalar subqueries, IN / EXISTS
elsewhere), ``aggregates`` (GROUP BY) and ``ordering`` (top-N, OVER).
"""
from __future__ import annotations

from typing import Callable, Protocol

from sqlglot import exp

from octo_platform.errors import PlanError
from octo_platform.frontend.definitions import SourceDef, TableDef
from octo_platform.frontend.parser import SESSION_CALL, SqlFile, ViewStmt
from octo_platform.frontend.aggregates import AggregateBinding
from octo_platform.frontend.intervals import interval_micros
from octo_platform.frontend.joins import JoinBinding
from octo_platform.frontend.ordering import OrderBinding
from octo_platform.frontend.scope import Scope
from octo_platform.frontend.subqueries import SubqueryBinding
from octo_platform.frontend.shapes import check_supported
from octo_platform.logical.lineage import column_types
from octo_platform.logical.plan import (
    AggCall,
    Aggregate,
    Filter,
    Node,
    Project,
    Scan,
    UnionAll,
    WINDOW_COLUMNS,
    Window,
    project,
)
from octo_platform.sqltext import DIALECT, quote

__all__ = ["Relations", "QueryBinder"]

WINDOW_FUNCTIONS = {"TUMBLE": "relation, time column, size",
                    "HOP": "relation, time column, slide, size",
                    SESSION_CALL: "relation, time column, gap"}


class Relations(Protocol):
    """What a query can read by name (the catalog)."""

    def relation(self, name: str) -> SourceDef | TableDef | ViewStmt | None:
        """The source, bound streaming table or view called ``name`` (any case)."""

    def names(self) -> list[str]:
        """The (lower-case) names of everything ``relation`` finds."""


class QueryBinder(JoinBinding, SubqueryBinding, AggregateBinding, OrderBinding):
    """Binds the queries of one SQL file into logical plans, collecting the sources and
    tables they read in ``deps``."""

    def __init__(self, catalog: Relations, file: SqlFile) -> None:
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
                ctes[cte.alias_or_name.lower()] = self.renamed(self.query(cte.this, ctes), cte)
        if isinstance(q, exp.Subquery):
            return self.query(q.this, ctes)
        if isinstance(q, (exp.Union, exp.Except, exp.Intersect)):
            return self.union(q, ctes)
        if not isinstance(q, exp.Select):
            raise self.error(f"expected a SELECT, found {q.key.upper()}", q)
        return self.select(q, ctes)

    def union(self, q: exp.Union | exp.Except | exp.Intersect, ctes: dict[str, Node]
              ) -> Node:
        """``UNION [ALL]``, ``EXCEPT [ALL]``, ``INTERSECT [ALL]`` of two queries."""
        what = type(q).__name__.upper()
        for arg in ("order", "limit"):
            if q.args.get(arg) is not None:
                raise self.error(f"{arg.upper()} on a {what} is not supported: put the "
                                 f"{what} in a subquery", q.args[arg])
        left, right = self.query(q.this, ctes), self.query(q.expression, ctes)
        if len(left.columns) != len(right.columns):
            raise self.error(f"{what} inputs have {len(left.columns)} and "
                             f"{len(right.columns)} columns", q)
        if not isinstance(q, exp.Union):
            return set_difference(left, right, what.lower(), bool(q.args.get("distinct")))
        children = [left, right]
        flat: list[Node] = []
        for child in children:
            flat.extend(child.children if isinstance(child, UnionAll) else (child,))
        node: Node = UnionAll(left.columns, children=tuple(flat))
        if q.args.get("distinct"):
            node = _distinct(node)
        return node

    def from_item(self, src: exp.Expression, ctes: dict[str, Node]) -> Scope:
        if isinstance(src, exp.Subquery):
            return Scope.of(self.renamed(self.query(src.this, ctes), src),
                            {src.alias.lower()} if src.alias else set())
        if isinstance(src, exp.Table) and isinstance(src.this, exp.Anonymous) \
                and src.this.name.upper() in WINDOW_FUNCTIONS:
            node, name = self.window(src.this, ctes)
            return Scope.of(node, {(src.alias or name).lower()})
        if not isinstance(src, exp.Table) or not src.name:
            raise self.error(f"unsupported FROM item {src.sql(DIALECT)!r}", src)
        return Scope.of(self.relation(src.name, src, ctes), {(src.alias or src.name).lower()})

    def renamed(self, node: Node, item: exp.Expression) -> Node:
        """``node`` with the column names of ``item``'s alias list (``AS t (a, b)`` of a
        derived table or a CTE), if it has one."""
        alias = item.args.get("alias")
        names = [c.name for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
        if not names:
            return node
        if len(names) != len(node.columns):
            raise self.error(f"{alias.name or 'the alias'} names {len(names)} columns, its "
                             f"query has {len(node.columns)}", alias)
        return project(node, tuple(names), tuple(quote(c) for c in node.columns))

    def window(self, call: exp.Anonymous, ctes: dict[str, Node]) -> tuple[Node, str]:
        """``TUMBLE(rel, time, size)`` / ``HOP(rel, time, slide, size)`` in FROM: the
        relation's rows in their windows, and the relation's name."""
        func = call.name.upper()
        form = WINDOW_FUNCTIONS[func]
        func = "SESSION" if func == SESSION_CALL else func
        args = call.expressions
        if len(args) != form.count(",") + 1:
            raise self.error(f"{func} takes ({form})", call)
        rel, time = args[0], args[1]
        if not isinstance(rel, (exp.Column, exp.Table)) or isinstance(rel, exp.Column) \
                and rel.table:
            raise self.error(f"the first argument of {func} is the name of a source, view or "
                             f"table ({func}({form}))", rel)
        node = self.relation(rel.name, rel, ctes)
        if not isinstance(time, exp.Column) or time.table:
            raise self.error(f"the second argument of {func} is a column of {rel.name} "
                             f"holding event time ({func}({form}))", time)
        column = next((c for c in node.columns if c.lower() == time.name.lower()), None)
        if column is None:
            raise self.error(f"{func}: {rel.name} has no column {time.name!r} (columns: "
                             f"{', '.join(node.columns)})", time)
        types = dict(zip(node.columns, column_types(node).values()))
        if types.get(column) not in (None, "TIMESTAMP", "TIMESTAMP_LTZ"):
            raise self.error(f"{func}: the time column {column} must be a TIMESTAMP (it is "
                             f"{types[column]})", time)
        taken = [c for c in node.columns if c.lower() in WINDOW_COLUMNS]
        if taken:
            raise self.error(f"{func}: {rel.name} already has a column {taken[0]!r} (a window "
                             f"adds {', '.join(WINDOW_COLUMNS)}); rename it in a view", rel)
        spans = []
        for arg in args[2:]:
            micros = interval_micros(arg)
            if micros is None:
                raise self.error(f"{func}: expected a positive interval such as INTERVAL '1' "
                                 f"MINUTE (units microsecond to week), found "
                                 f"{arg.sql(DIALECT)!r}", arg)
            spans.append(micros)
        size, slide = (spans[0], spans[0]) if func != "HOP" else (spans[1], spans[0])
        if slide > size:
            raise self.error(f"HOP: the slide ({arg_text(args[2])}) is longer than the size "
                             f"({arg_text(args[3])}): some rows would be in no window", call)
        return Window((*node.columns, *WINDOW_COLUMNS), input=node, kind=func.lower(),
                      time=column, size_us=size,
                      slide_us=slide if func == "HOP" else 0), rel.name


    def relation(self, name: str, where: exp.Expression, ctes: dict[str, Node]) -> Node:
        key = name.lower()
        if key in ctes:
            return ctes[key]
        found = self.catalog.relation(name)
        if isinstance(found, ViewStmt):
            return QueryBinder(self.catalog, found.file)._view(found, self)
        if isinstance(found, TableDef):
            self.deps.add(found.name)
            return Scan(found.columns, name=found.name, kind="table",
                        changelog=found.plan.mode, key=found.pk, event_time=found.event_time)
        if isinstance(found, SourceDef):
            self.deps.add(found.name)
            return Scan(found.columns, name=found.name, kind="source", types=found.types,
                        changelog=found.mode, key=found.pk)
        known = sorted([*self.catalog.names(), *ctes])
        raise self.error(f"unknown source, view or table {name!r} (known: "
                         f"{', '.join(known) or 'none'})", where)

    def _view(self, view: ViewStmt, outer: QueryBinder) -> Node:
        node = self.query(view.query, {})
        outer.deps |= self.deps
        return node

    def select(self, select: exp.Select, ctes: dict[str, Node]) -> Node:
        check_supported(select, self.file)
        scope = self.from_(select, ctes)
        group = select.args.get("group")
        having = select.args.get("having")
        is_agg = group is not None or having is not None or any(
            isinstance(n, exp.AggFunc) and n.find_ancestor(exp.Window) is None
            and n.find_ancestor(exp.Select) is select
            for item in select.expressions for n in item.walk())
        if is_agg and (lifted := self.lifted(select, scope, ctes)) is not None:
            return self.select(lifted, ctes)
        select, scope, post = self.scalar_subqueries(select, scope, ctes, is_agg)
        select, scope = self.mark_subqueries(select, scope, ctes, is_agg)
        group, having = select.args.get("group"), select.args.get("having")
        where = select.args.get("where")
        if where is not None:
            scope = self.where(where, scope, ctes)
        items = self.expand_stars(select.expressions, scope)
        names = self.output_names(items)
        windows = [i for i, item in enumerate(items) if isinstance(item, exp.Alias)
                   and isinstance(item.this, exp.Window)]
        order, limit = select.args.get("order"), select.args.get("limit")
        order_cols: dict[str, str] = {}  # ORDER BY expression -> column of the node
        if windows:
            if is_agg:
                raise self.error("a window function over an aggregate: compute the aggregate "
                                 "in a subquery and use the window in the enclosing query",
                                 items[windows[0]])
            if any(isinstance(items[i].this.this, exp.RowNumber) for i in windows):
                node = self.row_number(items, names, windows, scope)
            else:
                node = self.over(items, names, windows, scope)
        elif is_agg:
            node = self.aggregate(items, names, group, having, scope, post)
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
        return self.located(node, select)

    def located(self, node: Node, select: exp.Select) -> Node:
        """``node`` with the nodes this SELECT made (those not marked yet: a subquery's
        are) marked with where it is written (``Node.at``, which errors name)."""
        loc = self.file.select_location(select)
        at = f"{loc.file}:{loc.line}:{loc.col}"
        todo = [node]
        while todo:
            n = todo.pop()
            if not n.at:
                object.__setattr__(n, "at", at)  # an annotation, not part of its value
                todo.extend(n.inputs)
        return node


    def expand_stars(self, items: list[exp.Expression], scope: Scope) -> list[exp.Expression]:
        out: list[exp.Expression] = []
        for item in items:
            star = isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
            if not star:
                out.append(item)
                continue
            rels = [r for r in scope.rels if not r.hidden]
            if isinstance(item, exp.Column):
                rels = [r for r in rels if item.table.lower() in r.aliases]
                if not rels:
                    raise self.error(f"unknown table or alias {item.table!r}", item)
            at = next((x.meta for x in item.walk() if x.meta.get("start") is not None), {})
            for r in rels:
                for written, col in r.columns:
                    if not isinstance(item, exp.Column) and written.lower() in r.merged:
                        continue  # a USING column: once, as the join's merged column
                    ref = exp.column(col, quoted=True)
                    ref.meta.update(at)  # errors about expanded columns point at the star
                    ref.meta["from_star"] = True
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
                star = any(x.meta.get("from_star") for x in item.walk())
                raise self.error(f"duplicate output column {name!r}: " + (
                    "SELECT * reads two columns of that name (from different tables): list "
                    "the columns and give one an alias" if star else "give it an alias"), item)
            names.append(name)
        return tuple(names)

    # -- expressions -----------------------------------------------------------------------
    def rewrite(self, e: exp.Expression, scope: Scope,
                extra: Callable[[exp.Expression], exp.Expression | None] | None = None) -> str:
        """Spark SQL text of ``e`` with column references resolved against ``scope``
        (``extra`` may replace a sub-expression first)."""
        node = e.this if isinstance(e, exp.Alias) else e

        def fix(n: exp.Expression) -> exp.Expression:
            if extra is not None and (repl := extra(n)) is not None:
                return repl
            if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
                return exp.column(scope.resolve(n, self.file), quoted=True)
            return n

        return node.copy().transform(fix).sql(dialect=DIALECT)


def arg_text(e: exp.Expression) -> str:
    return e.sql(DIALECT)


def set_difference(left: Node, right: Node, op: str, distinct: bool) -> Node:
    """``left EXCEPT [ALL] right`` / ``left INTERSECT [ALL] right`` (``op``) over updating
    inputs, with SQL's multiset semantics (NULLs equal), on existing operators: both
    inputs tagged and unioned, a GROUP BY every column counting each side's copies, then
    a filter (the distinct forms: one row where it is kept) or a projection that repeats
    each row as often as it is kept (ALL: ``left - right`` or ``least(left, right)``
    copies, by ``explode``)."""
    cols = left.columns
    taken = {c.lower() for c in cols}
    nl, nr, cl, cr, i = (_fresh(n, taken) for n in ("_in_l", "_in_r", "_n_l", "_n_r", "_i"))
    tagged = tuple(Project((*cols, nl, nr), input=node,
                           exprs=(*(quote(c) for c in node.columns), *tags))
                   for node, tags in ((left, ("1", "0")), (right, ("0", "1"))))
    counts = Aggregate((*cols, cl, cr), input=UnionAll((*cols, nl, nr), children=tagged),
                       keys=cols, aggs=(AggCall("sum", nl), AggCall("sum", nr)))
    ql, qr = quote(cl), quote(cr)
    if distinct:
        right_test = "= 0" if op == "except" else "> 0"
        kept = Filter(counts.columns, input=counts, conditions=(f"{ql} > 0",
                                                                f"{qr} {right_test}"))
        return project(kept, cols, tuple(quote(c) for c in cols))
    copies = f"{ql} - {qr}" if op == "except" else f"least({ql}, {qr})"
    kept = Filter(counts.columns, input=counts, conditions=(f"{copies} > 0",))
    repeated = Project((*cols, i), input=kept, exprs=(*(quote(c) for c in cols),
                                                      f"explode(sequence(1, {copies}))"))
    return Project(cols, input=repeated, exprs=tuple(quote(c) for c in cols))


def _fresh(name: str, taken: set[str]) -> str:
    while name.lower() in taken:
        name = "_" + name
    taken.add(name.lower())
    return name


def _distinct(node: Node) -> Node:
    return Aggregate(node.columns, input=node, keys=node.columns, aggs=(), distinct=True)

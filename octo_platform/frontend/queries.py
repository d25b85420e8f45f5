"""Binding of queries: a SELECT (with its joins, subqueries, aggregates and top-Ns)
becomes a logical plan whose expressions are Spark SQL over plan columns.

Names are resolved against a ``Scope``; views and CTEs are inlined; unsupported shapes
are rejected with an error pointing at the SQL (``shapes``). The plan is built
straightforwardly: the optimizer's rules then push filters, bound top-Ns and prune columns.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Protocol

from sqlglot import exp

from octo_platform.errors import PlanError
from octo_platform.frontend.definitions import SourceDef, TableDef
from octo_platform.frontend.parser import SESSION_CALL, SqlFile, ViewStmt
from octo_platform.frontend.scope import Scope
from octo_platform.frontend.shapes import check_supported, conjuncts, function_name
from octo_platform.logical.plan import (
    AggCall,
    Aggregate,
    Filter,
    Join,
    Node,
    Over,
    Project,
    Scan,
    SortKey,
    TopN,
    UnionAll,
    WINDOW_COLUMNS,
    Window,
    project,
)
from octo_platform.logical.lineage import column_types
from octo_platform.frontend.intervals import interval_micros
from octo_platform.sqltext import DIALECT, quote, unquote

__all__ = ["Relations", "QueryBinder"]

JOIN_KINDS = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}
WINDOW_FUNCTIONS = {"TUMBLE": "relation, time column, size",
                    "HOP": "relation, time column, slide, size",
                    SESSION_CALL: "relation, time column, gap"}
SUPPORTED_AGGS = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min",
                  exp.Max: "max"}


class Relations(Protocol):
    """What a query can read by name (the catalog)."""

    def relation(self, name: str) -> SourceDef | TableDef | ViewStmt | None:
        """The source, bound streaming table or view called ``name`` (any case)."""

    def names(self) -> list[str]:
        """The (lower-case) names of everything ``relation`` finds."""


class QueryBinder:
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

    def from_(self, select: exp.Select, ctes: dict[str, Node]) -> Scope:
        from_ = select.args.get("from_")
        if from_ is None:
            raise self.error("a streaming table needs a FROM clause", select)
        scope = self.from_item(from_.this, ctes)
        for j in select.args.get("joins") or []:
            scope = self.join(scope, j, ctes)
        return scope

    def from_item(self, src: exp.Expression, ctes: dict[str, Node]) -> Scope:
        if isinstance(src, exp.Subquery):
            return Scope.of(self.query(src.this, ctes), {src.alias.lower()} if src.alias
                             else set())
        if isinstance(src, exp.Table) and isinstance(src.this, exp.Anonymous) \
                and src.this.name.upper() in WINDOW_FUNCTIONS:
            node, name = self.window(src.this, ctes)
            return Scope.of(node, {(src.alias or name).lower()})
        if not isinstance(src, exp.Table) or not src.name:
            raise self.error(f"unsupported FROM item {src.sql(DIALECT)!r}", src)
        return Scope.of(self.relation(src.name, src, ctes), {(src.alias or src.name).lower()})

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

    # -- joins -----------------------------------------------------------------------------
    def join(self, left: Scope, j: exp.Join, ctes: dict[str, Node]) -> Scope:
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
            j.args["on"], what, left, right, Scope(left.node, lrels),
            Scope(right.node, rrels), pushable, ambiguous=True)
        node = Join(lnames + rnames, left=lnode, right=rnode, kind=kind,
                    names=lnames + rnames, left_keys=tuple(k[0] for k in keys),
                    right_keys=tuple(k[1] for k in keys), residual=residual)
        return Scope(node, lrels + rrels, joined=True)

    def split_on(self, cond: exp.Expression, what: str, left: Scope, right: Scope,
                 lq: Scope, rq: Scope, pushable: dict[str, bool], *, ambiguous: bool):
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
                Scope(lq.node, lq.rels + rq.rels).resolve(col, self.file)  # raises
            return "l" if in_l else "r"

        def sides(e: exp.Expression) -> set[str]:
            return {side_of(c) for c in e.find_all(exp.Column) if not isinstance(c.this,
                                                                                 exp.Star)}

        both = Scope(rq.node, rq.rels, outer=lq)
        keys: list[tuple[str, str]] = []
        residual: list[str] = []
        pushed: dict[str, list[exp.Expression]] = {"l": [], "r": []}
        for c in conjuncts(cond):
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

    def subquery_join(self, scope: Scope, c: exp.Expression, negated: bool,
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
            check_supported(sub, self.file)
            right = self.from_(sub, ctes)
            rnames, rrels = right.qualified(label)
            where = sub.args.get("where")
            if where is None:
                raise self.error("an EXISTS subquery must be correlated with the outer query "
                                 "by an equality (WHERE inner.col = outer.col)", sub)
            inner_scope = Scope(right.node, right.rels, outer=scope)
            _, inner, keys, residual = self.split_on(
                where.this, "EXISTS subquery", scope, inner_scope, scope,
                Scope(right.node, rrels), {"l": False, "r": True}, ambiguous=False)
        return Join(outer.columns, left=outer, right=inner, kind=kind,
                    names=outer.columns + rnames, left_keys=tuple(k[0] for k in keys),
                    right_keys=tuple(k[1] for k in keys), residual=residual)

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
                raise self.error("a window function over an aggregate: compute the aggregate "
                                 "in a subquery and use the window in the enclosing query",
                                 items[windows[0]])
            if any(isinstance(items[i].this.this, exp.RowNumber) for i in windows):
                node = self.row_number(items, names, windows, scope)
            else:
                node = self.over(items, names, windows, scope)
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

    def where(self, where: exp.Where, scope: Scope, ctes: dict[str, Node]) -> Scope:
        """Filter by the plain conditions; IN / EXISTS subqueries become semi/anti joins.
        (The optimizer's rules move the conditions into joins and top-Ns.)"""
        if any(isinstance(n, exp.AggFunc) for n in where.this.walk()):
            raise self.error("aggregates are not allowed in WHERE (use HAVING)", where)
        plain: list[exp.Expression] = []
        subs: list[tuple[exp.Expression, bool]] = []
        node = scope.node
        for c in conjuncts(where.this):
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
                    limit: exp.Limit, order_cols: dict[str, str], scope: Scope) -> Node:
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
                   windows: list[int], scope: Scope) -> Node:
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

    def over(self, items: list[exp.Expression], names: tuple[str, ...], windows: list[int],
             scope: Scope) -> Node:
        """``f(x) OVER (PARTITION BY p ORDER BY t RANGE BETWEEN INTERVAL ... PRECEDING AND
        CURRENT ROW) AS name`` items: sliding-range aggregates per row."""
        cols = [n for i, n in enumerate(names) if i not in windows]
        exprs = [self.rewrite(item, scope) for i, item in enumerate(items) if i not in windows]

        def column_for(e: exp.Expression) -> str:
            text = self.rewrite(e, scope)
            if text not in exprs:
                exprs.append(text)
                cols.append(f"_w{len(cols)}")
            return cols[exprs.index(text)]

        form = ("f(x) OVER (PARTITION BY ... ORDER BY time RANGE BETWEEN INTERVAL '<n>' "
                "<unit> PRECEDING AND CURRENT ROW), f one of COUNT, SUM, AVG, MIN, MAX")
        calls: list[AggCall] = []
        shapes = set()
        for i in windows:
            w = items[i].this
            fn, spec, order = w.this, w.args.get("spec"), w.args.get("order")
            func = next((f for t, f in SUPPORTED_AGGS.items() if isinstance(fn, t)), None)
            span = interval_micros(spec.args.get("start")) if spec is not None else None
            if (func is None or isinstance(fn.this, exp.Distinct) or spec is None
                    or str(spec.args.get("kind", "")).upper() != "RANGE" or span is None
                    or str(spec.args.get("start_side", "")).upper() != "PRECEDING"
                    or str(spec.args.get("end", "")).upper() != "CURRENT ROW"
                    or order is None or len(order.expressions) != 1
                    or order.expressions[0].args.get("desc")):
                raise self.error(f"supported window functions: ROW_NUMBER() for top-N, and {form}",
                                 w)
            star = isinstance(fn.this, exp.Star) or fn.this is None
            calls.append(AggCall(func, None if star else column_for(fn.this)))
            shapes.add((tuple(column_for(p) for p in w.args.get("partition_by") or []),
                        column_for(order.expressions[0].this), span))
        if len(shapes) > 1:
            raise self.error("the windows of one SELECT must share PARTITION BY, ORDER BY and "
                             "RANGE (use a subquery for another)", items[windows[1]])
        (partition, time, span), = shapes
        pre = project(scope.node, tuple(cols), tuple(exprs))
        kind = column_types(pre).get(time)
        if kind not in (None, "TIMESTAMP", "TIMESTAMP_LTZ"):
            raise self.error(f"ORDER BY of a RANGE INTERVAL window must be a TIMESTAMP (it is "
                             f"{kind})", items[windows[0]])
        node = Over((*pre.columns, *(names[i] for i in windows)), input=pre,
                    partition=partition, time=time, range_us=span, aggs=tuple(calls))
        return project(node, names, tuple(quote(c) for c in names))

    def expand_stars(self, items: list[exp.Expression], scope: Scope) -> list[exp.Expression]:
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

    def aggregate(self, items: list[exp.Expression], names: tuple[str, ...],
                  group: exp.Group | None, having: exp.Having | None, scope: Scope) -> Node:
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
                raise self.error(f"aggregate {function_name(n) or n.key}() is not supported "
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
        src = self.partition_sessions(scope.node, key_sql, group)
        pre = Project(pre_cols, input=src, exprs=tuple(key_sql + arg_sql))
        node: Node = Aggregate(tuple(post_scope_cols) + agg_cols, input=pre,
                               keys=tuple(post_scope_cols), aggs=tuple(calls))
        if having_sql is not None:
            node = Filter(node.columns, input=node, conditions=(having_sql,))
        return project(node, names, tuple(select_sql))


    def partition_sessions(self, node: Node, keys: list[str], group: exp.Group | None
                           ) -> Node:
        """``node`` with a SESSION window under this GROUP BY (through filters) partitioned
        by the GROUP BY's other columns."""
        if isinstance(node, Filter):
            inner = self.partition_sessions(node.input, keys, group)
            return node if inner is node.input else replace(node, input=inner)
        if not isinstance(node, Window) or node.kind != "session":
            return node
        part = [unquote(k) for k in keys if unquote(k) not in WINDOW_COLUMNS]
        if any(p is None or p not in node.input.columns for p in part):
            raise self.error("GROUP BY over SESSION(...): the columns besides window_start "
                             "and window_end partition the sessions, so they must be plain "
                             "columns of the windowed relation", group)
        return replace(node, partition=tuple(p for p in part if p is not None))


def arg_text(e: exp.Expression) -> str:
    return e.sql(DIALECT)


def _distinct(node: Node) -> Node:
    return Aggregate(node.columns, input=node, keys=node.columns, aggs=(), distinct=True)

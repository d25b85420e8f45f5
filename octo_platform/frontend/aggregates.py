"""Binding of GROUP BY, HAVING and aggregate calls (a part of ``QueryBinder``)."""
from __future__ import annotations

import difflib
from dataclasses import replace

from sqlglot import exp

from octo_platform.errors import PlanError
from octo_platform.frontend.ordering import SUPPORTED_AGGS
from octo_platform.frontend.scope import Scope
from octo_platform.frontend.subqueries import Scalar, after_group, is_predicate_subquery
from octo_platform.frontend.shapes import function_name
from octo_platform.logical.plan import (
    CROSS_KEY,
    WINDOW_COLUMNS,
    Join,
    AggCall,
    Aggregate,
    Filter,
    Node,
    Project,
    Window,
    project,
)
from octo_platform.sqltext import DIALECT, quote, referenced_columns, rename_columns, unquote

__all__ = ["AggregateBinding", "having_condition", "select_aliases"]


class AggregateBinding:
    """GROUP BY of ``QueryBinder`` (mixed into it)."""

    def aggregate(self, items: list[exp.Expression], names: tuple[str, ...],
                  group: exp.Group | None, having: exp.Having | None, scope: Scope,
                  post_scalars: tuple[Scalar, ...] = ()) -> Node:
        """GROUP BY; ``post_scalars`` are (uncorrelated) scalar subqueries read beside the
        aggregates or in HAVING: joined after it."""
        labels = {s.label.lower() for s in post_scalars}
        group_exprs = self.group_expressions(items, group, scope)
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
                    raise self.error(f"{func.upper()}(DISTINCT ...) takes exactly one "
                                     "expression", n)
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
            if isinstance(n, exp.Column) and n.table.lower() in labels:
                return exp.column(n.name, quoted=True)  # a scalar subquery's, joined below
            if isinstance(n, (exp.Literal, exp.Null, exp.Boolean)):
                return None
            try:
                text = self.rewrite(n, scope)
            except PlanError:
                return None
            if text in key_sql:
                return exp.column(f"_g{key_sql.index(text)}", quoted=True)
            if isinstance(n, exp.Column):
                call = n.find_ancestor(exp.Anonymous)  # a function sqlglot does not know
                if call is not None:  # e.g. a misspelt aggregate
                    raise self.error(_not_aggregate(call, n), call)
                raise self.error(f"column {n.sql(DIALECT)!r} must appear in GROUP BY or be "
                                 "used in an aggregate", n)
            return None

        post_scope_cols = [f"_g{i}" for i in range(len(key_sql))]
        select_sql = [self.rewrite(i, scope, post) for i in items]
        having_sql = None
        if having is not None:
            having_sql = self.rewrite(having_condition(having, items, scope), scope, post)
        agg_cols = tuple(f"_agg{i}" for i in range(len(calls)))
        pre_cols = tuple(post_scope_cols) + tuple(f"_a{i}" for i in range(len(arg_sql)))
        src = self.partition_sessions(scope.node, key_sql, group)
        pre = Project(pre_cols, input=src, exprs=tuple(key_sql + arg_sql))
        if any(c.distinct and c.func in ("sum", "avg") for c in calls):
            node: Node = distinct_parts(pre, tuple(post_scope_cols), tuple(calls), agg_cols)
        else:
            node = Aggregate(tuple(post_scope_cols) + agg_cols, input=pre,
                             keys=tuple(post_scope_cols), aggs=tuple(calls))
        for scalar in post_scalars:
            node = self.join_after(node, scalar, key_sql)
        if having_sql is not None:
            node = Filter(node.columns, input=node, conditions=(having_sql,))
        return project(node, names, tuple(select_sql))


    def lifted(self, select: exp.Select, scope: Scope, ctes: dict[str, Node]
               ) -> exp.Select | None:
        """``select``, a GROUP BY, as a SELECT over it when ``IN`` / ``EXISTS`` / ``ANY`` /
        ``ALL`` (subquery) stands in its HAVING or beside its aggregates: a derived table
        computes the GROUP BY's keys (``_g0``, ...) and aggregates (``_x0``, ...), and the
        enclosing SELECT reads them, HAVING as its WHERE, so those subqueries are bound as
        in any WHERE and SELECT (a correlated one there reads the GROUP BY columns as the
        derived table's). None when there is no such subquery."""
        items = select.expressions
        if not any(n.find_ancestor(exp.Select) is select and is_predicate_subquery(n)
                   and after_group(n, select) for n in select.walk()) or any(
                isinstance(i, exp.Star) or isinstance(i, exp.Column)
                and isinstance(i.this, exp.Star) for i in items):
            return None
        self.subqueries += 1
        label = f"_l{self.subqueries}"
        keys = self.group_expressions(items, select.args.get("group"), scope)
        key_sql = [self.rewrite(k, scope) for k in keys]
        aggs: list[exp.Expression] = []
        names = self.output_names(items)

        def ref(column: str) -> exp.Column:
            return exp.column(column, table=label, quoted=True)

        def outer_columns(sub: exp.Select) -> None:
            """The columns of ``sub`` (a subquery) that name this query's: as the derived
            table's GROUP BY columns."""
            for col in list(sub.find_all(exp.Column)):
                try:
                    own = self.from_(col.find_ancestor(exp.Select), ctes).lookup(col, self.file)
                except PlanError:
                    own = None
                if own is not None or scope.lookup(col, self.file) is None:
                    continue
                text = self.rewrite(col, scope)
                if text not in key_sql:
                    raise self.error(f"column {col.sql(DIALECT)!r} must appear in GROUP BY "
                                     "to be read by a subquery in HAVING or beside the "
                                     "aggregates", col)
                col.replace(ref(f"_g{key_sql.index(text)}"))

        def swap(n: exp.Expression, keep: set[str] = frozenset()) -> exp.Expression:
            """``n`` (in place) with this query's aggregates and GROUP BY expressions as
            the derived table's columns; ``keep``: output names left as they are."""
            if isinstance(n, exp.Select):
                outer_columns(n)
                return n
            if isinstance(n, exp.AggFunc):
                text = n.sql(DIALECT)
                found = next((i for i, a in enumerate(aggs) if a.sql(DIALECT) == text), None)
                if found is None:
                    aggs.append(n.copy())
                    found = len(aggs) - 1
                return n.replace(ref(f"_x{found}"))
            if isinstance(n, exp.Column) and not n.table and n.name.lower() in keep:
                return n
            if not isinstance(n, (exp.Literal, exp.Null, exp.Boolean)) and not any(
                    isinstance(x, exp.Select) for x in n.walk()):
                try:
                    text = self.rewrite(n, scope)
                except PlanError:
                    text = None
                if text in key_sql:
                    return n.replace(ref(f"_g{key_sql.index(text)}"))
                if isinstance(n, exp.Column):
                    raise self.error(f"column {n.sql(DIALECT)!r} must appear in GROUP BY or "
                                     "be used in an aggregate", n)
            for child in list(n.iter_expressions()):
                swap(child, keep)
            return n

        outer_items = []
        for item, name in zip(items, names):
            value = swap((item.this if isinstance(item, exp.Alias) else item).copy())
            outer_items.append(exp.alias_(value, name, quoted=True))
        having = select.args.get("having")
        where = swap(having_condition(having, items, scope)) if having is not None else None
        order = select.args.get("order")
        if order is not None:
            order = order.copy()
            for o in order.expressions:
                swap(o.this, {n.lower() for n in names})
        inner = exp.Select(expressions=[
            *(exp.alias_(k.copy(), f"_g{i}", quoted=True) for i, k in enumerate(keys)),
            *(exp.alias_(a, f"_x{i}", quoted=True) for i, a in enumerate(aggs))])
        for arg in ("from_", "joins", "where"):
            if select.args.get(arg) is not None:
                inner.set(arg, select.args[arg].copy() if arg != "joins"
                          else [j.copy() for j in select.args[arg]])
        if keys:
            inner.set("group", exp.Group(expressions=[k.copy() for k in keys]))
        outer = exp.Select(expressions=outer_items)
        outer.set("from_", exp.From(this=exp.Subquery(
            this=inner, alias=exp.TableAlias(this=exp.to_identifier(label)))))
        for arg, value in (("where", exp.Where(this=where) if where is not None else None),
                           ("order", order), ("limit", select.args.get("limit")),
                           ("distinct", select.args.get("distinct"))):
            if value is not None:
                outer.set(arg, value.copy() if arg != "order" else value)
        return outer

    def group_expressions(self, items: list[exp.Expression], group: exp.Group | None,
                          scope: Scope) -> list[exp.Expression]:
        """The GROUP BY's expressions, a position (``GROUP BY 1``) or a select alias that
        names no input column replaced by the select item's expression."""
        aliases = select_aliases(items)
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
        return group_exprs

    def join_after(self, node: Node, scalar: Scalar, key_sql: list[str]) -> Node:
        """``node`` (a GROUP BY's output) LEFT JOIN a scalar subquery read after it: on the
        constant key, or on its correlation with GROUP BY columns."""
        right = tuple(f"{scalar.label}.{c}" for c in scalar.node.columns)
        group = {unquote(k): f"_g{i}" for i, k in enumerate(key_sql) if unquote(k)}
        lkeys = []
        for k in scalar.outer_keys:
            if not referenced_columns(k) <= set(group):
                raise self.error("a correlated subquery in HAVING or beside the aggregates of "
                                 "a GROUP BY may compare inner columns only with GROUP BY "
                                 "columns", scalar.at)
            lkeys.append(rename_columns(k, group))
        inner = scalar.inner_keys or tuple(quote(c) for c in
                                           scalar.node.columns[:len(scalar.outer_keys)])
        rkeys = [rename_columns(k, dict(zip(scalar.node.columns, right))) for k in inner]
        return Join(node.columns + right, left=node, right=scalar.node, kind="left",
                    names=node.columns + right, left_keys=tuple(lkeys) or (CROSS_KEY,),
                    right_keys=tuple(rkeys) or (CROSS_KEY,))

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



def select_aliases(items: list[exp.Expression]) -> dict[str, exp.Alias]:
    """The aliased select items by alias, lower case."""
    return {i.alias.lower(): i for i in items if isinstance(i, exp.Alias)}


def having_condition(having: exp.Having, items: list[exp.Expression], scope: Scope
                     ) -> exp.Expression:
    """HAVING's condition (a copy); a select alias it names that is no input column (Spark
    lets HAVING name one) replaced by the aliased expression."""
    aliases = select_aliases(items)

    def unalias(n: exp.Expression) -> exp.Expression:
        if (isinstance(n, exp.Column) and not n.table and n.name.lower() in aliases
                and not scope.has_column(n.name)):
            return aliases[n.name.lower()].this.copy()
        return n

    return having.this.copy().transform(unalias)


def distinct_parts(pre: Node, keys: tuple[str, ...], calls: tuple[AggCall, ...],
                   names: tuple[str, ...]) -> Node:
    """GROUP BY ``keys`` computing ``calls`` (named ``names``), some SUM / AVG (DISTINCT):
    per DISTINCT argument one GROUP BY (``expand_distinct``; the other aggregates in the
    first), joined on ``keys``, NULLs equal (each has a row for every group: the same
    input's)."""
    args = list(dict.fromkeys(c.arg for c in calls if c.distinct))
    parts: list[Node] = []
    for j, x in enumerate(args):
        mine = [i for i, c in enumerate(calls)
                if c.distinct and c.arg == x or j == 0 and not c.distinct]
        part_calls, part_names = tuple(calls[i] for i in mine), tuple(names[i] for i in mine)
        parts.append(expand_distinct(pre, keys, part_calls, part_names) if any(
            c.func in ("sum", "avg") for c in part_calls if c.distinct) else Aggregate(
            keys + part_names, input=pre, keys=keys, aggs=part_calls))
    node = parts[0]
    for j, part in enumerate(parts[1:], 1):
        right = tuple(f"_d{j}.{c}" for c in part.columns)

        def same(cols: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(e for c in cols[:len(keys)] for e in (
                f"isnull({quote(c)})", f"coalesce(CAST({quote(c)} AS STRING), '')"))
        node = Join(node.columns + right, left=node, right=part, kind="inner",
                    names=node.columns + right, left_keys=same(node.columns) or (CROSS_KEY,),
                    right_keys=same(right) or (CROSS_KEY,))
    at = {c: c for c in parts[0].columns}
    for j, part in enumerate(parts[1:], 1):
        at.update({c: f"_d{j}.{c}" for c in part.columns[len(keys):]})
    return project(node, keys + names, tuple(quote(at[c]) for c in keys + names))


def expand_distinct(pre: Node, keys: tuple[str, ...], calls: tuple[AggCall, ...],
                    names: tuple[str, ...]) -> Node:
    """GROUP BY ``keys`` computing ``calls`` (named ``names``), whose DISTINCT ones share
    one argument ``x``, as two GROUP BYs: by ``keys`` and ``x`` (each distinct value once,
    the other aggregates in parts), then by ``keys`` (the distinct ones over ``x``, the
    others merging their parts: counts and sums summed, MIN of MINs, AVG as sum / count).
    COUNT over no rows stays 0 (a global aggregate's parts can all be missing)."""
    x = next(c.arg for c in calls if c.distinct)
    assert x is not None
    parts: list[AggCall] = []
    finals: list[AggCall] = []
    outs: list[str] = []

    def part(call: AggCall) -> str:
        if call not in parts:
            parts.append(call)
        return f"_p{parts.index(call)}"

    def final(call: AggCall) -> str:
        if call not in finals:
            finals.append(call)
        return quote(f"_f{finals.index(call)}")

    for c in calls:
        if c.distinct:  # each (keys, x) group once: the aggregate over x
            outs.append(final(AggCall("count" if c.func == "count" else c.func, x)))
        elif c.func == "count":
            outs.append(f"coalesce({final(AggCall('sum', part(c)))}, 0)")
        elif c.func == "avg":
            total = final(AggCall("sum", part(AggCall("sum", c.arg))))
            count = final(AggCall("sum", part(AggCall("count", c.arg))))
            outs.append(f"CASE WHEN {count} > 0 THEN {total} / {count} END")
        else:  # sum, min, max: of the parts
            outs.append(final(AggCall(c.func, part(c))))
    inner_keys = (*keys, x)
    part_cols = tuple(f"_p{i}" for i in range(len(parts)))
    if parts:
        inner: Node = Aggregate(inner_keys + part_cols, input=pre, keys=inner_keys,
                                aggs=tuple(parts))
    else:  # the distinct (keys, x) pairs
        pairs = project(pre, inner_keys, tuple(quote(k) for k in inner_keys))
        inner = Aggregate(inner_keys, input=pairs, keys=inner_keys, distinct=True)
    outer = Aggregate((*keys, *(f"_f{i}" for i in range(len(finals)))), input=inner,
                      keys=keys, aggs=tuple(finals))
    return Project((*keys, *names), input=outer,
                   exprs=(*(quote(k) for k in keys), *outs))


def _not_aggregate(call: exp.Anonymous, column: exp.Column) -> str:
    """The error of an ungrouped ``column`` inside ``call``, a function octo does not know
    as an aggregate (Spark may know it as a scalar function)."""
    name = str(call.this)
    close = difflib.get_close_matches(name.lower(), list(SUPPORTED_AGGS.values()), n=1)
    hint = f" (did you mean {close[0].upper()}?)" if close else ""
    return (f"{name}() is no aggregate octo knows{hint}: as a scalar function, its column "
            f"{column.sql(DIALECT)!r} must appear in GROUP BY (aggregates: COUNT, SUM, AVG, "
            "MIN, MAX, COUNT(DISTINCT))")

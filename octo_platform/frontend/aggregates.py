"""Binding of GROUP BY, HAVING and aggregate calls (a part of ``QueryBinder``)."""
from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from octo_platform.errors import PlanError
from octo_platform.frontend.ordering import SUPPORTED_AGGS
from octo_platform.frontend.scope import Scope
from octo_platform.frontend.shapes import function_name
from octo_platform.logical.plan import (
    WINDOW_COLUMNS,
    AggCall,
    Aggregate,
    Filter,
    Node,
    Project,
    Window,
    project,
)
from octo_platform.sqltext import DIALECT, unquote

__all__ = ["AggregateBinding"]


class AggregateBinding:
    """GROUP BY of ``QueryBinder`` (mixed into it)."""

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


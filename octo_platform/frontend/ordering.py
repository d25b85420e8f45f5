"""Binding of ordered shapes: ``ORDER BY ... LIMIT`` and ``ROW_NUMBER()`` top-Ns, and
aggregates ``OVER`` a sliding time range (a part of ``QueryBinder``)."""
from __future__ import annotations

from sqlglot import exp

from octo_platform.frontend.intervals import interval_micros
from octo_platform.frontend.scope import Scope
from octo_platform.logical.lineage import column_types
from octo_platform.logical.plan import AggCall, Node, Over, SortKey, TopN, project
from octo_platform.sqltext import quote

__all__ = ["OrderBinding", "SUPPORTED_AGGS"]

SUPPORTED_AGGS = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min",
                  exp.Max: "max"}


class OrderBinding:
    """Top-N and OVER windows of ``QueryBinder`` (mixed into it)."""

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

    def window_column(self, e: exp.Expression, scope, cols: list[str],
                      exprs: list[str]) -> str:
        """The column of the projection under a window that holds ``e``'s value: an
        existing one with the same SQL, else a new ``_w<i>`` appended to ``cols``/``exprs``."""
        text = self.rewrite(e, scope)
        if text not in exprs:
            exprs.append(text)
            cols.append(f"_w{len(cols)}")
        return cols[exprs.index(text)]

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
            return self.window_column(e, scope, cols, exprs)

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
            return self.window_column(e, scope, cols, exprs)

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

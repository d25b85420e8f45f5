"""Binding of subqueries used as values (a part of ``QueryBinder``).

Scalar subqueries. An uncorrelated one returns at most one row (a global aggregate, or a
top-1): the query reads it through a LEFT JOIN on the constant key (its one row beside
every row; NULL when it has none), so a change of its value retracts and re-emits the
rows that used it. A correlated one, ``(SELECT agg FROM t WHERE t.k = outer.k AND ...)``,
is decorrelated: GROUP BY the inner sides of its equalities, LEFT JOIN on them, and where
no group matches, the value over no rows (``COUNT`` 0, other aggregates NULL). Correlated
by other conditions (``x.b < t.b``), it is computed per distinct value of the outer
columns it reads (joined with its FROM by its whole WHERE, grouped by them) and joined
back on those columns, NULLs equal.

Marks. ``IN (subquery)``, ``EXISTS`` and their negations anywhere but as conditions AND-ed
in WHERE (those are semi / anti joins) become a truth value per row, read from LEFT JOINs
with the subquery's distinct values (or keys), with ``IN``'s NULLs.

Used in WHERE, in a plain SELECT list or inside an aggregate's argument, the join comes
before the WHERE; a scalar subquery in HAVING or beside the aggregates of a GROUP BY
comes after it (a correlated one there is correlated with GROUP BY columns).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from octo_platform.errors import PlanError
from octo_platform.frontend.scope import Rel, Scope
from octo_platform.frontend.shapes import conjuncts, one_row
from octo_platform.logical.plan import (
    CROSS_KEY,
    AggCall,
    Aggregate,
    Filter,
    Join,
    Node,
    Project,
    TopN,
)
from octo_platform.sqltext import quote, rename_columns

__all__ = ["SubqueryBinding", "Scalar", "after_group", "for_existence", "is_predicate_subquery"]

WHERE_TO_WRITE = ("write it as a join with a GROUP BY subquery (FROM t JOIN (SELECT k, "
                  "agg(...) AS v FROM u GROUP BY k) s ON s.k = t.k)")


@dataclass
class Scalar:
    """A bound scalar subquery: its plan (its columns named ``label.column``) and, for a
    correlated one, the outer expressions equal to its first columns."""

    label: str
    node: Node
    outer_keys: tuple[str, ...] = ()
    inner_keys: tuple[str, ...] = ()  # over the node's columns; default: its first ones
    at: exp.Expression | None = None  # a correlated one: where it is written


class SubqueryBinding:
    """Scalar subqueries of ``QueryBinder`` (mixed into it)."""

    def scalar_subqueries(self, select: exp.Select, scope: Scope, ctes: dict[str, Node],
                          is_agg: bool) -> tuple[exp.Select, Scope, tuple[Scalar, ...]]:
        """``select`` (a copy) with each scalar subquery replaced by a column of it; the
        scope joined with those read before the WHERE; those read after the GROUP BY."""
        subs = [s for s in select.find_all(exp.Subquery) if _is_scalar(s, select)]
        if not subs:
            return select, scope, ()
        select = select.copy()
        subs = [s for s in select.find_all(exp.Subquery) if _is_scalar(s, select)]
        post: list[Scalar] = []
        for sub in subs:
            where = _clause(sub, select)
            if where not in ("expressions", "where", "having"):
                raise self.error("a scalar subquery is supported in SELECT, WHERE and HAVING",
                                 sub)
            after = is_agg and after_group(sub, select)
            self.subqueries += 1
            label = f"_sq{self.subqueries}"
            scalar, value = self.scalar(sub, scope, label, ctes)
            if after:
                post.append(scalar)
            else:
                scope = self.join_scalar(scope, scalar, _rel(scalar))
            sub.replace(value)
        return select, scope, tuple(post)

    def mark_subqueries(self, select: exp.Select, scope: Scope, ctes: dict[str, Node],
                        is_agg: bool) -> tuple[exp.Select, Scope]:
        """``select`` (a copy) with each ``IN (subquery)`` / ``EXISTS`` that is not a
        condition AND-ed in WHERE (those are semi / anti joins), and each ``x <op> ANY /
        ALL (subquery)``, replaced by its truth value per row, read from LEFT JOINs (a mark
        join), and the scope so joined."""
        def is_mark(n: exp.Expression, s: exp.Select) -> bool:
            return (n.find_ancestor(exp.Select) is s and is_predicate_subquery(n)
                    and (_quantified(n) is not None or not _is_top_conjunct(n, s)))

        def marks(s: exp.Select) -> list[exp.Expression]:
            return [n for n in s.find_all(exp.In, exp.Exists, *_QUANTIFIED) if is_mark(n, s)]

        if not marks(select):
            return select, scope
        select = select.copy()
        for node in marks(select):
            clause = _clause(node, select)
            if clause not in ("expressions", "where") or is_agg and clause == "expressions" and (
                    node.find_ancestor(exp.AggFunc) is None):
                raise self.error("IN / EXISTS (subquery) is supported in WHERE, in a SELECT "
                                 "without GROUP BY and inside aggregates; beside the "
                                 "aggregates of a GROUP BY or in HAVING, compute it in a "
                                 "subquery first", node)
            scope, value = (self.in_mark(node, scope, ctes) if isinstance(node, exp.In)
                            else self.exists_mark(node, scope, ctes)
                            if isinstance(node, exp.Exists)
                            else self.quantified_mark(node, scope, ctes))
            node.replace(value)
        return select, scope

    def in_mark(self, node: exp.In, scope: Scope, ctes: dict[str, Node]
                ) -> tuple[Scope, exp.Expression]:
        """``x IN (SELECT y ...)`` per row, with SQL's NULLs: TRUE on a match; else FALSE
        when the subquery is empty, NULL when ``x`` is NULL or the subquery has a NULL."""
        query = node.args["query"].this
        x = node.this.copy()
        try:
            inner = self.query(query, ctes)
        except PlanError:
            if not isinstance(query, exp.Select) or not self.references_outer(query, scope,
                                                                               ctes):
                raise
            # correlated: EXISTS a row equal to x; its row counts as correlated aggregates
            item = query.expressions[0] if len(query.expressions) == 1 else None
            y = item.this if isinstance(item, exp.Alias) else item
            if y is None or any(isinstance(n, exp.AggFunc) for n in y.walk()) or any(
                    query.args.get(a) is not None for a in ("distinct", "group", "limit")):
                raise self.error("a correlated IN (subquery) outside a condition AND-ed in "
                                 "WHERE is supported over one column of its rows (no "
                                 "aggregate, DISTINCT, GROUP BY or LIMIT)", node)
            equal = query.copy()
            equal.set("where", exp.Where(this=exp.and_(
                exp.Paren(this=query.args["where"].this.copy()),
                exp.EQ(this=y.copy(), expression=x.copy()))))
            scope, found = self.exists_mark(exp.Exists(this=equal), scope, ctes)
            self.subqueries += 1
            stats, (n, nn) = self.correlated(
                query, scope, f"_sq{self.subqueries}", ctes,
                values=(exp.Count(this=exp.Star()), exp.Count(this=y.copy())),
                what="a correlated IN (subquery)")
            scope = self.join_scalar(scope, stats, _rel(stats))
        else:
            if len(inner.columns) != 1:
                raise self.error(f"an IN subquery must return one column (it returns "
                                 f"{len(inner.columns)})", node)
            y = inner.columns[0]
            values = Aggregate(inner.columns, input=inner, keys=inner.columns, distinct=True)
            counts = Aggregate(("n", "nn"), input=inner, keys=(),
                               aggs=(AggCall("count", None), AggCall("count", y)))
            self.subqueries += 1
            match = Scalar(f"_sq{self.subqueries}", values, (self.rewrite(node.this, scope),))
            self.subqueries += 1
            stats = Scalar(f"_sq{self.subqueries}", counts)
            for s in (match, stats):
                scope = self.join_scalar(scope, s, _rel(s))
            found = exp.Not(this=exp.Is(this=_column(match.label, y), expression=exp.Null()))
            n, nn = _column(stats.label, "n"), _column(stats.label, "nn")
        value = exp.Case(ifs=[
            exp.If(this=found, true=exp.true()),
            exp.If(this=exp.EQ(this=n, expression=exp.Literal.number(0)), true=exp.false()),
            exp.If(this=exp.or_(exp.Is(this=exp.Paren(this=x), expression=exp.Null()),
                                exp.LT(this=nn, expression=n.copy())),
                   true=exp.Cast(this=exp.Null(), to=exp.DataType.build("BOOLEAN")))],
            default=exp.false())
        return scope, exp.Paren(this=value)

    def quantified_mark(self, node: exp.Expression, scope: Scope, ctes: dict[str, Node]
                        ) -> tuple[Scope, exp.Expression]:
        """``x <op> ANY / ALL (SELECT y ...)`` per row, with SQL's NULLs: from the subquery's
        row count ``n``, count of non-NULL values ``nn``, least ``lo`` and greatest ``hi``
        value (one row, joined on the constant key). ``= ANY`` is ``IN``, ``<> ALL`` is
        ``NOT IN``. ANY: FALSE over no rows, else NULL for a NULL ``x``, else TRUE when
        some value satisfies the comparison, else NULL when the subquery has a NULL, else
        FALSE; ALL the same with TRUE and FALSE swapped, asking whether some value fails."""
        quantifier = node.expression
        query = _quantified(node)
        every = isinstance(quantifier, exp.All)
        op = _QUANTIFIED[type(node)]
        if (op, every) in (("=", False), ("<>", True)):
            scope, value = self.in_mark(exp.In(this=node.this.copy(), query=exp.Subquery(
                this=query.copy())), scope, ctes)
            return scope, exp.Paren(this=exp.Not(this=value)) if every else value
        what = f"an {'ALL' if every else 'ANY'} subquery"
        self.subqueries += 1
        label = f"_sq{self.subqueries}"
        try:
            inner = self.query(query, ctes)
        except PlanError:
            if not isinstance(query, exp.Select) or not self.references_outer(query, scope,
                                                                               ctes):
                raise
            # correlated: the four values per row, as correlated aggregates
            if len(query.expressions) != 1:
                raise self.error(f"{what} must return one column (it returns "
                                 f"{len(query.expressions)})", node)
            item = query.expressions[0]
            y = item.this if isinstance(item, exp.Alias) else item
            s, (n, nn, lo, hi) = self.correlated(query, scope, label, ctes, values=(
                exp.Count(this=exp.Star()), exp.Count(this=y.copy()), exp.Min(this=y.copy()),
                exp.Max(this=y.copy())), what=f"a correlated {what}")
        else:
            if len(inner.columns) != 1:
                raise self.error(f"{what} must return one column (it returns "
                                 f"{len(inner.columns)})", node)
            y = inner.columns[0]
            s = Scalar(label, Aggregate(("n", "nn", "lo", "hi"), input=inner, keys=(), aggs=(
                AggCall("count", None), AggCall("count", y), AggCall("min", y),
                AggCall("max", y))))
            n, nn, lo, hi = (_column(s.label, c) for c in ("n", "nn", "lo", "hi"))
        scope = self.join_scalar(scope, s, _rel(s))

        def x() -> exp.Expression:
            return exp.Paren(this=node.this.copy())

        def cmp(kind: type, a: exp.Expression, b: exp.Expression) -> exp.Expression:
            return kind(this=a.copy(), expression=b.copy())
        # ANY: some value v with x <op> v; ALL: some value v with NOT (x <op> v); as the
        # comparison with the least or greatest value (``differs``: with either)
        kind, bound = {(">", False): (exp.GT, lo), (">=", False): (exp.GTE, lo),
                       ("<", False): (exp.LT, hi), ("<=", False): (exp.LTE, hi),
                       (">", True): (exp.LTE, hi), (">=", True): (exp.LT, hi),
                       ("<", True): (exp.GTE, lo), ("<=", True): (exp.GT, lo)}.get(
            (op, every), (None, None))
        some = cmp(kind, x(), bound) if kind is not None else exp.or_(
            cmp(exp.NEQ, lo, x()), cmp(exp.NEQ, hi, x()))
        found, empty = (exp.false(), exp.true()) if every else (exp.true(), exp.false())
        null = exp.Cast(this=exp.Null(), to=exp.DataType.build("BOOLEAN"))
        zero = exp.Literal.number(0)
        value = exp.Case(ifs=[
            exp.If(this=cmp(exp.EQ, n, zero), true=empty),
            exp.If(this=exp.Is(this=x(), expression=exp.Null()), true=null),
            exp.If(this=exp.and_(cmp(exp.GT, nn, zero), exp.Paren(this=some)), true=found),
            exp.If(this=cmp(exp.LT, nn, n), true=null.copy())],
            default=empty.copy())
        return scope, exp.Paren(this=value)

    def exists_mark(self, node: exp.Exists, scope: Scope, ctes: dict[str, Node]
                    ) -> tuple[Scope, exp.Expression]:
        """``EXISTS (SELECT ... WHERE inner.k = outer.k AND ...)`` per row: a LEFT JOIN
        with the distinct inner keys; uncorrelated, whether the subquery has a row."""
        query = for_existence(node.this)
        self.subqueries += 1
        label = f"_sq{self.subqueries}"
        if not isinstance(query, exp.Select):
            raise self.error("EXISTS takes a SELECT", node)
        if one_row(query):
            self.from_(query, ctes)  # its FROM must still exist
            return scope, exp.true()
        if not self.references_outer(query, scope, ctes):
            counts = Aggregate(("n",), input=self.query(query, ctes), keys=(),
                               aggs=(AggCall("count", None),))
            s = Scalar(label, counts)
            scope = self.join_scalar(scope, s, _rel(s))
            return scope, exp.Paren(this=exp.GT(this=_column(label, "n"),
                                                expression=exp.Literal.number(0)))
        for arg in ("limit", "order"):
            if query.args.get(arg) is not None:
                raise self.error(f"{arg.upper()} in a correlated EXISTS is not supported here",
                                 query.args[arg])
        if query.args.get("having") is not None:
            node, outer_keys = self.groups_kept(query, scope, ctes)
            s = Scalar(label, node, tuple(outer_keys))
            scope = self.join_scalar(scope, s, _rel(s))
            return scope, exp.Paren(this=exp.Not(this=exp.Is(this=_column(label, "_e"),
                                                               expression=exp.Null())))
        inner = self.from_(query, ctes)
        split = self.correlation(query, inner, scope, "a correlated EXISTS", strict=False)
        if split is None:  # correlated otherwise: whether COUNT(*) over its rows > 0
            count = exp.Count(this=exp.Star())
            s, (value,) = self.correlated_by_rows(query, (count,), inner, scope, label, ctes)
            scope = self.join_scalar(scope, s, _rel(s))
            return scope, exp.Paren(this=exp.GT(this=value, expression=exp.Literal.number(0)))
        inner_keys, outer_keys, kept = split
        grouped = query.copy()
        grouped.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
        grouped.set("distinct", None)
        grouped.set("group", exp.Group(expressions=[k.copy() for k in inner_keys]))
        grouped.set("expressions", [exp.alias_(k.copy(), f"_k{i}", quoted=True)
                                    for i, k in enumerate(inner_keys)])
        s = Scalar(label, self.query(grouped, ctes), tuple(outer_keys))
        scope = self.join_scalar(scope, s, _rel(s))
        return scope, exp.Paren(this=exp.Not(this=exp.Is(this=_column(label, "_k0"),
                                                           expression=exp.Null())))

    def groups_kept(self, query: exp.Select, scope: Scope, ctes: dict[str, Node]
                    ) -> tuple[Node, list[str]]:
        """``EXISTS (SELECT ... WHERE inner.k = outer.k AND ... GROUP BY g HAVING h)``: the
        distinct inner sides ``_k0``, ... of its correlation equalities over the groups (by
        them and ``g``) that HAVING keeps, beside TRUE (``_e``), and the outer expressions
        equal to them."""
        inner = self.from_(query, ctes)
        inner_keys, outer_keys, kept = self.correlation(
            query, inner, scope, "a correlated EXISTS with HAVING")
        group = query.args.get("group")
        grouped = query.copy()
        grouped.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
        by = [*(k.copy() for k in inner_keys),
              *(g.copy() for g in (group.expressions if group is not None else []))]
        grouped.set("group", exp.Group(expressions=by) if by else None)
        grouped.set("expressions", [
            *(exp.alias_(k.copy(), f"_k{i}", quoted=True) for i, k in enumerate(inner_keys)),
            exp.alias_(exp.true(), "_e", quoted=True)])
        grouped.set("distinct", exp.Distinct())
        return self.query(grouped, ctes), outer_keys

    def correlation(self, query: exp.Select, inner: Scope, scope: Scope, what: str,
                    strict: bool = True
                    ) -> tuple[list[exp.Expression], list[str], list[exp.Expression]] | None:
        """The WHERE of a correlated subquery split: the inner sides of its correlation
        equalities, their outer sides (against ``scope``), and the other conditions; None
        (an error if ``strict``) when a condition reads outer columns otherwise."""
        inner_keys: list[exp.Expression] = []
        outer_keys: list[str] = []
        kept: list[exp.Expression] = []
        where = query.args.get("where")
        for c in conjuncts(where.this) if where is not None else []:
            sides = {_side(col, inner, scope, self.file) for col in c.find_all(exp.Column)}
            if "outer" not in sides:
                kept.append(c)
                continue
            if isinstance(c, exp.EQ):
                a = {_side(col, inner, scope, self.file) for col in c.this.find_all(exp.Column)}
                b = {_side(col, inner, scope, self.file)
                     for col in c.expression.find_all(exp.Column)}
                pair = ((c.this, c.expression) if a == {"inner"} and b == {"outer"} else
                        (c.expression, c.this) if a == {"outer"} and b == {"inner"} else None)
                if pair is not None:
                    inner_keys.append(pair[0])
                    outer_keys.append(self.rewrite(pair[1], scope))
                    continue
            if not strict:
                return None
            raise self.error(f"{what} is supported when it is correlated by equalities "
                             f"(WHERE inner.col = outer.col): this condition is not one; "
                             f"{WHERE_TO_WRITE}", c)
        return inner_keys, outer_keys, kept

    def join_scalar(self, scope: Scope, scalar: Scalar, rel: Rel) -> Scope:
        """``scope`` LEFT JOIN the subquery (on its correlation keys, or the constant)."""
        label = next(iter(scope.rels[0].aliases), "_from")
        names, rels = scope.qualified(label)
        right = tuple(f"{scalar.label}.{c}" for c in scalar.node.columns)
        rename = dict(zip(scope.node.columns, names))
        lkeys = tuple(rename_columns(k, rename) for k in scalar.outer_keys) or (CROSS_KEY,)
        inner = scalar.inner_keys or tuple(quote(c) for c in
                                           scalar.node.columns[:len(scalar.outer_keys)])
        mine = dict(zip(scalar.node.columns, right))
        rkeys = tuple(rename_columns(k, mine) for k in inner) or (CROSS_KEY,)
        node = Join(names + right, left=scope.node, right=scalar.node, kind="left",
                    names=names + right, left_keys=lkeys, right_keys=rkeys)
        return Scope(node, rels + [rel], scope.outer, joined=True)

    def scalar(self, sub: exp.Subquery, scope: Scope, label: str, ctes: dict[str, Node]
               ) -> tuple[Scalar, exp.Expression]:
        """The plan of one scalar subquery and the expression that stands for it."""
        query = sub.this
        try:
            node = self.query(query, ctes)
        except PlanError:
            if not isinstance(query, exp.Select) or not self.references_outer(query, scope,
                                                                               ctes):
                raise
            scalar, (value,) = self.correlated(query, scope, label, ctes)
            scalar.at = sub
            return scalar, value
        if len(node.columns) != 1:
            raise self.error(f"a scalar subquery must return one column (it returns "
                             f"{len(node.columns)})", sub)
        if not _at_most_one_row(node):
            raise self.error("a scalar subquery must return at most one row: make it an "
                             "aggregate without GROUP BY (SELECT max(x) FROM ...) or "
                             f"ORDER BY ... LIMIT 1; for one value per row, {WHERE_TO_WRITE}",
                             sub)
        return Scalar(label, node), _column(label, node.columns[0])

    def references_outer(self, query: exp.Select, scope: Scope, ctes: dict[str, Node]
                         ) -> bool:
        """Whether ``query``'s WHERE names columns only the outer ``scope`` has."""
        try:
            inner = self.from_(query, ctes)
        except PlanError:
            return False
        where = query.args.get("where")
        cols = list(where.find_all(exp.Column)) if where is not None else []
        return any(_side(c, inner, scope, self.file) == "outer" for c in cols)

    def correlated(self, query: exp.Select, scope: Scope, label: str,
                   ctes: dict[str, Node], values: tuple[exp.Expression, ...] = (),
                   what: str = "a correlated scalar subquery"
                   ) -> tuple[Scalar, tuple[exp.Expression, ...]]:
        """``(SELECT agg(...) FROM t WHERE t.k = outer.k AND ...)`` as a GROUP BY of the
        inner sides of its correlation equalities, and the expression for it: its value,
        or the value over no rows where no group matches. ``values``: aggregates over its
        rows to compute in its place (one expression each)."""
        # one row per outer row: an aggregate; grouped by (some of) the inner sides of its
        # correlation equalities (NULL where no group matches, COUNT too); or the first
        # row by an ORDER BY (LIMIT 1)
        top1 = not values and _limit(query) == 1 and query.args.get("order") is not None
        allowed = {"order", "limit"} if top1 else {"group", "having"} if (
            not values and query.args.get("group") is not None) else set()
        for arg in ("group", "having", "limit", "order", "distinct"):
            if query.args.get(arg) is not None and arg not in allowed:
                raise self.error(f"{arg.upper()} in {what} is not supported: "
                                 f"{WHERE_TO_WRITE}", query.args[arg])
        if not values:
            if len(query.expressions) != 1:
                raise self.error(f"a scalar subquery must return one column (it returns "
                                 f"{len(query.expressions)})", query)
            item = query.expressions[0]
            values = (item.this if isinstance(item, exp.Alias) else item,)
            if any(isinstance(n, exp.AggFunc) for n in values[0].walk()) == top1:
                raise self.error(f"{what} must be an aggregate (SELECT count(*) / max(x) ... "
                                 f"WHERE inner.k = outer.k) or the first row by an ORDER BY "
                                 f"(ORDER BY ... LIMIT 1), which give one value per row", item)
        inner = self.from_(query, ctes)
        for value in values:
            if any(_side(col, inner, scope, self.file) == "outer" for col in value.find_all(
                    exp.Column)):
                raise self.error(f"{what} may read outer columns only in its WHERE",
                                 query.expressions[0])
        split = self.correlation(query, inner, scope, what, strict=bool(allowed))
        if split is None:
            return self.correlated_by_rows(query, values, inner, scope, label, ctes)
        inner_keys, outer_keys, kept = split
        key_sql = [self.rewrite(k, inner) for k in inner_keys]
        for g in query.args["group"].expressions if "group" in allowed else []:
            if self.rewrite(g, inner) not in key_sql:
                raise self.error(f"{what} may GROUP BY only inner columns it compares with "
                                 "outer ones (WHERE inner.k = outer.k ... GROUP BY inner.k): "
                                 "other groups would give several rows", g)
        grouped = query.copy()
        grouped.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
        keys = [exp.alias_(k.copy(), f"_k{i}", quoted=True) for i, k in enumerate(inner_keys)]
        if top1:
            grouped.set("order", None)
            grouped.set("limit", None)
            grouped.set("expressions", [*keys, *_value_items(values), exp.alias_(exp.Window(
                this=exp.RowNumber(), partition_by=[k.copy() for k in inner_keys],
                order=query.args["order"].copy()), "_rn", quoted=True)])
            first = exp.Select(expressions=[exp.column(c, quoted=True) for c in (
                *(f"_k{i}" for i in range(len(keys))), "_m", "_v")])
            first.set("from_", exp.From(this=exp.Subquery(
                this=grouped, alias=exp.TableAlias(this=exp.to_identifier("_t")))))
            grouped = first.where(exp.EQ(this=exp.column("_rn", quoted=True),
                                         expression=exp.Literal.number(1)))
        else:
            grouped.set("group", exp.Group(expressions=[k.copy() for k in inner_keys]))
            grouped.set("expressions", [*keys, *_value_items(values)])
        node = self.query(grouped, ctes)
        return Scalar(label, node, tuple(outer_keys)), _or_over_no_rows(
            label, values, matched_only=bool(allowed))

    def correlated_by_rows(self, query: exp.Select, values: tuple[exp.Expression, ...],
                           inner: Scope, scope: Scope, label: str, ctes: dict[str, Node]
                           ) -> tuple[Scalar, tuple[exp.Expression, ...]]:
        """A scalar subquery correlated by other conditions (``x.b < t.b``): over the
        distinct values of the outer columns it reads (``_o0``, ...), joined with its FROM
        by its whole WHERE (a cross join with a residual when no equality is left: each
        distinct outer value meets every inner row) and grouped by them; the query then
        joins that on its outer columns, NULLs equal."""
        outer_cols: list[str] = []
        where = query.args["where"].this.copy()
        for col in list(where.find_all(exp.Column)):
            if _side(col, inner, scope, self.file) != "outer":
                continue
            name = scope.resolve(col, self.file)
            if name not in outer_cols:
                outer_cols.append(name)
            col.replace(exp.column(f"_o{outer_cols.index(name)}", table="_d", quoted=True))
        picked = tuple(f"_o{i}" for i in range(len(outer_cols)))
        source, cols = _narrowest(scope.node, outer_cols)
        outer = Project(picked, input=source, exprs=tuple(quote(c) for c in cols))
        cte = f"{label}_outer"
        ctes = {**ctes, cte: Aggregate(picked, input=outer, keys=picked, distinct=True)}
        keys = [exp.column(c, table="_d", quoted=True) for c in picked]
        grouped = exp.Select(expressions=[
            *(exp.alias_(k.copy(), f"_k{i}", quoted=True) for i, k in enumerate(keys)),
            *_value_items(values)])
        grouped.set("from_", exp.From(this=exp.Table(
            this=exp.to_identifier(cte), alias=exp.TableAlias(this=exp.to_identifier("_d")))))
        grouped.set("joins", [exp.Join(this=query.args["from_"].this.copy(), kind="CROSS"),
                              *(j.copy() for j in query.args.get("joins") or [])])
        grouped.set("where", exp.Where(this=where))
        grouped.set("group", exp.Group(expressions=keys))
        node = self.query(grouped, ctes)
        outer_keys, inner_keys = [], []
        for i, c in enumerate(outer_cols):
            for side, ref in ((outer_keys, quote(c)), (inner_keys, quote(f"_k{i}"))):
                side += [f"isnull({ref})", f"coalesce(CAST({ref} AS STRING), '')"]
        return (Scalar(label, node, tuple(outer_keys), tuple(inner_keys)),
                _or_over_no_rows(label, values))


def _narrowest(node: Node, cols: list[str]) -> tuple[Node, list[str]]:
    """The input deepest in ``node`` whose rows give every value tuple of ``cols`` that
    ``node``'s rows have (a superset), and the columns there: through filters and into the
    side of a join that holds them all (the preserved side of an outer join: the other's
    values may be NULL-padded), so the values of one table of a join are read from it, not
    from the join."""
    while True:
        if isinstance(node, Filter):
            node = node.input
            continue
        if not isinstance(node, Join) or node.kind in ("semi", "anti"):
            return node, cols
        nl = len(node.left.columns)
        at = [node.names.index(c) for c in cols]
        sides = [("left", node.left, 0)] if node.kind in ("inner", "left") else []
        sides += [("right", node.right, nl)] if node.kind in ("inner", "right") else []
        for _, child, offset in sides:
            if all(offset <= i < offset + len(child.columns) for i in at):
                node, cols = child, [child.columns[i - offset] for i in at]
                break
        else:
            return node, cols


def _value_name(i: int) -> str:
    """The column of a correlated subquery's ``i``-th value."""
    return "_v" if i == 0 else f"_v{i}"


def _value_items(values: tuple[exp.Expression, ...]) -> list[exp.Expression]:
    """A correlated subquery's select items after its keys: whether a group matched
    (``_m``), its values."""
    return [exp.alias_(exp.true(), "_m", quoted=True),
            *(exp.alias_(v.copy(), _value_name(i), quoted=True) for i, v in enumerate(values))]


def _or_over_no_rows(label: str, values: tuple[exp.Expression, ...],
                     matched_only: bool = False) -> tuple[exp.Expression, ...]:
    """Each of the subquery's values, or (no group matched) its value over no rows (NULL
    if ``matched_only``: a subquery that has no row then)."""
    out = []
    for i, value in enumerate(values):
        column: exp.Expression = _column(label, _value_name(i))
        empty = exp.Null() if matched_only else _over_no_rows(value)
        if not isinstance(empty, exp.Null):
            matched = _column(label, "_m")
            column = exp.Case(ifs=[exp.If(this=exp.Is(this=matched, expression=exp.Null()),
                                          true=empty)], default=column)
        out.append(exp.Paren(this=column))
    return tuple(out)


def _is_scalar(sub: exp.Subquery, select: exp.Select) -> bool:
    """A subquery of ``select`` itself used as a value (not in FROM, JOIN, IN, ANY, ALL, a
    set operation or a nested SELECT)."""
    return (sub.find_ancestor(exp.Select) is select
            and not isinstance(sub.parent, (exp.From, exp.Join, exp.Union, exp.Except,
                                            exp.Intersect, exp.In, exp.Exists, exp.Any,
                                            exp.All)))


def after_group(node: exp.Expression, select: exp.Select) -> bool:
    """Whether ``node`` (of ``select``, an aggregate query) is read after its GROUP BY: in
    HAVING, or in the select list outside ``select``'s aggregates."""
    clause = _clause(node, select)
    agg = node.find_ancestor(exp.AggFunc)
    return clause == "having" or clause == "expressions" and (
        agg is None or agg.find_ancestor(exp.Select) is not select)


def _clause(node: exp.Expression, select: exp.Select) -> str | None:
    """The argument of ``select`` that holds ``node``."""
    while node.parent is not None and node.parent is not select:
        node = node.parent
    return node.arg_key if node.parent is select else None


def _side(col: exp.Column, inner: Scope, outer: Scope, file) -> str:
    """``inner`` when the subquery's own FROM has the column (inner names win), ``outer``
    when only the enclosing query does."""
    if inner.lookup(col, file) is not None:
        return "inner"
    try:
        return "outer" if outer.lookup(col, file) is not None else "inner"
    except PlanError:
        return "outer"


def for_existence(query: exp.Expression) -> exp.Expression:
    """``query`` as ``EXISTS`` reads it: whether it has a row does not depend on its
    DISTINCT, a LIMIT above 0 with its ORDER BY, or a GROUP BY without HAVING (then read as
    its rows)."""
    if not isinstance(query, exp.Select):
        return query
    query = query.copy()
    query.set("distinct", None)
    if (_limit(query) or 0) > 0:
        query.set("order", None)
        query.set("limit", None)
    if query.args.get("group") is not None and query.args.get("having") is None:
        query.set("group", None)
        query.set("expressions", [exp.Literal.number(1)])
    return query


def _limit(query: exp.Select) -> int | None:
    """The number ``query``'s LIMIT writes, if it writes one."""
    limit = query.args.get("limit")
    n = limit.expression if isinstance(limit, exp.Limit) else None
    return int(n.this) if isinstance(n, exp.Literal) and n.is_int else None


def _at_most_one_row(node: Node) -> bool:
    while isinstance(node, (Project, Filter)):
        node = node.input
    return (isinstance(node, Aggregate) and not node.keys) or (
        isinstance(node, TopN) and node.n == 1 and not node.partition)


def _over_no_rows(value: exp.Expression) -> exp.Expression:
    """``value`` (an expression of aggregates) over no rows: COUNT is 0, the others NULL;
    NULL when that is all it can be."""
    counts = any(isinstance(n, exp.Count) for n in value.walk())
    if not counts:
        return exp.Null()

    def empty(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Count):
            return exp.Literal.number(0)
        if isinstance(n, exp.AggFunc):
            return exp.Null()
        return n

    return exp.Paren(this=value.copy().transform(empty))


def _rel(scalar: Scalar) -> Rel:
    """The relation of a subquery's columns, named only by the expressions standing for
    it (not by ``*``)."""
    names = [f"{scalar.label}.{c}" for c in scalar.node.columns]
    return Rel({scalar.label}, [(n, n) for n in names], hidden=True)


def _is_top_conjunct(node: exp.Expression, select: exp.Select) -> bool:
    """Whether ``node`` is a condition AND-ed in WHERE: ``x IN (...)``, ``[NOT] EXISTS``
    (a semi or anti join)."""
    where = select.args.get("where")
    for c in conjuncts(where.this) if where is not None else []:
        if c is node or isinstance(c, exp.Not) and c.this is node and isinstance(node,
                                                                                 exp.Exists):
            return True
    return False


_QUANTIFIED = {exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">", exp.GTE: ">=", exp.LT: "<",
               exp.LTE: "<="}


def is_predicate_subquery(node: exp.Expression) -> bool:
    """Whether ``node`` is ``x IN (subquery)``, ``EXISTS (subquery)`` or ``x <op> ANY /
    ALL (subquery)``."""
    return (isinstance(node, exp.Exists) or isinstance(node, exp.In)
            and node.args.get("query") is not None or _quantified(node) is not None)


def _quantified(node: exp.Expression) -> exp.Expression | None:
    """The subquery of a comparison ``x <op> ANY / ALL (subquery)``, else None."""
    q = node.args.get("expression") if type(node) in _QUANTIFIED else None
    if not isinstance(q, (exp.Any, exp.All)):
        return None
    query = q.this.this if isinstance(q.this, exp.Subquery) else q.this
    return query if isinstance(query, (exp.Select, exp.Union)) else None


def _column(label: str, column: str) -> exp.Column:
    """The reference to a subquery's column (only such a reference names it)."""
    return exp.column(f"{label}.{column}", table=label, quoted=True)

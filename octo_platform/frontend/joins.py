"""Binding of FROM clauses and joins: explicit joins, ``IN`` / ``EXISTS`` subqueries as
semi / anti joins, and the WHERE conditions around them (a part of ``QueryBinder``)."""
from __future__ import annotations

from sqlglot import exp

from octo_platform.frontend.scope import Rel, Scope
from octo_platform.frontend.shapes import check_supported, conjuncts, one_row
from octo_platform.frontend.subqueries import for_existence
from octo_platform.logical.plan import CROSS_KEY, Filter, Join, Node, Project
from octo_platform.sqltext import DIALECT, quote

__all__ = ["JoinBinding", "JOIN_KINDS"]

JOIN_KINDS = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}


class JoinBinding:
    """Joins of ``QueryBinder`` (mixed into it)."""

    def from_(self, select: exp.Select, ctes: dict[str, Node]) -> Scope:
        """The FROM clause's inputs joined left to right, as Spark does (a comma binds as
        tightly as ``JOIN``: ``FROM a, b RIGHT JOIN c ON ...`` keeps every row of ``c``). A
        comma, ``CROSS JOIN`` or inner ``JOIN`` without an equality is a cross join here:
        the ``join_conditions`` rule turns the WHERE equalities between its inputs into
        join keys."""
        from_ = select.args.get("from_")
        if from_ is None:
            raise self.error("a streaming table needs a FROM clause", select)
        scope = self.from_item(from_.this, ctes)
        for j in select.args.get("joins") or []:
            scope = self.join(scope, j, ctes)
        return scope

    def join(self, left: Scope, j: exp.Join, ctes: dict[str, Node]) -> Scope:
        right = self.from_item(j.this, ctes)
        what = f"JOIN {j.this.sql(DIALECT)}"
        side, kind_word = (j.side or "").upper(), (j.kind or "").upper()
        if kind_word in ("SEMI", "ANTI"):
            raise self.error(f"{side} {kind_word} JOIN is not supported: write WHERE ... IN / "
                             "EXISTS / NOT EXISTS (subquery)", j)
        on = j.args.get("on")
        using_cols = list(j.args.get("using") or [])
        using = [c.name for c in using_cols]
        if on is None and side and not using:
            raise self.error(f"{side} {what} has no ON condition: join ON an equality of "
                             "the two sides", j)
        for item, scope in ((j.this, right), (j.parent_select, left)):
            if not scope.joined and not scope.rels[0].aliases:
                raise self.error("a subquery in a join needs an alias", item)
        kind = JOIN_KINDS[side]
        taken = {a for r in left.rels for a in r.aliases}
        dup = taken & right.rels[0].aliases
        if dup:
            raise self.error(f"table name or alias {sorted(dup)[0]!r} appears twice in FROM: "
                             "give each occurrence its own alias", j.this)
        lnames, lrels = left.qualified(next(iter(left.rels[0].aliases), "_from"))
        rnames, rrels = right.qualified(next(iter(right.rels[0].aliases)))
        if using:
            lnode, rnode, residual = left.node, right.node, None
            pairs = self.using_columns(using_cols, Scope(left.node, lrels),
                                       Scope(right.node, rrels))
            keys = [(quote(lc), quote(rc)) for lc, rc in pairs]
        elif on is None or kind_word == "CROSS":  # a comma or CROSS JOIN
            lnode, rnode, keys, residual = left.node, right.node, [(CROSS_KEY, CROSS_KEY)], None
        else:
            pushable = {"l": kind in ("inner", "right"), "r": kind in ("inner", "left")}
            lnode, rnode, keys, residual = self.split_on(
                on, what, left, right, Scope(left.node, lrels),
                Scope(right.node, rrels), pushable, ambiguous=True)
        node = Join(lnames + rnames, left=lnode, right=rnode, kind=kind,
                    names=lnames + rnames, left_keys=tuple(k[0] for k in keys),
                    right_keys=tuple(k[1] for k in keys), residual=residual)
        if not using:
            return Scope(node, lrels + rrels, joined=True)
        # USING: each column once, first, unqualified: the left's (inner, left join), the
        # right's (right join), or the first of the two that is not NULL (full join)
        if kind == "full":
            self.subqueries += 1
            merged = tuple(f"_u{self.subqueries}.{n}" for n in using)
            node = Project((*node.columns, *merged), input=node, exprs=(
                *(quote(c) for c in node.columns),
                *(f"coalesce({lk}, {rk})" for lk, rk in keys)))
        else:
            merged = tuple(p[0 if kind != "right" else 1] for p in pairs)
        hide = frozenset(n.lower() for n in using)
        rels = [Rel(set(), list(zip(using, merged))),
                *(Rel(r.aliases, r.columns, r.hidden, r.merged | hide) for r in lrels + rrels)]
        return Scope(node, rels, joined=True)

    def using_columns(self, using: list[exp.Expression], left: Scope, right: Scope
                      ) -> list[tuple[str, str]]:
        """The join keys of ``JOIN ... USING (c, ...)``: each column of each side."""
        keys = []
        for col in using:
            sides = [s.lookup(exp.column(col.name), self.file) for s in (left, right)]
            if None in sides:
                where = "left" if sides[0] is None else "right"
                raise self.error(f"USING column {col.name!r} is not a column of the join's "
                                 f"{where} side", col)
            keys.append((sides[0], sides[1]))
        return keys

    def split_on(self, cond: exp.Expression, what: str, left: Scope, right: Scope,
                 lq: Scope, rq: Scope, pushable: dict[str, bool], *, ambiguous: bool):
        """Split a join condition into equi-keys, conditions pushed into one input and a
        residual. ``lq``/``rq`` resolve to the join's (qualified) names; ``left``/``right``
        to each input's own. Inner names win over outer ones unless ``ambiguous``. Without
        an equality the join is keyed by ``CROSS_KEY``: every row meets every row of the
        other side, and the residual decides (a change of one side checks the other's
        whole state)."""

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
            if isinstance(c, exp.Boolean) and c.this is True:
                continue  # ON TRUE (and a JOIN without ON, which sqlglot reads so)
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
            keys.append((CROSS_KEY, CROSS_KEY))
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
        elif (sub := for_existence(c.this)).args.get("having") is not None:
            inner, outer_keys = self.groups_kept(sub, scope, ctes)
            rnames = tuple(f"{label}.{col}" for col in inner.columns)
            keys = [(k, quote(r)) for k, r in zip(outer_keys, rnames)] or [(CROSS_KEY,
                                                                             CROSS_KEY)]
            residual = None
        else:
            for arg in ("limit", "order"):
                if sub.args.get(arg) is not None:
                    raise self.error(f"{arg.upper()} in an EXISTS subquery is not supported",
                                     sub.args[arg])
            check_supported(sub, self.file)
            right = self.from_(sub, ctes)
            rnames, rrels = right.qualified(label)
            where = sub.args.get("where")
            inner_scope = Scope(right.node, right.rels, outer=scope)
            # without an equality to the outer query: on the constant key (a row is kept
            # while the subquery has a row, or one its residual condition matches)
            _, inner, keys, residual = self.split_on(
                where.this if where is not None else exp.true(), "EXISTS subquery", scope,
                inner_scope, scope, Scope(right.node, rrels), {"l": False, "r": True},
                ambiguous=False)
        return Join(outer.columns, left=outer, right=inner, kind=kind,
                    names=outer.columns + rnames, left_keys=tuple(k[0] for k in keys),
                    right_keys=tuple(k[1] for k in keys), residual=residual)

    def where(self, where: exp.Where, scope: Scope, ctes: dict[str, Node]) -> Scope:
        """Filter by the plain conditions; IN / EXISTS subqueries become semi/anti joins.
        (The optimizer's rules move the conditions into joins and top-Ns.)"""
        owner = where.find_ancestor(exp.Select)
        for n in where.this.find_all(exp.AggFunc):  # not those of its subqueries
            if n.find_ancestor(exp.Select) is owner:
                raise self.error("aggregates are not allowed in WHERE (use HAVING)", n)
        plain: list[exp.Expression] = []
        subs: list[tuple[exp.Expression, bool]] = []
        node = scope.node
        for c in conjuncts(where.this):
            negated = isinstance(c, exp.Not)
            inner = c.this if negated else c
            if isinstance(inner, exp.In) and inner.args.get("query") is not None \
                    and not negated:  # (NOT IN is a mark join: see mark_subqueries)
                subs.append((inner, False))
            elif isinstance(inner, exp.Exists) and one_row(inner.this):
                self.from_(inner.this, ctes)  # its FROM must still exist
                plain.append(exp.false() if negated else exp.true())
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

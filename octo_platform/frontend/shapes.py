"""Checks for query shapes that cannot be maintained incrementally.

Each rejects the shape at plan time with what to write instead, pointing at the SQL.
"""
from __future__ import annotations

from sqlglot import exp

from octo_platform.errors import PlanError, SqlError
from octo_platform.frontend.parser import SESSION_CALL, SqlFile, TableStmt
from octo_platform.logical.plan import Node, TopN, Window

__all__ = ["NONDETERMINISTIC", "check_supported", "check_bounded", "conjuncts", "one_row",
           "function_name"]

NONDETERMINISTIC = {
    "rand", "randn", "random", "uuid", "shuffle", "now", "current_timestamp", "current_date",
    "current_time", "localtimestamp", "unix_timestamp", "monotonically_increasing_id",
    "spark_partition_id", "input_file_name", "input_file_block_start",
    "input_file_block_length", "rand_str", "randstr", "uniform", "try_reflect", "reflect",
    "java_method", "current_timezone",
}


def check_supported(select: exp.Select, file: SqlFile) -> None:
    """Reject the shapes of one SELECT (not its subqueries) we cannot maintain."""

    def error(message: str, node: exp.Expression) -> PlanError:
        return PlanError(message, file.location_of(node))

    order, limit = select.args.get("order"), select.args.get("limit")
    if order is not None and limit is None:
        raise error("ORDER BY without LIMIT has no meaning for a streaming table "
                         "(its rows have no order); remove it", order)
    for node in select.walk():
        if isinstance(node, exp.Select) and node is not select:
            continue  # checked when it is bound
        if node.find_ancestor(exp.Select) is not select and node is not select:
            continue
        if isinstance(node, exp.Window) and not (
                isinstance(node.parent, exp.Alias) and node.parent.parent is select):
            raise error("window functions are supported only as items of a SELECT list: "
                        "ROW_NUMBER() OVER (...) AS rank, bounded by WHERE rank <= n in "
                        "the enclosing query (top-N), or aggregates OVER a RANGE BETWEEN "
                        "INTERVAL ... PRECEDING AND CURRENT ROW", node)
        fname = function_name(node)
        if fname in NONDETERMINISTIC:
            raise error(f"non-deterministic function {fname}() cannot be maintained "
                             "incrementally: a retraction must reproduce the row it "
                             "removes", node)


def check_bounded(plan: Node, stmt: TableStmt) -> None:
    """Reject a ROW_NUMBER that no ``WHERE rank <= n`` bounded (see ``bound_top_n``)."""
    if (top := _unbounded_top_n(plan)) is not None:
        window = stmt.query.find(exp.Window)
        raise SqlError(f"ROW_NUMBER() AS {top.rank} needs a bound: filter the subquery with "
                       f"WHERE {top.rank} <= n (a ranking of every row is not maintained)",
                       stmt.file.location_of(window) if window is not None else
                       stmt.location())


def check_sessions(plan: Node, stmt: TableStmt) -> None:
    """Reject a SESSION window that no GROUP BY partitions (see ``partition_sessions``)."""
    if _unbound_session(plan):
        call = next((n for n in stmt.query.walk() if isinstance(n, exp.Anonymous)
                     and n.name.upper() == SESSION_CALL), None)
        raise SqlError("SESSION(...) needs a GROUP BY over it: the GROUP BY's columns "
                       "besides window_start and window_end partition the sessions",
                       stmt.file.location_of(call) if call is not None else stmt.location())


def _unbound_session(node: Node) -> bool:
    if isinstance(node, Window) and node.kind == "session" and node.partition is None:
        return True
    return any(_unbound_session(c) for c in node.inputs)


def function_name(node: exp.Expression) -> str | None:
    """The lower-case name of the function ``node`` calls, if it is a call."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def one_row(query: exp.Expression) -> bool:
    """Whether ``query`` is an aggregate without GROUP BY, HAVING or LIMIT: it returns one
    row whatever its input (so ``EXISTS (query)`` is TRUE)."""
    return isinstance(query, exp.Select) and not any(
        query.args.get(a) is not None for a in ("group", "having", "limit")) and any(
        isinstance(n, exp.AggFunc) and n.find_ancestor(exp.Select) is query
        for i in query.expressions for n in i.walk())


def conjuncts(e: exp.Expression) -> list[exp.Expression]:
    """The AND-ed parts of a condition (parentheses looked through). A part common to every
    branch of an OR is factored out of it, as Spark's optimizer does: ``(a AND x) OR (a AND
    y)`` is ``a AND (x OR y)`` (in SQL's three-valued logic too), so a join key written in
    each branch (TPC-H q19) is a join key."""
    return [c for part in _parts(e, exp.And)
            for c in (_factored(part) if isinstance(part, exp.Or) else [part])]


def _parts(e: exp.Expression, kind: type) -> list[exp.Expression]:
    """The operands of nested ``kind`` (AND, OR) nodes, parentheses looked through."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, kind):
        return _parts(e.this, kind) + _parts(e.expression, kind)
    return [e]


def _same(e: exp.Expression) -> str:
    """``e``'s text, an equality's sides in one order (``a = b`` is ``b = a``)."""
    if isinstance(e, exp.EQ):
        return " = ".join(sorted((e.this.sql(), e.expression.sql())))
    return e.sql()


def _factored(e: exp.Or) -> list[exp.Expression]:
    branches = [conjuncts(b) for b in _parts(e, exp.Or)]
    # (a part holding a subquery stays where it is written: it binds there)
    common = [c for c in branches[0] if c.find(exp.Select) is None and all(
        any(_same(c) == _same(o) for o in b) for b in branches[1:])]
    if not common:
        return [e]
    shared = {_same(c) for c in common}
    rest = [[c for c in b if _same(c) not in shared] for b in branches]
    if any(not r for r in rest):  # a branch holds only the common parts: the OR is them
        return common
    return [*common, exp.or_(*(exp.paren(exp.and_(*r)) if len(r) > 1 else r[0]
                               for r in rest))]


def _unbounded_top_n(node: Node) -> TopN | None:
    if isinstance(node, TopN) and node.n is None:
        return node
    return next((t for c in node.inputs if (t := _unbounded_top_n(c)) is not None), None)

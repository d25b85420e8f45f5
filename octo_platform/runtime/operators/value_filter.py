"""A driver-path filter that Spark evaluates once per distinct value of what it reads.

A filter of a stateless step is a Spark SQL condition over a few of the row's columns.
When Spark's analysis says the condition is deterministic, it gives the same answer for the
same values, so ``ValueFilter`` asks Spark (a local relation, as ``LocalContext.sql`` does)
only about the combinations of those columns' values the run has not seen yet, keeps the
answers, and keeps the rows whose combination Spark answered true. The answers are Spark's,
never a second evaluator's: a filter on a category or a state (``p.state IN ('OR', 'ID',
'CA')``) costs Spark one call in a run's first batches and none afterwards, and a batch of
thousands of rows with a few distinct values asks about those few (no Spark job).

Columns of floating-point or nested types are not taken (Arrow groups -0.0 with 0.0 and
NaNs together, which an expression may tell apart), nor conditions that read no column,
nor those that read the clock or the session (``current_timestamp()``, ``now()``,
``current_date()``...: Spark calls them deterministic, as they are within one query, but
their answer changes from batch to batch).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from octo_platform.runtime.operators.arrow import key_join, safe_keys
from octo_platform.sqltext import quote

if TYPE_CHECKING:
    from octo_platform.runtime.operators.kernels import LocalContext

__all__ = ["ValueFilter"]

_ANSWERS = 100_000  # answers kept per condition: past this, new ones are used, not kept
# At most this many distinct values a batch (each answer is looked up in Python): a filter
# of a 300K-event window batch over as many distinct values took 2.6 s instead of 0.6 s.
_DISTINCT = 5_000
_KEEP = "__octo_keep"
_ROW = "__octo_row"


class ValueFilter:
    """Condition ``condition`` over the columns ``columns``, with the answers Spark gave."""

    def __init__(self, condition: str, columns: list[str]) -> None:
        self.condition, self.columns = condition, columns
        self.answers: dict[tuple, bool] = {}

    @staticmethod
    def of(lc: LocalContext, table: pa.Table, condition: str) -> ValueFilter | None:
        """The run's filter of ``condition`` over rows like ``table``'s (Spark's analysis
        asked once per run: is it deterministic, which columns does it read); None when it
        cannot be taken (see the module)."""
        def make() -> ValueFilter | None:
            analyzed = lc.frame(table).filter(condition)._jdf.queryExecution().analyzed()
            cond = analyzed.condition()
            if not cond.deterministic() or _reads_the_clock(cond):
                return None
            refs = cond.references().toList()
            names = [refs.apply(i).name() for i in range(refs.size())]
            fields = [table.schema.field(n) if n in table.column_names else None
                      for n in names]
            if not names or any(f is None or pa.types.is_floating(f.type)
                                or pa.types.is_nested(f.type) for f in fields):
                return None
            return ValueFilter(condition, list(dict.fromkeys(names)))
        return lc.once(f"value-filter:{condition}:{table.schema}", make)

    def apply(self, lc: LocalContext, table: pa.Table) -> pa.Table | None:
        """The rows of ``table`` the condition keeps (true; not false or NULL); None when
        asking about values would not gain (more than ``_DISTINCT`` of them, or more new
        ones than half the rows): Spark then filters the rows themselves."""
        cols = self.columns
        distinct = table.select(cols).group_by(cols, use_threads=False).aggregate([])
        if distinct.num_rows > _DISTINCT:
            return None
        values = [tuple(r.values()) for r in distinct.to_pylist()]
        new = [i for i, v in enumerate(values) if v not in self.answers]
        if len(new) > table.num_rows // 2:
            return None
        answers = self.answers if len(self.answers) + len(new) <= _ANSWERS else \
            dict(self.answers)
        if new:
            got = lc.sql(f"value-filter:{self.condition}", distinct.take(new),
                         lambda df: df.selectExpr(f"coalesce(({self.condition}), false) AS "
                                                  f"{quote(_KEEP)}"))
            answers.update(zip([values[i] for i in new], got.column(_KEEP).to_pylist()))
        keep = pa.array([answers[v] for v in values], pa.bool_())
        rows, rcols = safe_keys(table.select(cols).append_column(
            _ROW, pa.array(np.arange(table.num_rows))), cols, "_r")
        found, dcols = safe_keys(distinct.append_column(_KEEP, keep), cols, "_d")
        matched = key_join(rows.select([*rcols, _ROW]), found.select([*dcols, _KEEP]),
                           rcols, dcols, "inner")
        mask = np.zeros(table.num_rows, bool)
        mask[matched[_ROW].to_numpy()] = matched[_KEEP].to_numpy(zero_copy_only=False)
        return table.filter(pa.array(mask))


def _reads_the_clock(expr) -> bool:  # a Catalyst expression, through py4j
    """Whether the expression or one below it is a ``Current*`` one (the time, the date, the
    user...), ``now()`` or ``localtimestamp()``."""
    name = expr.getClass().getSimpleName()
    if name.startswith("Current") or name in ("Now", "LocalTimestamp"):
        return True
    children = expr.children()
    return any(_reads_the_clock(children.apply(i)) for i in range(children.size()))

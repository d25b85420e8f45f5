"""A rescale batch (``octo rescale TABLE --buckets N``; ``recompute.rescale``): a table's
operator state and current state moved to ``N`` buckets, exactly once.

Each bucketed table (every state table of the plan, ``_current``) is rewritten as of the
versions the last batch committed: every row goes to the bucket of its key under the new
count (``bucket_columns``: the columns each operator buckets its state by), in one Spark
job whose tasks write the files, and one Delta commit per table replaces all of its files.
A state log keeps its shape: the files of each write (a generation: ``base``/``delta``,
its rows stamped with their batch) become the files of one new write of the same kind, so
reading the newest row of a key and the amortized compaction work as before. Every row is
checked on the way: the bucket the old count gives its key must be the one it was filed
under (else the job fails, before any commit: a layout this module does not know).

Exactly once like any batch: the batch's intent (``{"_rescale": N}``) is logged first,
each table's commit carries the batch (a table that already holds it is left alone when the
batch is redone), and the commit record names the new bucket count in the plan's
fingerprint (``-bN``), which later runs keep. A run that finds the intent pending finishes
the rescale before its next batch (``Pipeline.run_batch``). The batch writes no change
events: the table's rows are unchanged, only where its state lives.
"""
from __future__ import annotations

import posixpath
import time
from typing import TYPE_CHECKING

from octo_platform.columns import BUCKET
from octo_platform.errors import RunError
from octo_platform.physical.plan import PAggregate, PJoin, PPartitioned
from octo_platform.runtime.current import current_key
from octo_platform.runtime.operators.context import bucket_sql, positional
from octo_platform.runtime.state_log import STATE_FORMAT, generation
from octo_platform.runtime.writes import Output, write_outputs
from octo_platform.sqltext import quote, string

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from octo_platform.runtime.stats import BatchStats
    from octo_platform.runtime.table_run import TableRun

__all__ = ["RESCALE", "bucket_columns", "rescale_batch"]

RESCALE = "_rescale"  # key of a batch-log intent that moves the table to that many buckets


def bucket_columns(pipe: TableRun) -> dict[str, list[str]]:
    """The columns whose bucket files each row of the table's bucketed tables, by their
    key in a commit's versions (``state/<table>``, ``current``)."""
    plan = pipe.table.physical
    out = {"current": current_key(pipe)}
    for node in plan.operators:
        if isinstance(node, PAggregate):  # the groups' rows, and their value multisets
            out.update((f"state/{t}", list(node.keys)) for t in node.state_tables())
        elif isinstance(node, PJoin):  # each side's rows with their join key (k0, k1, ...)
            for side, keys in (("left", node.left_keys), ("right", node.right_keys)):
                out[f"state/{node.side_table(side)}"] = [f"k{i}" for i in range(len(keys))]
        elif isinstance(node, PPartitioned):  # the input's columns, stored positionally
            stored = dict(zip(node.input.columns, positional(node.input.columns)))
            out[f"state/{node.id}"] = [stored[p] for p in node.partition]
    unknown = [t for t in plan.state_tables if f"state/{t}" not in out]
    if unknown:
        raise RunError(f"streaming table {pipe.name!r} cannot be rescaled: the layout of its "
                       f"state {', '.join(unknown)} is not known to `octo rescale`")
    return out


def rescale_batch(pipe: TableRun, batch: int, buckets: int, pinned: dict[str, int | None],
                  ts_ms: int, stats: BatchStats, started: float, *,
                  resumed: bool) -> BatchStats:
    """Batch ``batch``: the table's bucketed tables (as of ``pinned``) rewritten into
    ``buckets`` buckets and committed; the table's fingerprint then names ``buckets``."""
    old = pipe.buckets
    outputs = []
    for key, columns in bucket_columns(pipe).items():
        outputs += _rewritten(pipe, key, columns, pinned.get(key), old, buckets)
    written = write_outputs(outputs, batch=batch, store=pipe.env.store, resumed=resumed)
    versions = {**pinned, **written.versions}
    fingerprint = f"{pipe.table.physical.fingerprint}-b{buckets}"
    stats.path, stats.seconds = "rescale", time.monotonic() - started
    pipe.log.append(batch, "commit", {"versions": versions, "stats": stats.to_json(),
                                      "fingerprint": fingerprint,
                                      "state_format": STATE_FORMAT,
                                      "watermarks": stats.watermarks,
                                      "watermark": stats.watermark,
                                      RESCALE: [old, buckets]}, ts_ms)
    if pipe.progress:
        pipe.progress(f"[{pipe.name}] batch {batch}: rescaled from {old} to {buckets} "
                      f"buckets ({len(written.wrote)} tables rewritten), "
                      f"{stats.seconds:.2f}s")
    return stats


def _rewritten(pipe: TableRun, key: str, columns: list[str], version: int | None, old: int,
               new: int) -> list[Output]:
    """Outputs rewriting the table of versions key ``key`` (as of ``version``) into ``new``
    buckets: one per write (generation) of its files, the first replacing all files.
    None for a table that has no version yet."""
    from pyspark.sql.pandas.types import from_arrow_schema

    store = pipe.env.store
    path = pipe.layout.current(pipe.name) if key == "current" else \
        pipe.layout.state(pipe.name, key.removeprefix("state/"))
    if version is None:
        return []
    schema = store.arrow_schema(path)
    data = from_arrow_schema(schema.remove(schema.get_field_index(BUCKET)))
    groups: dict[str, list[str]] = {}
    for f in store.data_files(path, version):
        groups.setdefault(generation(f), []).append(f["uri"])
    frames = [(name.split("-", 1)[0], _moved(pipe.spark.read.schema(data).parquet(*uris),
                                             columns, old, new, path))
              for name, uris in sorted(groups.items())]
    if not frames:  # no rows: an empty table of the new layout
        frames = [("base", pipe.spark.createDataFrame(schema.empty_table()))]
    return [Output(key, path, frame, bucketed=True, prefix=prefix,
                   replace="all" if i == 0 else None)
            for i, (prefix, frame) in enumerate(frames)]


def _moved(rows: DataFrame, columns: list[str], old: int, new: int, path: str) -> DataFrame:
    """``rows`` (of one table's files) with ``_bucket`` of the ``new`` count; a row that the
    ``old`` count would not have filed where it was fails the job."""
    filed = f"CAST(regexp_extract(_metadata.file_path, '{BUCKET}=([0-9]+)', 1) AS INT)"
    error = string(f"octo rescale: a row of {posixpath.basename(path)} is not in the bucket "
                   f"of {', '.join(columns) or 'no columns'} (its layout is not known)")
    check = "true" if not columns else f"{filed} = {bucket_sql(columns, old)}"
    return rows.selectExpr(*[quote(c) for c in rows.columns],
                           f"CASE WHEN {check} THEN {bucket_sql(columns, new)} "
                           f"ELSE raise_error({error}) END AS {BUCKET}")

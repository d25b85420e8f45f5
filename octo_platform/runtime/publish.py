"""Publishing a recomputation (``octo backfill``, ``octo refresh``; see ``recompute``): the
difference between the live table and the recomputed one, written as one ordinary batch of
change events, while the table's state and current rows become the recomputed ones."""
from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING, Any

from octo_platform.columns import BUCKET, WEIGHT
from octo_platform.errors import RunError
from octo_platform.runtime.layout import Layout, ScratchLayout
from octo_platform.runtime.operators import consolidate
from octo_platform.runtime.sink import Events
from octo_platform.runtime.state_log import STATE_FORMAT
from octo_platform.runtime.writes import Output, write_outputs
from octo_platform.sqltext import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from octo_platform.runtime.stats import BatchStats
    from octo_platform.runtime.table_run import TableRun

__all__ = ["recompute_diff", "publish_recomputed", "RECOMPUTED"]

RECOMPUTED = "recompute"  # key of a batch-log intent that publishes a recomputation


def recompute_diff(pipe: TableRun, scratch: Layout, pinned: dict[str, int | None]) -> DataFrame:
    """Weighted rows turning the current table (as of ``pinned``) into ``scratch``'s."""
    cols = [quote(c) for c in pipe.table.physical.root.columns]
    w = quote(WEIGHT)

    def rows(layout: Layout, version: int | None, weight: int) -> DataFrame:
        path = layout.current(pipe.name)
        files = pipe.env.store.files(path, version)
        df = (pipe.spark.read.parquet(*files) if files else
              pipe.spark.createDataFrame(pipe.env.store.arrow_schema(path).empty_table()))
        return df.selectExpr(*cols, f"CAST({weight} AS BIGINT) AS {w}")

    old = rows(pipe.layout, pinned.get("current"), -1)
    new = rows(scratch, pipe.env.store.version(scratch.current(pipe.name)), 1)
    return consolidate(old.unionByName(new), cols)


def publish_recomputed(pipe: TableRun, batch: int, spec: dict[str, Any],
                       pinned: dict[str, int | None], ts_ms: int, stats: BatchStats,
                       started: float) -> BatchStats:
    """Batch ``batch`` of a recomputation: the difference between the current table and
    the recomputed one as change events; state and current table become the recomputed
    ones. Every write is idempotent, so a crash in between is finished by the next run."""
    scratch = ScratchLayout.for_batch(pipe.layout, pipe.name, batch)
    store, plan = pipe.env.store, pipe.table.physical
    if store.version(scratch.current(pipe.name)) is None:
        raise RunError(f"{pipe.name}: batch {batch} publishes a recomputation whose result "
                       f"is gone ({scratch.warehouse} was deleted); run `octo refresh "
                       f"{pipe.name}` to rebuild the table from all input")
    events = Events(pipe.env.encode_changelog(
        recompute_diff(pipe, scratch, pinned), plan.root.columns, plan.pk,
        table=pipe.name, batch=batch, ts_ms=ts_ms))
    outputs = [Output("changelog", pipe.layout.changelog(pipe.name), events.rows)]
    copies = {f"state/{t}": (scratch.state(pipe.name, t), pipe.layout.state(pipe.name, t))
              for t in plan.state_tables}
    copies["current"] = (scratch.current(pipe.name), pipe.layout.current(pipe.name))
    for key, (src, dst) in copies.items():
        if store.version(src) is None and store.version(dst) is None:
            continue
        rows, bucketed = read_whole(pipe, src if store.version(src) is not None else dst)
        if store.version(src) is None:
            rows = rows.limit(0)
        outputs.append(Output(key, dst, rows, bucketed=bucketed, replace="all",
                              prefix="base"))
    versions = {**pinned, **write_outputs(outputs, batch=batch, store=store).versions}
    stats.events = events.counts()
    stats.seconds = time.monotonic() - started
    pipe.memo.clear()
    pipe.log.append(batch, "commit", {"versions": versions, "stats": stats.to_json(),
                                      "fingerprint": pipe.fingerprint,
                                      "state_format": STATE_FORMAT,
                                      "watermarks": stats.watermarks,
                                      "watermark": stats.watermark,
                                      RECOMPUTED: spec}, ts_ms)
    if "://" not in scratch.warehouse:
        shutil.rmtree(scratch.warehouse, ignore_errors=True)
    if pipe.progress:
        pipe.progress(stats.line() + f" (recomputed: {spec.get('what', 'all')})")
    return stats


def read_whole(pipe: TableRun, path: str) -> tuple[DataFrame, bool]:
    """The latest version of a table and whether it is ``_bucket``-partitioned (the
    column is then included, taken from the files' partition folders)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    store = pipe.env.store
    schema = store.arrow_schema(path)
    bucketed = BUCKET in schema.names
    files = store.files(path, store.version(path))
    if not files:
        return pipe.spark.createDataFrame(schema.empty_table()), bucketed
    if not bucketed:
        return pipe.spark.read.schema(from_arrow_schema(schema)).parquet(*files), False
    data = from_arrow_schema(schema.remove(schema.get_field_index(BUCKET)))
    bucket = f"CAST(regexp_extract(_metadata.file_path, '{BUCKET}=([0-9]+)', 1) AS INT)"
    return pipe.spark.read.schema(data).parquet(*files).selectExpr(
        *[quote(n) for n in data.names], f"{bucket} AS {BUCKET}"), True

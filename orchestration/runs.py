"""What a run did and where a table stands, as Dagster metadata: shared by the catch-up
asset (``assets.catch_up``), the continuous job (``automation.run_continuously``) and the
backlog sensor's lag observations (``automation.observation``)."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable

import dagster as dg

if TYPE_CHECKING:
    import pyarrow as pa

    from octo_platform.runtime.stats import BatchStats
    from octo_platform.runtime.status import TableStatus

__all__ = ["run_metadata", "backlog_metadata", "watermark_metadata", "column_schema"]


def run_metadata(batches: Iterable[BatchStats], status: TableStatus,
                 seconds: float) -> dict[str, Any]:
    """The batches a run committed for one table, and the table's status after it."""
    batches = list(batches)
    events: Counter[str] = Counter()
    for b in batches:
        events.update(b.events)
    return {
        "batches": len(batches),
        "rows_in": sum(b.rows_in for b in batches),
        "events_c": events.get("c", 0),
        "events_u": events.get("u", 0),
        "events_d": events.get("d", 0),
        "dead_letters": sum(b.dead_letters for b in batches),
        "last_batch": status.last_batch,
        "changelog_version": status.changelog_version,
        "dagster/row_count": status.current_rows or 0,
        "duration_s": round(seconds, 3),
        **backlog_metadata(status),
        **watermark_metadata(status, late_rows=sum(b.late_rows for b in batches)),
    }


def backlog_metadata(status: TableStatus) -> dict[str, Any]:
    """The input waiting for a table: in all (``backlog``) and per input."""
    return {"backlog": status.waiting, "backlog_by_input": status.backlog}


def watermark_metadata(status: TableStatus, *, late_rows: int | None = None
                       ) -> dict[str, Any]:
    """A watermarked table's event-time progress: its watermark (UTC) and late records
    (``late_rows``: those of a run; default: all the table's batches committed)."""
    if not status.watermarked:
        return {}
    return {"watermark": status.watermark or dg.MetadataValue.null(),
            "late_rows": status.late_rows if late_rows is None else late_rows}


def column_schema(schema: pa.Schema) -> dg.TableSchema:
    """The columns of an Arrow schema with their Spark SQL types, as Delta stores them."""
    return dg.TableSchema(columns=[dg.TableColumn(f.name, _spark_type(f.type)) for f in schema])


def _spark_type(t: pa.DataType) -> str:
    """Spark SQL name of an Arrow type as Delta stores it."""
    import pyarrow as pa

    simple = [(pa.types.is_int64, "BIGINT"), (pa.types.is_int32, "INT"),
              (pa.types.is_int16, "SMALLINT"), (pa.types.is_int8, "TINYINT"),
              (pa.types.is_float64, "DOUBLE"), (pa.types.is_float32, "FLOAT"),
              (pa.types.is_boolean, "BOOLEAN"), (pa.types.is_string, "STRING"),
              (pa.types.is_large_string, "STRING"), (pa.types.is_string_view, "STRING"),
              (pa.types.is_timestamp, "TIMESTAMP"), (pa.types.is_date, "DATE"),
              (pa.types.is_binary, "BINARY"), (pa.types.is_large_binary, "BINARY")]
    for test, name in simple:
        if test(t):
            return name
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    return str(t).upper()

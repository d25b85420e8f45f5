"""What a batch reports: its counts, seconds, Spark jobs, where it ran, its watermark."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from octo_platform.runtime.sinks import SinkStats

__all__ = ["BatchStats", "table_watermark", "iso_time"]


@dataclass
class BatchStats:
    table: str
    batch: int
    rows_in: int = 0
    events: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    seconds: float = 0.0
    spark_jobs: int = 0  # Spark jobs the batch ran (its fixed cost is mostly these)
    skipped: bool = False
    sinks: list[SinkStats] = field(default_factory=list)  # sink batches published after it
    late_rows: int = 0  # of the dead letters: records below their source's watermark
    # Each watermarked input's watermark after the batch (microseconds since the epoch),
    # by input key; durable in the batch's commit record.
    watermarks: dict[str, int] = field(default_factory=dict)
    watermarked: int = 0  # how many of the table's inputs have a watermark
    path: str = "spark"  # where the batch ran: "driver" (small batches) or "spark"
    # Spark path: state buckets its tasks found in their machine's cache, and looked up
    cached_buckets: tuple[int, int] = (0, 0)

    @property
    def watermark(self) -> int | None:
        """The table's watermark: the least of its sources' (None until every source that
        declares one has one)."""
        return table_watermark(self.watermarks, self.watermarked)

    def line(self) -> str:
        ops = " ".join(f"{op}={self.events.get(op, 0)}" for op in ("c", "u", "d"))
        late = f" ({self.late_rows} late)" if self.late_rows else ""
        wm = "" if self.watermark is None else f", watermark {iso_time(self.watermark)}"
        return (f"[{self.table}] batch {self.batch}: {self.rows_in} rows in, events {ops}, "
                f"{self.dead_letters} dead letters{late}{wm}, {self.seconds:.2f}s, "
                f"{self.spark_jobs} Spark jobs, {self.path} path{self.cached()}")

    def cached(self) -> str:
        hits, lookups = self.cached_buckets
        return f", {hits}/{lookups} state buckets cached" if lookups else ""

    def to_json(self) -> dict[str, Any]:
        out = {"rows_in": self.rows_in, "events": self.events,
               "dead_letters": self.dead_letters, "seconds": round(self.seconds, 3),
               "spark_jobs": self.spark_jobs, "path": self.path}
        if self.cached_buckets[1]:
            out["cached_buckets"] = list(self.cached_buckets)
        if self.watermarked:
            out.update(late_rows=self.late_rows, watermark=None if self.watermark is None
                       else iso_time(self.watermark))
        return out


def table_watermark(marks: dict[str, int], sources: int) -> int | None:
    """A table's watermark: the least of its ``sources`` watermarked sources' ``marks``
    (None until each of them has one)."""
    return min(marks.values()) if sources and len(marks) >= sources else None


def iso_time(micros: int) -> str:
    """A watermark (microseconds since the epoch) as UTC text, as Spark shows timestamps."""
    return (datetime(1970, 1, 1) + timedelta(microseconds=micros)).isoformat(sep=" ")

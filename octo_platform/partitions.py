"""Event-time partitions of a streaming table.

A table declares them in its ``WITH`` clause::

    CREATE STREAMING TABLE daily_volume WITH (
        partition_by = 'day',             -- a DATE or TIMESTAMP column of the result
        partitions = 'daily',             -- hourly | daily | monthly (default: daily)
        partition_start = '2026-11-01'    -- the first partition
    ) AS SELECT CAST(date_time AS DATE) AS day, ...

A row belongs to the partition whose time window holds its ``partition_by`` value (UTC).
Partitions are what a backfill recomputes (``octo backfill``, Dagster partition backfills);
the table itself is one Delta table either way. Keys follow Dagster's time-window partition
keys (``2026-11-21``, ``2026-11-21-13:00``), so a key means the same in both places.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from octo_platform.sqltext import quote

__all__ = ["Partitioning", "GRANULARITIES", "parse_time"]

# granularity -> (Python key format, Spark date_trunc unit, Spark key pattern)
GRANULARITIES = {
    "hourly": ("%Y-%m-%d-%H:%M", "HOUR", "yyyy-MM-dd-HH:mm"),
    "daily": ("%Y-%m-%d", "DAY", "yyyy-MM-dd"),
    "monthly": ("%Y-%m-%d", "MONTH", "yyyy-MM-dd"),
}


def parse_time(text: str) -> datetime:
    """A date or timestamp in ISO form (UTC unless it names an offset)."""
    t = datetime.fromisoformat(text.strip())
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


@dataclass(frozen=True)
class Partitioning:
    column: str
    granularity: str
    start: datetime  # UTC, aligned to the granularity

    @property
    def key_format(self) -> str:
        return GRANULARITIES[self.granularity][0]

    def key_sql(self, prefix: str = "") -> str:
        """Spark SQL giving a row's partition key (NULL when its event time is NULL)."""
        _, unit, pattern = GRANULARITIES[self.granularity]
        return (f"date_format(date_trunc('{unit}', CAST({prefix}{quote(self.column)} AS "
                f"TIMESTAMP)), '{pattern}')")

    def within_sql(self, start: datetime, end: datetime, prefix: str = "") -> str:
        """Spark SQL: the row's event time falls in ``[start, end)``."""
        ts = f"CAST({prefix}{quote(self.column)} AS TIMESTAMP)"
        return (f"({ts} >= TIMESTAMP '{_sql_time(start)}' AND "
                f"{ts} < TIMESTAMP '{_sql_time(end)}')")

    def window(self, first: str, last: str) -> tuple[datetime, datetime]:
        """``[start, end)`` of the partitions ``first`` .. ``last`` (keys, both included)."""
        start, last_start = self.key_time(first), self.key_time(last)
        if last_start < start:
            raise ValueError(f"partition {last!r} comes before {first!r}")
        return start, self.next_start(last_start)

    def key_time(self, key: str) -> datetime:
        try:
            t = datetime.strptime(key, self.key_format).replace(tzinfo=timezone.utc)
        except ValueError:
            raise ValueError(f"{key!r} is not a {self.granularity} partition key (like "
                             f"{self.start.strftime(self.key_format)!r})") from None
        if t < self.start:
            raise ValueError(f"partition {key!r} is before the first partition "
                             f"{self.start.strftime(self.key_format)!r}")
        return t

    def next_start(self, t: datetime) -> datetime:
        if self.granularity == "hourly":
            return t + timedelta(hours=1)
        if self.granularity == "daily":
            return t + timedelta(days=1)
        return t.replace(year=t.year + t.month // 12, month=t.month % 12 + 1)

    def key_of(self, t: datetime) -> str:
        """The key of the partition holding ``t``."""
        t = t.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
        if self.granularity != "hourly":
            t = t.replace(hour=0)
        if self.granularity == "monthly":
            t = t.replace(day=1)
        return t.strftime(self.key_format)

    def describe(self, start: datetime, end: datetime) -> str:
        """``first .. last`` partition keys of ``[start, end)``."""
        a, b = self.key_of(start), self.key_of(end - timedelta(microseconds=1))
        return a if a == b else f"{a} .. {b}"


def _sql_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

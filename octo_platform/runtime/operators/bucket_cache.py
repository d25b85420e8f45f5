"""A state bucket's rows kept on the machine whose Spark task last computed them, across
batches and runs: the Spark path's counterpart of the driver path's state cache.

Each entry is an Arrow IPC file under a directory of the machine (``OCTO_STATE_CACHE``, by
default ``octo-state-cache`` in the system's temporary directory), memory-mapped by the next
task that reads the bucket there, whichever Python worker runs it. An entry is named by the
state table's location, the bucket and the exact data files the batch log pins for it: a task
whose pinned files name no entry here (another machine ran the bucket last, the batch that
wrote the entry died before its commit, the cache was cleared) reads those files from Delta,
which stays the durable truth. So an entry is never trusted beyond the files it stands for,
and exactly-once is unchanged. Each bucket keeps its newest entry only.

The driver path keeps what it held at the end of a run the same way (``driver.keep_held``):
each current-state bucket as the Spark path does, each state table whole (bucket
``WHOLE``), so the next run's first batch on the machine maps them instead of reading and
de-duplicating the Parquet files.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

__all__ = ["CACHE_ENV", "WHOLE", "cached", "keep", "counter"]

CACHE_ENV = "OCTO_STATE_CACHE"  # a directory, or "off"
WHOLE = -1  # the bucket of an entry holding a state table's rows as a whole (driver path)


def _bucket_dir(table: str, bucket: int) -> Path | None:
    root = os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "octo-state-cache")
    if root == "off":
        return None
    return Path(root) / hashlib.sha1(table.encode()).hexdigest()[:20] / str(bucket)


def _entry(files: list[str]) -> str:
    return hashlib.sha1("\n".join(sorted(files)).encode()).hexdigest()[:24] + ".arrow"


def cached(table: str, bucket: int, files: list[str], counts: Any = None) -> pa.Table | None:
    """The rows of ``table``'s bucket as its data ``files`` (paths relative to the table)
    hold them, if this machine kept them; else None. ``counts`` (``counter``) gets (1, 1)
    for a bucket found here, (0, 1) for one with files that was not."""
    where = _bucket_dir(table, bucket)
    if where is None or not files:
        return None
    try:
        with pa.memory_map(str(where / _entry(files))) as source:
            rows = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid):
        rows = None
    if counts is not None:
        counts.add((int(rows is not None), 1))
    return rows


class _Pairs(AccumulatorParam):
    def zero(self, value: tuple[int, int]) -> tuple[int, int]:
        return (0, 0)

    def addInPlace(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


def counter(spark: Any) -> Any:
    """A Spark accumulator of (buckets found in the cache, buckets looked up) for tasks to
    add to (``cached``)."""
    return spark.sparkContext.accumulator((0, 0), _Pairs())


def keep(table: str, bucket: int, files: list[str], rows: pa.Table) -> None:
    """Keep ``rows`` as the rows of ``table``'s bucket once its data files are ``files``
    (what the batch that wrote them commits), replacing the bucket's older entry. A cache
    that cannot be written is no error: the next task reads Delta."""
    where = _bucket_dir(table, bucket)
    if where is None or not files:
        return
    name = _entry(files)
    try:
        where.mkdir(parents=True, exist_ok=True)
        part = where / f".{uuid.uuid4().hex}.tmp"
        with pa.OSFile(str(part), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as out:
            out.write_table(rows)
        os.replace(part, where / name)
        for old in where.iterdir():
            if old.name != name and not old.name.startswith("."):
                old.unlink(missing_ok=True)
    except OSError:
        return

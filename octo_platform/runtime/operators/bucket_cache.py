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

A join's sides keep an entry per data file instead (``file_rows``): the file's rows sorted
by the hash of their join key (``keyed_rows.key_hash``), with the hashes, so that a task finds
the rows of the keys its batch touches by binary search (``find``) in the mapped files, never
reading the rest. The task that writes a file keeps its entry (``keep_file``); a file read
from Delta is kept once read. A data file never changes, so its entry stands for it until
the file leaves the bucket's log (``forget_files``).

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
from typing import Any, Callable

import numpy as np
import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from octo_platform.runtime.operators.keyed_rows import key_hash

__all__ = ["CACHE_ENV", "WHOLE", "HASH", "cached", "keep", "counter", "file_rows", "keep_file",
           "find", "forget_files"]

CACHE_ENV = "OCTO_STATE_CACHE"  # a directory, or "off"
WHOLE = -1  # the bucket of an entry holding a state table's rows as a whole (driver path)
HASH = "_h"  # a file entry's column of its rows' key hashes, in ascending order
_FILES = "files"  # the bucket's subdirectory of file entries


def _bucket_dir(table: str, bucket: int) -> Path | None:
    root = os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "octo-state-cache")
    if root == "off":
        return None
    return Path(root) / hashlib.sha1(table.encode()).hexdigest()[:20] / str(bucket)


def _entry(files: list[str]) -> str:
    return hashlib.sha1("\n".join(sorted(files)).encode()).hexdigest()[:24] + ".arrow"


def _mapped(path: Path) -> pa.Table | None:
    try:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid):
        return None


def _write(where: Path, name: str, rows: pa.Table) -> None:
    """``rows`` as the Arrow IPC file ``where/name``, whole or not at all."""
    where.mkdir(parents=True, exist_ok=True)
    part = where / f".{uuid.uuid4().hex}.tmp"
    with pa.OSFile(str(part), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as out:
        out.write_table(rows)
    os.replace(part, where / name)


def cached(table: str, bucket: int, files: list[str], counts: Any = None) -> pa.Table | None:
    """The rows of ``table``'s bucket as its data ``files`` (paths relative to the table)
    hold them, if this machine kept them; else None. ``counts`` (``counter``) gets (1, 1)
    for a bucket found here, (0, 1) for one with files that was not."""
    where = _bucket_dir(table, bucket)
    if where is None or not files:
        return None
    rows = _mapped(where / _entry(files))
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
        _write(where, name, rows)
        for old in where.iterdir():
            if old.name != name and not old.name.startswith("."):
                old.unlink(missing_ok=True)
    except OSError:
        return


def file_rows(table: str, bucket: int, file: str, read: Callable[[], pa.Table],
              keys: list[str]) -> tuple[pa.Table, bool] | None:
    """The rows of one data ``file`` of ``table``'s bucket (``read()`` reads it), sorted by
    the hash of their ``keys`` (column ``HASH``), and whether this machine had kept them:
    mapped from its entry, else read and kept (``keep_file``). None when the keys' types
    have no hash (``key_hash``) or the cache is off."""
    where = _bucket_dir(table, bucket)
    if where is None:
        return None
    rows = _mapped(where / _FILES / _file_entry(file))
    if rows is not None:
        return rows, True
    rows = keep_file(table, bucket, file, read(), keys)
    return None if rows is None else (rows, False)


def keep_file(table: str, bucket: int, file: str, rows: pa.Table, keys: list[str]
              ) -> pa.Table | None:
    """Keep ``rows``, the rows of data ``file`` of ``table``'s bucket, as its entry: sorted
    by the hash of their ``keys``, with the hashes (``HASH``), as returned. None when the
    keys' types have no hash or the cache is off. An entry that cannot be written is no
    error: the next task reads the file."""
    where = _bucket_dir(table, bucket)
    hashes = None if where is None else key_hash(rows, keys)
    if hashes is None:
        return None
    order = np.argsort(hashes, kind="stable")
    rows = rows.take(order).append_column(HASH, pa.array(hashes[order]))
    try:
        _write(where / _FILES, _file_entry(file), rows)
    except OSError:
        pass
    return rows


def _file_entry(file: str) -> str:
    return hashlib.sha1(file.encode()).hexdigest()[:24] + ".arrow"


def find(rows: pa.Table, hashes: np.ndarray) -> pa.Table:
    """The rows of a file entry (``file_rows``) whose key hash is one of ``hashes`` (in
    ascending order, distinct), without ``HASH``: a binary search per hash, no scan."""
    if not rows.num_rows or not len(hashes):
        return rows.slice(0, 0).drop_columns([HASH])
    have = rows.column(HASH).to_numpy()  # one chunk: mapped, not copied
    starts = np.searchsorted(have, hashes, "left")
    ends = np.searchsorted(have, hashes, "right")
    hit = ends > starts
    starts, ends = starts[hit], ends[hit]
    lengths = ends - starts
    at = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + \
        np.arange(int(lengths.sum()))
    return rows.take(pa.array(at, pa.int64())).drop_columns([HASH])


def forget_files(table: str, bucket: int, files: list[str]) -> None:
    """Drop the bucket's file entries of files other than ``files`` (its log's now)."""
    where = _bucket_dir(table, bucket)
    if where is None:
        return
    keep = {_file_entry(f) for f in files}
    try:
        for old in (where / _FILES).iterdir():
            if old.name not in keep and not old.name.startswith("."):
                old.unlink(missing_ok=True)
    except OSError:
        return

"""A state table's rows found by key, for the driver path's run-long state cache
(``kernels.LocalContext.cached`` with ``keys``): a batch reaches the rows of the keys it
touches in O(its keys x log(state)), never scanning the rest, and replaces them in O(its
keys) plus an amortized share of a merge.

Rows live in two runs, each an Arrow table in any order with an index: the top 32 bits of
a 64-bit hash of the key columns per row (``key_hash``), sorted, with each one's row. The
``base`` run has a mask of the rows since replaced; a small ``recent`` run holds the rows
written since the base was built. Rows loaded in hash order need no sort; many rows loaded
out of it are first searched by a hash join, and sorted for the next search (in the
background when kept for later batches), so a run of one batch never waits for a sort of
its state. A lookup binary-searches both indexes for the hashes of the keys asked, then
compares the key columns themselves (NULL equals NULL, NaN equals NaN, -0.0 equals 0.0, as
Spark groups), so a tie of hashes costs a comparison, never a wrong row. When the
recent run outgrows a quarter of the base, the two merge into a new base (two sorted
indexes: a linear merge; the tables concatenate by chunks). Each version is immutable: a
batch that fails leaves the cache's version of the rows before it intact.

Keys of a type ``key_hash`` does not cover (decimals, nested types) fall back to a scan of
all rows per lookup: still correct, O(state).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.runtime.operators.arrow import concat, key_join, normal_floats, safe_keys, \
    value_bytes

__all__ = ["KeyedRows", "Found", "key_hash", "same_values", "sorted_hashes"]

_NULL = np.uint64(0x9E3779B97F4A7C15)  # a NULL key column's hash
_PRIME = np.uint64(0x100000001B3)
# From this many rows (out of hash order) a run is first searched by a hash join of the
# hashes asked, and sorted for the next search: 2M hashes took ~55 ms to sort (``_index``),
# a join of 100K hashes against them 25-45 ms (``_Run``).
_LAZY_ROWS = 200_000
# An index keeps the top 32 bits of each row's hash: rows whose top bits tie are told
# apart by their keys (``KeyedRows._matches``), and each row's position fits below them.
_TOP = np.uint64(32)


def _idle_priority() -> None:
    """Run the calling thread at the lowest CPU priority, so a sort kept for later takes the
    cores the batches leave idle, not theirs. Linux only (a thread is a task there, with a
    priority of its own); elsewhere it sorts at the process's priority."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


_INDEXER = ThreadPoolExecutor(1, thread_name_prefix="octo-index",  # sorts runs kept for later
                              initializer=_idle_priority)


def same_values(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array
                ) -> pa.ChunkedArray | pa.Array:
    """Spark's ``a <=> b``: both NULL, or equal (NaN equals NaN, as Spark compares)."""
    equal = pc.equal(a, b)
    if pa.types.is_floating(a.type):
        equal = pc.or_(equal, pc.and_(pc.is_nan(a), pc.is_nan(b)))
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(pc.fill_null(equal, False), both_null)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place: a bijection of uint64 that spreads every input
    bit."""
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


def _words(col: pa.Array) -> np.ndarray | None:
    """A column's values as uint64 words equal where the values are (NULLs: any word);
    None for a type this does not cover."""
    t = col.type
    if pa.types.is_null(t):
        return np.zeros(len(col), np.uint64)
    if pa.types.is_boolean(t):
        col = pc.cast(col, pa.int64())
    elif pa.types.is_floating(t):
        col = normal_floats(pa.table({"x": col.cast(pa.float64())}))["x"].combine_chunks()
        col = col.view(pa.int64())
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
            or pa.types.is_large_binary(t):
        return _bytes_hash(col)
    elif pa.types.is_date32(t) or pa.types.is_time32(t):
        col = col.view(pa.int32()).cast(pa.int64())
    elif pa.types.is_timestamp(t) or pa.types.is_date64(t) or pa.types.is_time64(t) \
            or pa.types.is_duration(t):
        col = col.view(pa.int64())
    elif not pa.types.is_integer(t):
        return None
    if not pa.types.is_uint64(col.type):
        col = col.cast(pa.int64())
    if col.null_count:
        col = pc.fill_null(col, 0)
    return col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False).view(np.uint64)


def _bytes_hash(col: pa.Array) -> np.ndarray:
    """A polynomial hash (mod 2^64) of each value's bytes, its length mixed in."""
    data, starts, lengths = value_bytes(col)
    out = lengths.astype(np.uint64)
    total = int(lengths.sum())
    if not total:
        return out
    first = int(starts[0])
    raw = data[first:first + total].astype(np.uint64)
    starts = starts - first
    position = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    powers = np.cumprod(np.full(int(lengths.max()), _PRIME, np.uint64))
    full = lengths > 0
    sums = np.add.reduceat((raw + np.uint64(1)) * powers[position], starts[full])
    out[full] ^= _mix(sums)
    return out


def key_hash(table: pa.Table, keys: list[str]) -> np.ndarray | None:
    """Per row, a 64-bit hash of ``keys`` (equal keys, equal hashes); None when a key's
    type is not covered."""
    h = None
    for k in keys:
        col = table.column(k).combine_chunks()
        words = _words(col)
        if words is None:
            return None
        if col.null_count:
            words = np.where(col.is_valid().to_numpy(zero_copy_only=False), words, _NULL)
        if h is None:  # the first key: 0 * _PRIME ^ words
            h = words.copy()
        else:
            h *= _PRIME
            h ^= words
        _mix(h)
    return np.zeros(table.num_rows, np.uint64) if h is None else h


class _Run:
    """Rows (in any order) and their keys' hashes. Indexed (``at`` set): ``hashes`` the
    sorted top bits of the rows' hashes (``_TOP``), row ``at[j]``'s are ``hashes[j]``. Not
    yet (``at`` None): ``hashes[i]`` is row ``i``'s, and a search is a hash join of the
    hashes asked; the next search uses the index (``indexed``), sorted meanwhile in the
    background (``index_later``) or then. Merging runs copies no rows: tables concatenate
    by chunks."""

    def __init__(self, rows: pa.Table, hashes: np.ndarray, at: np.ndarray | None) -> None:
        self.rows, self.hashes, self.at = rows, hashes, at
        self.searched = False
        self._index: Future | None = None

    @staticmethod
    def of(rows: pa.Table, hashes: np.ndarray, lazy: bool = False) -> _Run:
        """A run of ``rows`` with their keys' ``hashes``: indexed now when they come in
        hash order (no sort) or unless ``lazy``."""
        if not np.any(hashes[1:] < hashes[:-1]):
            return _Run(rows, _top(hashes), np.arange(len(hashes)))
        return _Run(rows, hashes, None) if lazy else _Run.sort(rows, hashes)

    @staticmethod
    def sort(rows: pa.Table, hashes: np.ndarray) -> _Run:
        """The run of ``rows`` indexed by a sort of their ``hashes`` (not in hash order)."""
        return _Run(rows, *_index(hashes))

    def index_later(self) -> None:
        """Start sorting the run in the background (for ``indexed``)."""
        if self.at is None and self._index is None:
            self._index = _INDEXER.submit(_Run.sort, self.rows, self.hashes)

    def indexed(self) -> _Run:
        """The run indexed: by the background sort if it is done, else sorted now (the
        background's sorts run at idle priority, behind a busy machine's other work)."""
        if self.at is not None:
            return self
        if self._index is not None and self._index.done():
            return self._index.result()
        if self._index is not None:
            self._index.cancel()  # if it has not started
        return _Run.sort(self.rows, self.hashes)

    def pairs(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(i, r) for each asked hash ``hashes[i]`` and row ``r`` of that hash."""
        if self.at is None:
            asked = pa.table({"h": hashes, "i": np.arange(len(hashes))})
            mine = pa.table({"h": self.hashes, "r": np.arange(len(self.hashes))})
            got = mine.join(asked, "h", join_type="inner", use_threads=False)
            return got["i"].to_numpy(), got["r"].to_numpy()
        mine, n = self.hashes, len(self.hashes)
        ordered, order = _index(hashes)  # a search starts where the last one ended
        lo = np.searchsorted(mine, ordered, "left")
        counts = (mine[np.minimum(lo, n - 1)] == ordered).astype(np.int64) if n else 0 * lo
        # Where the next row's top bits are the same (a multiset's values, or a tie), a
        # second search counts them: a search of every hash costs ~15 ms per 100K over 2M.
        more = np.flatnonzero(counts)
        more = more[lo[more] + 1 < n]
        more = more[mine[lo[more] + 1] == ordered[more]]
        counts[more] = np.searchsorted(mine, ordered[more], "right") - lo[more]
        asked = np.repeat(order, counts)
        first = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        return asked, self.at[first + np.arange(len(asked))]

    def take(self, rows: np.ndarray) -> pa.Table:
        return self.rows.take(pa.array(rows))

    def without(self, dead: np.ndarray) -> _Run:
        """The indexed run without the rows ``dead`` flags (by row)."""
        keep = ~dead[self.at]
        return _Run(self.rows, self.hashes[keep], self.at[keep])

    def merged(self, other: _Run) -> _Run:
        """Both indexed runs as one (a stable sort of two sorted runs is a linear merge);
        rows no position names are dropped once they outnumber the rest."""
        rows = pa.concat_tables([self.rows, other.rows])
        hashes = np.concatenate([self.hashes, other.hashes])
        at = np.concatenate([self.at, other.at + self.rows.num_rows])
        order = np.argsort(hashes, kind="stable")
        run = _Run(rows, hashes[order], at[order])
        if rows.num_rows > 2 * len(at) or rows.column(0).num_chunks > 64:
            run = _Run(run.rows.take(pa.array(run.at)), run.hashes,
                       np.arange(len(run.at), dtype=np.int64))
        return run

    def dead(self) -> np.ndarray:
        """A mask of the run's rows its index does not name (all but those ``at`` holds)."""
        dead = np.ones(self.rows.num_rows, bool)
        dead[self.at] = False
        return dead


def _packed_sort(hashes: np.ndarray, low: np.uint64) -> tuple[np.ndarray, np.ndarray]:
    """``hashes >> low``, sorted, and the order that sorts them: each hash's top bits packed
    with its position in the ``low`` bits, sorted as values. numpy sorts values far faster
    than it argsorts them (2M hashes: 45 against 310 ms here)."""
    packed = hashes >> low << low
    packed |= np.arange(len(hashes), dtype=np.uint64)
    packed.sort()
    order = (packed & ((np.uint64(1) << low) - np.uint64(1))).view(np.int64)
    packed >>= low
    return packed, order


def _index(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top bits (``_TOP``) of ``hashes``, sorted, and the order that sorts them (ties
    in any order); 2M hashes in ~55 ms here."""
    if len(hashes) >= 1 << 32:  # positions do not fit below the top bits
        top = _top(hashes)
        order = np.argsort(top, kind="stable")
        return top[order], order
    top, order = _packed_sort(hashes, _TOP)
    return top.astype(np.uint32), order


def _top(hashes: np.ndarray) -> np.ndarray:
    """The top bits (``_TOP``) of ``hashes``, as 32-bit values: an index half the size is
    searched faster (100K sorted hashes in 2M: 10.5 against 24.9 ms here)."""
    return (hashes >> _TOP).astype(np.uint32)


def sorted_hashes(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``hashes`` sorted, and the order that sorts them (an ``argsort``): their top bits
    sorted with as few low bits as the positions need (``_packed_sort``), then the rare
    hashes whose top bits tie sorted again (a stable sort of an almost sorted array)."""
    n = len(hashes)
    _, order = _packed_sort(hashes, np.uint64(max(1, (n - 1).bit_length())))
    ordered = hashes[order]
    if n > 1 and np.any(ordered[1:] < ordered[:-1]):
        again = np.argsort(ordered, kind="stable")
        order, ordered = order[again], ordered[again]
    return ordered, order


@dataclass(frozen=True)
class Found:
    """What ``KeyedRows.find`` found: the ``rows`` of the distinct keys ``asked``, and
    where they are (rows of the base and of the recent run)."""

    rows: pa.Table
    asked: pa.Table
    base: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    recent: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class KeyedRows:
    """Rows found by the values of ``keys`` (several rows may share a key: a multiset's
    values). ``find`` gives the rows of some keys; ``replace`` gives a new version where
    the rows of some keys are replaced. ``kept``: the rows are kept for later batches (a
    run's state cache), so many rows out of hash order, first searched by a hash join, are
    sorted in the background after that search, not at the next one."""

    def __init__(self, rows: pa.Table, keys: list[str], kept: bool = False) -> None:
        self.keys, self.schema, self._kept = keys, rows.schema, kept
        hashes = key_hash(rows, keys) if keys else None
        self._scan: pa.Table | None = rows if hashes is None else None
        if hashes is not None:
            self._base = _Run.of(rows, hashes, lazy=rows.num_rows >= _LAZY_ROWS)
            self._dead = np.zeros(rows.num_rows, bool)  # the base's rows since replaced
            self._recent = _Run(rows.schema.empty_table(), _top(hashes[:0]),
                                np.empty(0, np.int64))

    @property
    def num_rows(self) -> int:
        if self._scan is not None:
            return self._scan.num_rows
        return int(len(self._dead) - self._dead.sum()) + len(self._recent.at)

    def table(self) -> pa.Table:
        """Every row (in no particular order)."""
        if self._scan is not None:
            return self._scan
        # the base's rows its index does not name are dead too (``_Run.dead``): a filter
        # reads them in place, where a take in hash order gathers them (2M rows: 25 ms
        # against 150 ms)
        live = self._base.rows.filter(pa.array(~self._dead))
        return concat([live, self._recent.take(self._recent.at)], self.schema)

    def find(self, probe: pa.Table) -> Found:
        """The rows whose key equals (``<=>``) some row of ``probe[keys]``."""
        asked = self._distinct(probe)
        if self._scan is not None:
            return Found(self._scan_matches(asked, "left semi"), asked)
        if self._base.searched:
            self._base = self._base.indexed()  # the same rows, found faster from now on
        elif self._kept:
            self._base.index_later()
        self._base.searched = True
        hashes = key_hash(asked, self.keys)
        base = self._matches(self._base, asked, hashes)
        base = base[~self._dead[base]]
        recent = self._matches(self._recent, asked, hashes)
        rows = concat([self._base.take(base), self._recent.take(recent)], self.schema)
        return Found(rows, asked, base, recent)

    def replace(self, found: Found, rows: pa.Table) -> KeyedRows:
        """A new version: without the rows ``found`` (by ``find``), with ``rows`` (whose
        keys are among the keys ``found`` was asked for)."""
        rows = rows.select(self.schema.names).cast(self.schema)
        new = object.__new__(KeyedRows)
        new.keys, new.schema, new._kept = self.keys, self.schema, self._kept
        if self._scan is not None:
            new._scan = concat([self._scan_matches(found.asked, "left anti"), rows],
                               self.schema)
            return new
        new._scan = None
        dead = self._dead.copy()
        dead[found.base] = True
        gone = np.zeros(self._recent.rows.num_rows, bool)
        gone[found.recent] = True
        recent = self._recent.without(gone).merged(
            _Run.of(rows, key_hash(rows, self.keys)))
        live = len(dead) - int(dead.sum())
        if len(recent.at) * 4 > live:  # rebuild: one run of every row
            base = self._base.indexed().without(dead).merged(recent)
            new._base, new._dead = base, base.dead()
            new._recent = _Run(self.schema.empty_table(), base.hashes[:0], base.at[:0])
        else:
            new._base, new._dead, new._recent = self._base, dead, recent
        return new

    def add(self, rows: pa.Table) -> KeyedRows:
        """A new version with ``rows`` added (a multiset's rows: none replaced)."""
        nothing = self.schema.empty_table()
        return self.replace(Found(nothing, nothing.select(self.keys)), rows)

    def _distinct(self, probe: pa.Table) -> pa.Table:
        keys = normal_floats(probe.select(self.keys))  # as ``same_values`` compares
        return keys.group_by(self.keys, use_threads=False).aggregate([])

    def _matches(self, run: _Run, asked: pa.Table, hashes: np.ndarray) -> np.ndarray:
        """The rows of ``run`` whose key is one of ``asked``'s (distinct)."""
        i, r = run.pairs(hashes)
        if not len(r):
            return r
        equal = pa.array(np.ones(len(r), bool))
        ii, rr = pa.array(i), pa.array(r)
        for k in self.keys:
            equal = pc.and_(equal, same_values(asked.column(k).take(ii),
                                               run.rows.column(k).take(rr)))
        return r[equal.to_numpy(zero_copy_only=False)]

    def _scan_matches(self, asked: pa.Table, how: str) -> pa.Table:
        assert self._scan is not None
        rows, names = self._scan, self._scan.column_names
        keys = normal_floats(rows.select(self.keys))  # as ``_distinct`` made ``asked``
        for i, k in enumerate(self.keys):  # compared as normalized, kept as they are
            rows = rows.append_column(f"_n{i}", keys.column(k))
        normal = [f"_n{i}" for i in range(len(self.keys))]
        ok, ocols = safe_keys(rows, normal, "_o")
        pk, pcols = safe_keys(asked.rename_columns(normal), normal, "_p")
        return key_join(ok, pk.select(pcols), ocols, pcols, how).select(names)

"""The driver path's state cache found by key (``operators.keyed_rows``), against a model:
a Python list of rows replaced by key, with keys compared as Spark groups them (NULL equals
NULL, NaN equals NaN, -0.0 equals 0.0). Random keys of every covered type and of a type the
hash does not cover (the scan fallback), several rows per key (a multiset), and enough
versions that the recent run is merged into the base several times; and with hashes
that collide on purpose."""
from __future__ import annotations

import math
import random
import sys
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from octo_platform.runtime.operators import keyed_rows
from octo_platform.runtime.operators.keyed_rows import KeyedRows, key_hash

TYPES = {
    "int": (pa.int64(), lambda r: r.choice([None, -1, 0, 1, 2, 3, 2**40, -(2**63)])),
    "str": (pa.string(), lambda r: r.choice([None, "", "a", "ab", "é", "abcd", "abcde" * 3])),
    "float": (pa.float64(), lambda r: r.choice([None, 0.0, -0.0, 1.5, math.nan, -1.5])),
    "bool": (pa.bool_(), lambda r: r.choice([None, True, False])),
    "dec": (pa.decimal128(5, 2), lambda r: r.choice([None, Decimal("1.00"), Decimal("2.50")])),
}


def _norm(v):
    if isinstance(v, float):
        return "nan" if math.isnan(v) else v + 0.0
    return v


def _key(row: dict, keys: list[str]) -> tuple:
    return tuple(_norm(row[k]) for k in keys)


def _sorted(rows: list[dict]) -> list[tuple]:
    return sorted((tuple(repr(_norm(v)) for v in r.values()) for r in rows))


@pytest.mark.parametrize("kinds", [["int"], ["str"], ["float"], ["int", "str"],
                                   ["bool", "float", "int"], ["dec"], ["int", "dec"]])
@pytest.mark.parametrize("seed,collide,lazy,kept", [
    (1, False, False, False), (2, False, True, False), (3, True, False, False),
    (4, True, True, True), (5, False, True, True)])
def test_find_and_replace_equal_a_model(kinds, seed, collide, lazy, kept, monkeypatch):
    """``lazy``: the rows first loaded are searched by a hash join, then sorted (as from
    ``_LAZY_ROWS`` rows); ``kept``: sorted in the background after the first search."""
    monkeypatch.setattr(keyed_rows, "_LAZY_ROWS", 0 if lazy else 10**9)
    if collide:  # four hashes in all: nearly every lookup meets other keys' rows
        real = keyed_rows.key_hash
        monkeypatch.setattr(keyed_rows, "key_hash", lambda t, k: (
            None if (h := real(t, k)) is None else h % np.uint64(4)))
    rnd = random.Random(seed)
    keys = [f"k{i}" for i in range(len(kinds))]
    schema = pa.schema([*(pa.field(k, TYPES[t][0]) for k, t in zip(keys, kinds)),
                        pa.field("v", pa.int64())])

    def rows(n: int) -> list[dict]:
        return [{**{k: TYPES[t][1](rnd) for k, t in zip(keys, kinds)}, "v": rnd.randint(0, 9)}
                for _ in range(n)]

    model = rows(60)
    cache = KeyedRows(pa.Table.from_pylist(model, schema), keys, kept=kept)
    for _ in range(25):
        probe = rows(rnd.randint(0, 6))
        asked = {_key(r, keys) for r in probe}
        found = cache.find(pa.Table.from_pylist(probe, schema))
        assert _sorted(found.rows.to_pylist()) == _sorted(
            [r for r in model if _key(r, keys) in asked])
        new = [r for r in rows(rnd.randint(0, 8)) if _key(r, keys) in asked] or \
            [dict(r, v=r["v"] + 100) for r in probe[:1]]
        before = cache
        cache = cache.replace(found, pa.Table.from_pylist(new, schema))
        old_model = model
        model = [r for r in model if _key(r, keys) not in asked] + new
        table = cache.table()
        assert _sorted(table.to_pylist()) == _sorted(model)
        assert cache.num_rows == len(model)
        # a version is never changed by the next one (a failed batch keeps its cache)
        assert _sorted(before.table().to_pylist()) == _sorted(old_model)


def test_hash_is_equal_for_equal_keys_and_spreads_the_rest():
    t = pa.table({"s": ["", None, "a", "ab", "ba", "ab", None, ""],
                  "f": [0.0, None, math.nan, -0.0, float("nan"), 0.0, None, 0.0]})
    h = key_hash(t, ["s", "f"])
    assert h[3] == h[5] and h[1] == h[6] and h[0] == h[7]
    assert len(set(h.tolist())) == 5  # ("", 0), NULLs, ("a", NaN), ("ab", 0), ("ba", NaN)
    many = pa.table({"k": np.arange(100_000)})
    assert len(np.unique(key_hash(many, ["k"]))) == 100_000
    assert key_hash(pa.table({"d": pa.array([Decimal(1)])}), ["d"]) is None


def test_a_scan_keeps_the_values_it_does_not_compare():
    """Keys of a type the hash does not cover are compared with floats normalized, but the
    rows kept keep their own values (-0.0 stays -0.0)."""
    t = pa.table({"k": pa.array([Decimal("1.00"), Decimal("2.00")], pa.decimal128(5, 2)),
                  "x": pa.array([-0.0, 1.0])})
    cache = KeyedRows(t, ["k"])
    found = cache.find(t.slice(1))
    kept = cache.replace(found, t.slice(1)).table().sort_by("k")
    assert math.copysign(1.0, kept["x"][0].as_py()) == -1.0


@pytest.mark.parametrize("n", [0, 1, 2, 5000, 300_000])
def test_an_index_sorts_hashes_by_their_top_bits_and_position_then_fixes_ties(n):
    """``sorted_hashes`` sorts the top bits of each hash packed with its position, then sorts
    again hashes whose top bits tie: the same hashes as one sort, and an order that gives
    them (duplicates, ties in the top bits with the low bits reversed, 0 and 2^64-1);
    ``_index`` sorts the top 32 bits the same way."""
    rng = np.random.default_rng(n)
    hashes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    if n > 5000:
        hashes[:1000] = hashes[1000:2000]  # duplicates
        top = hashes[3000] & ~np.uint64(0xFFFFF)
        hashes[3000:3010] = top | np.arange(10, 0, -1, dtype=np.uint64)  # top bits tie
        hashes[4000:4002] = [0, 2**64 - 1]
    ordered, order = keyed_rows.sorted_hashes(hashes)
    assert sorted(order.tolist()) == list(range(n))
    assert (ordered == np.sort(hashes)).all()
    assert (hashes[order] == ordered).all()
    tops, order = keyed_rows._index(hashes)  # an index: the top bits, ties in any order
    assert sorted(order.tolist()) == list(range(n))
    assert (tops == np.sort(hashes >> np.uint64(32))).all()
    assert (hashes[order] >> np.uint64(32) == tops).all()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities: Linux")
def test_kept_rows_are_sorted_at_idle_priority_and_a_search_does_not_wait_for_it():
    """The background sorts take the cores the batches leave idle (nice 19 on Linux); a
    search that needs an index not yet sorted sorts it itself rather than wait."""
    import os
    import threading

    assert keyed_rows._INDEXER.submit(
        lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result() == 19
    gate = threading.Event()
    keyed_rows._INDEXER.submit(gate.wait)  # the indexer busy: the next sort waits its turn
    try:
        rows = pa.table({"k": np.arange(1000, 0, -1, dtype=np.int64)})
        hashes = key_hash(rows, ["k"])
        run = keyed_rows._Run.of(rows, hashes, lazy=True)
        run.index_later()
        indexed = run.indexed()
        assert run._index is not None and run._index.cancelled()
        assert indexed.at is not None and sorted(indexed.at) == list(range(1000))
    finally:
        gate.set()

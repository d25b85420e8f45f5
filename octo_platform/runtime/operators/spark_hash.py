"""Spark's ``hash(...)`` (Murmur3, seed 42) and ``pmod`` over Arrow columns, computed as
Spark computes them, for the types whose hashing is a fixed function of their value: the
driver path places a change event in its current-state bucket without a round trip to Spark.
Other types (``hashable`` says which) are left to Spark: the caller asks it instead.

Spark (``Murmur3_x86_32``, ``HashExpression``): a NULL leaves the running hash as it was;
BOOLEAN, INT, DATE (its day number) hash as ``hashInt``; BIGINT and TIMESTAMP (its
microseconds) as ``hashLong`` (the low word, then the high one); STRING as
``hashUnsafeBytes`` of its UTF-8 bytes (whole little-endian words, then each remaining byte
as a signed int: not the standard Murmur3 tail).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octo_platform.runtime.operators.arrow import value_bytes

__all__ = ["hashable", "spark_hash", "spark_pmod"]

SEED = 42
_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def hashable(t: pa.DataType) -> bool:
    """Whether ``spark_hash`` computes Spark's hash of a column of type ``t``."""
    return (pa.types.is_boolean(t) or pa.types.is_int8(t) or pa.types.is_int16(t)
            or pa.types.is_int32(t) or pa.types.is_int64(t) or pa.types.is_date32(t)
            or (pa.types.is_timestamp(t) and t.unit == "us")
            or pa.types.is_string(t) or pa.types.is_large_string(t))


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h1 = h1 ^ np.asarray(length, dtype=np.uint32)
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * np.uint32(0x85EBCA6B)
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * np.uint32(0xC2B2AE35)
    return h1 ^ (h1 >> np.uint32(16))


def _hash_int(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seed, _mix_k1(values.astype(np.int32).view(np.uint32))), 4)


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    words = values.astype(np.int64).view(np.uint64)
    low = (words & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (words >> np.uint64(32)).astype(np.uint32)
    return _fmix(_mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high)), 8)


def _hash_strings(col: pa.Array, seed: np.ndarray) -> np.ndarray:
    """``hashUnsafeBytes`` of each value's UTF-8 bytes, all rows at once: the k-th whole
    word of every value long enough, then each tail byte (values of NULL rows are
    meaningless: the caller keeps the seed there)."""
    data, starts, lengths = value_bytes(col)
    aligned = lengths - lengths % 4
    h = seed.copy()
    # Rows by their number of whole words, longest first: word k is hashed for a prefix.
    words = aligned // 4
    order = np.argsort(-words, kind="stable")
    longer = np.searchsorted(-words[order], -np.arange(int(words.max(initial=0))), "left")
    for k, m in enumerate(longer):
        rows = order[:m]
        at = starts[rows] + 4 * k
        word = (data[at].astype(np.uint32) | data[at + 1].astype(np.uint32) << np.uint32(8)
                | data[at + 2].astype(np.uint32) << np.uint32(16)
                | data[at + 3].astype(np.uint32) << np.uint32(24))
        h[rows] = _mix_h1(h[rows], _mix_k1(word))
    for t in range(3):  # each tail byte as a signed int
        rows = np.nonzero(lengths - aligned > t)[0]
        byte = data[starts[rows] + aligned[rows] + t].view(np.int8).astype(np.int32)
        h[rows] = _mix_h1(h[rows], _mix_k1(byte.view(np.uint32)))
    return _fmix(h, lengths.astype(np.uint32))


def spark_hash(columns: list[pa.ChunkedArray | pa.Array]) -> np.ndarray:
    """Spark's ``hash(c1, c2, ...)`` of each row, as int32."""
    n = len(columns[0]) if columns else 0
    h = np.full(n, SEED, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for col in columns:
            col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            t = col.type
            valid = col.is_valid().to_numpy(zero_copy_only=False)
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                new = _hash_strings(col, h)
            else:
                if pa.types.is_boolean(t):
                    raw = pc.cast(col, pa.int32())
                elif pa.types.is_date32(t) or pa.types.is_timestamp(t):
                    raw = col.view(pa.int32() if pa.types.is_date32(t) else pa.int64())
                else:
                    raw = col
                values = pc.fill_null(raw, 0).to_numpy(zero_copy_only=False)
                wide = pa.types.is_int64(raw.type)
                new = _hash_long(values, h) if wide else _hash_int(values, h)
            h = np.where(valid, new, h)
    return h.view(np.int32)


def spark_pmod(hashes: np.ndarray, n: int) -> pa.Array:
    """Spark's ``pmod(hash, n)`` (a non-negative remainder), as int32."""
    return pa.array(np.mod(hashes.astype(np.int64), n).astype(np.int32))

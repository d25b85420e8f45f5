"""Reserved column names every stage agrees on (ground floor: imports no octo stage)."""
from __future__ import annotations

__all__ = ["WEIGHT", "BUCKET", "COUNT"]

WEIGHT = "__octo_w"  # +n inserts n copies of a row, -n retracts them (a Z-set weight)
BUCKET = "_bucket"  # state and snapshot tables are partitioned by pmod(hash(key), buckets)
COUNT = "_n"  # rows of a group in aggregate state

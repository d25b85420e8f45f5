"""Vectorized (numpy/pyarrow), seeded Nexmark input for the join benchmarks.

Same schemas, file formats and proportions as ``connectors.generators.nexmark`` (whose
row-at-a-time generator needs minutes per million bids and, for the CDC feed, time that grows
with the feed's size): per batch of B bids, B/46 persons and 3B/46 auctions (Parquet, one file
per batch and source) and a Debezium JSON feed of a mutable ``auctions_cdc`` table: a snapshot
of B/20 rows in batch 0, then per batch B/100 creates, B/250 updates and B/500 deletes of
random live rows (updates collapse or raise a reserve, raise an initial bid or move a row to
another category). Bids pick an auction uniformly, or one of every tenth auction (hot) half of
the time; bidders likewise (every fifth person, 30%). Ids continue across batches, so later
bids hit auctions of any earlier batch. Speed: ~1M events/s of Parquet on one core, the JSON
CDC feed ~100K events/s.

A batch is sized in *events* (all four sources): ``bids_for_events(E)`` bids make ~E events.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from connectors.generators.nexmark import AUCTIONS_DDL, BIDS_DDL, PERSONS_DDL, arrow_schema

__all__ = ["EVENTS_PER_BID", "SOURCES", "FastNexmark", "bids_for_events", "write_batch"]

SOURCES = {  # name -> (DDL, format)
    "persons": (PERSONS_DDL, "parquet"),
    "auctions": (AUCTIONS_DDL, "parquet"),
    "bids": (BIDS_DDL, "parquet"),
    "auctions_cdc": (AUCTIONS_DDL, "debezium-json"),
}
# bids + persons + auctions + CDC changes (creates, updates, deletes) per bid, after batch 0
EVENTS_PER_BID = 1 + 1 / 46 + 3 / 46 + 1 / 100 + 1 / 250 + 1 / 500

CHANNELS = ("apple", "google", "facebook", "baidu")
FIRST = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter")
LAST = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
CITIES = (("Phoenix", "AZ"), ("Los Angeles", "CA"), ("San Francisco", "CA"), ("Boise", "ID"),
          ("Portland", "OR"), ("Bend", "OR"), ("Redmond", "WA"), ("Seattle", "WA"),
          ("Kent", "WA"), ("Cheyenne", "WY"))
ADJ = ("vintage", "rare", "mint", "signed", "antique", "used", "boxed", "limited")
NOUN = ("camera", "guitar", "watch", "lamp", "bicycle", "vase", "comic", "record", "chair")
BASE_EPOCH = 1_704_067_200  # 2024-01-01 00:00:00 UTC
TS_FMT = "%Y-%m-%d %H:%M:%S"


def bids_for_events(events: int) -> int:
    return max(1, round(events / EVENTS_PER_BID))


def _pick(rng: np.random.Generator, values: tuple[str, ...], n: int) -> tuple[pa.Array, Any]:
    idx = rng.integers(0, len(values), n)
    return pc.take(pa.array(values, pa.string()), pa.array(idx)), idx


def _join(*parts: Any) -> pa.Array:
    """Element-wise string concatenation of arrays and str scalars."""
    return pc.binary_join_element_wise(*parts, "")


def _ids_str(ids: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(ids, pa.int64()), pa.string())


class FastNexmark:
    """Seeded generator; call ``batch(i, n_bids)`` for i = 0, 1, 2, ... in order."""

    def __init__(self, seed: int = 7, first_person: int = 100, first_auction: int = 1000):
        self.rng = np.random.default_rng(seed)
        self.clock = BASE_EPOCH  # seconds; one tick per generated event
        self.first_person, self.next_person = first_person, first_person
        self.first_auction, self.next_auction = first_auction, first_auction
        self.next_cdc = 1
        self.cdc: dict[int, dict[str, Any]] = {}  # live auctions_cdc rows

    def _ticks(self, n: int) -> np.ndarray:
        t = self.clock + 1 + np.arange(n, dtype=np.int64)
        self.clock += n
        return t

    @staticmethod
    def _ts(seconds: np.ndarray) -> pa.Array:
        return pa.array(seconds * 1_000_000, pa.timestamp("us", tz="UTC"))

    # -- append-only sources --------------------------------------------------------------
    def persons(self, n: int) -> pa.Table:
        ids = np.arange(self.next_person, self.next_person + n, dtype=np.int64)
        self.next_person += n
        first, _ = _pick(self.rng, FIRST, n)
        last, _ = _pick(self.rng, LAST, n)
        city_idx = pa.array(self.rng.integers(0, len(CITIES), n))
        cities = pc.take(pa.array([c for c, _ in CITIES], pa.string()), city_idx)
        states = pc.take(pa.array([s for _, s in CITIES], pa.string()), city_idx)
        return pa.table({
            "id": ids, "name": _join(first, " ", last),
            "email": _join(pc.utf8_lower(first), ".", pc.utf8_lower(last), _ids_str(ids),
                           "@example.com"),
            "city": cities, "state": states,
            "date_time": self._ts(self._ticks(n)),
        }, schema=arrow_schema(PERSONS_DDL))

    def _auction_columns(self, ids: np.ndarray) -> dict[str, Any]:
        n, rng = len(ids), self.rng
        if self.next_person == self.first_person:
            raise ValueError("generate persons before auctions (sellers must exist)")
        now = self._ticks(n)
        initial = rng.integers(1, 1001, n)
        adj, _ = _pick(rng, ADJ, n)
        noun, _ = _pick(rng, NOUN, n)
        return {"id": ids, "item_name": _join(adj, " ", noun),
                "description": _join("A ", adj, " ", noun, ", lot ", _ids_str(ids)),
                "initial_bid": initial, "reserve": initial + rng.integers(1, 1001, n),
                "date_time": now, "expires": now + rng.integers(600, 7201, n),
                "seller": rng.integers(self.first_person, self.next_person, n),
                "category": rng.integers(10, 20, n)}

    def auctions(self, n: int) -> pa.Table:
        ids = np.arange(self.next_auction, self.next_auction + n, dtype=np.int64)
        self.next_auction += n
        cols = self._auction_columns(ids)
        cols["date_time"], cols["expires"] = self._ts(cols["date_time"]), self._ts(cols["expires"])
        return pa.table(cols, schema=arrow_schema(AUCTIONS_DDL))

    def bids(self, n: int) -> pa.Table:
        rng = self.rng
        lo, hi = self.first_auction, self.next_auction
        if hi == lo:
            raise ValueError("generate persons and auctions before bids")
        # hot auctions: every tenth id; hot people: every fifth
        n_hot_a = (hi - lo + 9) // 10
        auction = np.where(rng.random(n) < 0.5, lo + 10 * rng.integers(0, n_hot_a, n),
                           rng.integers(lo, hi, n))
        plo, phi = self.first_person, self.next_person
        n_hot_p = (phi - plo + 4) // 5
        bidder = np.where(rng.random(n) < 0.3, plo + 5 * rng.integers(0, n_hot_p, n),
                          rng.integers(plo, phi, n))
        channel, _ = _pick(rng, CHANNELS, n)
        price = np.where(rng.random(n) < 0.9, rng.integers(1, 2001, n),
                         rng.integers(2000, 100_001, n))
        url = _join("https://www.nexmark.com/", channel, "/item.htm?query=", _ids_str(auction))
        return pa.table({"auction": auction, "bidder": bidder, "price": price,
                         "channel": channel, "url": url,
                         "date_time": self._ts(self._ticks(n))}, schema=arrow_schema(BIDS_DDL))

    # -- the CDC feed ---------------------------------------------------------------------
    def _cdc_rows(self, n: int) -> list[dict[str, Any]]:
        ids = np.arange(self.next_cdc, self.next_cdc + n, dtype=np.int64)
        self.next_cdc += n
        cols = self._auction_columns(ids)
        for k in ("date_time", "expires"):
            cols[k] = [datetime.fromtimestamp(int(s), tz=timezone.utc).strftime(TS_FMT)
                       for s in cols[k]]
        cols = {k: v.to_pylist() if isinstance(v, pa.Array) else
                (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in cols.items()}
        return [dict(zip(cols, vals)) for vals in zip(*cols.values())]

    def _event(self, op: str, before: dict | None, after: dict | None) -> dict[str, Any]:
        self.clock += 1
        return {"before": before, "after": after, "op": op, "ts_ms": self.clock * 1000,
                "source": {"table": "auctions"}}

    def cdc_events(self, snapshot: int, creates: int, updates: int,
                   deletes: int) -> list[dict[str, Any]]:
        """``snapshot`` pre-existing rows as ``r`` events, then a shuffled mix of creates,
        updates and deletes (each live row touched at most once per call)."""
        events = []
        for row in self._cdc_rows(snapshot):
            self.cdc[row["id"]] = row
            events.append(self._event("r", None, row))
        live = np.fromiter(self.cdc.keys(), dtype=np.int64, count=len(self.cdc))
        k = min(len(live), updates + deletes)
        picked = self.rng.choice(live, size=k, replace=False).tolist() if k else []
        ops = ["c"] * creates + ["u"] * min(updates, k) + ["d"] * (k - min(updates, k))
        ops = [ops[i] for i in self.rng.permutation(len(ops))]
        new_rows = iter(self._cdc_rows(creates))
        targets = iter(picked)
        rng = self.rng
        for op in ops:
            if op == "c":
                row = next(new_rows)
                self.cdc[row["id"]] = row
                events.append(self._event("c", None, row))
                continue
            old = self.cdc[next(targets)]
            if op == "d":
                del self.cdc[old["id"]]
                events.append(self._event("d", old, None))
                continue
            new, kind = dict(old), int(rng.integers(0, 4))
            if kind == 0:  # reserve collapses
                new["initial_bid"] = max(1, old["initial_bid"] // 4)
                new["reserve"] = new["initial_bid"] + int(rng.integers(1, 6))
            elif kind == 1:  # reserve rises
                new["reserve"] = old["reserve"] + int(rng.integers(1, 501))
            elif kind == 2:  # moves to another category
                new["category"] = int(rng.choice([c for c in range(10, 20)
                                                  if c != old["category"]]))
            else:  # initial bid rises
                new["initial_bid"] = old["initial_bid"] + int(rng.integers(500, 1001))
                new["reserve"] = max(old["reserve"], new["initial_bid"]) + int(
                    rng.integers(1, 101))
            self.cdc[old["id"]] = new
            events.append(self._event("u", old, new))
        return events

    # -- one batch of every source --------------------------------------------------------
    def batch(self, i: int, n_bids: int) -> dict[str, Any]:
        """Tables (Parquet sources) and a list of events (``auctions_cdc``) of batch ``i``."""
        out: dict[str, Any] = {
            "persons": self.persons(max(1, n_bids // 46)),
            "auctions": self.auctions(max(1, n_bids * 3 // 46)),
            "bids": self.bids(n_bids),
        }
        if i == 0:
            out["auctions_cdc"] = self.cdc_events(max(10, n_bids // 20), max(1, n_bids // 100),
                                                  0, 0)
        else:
            out["auctions_cdc"] = self.cdc_events(0, max(1, n_bids // 100),
                                                  max(1, n_bids // 250), max(1, n_bids // 500))
        return out


def write_batch(data: dict[str, Any], root: Path, seq: int) -> dict[str, str]:
    """Write one batch: ``root/<source>/part-<seq>.<ext>``; returns {source: path}."""
    paths = {}
    for name, value in data.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        if isinstance(value, pa.Table):
            path = d / f"part-{seq:05d}.parquet"
            pq.write_table(value, path)
        else:
            path = d / f"part-{seq:05d}.json"
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in value)
        paths[name] = str(path)
    return paths


def count(value: Any) -> int:
    return value.num_rows if isinstance(value, pa.Table) else len(value)

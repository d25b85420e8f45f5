"""Deterministic (seeded) Nexmark-style auction generator plus atomic file writers.

Event times are 'YYYY-MM-DD HH:MM:SS' strings (UTC wall clock starting 2024-01-01) that Spark's
JSON/CSV readers parse as TIMESTAMP under the ``*_DDL`` schemas below (Parquet stores them as UTC
instants, so all formats agree when spark.sql.session.timeZone=UTC).  Files are written once,
atomically, with names ``part-NNNNN-<dir>.<ext>`` that sort in write order.
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "AUCTIONS_DDL", "BIDS_DDL", "CHANNELS", "PERSONS_DDL", "NexmarkGenerator", "arrow_schema",
    "demo_round", "write_csv", "write_debezium", "write_json", "write_parquet",
]

PERSONS_DDL = "id BIGINT, name STRING, email STRING, city STRING, state STRING, date_time TIMESTAMP"
AUCTIONS_DDL = (
    "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, "
    "date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT"
)
BIDS_DDL = (
    "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP"
)

CHANNELS = ("apple", "google", "facebook", "baidu")
_FIRST = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter")
_LAST = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
_CITIES = (("Phoenix", "AZ"), ("Los Angeles", "CA"), ("San Francisco", "CA"), ("Boise", "ID"),
           ("Portland", "OR"), ("Bend", "OR"), ("Redmond", "WA"), ("Seattle", "WA"),
           ("Kent", "WA"), ("Cheyenne", "WY"))
_ADJ = ("vintage", "rare", "mint", "signed", "antique", "used", "boxed", "limited")
_NOUN = ("camera", "guitar", "watch", "lamp", "bicycle", "vase", "comic", "record", "chair")
_BASE_EPOCH = 1_704_067_200  # 2024-01-01 00:00:00 UTC
_ROUND_SECONDS = 3600
_TS_FMT = "%Y-%m-%d %H:%M:%S"
_PART_RE = re.compile(r"^part-(\d+)-")
_ARROW_TYPES = {"BIGINT": pa.int64(), "INT": pa.int32(), "STRING": pa.string(),
                "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(),
                "TIMESTAMP": pa.timestamp("us", tz="UTC")}


def _fmt(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).strftime(_TS_FMT)


class NexmarkGenerator:
    """Seeded generator of persons, auctions and bids plus a Debezium CDC feed of auctions."""

    def __init__(self, *, seed: int = 7, first_auction: int = 1000, first_person: int = 100):
        self._rng = random.Random(seed)
        self._clock = _BASE_EPOCH
        self._next_person = first_person
        self._next_auction = first_auction
        self._next_cdc = 1
        self._person_ids: list[int] = []
        self._auction_ids: list[int] = []
        self._cdc: dict[int, dict[str, Any]] = {}

    # -- state ------------------------------------------------------------------------------
    @property
    def person_ids(self) -> tuple[int, ...]:
        return tuple(self._person_ids)

    @property
    def auction_ids(self) -> tuple[int, ...]:
        return tuple(self._auction_ids)

    def cdc_rows(self) -> list[dict[str, Any]]:
        """Current image of the mutable ``auctions_cdc`` dataset, ordered by id."""
        return [dict(self._cdc[k]) for k in sorted(self._cdc)]

    def begin_round(self, round_no: int) -> None:
        """Move event time to the start of ``round_no`` (one hour per round; never backwards)."""
        self._clock = max(self._clock, _BASE_EPOCH + round_no * _ROUND_SECONDS)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # -- append-only streams ----------------------------------------------------------------
    def persons(self, n: int) -> list[dict[str, Any]]:
        """``n`` new persons (ids continue from the previous call)."""
        out = []
        for _ in range(n):
            pid, self._next_person = self._next_person, self._next_person + 1
            first, last = self._rng.choice(_FIRST), self._rng.choice(_LAST)
            city, state = self._rng.choice(_CITIES)
            out.append({"id": pid, "name": f"{first} {last}",
                        "email": f"{first.lower()}.{last.lower()}{pid}@example.com",
                        "city": city, "state": state, "date_time": _fmt(self._tick())})
            self._person_ids.append(pid)
        return out

    def _auction_row(self, aid: int) -> dict[str, Any]:
        if not self._person_ids:
            raise ValueError("generate persons before auctions (sellers must exist)")
        now = self._tick()
        initial = self._rng.randint(1, 1000)
        adj, noun = self._rng.choice(_ADJ), self._rng.choice(_NOUN)
        return {"id": aid, "item_name": f"{adj} {noun}",
                "description": f"A {adj} {noun}, lot {aid}", "initial_bid": initial,
                "reserve": initial + self._rng.randint(1, 1000), "date_time": _fmt(now),
                "expires": _fmt(now + self._rng.randint(600, 7200)),
                "seller": self._rng.choice(self._person_ids),
                "category": self._rng.randint(10, 19)}

    def auctions(self, n: int) -> list[dict[str, Any]]:
        """``n`` new auctions, each sold by an existing person."""
        out = []
        for _ in range(n):
            aid, self._next_auction = self._next_auction, self._next_auction + 1
            out.append(self._auction_row(aid))
            self._auction_ids.append(aid)
        return out

    def bids(self, n: int) -> list[dict[str, Any]]:
        """``n`` bids on existing auctions (every tenth auction is hot) by existing persons."""
        if not self._auction_ids or not self._person_ids:
            raise ValueError("generate persons and auctions before bids")
        hot_auctions, hot_people = self._auction_ids[::10], self._person_ids[::5]
        out = []
        for _ in range(n):
            rng = self._rng
            auction = rng.choice(hot_auctions if rng.random() < 0.5 else self._auction_ids)
            bidder = rng.choice(hot_people if rng.random() < 0.3 else self._person_ids)
            channel = rng.choice(CHANNELS)
            price = rng.randint(1, 2000) if rng.random() < 0.9 else rng.randint(2000, 100_000)
            out.append({"auction": auction, "bidder": bidder, "price": price, "channel": channel,
                        "url": f"https://www.nexmark.com/{channel}/item.htm?query={auction}",
                        "date_time": _fmt(self._tick())})
        return out

    # -- CDC feed ---------------------------------------------------------------------------
    def seed_cdc(self, n: int) -> list[dict[str, Any]]:
        """Add ``n`` pre-existing ``auctions_cdc`` rows without events (see snapshot_events)."""
        rows = []
        for _ in range(n):
            row = self._auction_row(self._next_cdc)
            self._cdc[row["id"]] = row
            self._next_cdc += 1
            rows.append(dict(row))
        return rows

    def _event(self, op: str, before: dict | None, after: dict | None) -> dict[str, Any]:
        return {"before": dict(before) if before else None, "after": dict(after) if after else None,
                "op": op, "ts_ms": self._tick() * 1000, "source": {"table": "auctions"}}

    def snapshot_events(self) -> list[dict[str, Any]]:
        """``r`` (snapshot read) events for every current ``auctions_cdc`` row."""
        return [self._event("r", None, row) for row in self.cdc_rows()]

    def _pick(self, touched: set[int], col: str | None, use_max: bool) -> dict | None:
        """A row not yet touched in this call: the min/max of ``col`` in some category, or any."""
        free = [r for r in self._cdc.values() if r["id"] not in touched]
        if not free:
            return None
        if col is not None:
            cats = sorted({r["category"] for r in free})
            self._rng.shuffle(cats)
            for cat in cats:
                rows = [r for r in self._cdc.values() if r["category"] == cat]
                best = (max if use_max else min)(rows, key=lambda r: (r[col], r["id"]))
                if best["id"] not in touched:
                    return best
        return self._rng.choice(free)

    def _updated(self, row: dict[str, Any], kind: int) -> dict[str, Any]:
        new, rng = dict(row), self._rng
        same_cat = [r for r in self._cdc.values() if r["category"] == row["category"]]
        if kind == 0:  # the category's max-reserve row collapses: MIN and MAX both move
            new["initial_bid"] = max(1, row["initial_bid"] // 4)
            new["reserve"] = new["initial_bid"] + rng.randint(1, 5)
        elif kind == 1:  # a new top of the category
            new["initial_bid"] = max(r["initial_bid"] for r in same_cat) + rng.randint(1, 100)
            new["reserve"] = max(r["reserve"] for r in same_cat) + rng.randint(1, 500)
        elif kind == 2:  # moves to another category
            new["category"] = rng.choice([c for c in range(10, 20) if c != row["category"]])
        else:  # the category's min-initial_bid row rises
            new["initial_bid"] = row["initial_bid"] + rng.randint(500, 1000)
            new["reserve"] = max(row["reserve"], new["initial_bid"]) + rng.randint(1, 100)
        return new

    def auction_changes(
        self, n_updates: int, n_deletes: int, *, n_creates: int = 0
    ) -> list[dict[str, Any]]:
        """A shuffled mix of ``c``/``u``/``d`` events applied to the ``auctions_cdc`` rows.

        Updates and deletes deliberately hit the min/max row of some category; a row is touched
        at most once per call.  Fewer events are produced if rows run out.
        """
        ops = ["c"] * n_creates + ["u"] * n_updates + ["d"] * n_deletes
        self._rng.shuffle(ops)
        touched: set[int] = set()
        events: list[dict[str, Any]] = []
        n_u = n_d = 0
        for op in ops:
            if op == "c":
                row = self._auction_row(self._next_cdc)
                self._next_cdc += 1
                self._cdc[row["id"]] = row
                touched.add(row["id"])
                events.append(self._event("c", None, row))
                continue
            if op == "u":
                kind, n_u = n_u % 4, n_u + 1
                col, use_max = {0: ("reserve", True), 3: ("initial_bid", False)}.get(
                    kind, (None, False))
            else:
                kind, n_d = n_d % 3, n_d + 1
                col, use_max = [("reserve", True), ("initial_bid", False), (None, False)][kind]
            row = self._pick(touched, col, use_max)
            if row is None:
                continue
            touched.add(row["id"])
            if op == "u":
                new = self._updated(row, kind)
                self._cdc[row["id"]] = new
                events.append(self._event("u", row, new))
            else:
                del self._cdc[row["id"]]
                events.append(self._event("d", row, None))
        return events


# -- atomic writers -------------------------------------------------------------------------
def _write_atomic(directory: str | Path, ext: str, write: Any) -> str:
    """Call ``write(tmp_path)`` then rename to the next ``part-NNNNN-<dir>.<ext>`` name."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    kind = re.sub(r"[^A-Za-z0-9_]+", "_", d.resolve().name) or "data"
    nums = [int(m.group(1)) for m in map(_PART_RE.match, os.listdir(d)) if m]
    seq = max(nums, default=-1) + 1
    tmp = d / f".part-{seq:05d}-{kind}.{ext}.{os.getpid()}.tmp"
    try:
        write(tmp)
        while (final := d / f"part-{seq:05d}-{kind}.{ext}").exists():
            seq += 1
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    return str(final)


def _write_lines(directory: str | Path, objs: Iterable[Any]) -> str:
    def write(path: Path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for obj in objs:
                f.write(json.dumps(obj, separators=(",", ":")) + "\n")

    return _write_atomic(directory, "json", write)


def write_json(rows: Iterable[dict[str, Any]], directory: str | Path) -> str:
    """Write rows as a new JSON-lines file; return its path."""
    return _write_lines(directory, rows)


def write_debezium(
    events: Iterable[dict[str, Any]], directory: str | Path, *, wrapped: bool = False
) -> str:
    """Write Debezium events as JSON lines, optionally in a Kafka Connect ``payload`` wrapper."""
    if wrapped:
        fields = [{"field": f, "type": t, "optional": f != "op"} for f, t in (
            ("before", "struct"), ("after", "struct"), ("op", "string"), ("ts_ms", "int64"),
            ("source", "struct"))]
        schema = {"type": "struct", "name": "auctions.Envelope", "optional": False,
                  "fields": fields}
        events = [{"schema": schema, "payload": e} for e in events]
    return _write_lines(directory, events)


def arrow_schema(ddl: str) -> pa.Schema:
    """A pyarrow schema for a simple ``name TYPE, ...`` DDL (TIMESTAMP as UTC microseconds)."""
    fields = [part.split() for part in ddl.split(",")]
    return pa.schema([pa.field(name, _ARROW_TYPES[typ.upper()]) for name, typ in fields])


def write_parquet(
    rows: Iterable[dict[str, Any]], directory: str | Path, *, schema: pa.Schema
) -> str:
    """Write rows as a new Parquet file; timestamp strings are parsed for timestamp fields."""
    rows = [dict(r) for r in rows]
    for field in schema:
        if pa.types.is_timestamp(field.type):
            tz = timezone.utc if field.type.tz else None
            for r in rows:
                if isinstance(r.get(field.name), str):
                    r[field.name] = datetime.strptime(r[field.name], _TS_FMT).replace(tzinfo=tz)
    table = pa.Table.from_pylist(rows, schema=schema)
    return _write_atomic(directory, "parquet", lambda p: pq.write_table(table, p))


def write_csv(
    rows: Iterable[dict[str, Any]], directory: str | Path, *, columns: list[str]
) -> str:
    """Write rows as a new CSV file with a header line (None becomes an empty field)."""
    def write(path: Path) -> None:
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(columns)
            for r in rows:
                w.writerow(["" if r.get(c) is None else r.get(c) for c in columns])

    return _write_atomic(directory, "csv", write)


# -- demo -----------------------------------------------------------------------------------
def demo_round(
    project_dir: str | Path, *, round_no: int, generator: NexmarkGenerator, scale: int = 1
) -> dict[str, int]:
    """Write one round of demo input under ``<project_dir>/data/``; return counts per kind.

    Round 0 snapshots the initial ``auctions_cdc`` rows (``r``) plus creates; later rounds mix
    creates, updates and deletes.  Reuse the same generator for consecutive rounds.
    """
    data = Path(project_dir) / "data"
    generator.begin_round(round_no)
    persons = generator.persons(20 * scale)
    auctions = generator.auctions(30 * scale)
    bids = generator.bids(200 * scale)
    if round_no == 0:
        generator.seed_cdc(20 * scale)
        events = generator.snapshot_events() + generator.auction_changes(0, 0, n_creates=5 * scale)
    else:
        events = generator.auction_changes(8 * scale, 4 * scale, n_creates=5 * scale)
    write_json(persons, data / "persons")
    write_json(auctions, data / "auctions")
    write_json(bids, data / "bids")
    write_debezium(events, data / "auctions_cdc")
    return {"persons": len(persons), "auctions": len(auctions), "bids": len(bids),
            "auctions_cdc": len(events)}

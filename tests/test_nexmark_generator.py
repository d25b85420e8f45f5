"""Tests for the deterministic Nexmark generator and its atomic file writers (no Spark)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from connectors.generators.nexmark import (
    AUCTIONS_DDL,
    BIDS_DDL,
    CHANNELS,
    PERSONS_DDL,
    NexmarkGenerator,
    arrow_schema,
    demo_round,
    write_csv,
    write_debezium,
    write_json,
    write_parquet,
)


def _ddl_columns(ddl: str) -> list[str]:
    return [part.split()[0] for part in ddl.split(",")]


def _run(seed: int) -> list:
    g = NexmarkGenerator(seed=seed)
    out: list = []
    for r in range(3):
        g.begin_round(r)
        out += [g.persons(5), g.auctions(7), g.bids(40)]
        if r == 0:
            g.seed_cdc(10)
            out.append(g.snapshot_events())
        out.append(g.auction_changes(4, 2, n_creates=3))
    return out


def _read_lines(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_deterministic_for_fixed_seed() -> None:
    assert _run(7) == _run(7)
    assert _run(7) != _run(8)


def test_demo_round_deterministic(tmp_path: Path) -> None:
    contents = []
    for name in ("a", "b"):
        g = NexmarkGenerator(seed=3)
        for r in range(3):
            demo_round(tmp_path / name, round_no=r, generator=g)
        data = tmp_path / name / "data"
        contents.append({str(p.relative_to(data)): p.read_text() for p in data.rglob("*.json")})
    assert contents[0] == contents[1]
    assert len(contents[0]) == 12


def test_rows_match_ddl_and_referential_integrity() -> None:
    g = NexmarkGenerator(seed=11, first_auction=500, first_person=50)
    persons, auctions, bids = [], [], []
    for r in range(4):
        g.begin_round(r)
        persons += g.persons(6)
        auctions += g.auctions(9)
        bids += g.bids(80)
    person_ids = {p["id"] for p in persons}
    auction_ids = {a["id"] for a in auctions}
    assert min(person_ids) == 50 and min(auction_ids) == 500
    assert len(person_ids) == len(persons) and len(auction_ids) == len(auctions)
    assert person_ids == set(g.person_ids) and auction_ids == set(g.auction_ids)
    for rows, ddl in ((persons, PERSONS_DDL), (auctions, AUCTIONS_DDL), (bids, BIDS_DDL)):
        assert all(list(row) == _ddl_columns(ddl) for row in rows)
    assert all(a["seller"] in person_ids and 10 <= a["category"] <= 19 for a in auctions)
    assert all(len(p["state"]) == 2 and p["state"].isupper() for p in persons)
    for b in bids:
        assert b["auction"] in auction_ids and b["bidder"] in person_ids
        assert isinstance(b["price"], int) and b["price"] > 0 and b["channel"] in CHANNELS
    hottest = max(auction_ids, key=lambda a: sum(b["auction"] == a for b in bids))
    assert sum(b["auction"] == hottest for b in bids) > 3 * len(bids) / len(auction_ids)
    # event time advances: never backwards, and each round starts later
    times = [b["date_time"] for b in bids]
    assert times == sorted(times) and len(times[0]) == 19


def test_bids_need_auctions() -> None:
    with pytest.raises(ValueError):
        NexmarkGenerator().bids(1)


def test_cdc_replay_yields_current_rows() -> None:
    g = NexmarkGenerator(seed=5)
    g.persons(10)
    g.seed_cdc(15)
    events = g.snapshot_events() + g.auction_changes(0, 0, n_creates=5)
    for _ in range(6):
        events += g.auction_changes(8, 4, n_creates=3)
    image: dict[int, dict] = {}
    ops = set()
    for e in events:
        ops.add(e["op"])
        assert e["source"] == {"table": "auctions"}
        assert list(e) == ["before", "after", "op", "ts_ms", "source"]
        if e["op"] in ("c", "r"):
            assert e["before"] is None and e["after"]["id"] not in image
        else:
            assert image[e["before"]["id"]] == e["before"]  # before image is the previous image
        if e["op"] == "u":
            assert e["after"]["id"] == e["before"]["id"] and e["after"] != e["before"]
        if e["op"] == "d":
            assert e["after"] is None
            del image[e["before"]["id"]]
        else:
            assert list(e["after"]) == _ddl_columns(AUCTIONS_DDL)
            image[e["after"]["id"]] = e["after"]
    assert ops == {"c", "u", "d", "r"}
    assert [image[k] for k in sorted(image)] == g.cdc_rows()
    ts = [e["ts_ms"] for e in events]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)


def test_cdc_min_max_really_change() -> None:
    g = NexmarkGenerator(seed=9)
    g.persons(5)
    g.seed_cdc(40)

    def extremes() -> dict:
        cats: dict[int, list] = {}
        for r in g.cdc_rows():
            cats.setdefault(r["category"], []).append(r)
        return {c: (min(x["initial_bid"] for x in rs), max(x["reserve"] for x in rs),
                    min(rs, key=lambda x: (x["initial_bid"], x["id"]))["id"],
                    max(rs, key=lambda x: (x["reserve"], x["id"]))["id"]) for c, rs in cats.items()}

    deleted_extreme = False
    for _ in range(5):
        before = extremes()
        events = g.auction_changes(8, 4)
        gone = {e["before"]["id"] for e in events if e["op"] == "d"}
        deleted_extreme |= any(v[2] in gone or v[3] in gone for v in before.values())
        assert extremes() != before
    assert deleted_extreme


def test_writers_atomic_ordered_and_readable(tmp_path: Path) -> None:
    g = NexmarkGenerator()
    g.persons(5)
    g.auctions(5)
    bids = g.bids(20)
    d = tmp_path / "bids"
    paths = [write_json(bids, d), write_json(bids[:3], d),
             write_parquet(bids, d, schema=arrow_schema(BIDS_DDL)),
             write_csv(bids, d, columns=_ddl_columns(BIDS_DDL))]
    names = [os.path.basename(p) for p in paths]
    assert names == sorted(names) and len(set(names)) == 4
    assert names[0] == "part-00000-bids.json"
    assert sorted(os.listdir(d)) == names  # no temp files left behind
    assert _read_lines(paths[0]) == bids and _read_lines(paths[1]) == bids[:3]
    table = pq.read_table(paths[2])
    assert table.column_names == _ddl_columns(BIDS_DDL) and table.num_rows == 20
    with open(paths[3], encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == _ddl_columns(BIDS_DDL) and rows[0]["url"] == bids[0]["url"]
    assert len(rows) == 20 and rows[5]["price"] == str(bids[5]["price"])


def test_failed_write_leaves_no_files(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_json([{"x": object()}], tmp_path / "bad")
    assert os.listdir(tmp_path / "bad") == []


def test_wrapped_debezium_has_payload(tmp_path: Path) -> None:
    g = NexmarkGenerator()
    g.persons(3)
    g.seed_cdc(4)
    events = g.snapshot_events() + g.auction_changes(2, 1, n_creates=1)
    plain = _read_lines(write_debezium(events, tmp_path / "cdc"))
    wrapped = _read_lines(write_debezium(events, tmp_path / "cdc", wrapped=True))
    assert plain == events
    assert [w["payload"] for w in wrapped] == events
    assert all(w["schema"]["type"] == "struct" for w in wrapped)
    assert sorted(os.listdir(tmp_path / "cdc")) == ["part-00000-cdc.json", "part-00001-cdc.json"]


def test_demo_round_layout(tmp_path: Path) -> None:
    g = NexmarkGenerator()
    counts = [demo_round(tmp_path, round_no=r, generator=g) for r in range(3)]
    assert counts[0]["bids"] == 200 and counts[0]["persons"] == 20
    data = tmp_path / "data"
    for kind in ("persons", "auctions", "bids", "auctions_cdc"):
        files = sorted(os.listdir(data / kind))
        assert files == [f"part-{i:05d}-{kind}.json" for i in range(3)]
        assert sum(len(_read_lines(str(data / kind / f))) for f in files) == sum(
            c[kind] for c in counts)
    first = _read_lines(str(data / "auctions_cdc" / "part-00000-auctions_cdc.json"))
    assert {e["op"] for e in first} == {"r", "c"}
    later = _read_lines(str(data / "auctions_cdc" / "part-00001-auctions_cdc.json"))
    assert {e["op"] for e in later} == {"c", "u", "d"}
    bid_auctions = {b["auction"] for b in _read_lines(str(data / "bids" / "part-00002-bids.json"))}
    auctions = {a["id"] for f in sorted(os.listdir(data / "auctions"))
                for a in _read_lines(str(data / "auctions" / f))}
    assert bid_auctions <= auctions

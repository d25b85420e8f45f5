"""The repo's example project (``sql/``, run by ``octo demo``) compiles and explains (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.generators.nexmark import AUCTIONS_DDL, BIDS_DDL, PERSONS_DDL
from octo_platform.demo import repo_sql_dir
from octo_platform.physical.plan import PAggregate
from octo_platform.project import Project, load_project

ROOT = Path(__file__).resolve().parents[1]

EXPECTED_TABLES = {
    "auction_stats": "auctions",
    "bid_histogram": "auctions",
    "channel_stats": "bids",
    "bids_per_minute": "bids",
    "whale_bids": "bids",
    "daily_volume": "bids",
    "category_reserve": "cdc",
    "auction_count": "cdc",
    "local_sellers": "cdc",
    "category_prices": "auctions",
    "hot_auctions": "auctions",
}


@pytest.fixture(scope="module")
def project() -> Project:
    return load_project(ROOT)


def test_demo_uses_the_repo_sql_folder() -> None:
    assert repo_sql_dir() == ROOT / "sql"


def test_expected_tables_and_groups(project: Project) -> None:
    assert {t.name: t.group for t in project.tables.values()} == EXPECTED_TABLES


@pytest.mark.parametrize("name", sorted(EXPECTED_TABLES))
def test_every_table_compiles_and_explains_deterministically(project: Project, name: str) -> None:
    first = project.explain(name)
    assert first == project.explain(name)
    assert first == load_project(ROOT).explain(name)  # a fresh compile gives the same text
    assert f"== Logical plan: {name} ==" in first
    assert f"== Physical plan: {name} ==" in first
    assert "0x" not in first  # no memory addresses


@pytest.mark.parametrize(("source", "ddl", "fmt"), [
    ("bids", BIDS_DDL, "json"),
    ("auctions", AUCTIONS_DDL, "json"),
    ("persons", PERSONS_DDL, "json"),
    ("auctions_cdc", AUCTIONS_DDL, "debezium-json"),
])
def test_sources_match_the_generator(project: Project, source: str, ddl: str, fmt: str) -> None:
    s = project.source(source)
    declared = [(c.strip().split()[0], c.strip().split()[1]) for c in ddl.split(",")]
    assert list(zip(s.columns, s.types)) == declared
    assert s.format == fmt
    assert s.options["path"] == f"data/{source}"


def _aggregate(project: Project, name: str) -> PAggregate:
    (agg,) = [op for op in project.table(name).physical.operators if isinstance(op, PAggregate)]
    return agg


def test_shapes_the_demo_shows(project: Project) -> None:
    assert project.source("auctions_cdc").pk == ("id",)
    assert project.source("auctions_cdc").mode == "updating"
    assert project.table("bid_histogram").definition.deps == ("auction_stats",)
    # an aggregate over another aggregate's changelog: updating input, MAX needs a multiset
    hist = _aggregate(project, "bid_histogram")
    assert hist.input.mode == "updating"
    assert {a.func: a.strategy for a in hist.aggs}["max"] == "multiset"
    # append-only input: MAX can be a running value
    assert {a.func: a.strategy for a in _aggregate(project, "auction_stats").aggs}["max"] == \
        "running"
    # MIN/MAX over a CDC feed cannot be a running value
    assert all(a.strategy == "multiset" for a in _aggregate(project, "category_reserve").aggs
               if a.func in ("min", "max"))
    assert any(a.distinct for a in _aggregate(project, "channel_stats").aggs)
    assert _aggregate(project, "auction_count").is_global
    assert project.table("whale_bids").physical.pk is None
    assert not any(isinstance(op, PAggregate)
                   for op in project.table("whale_bids").physical.operators)
    # a tumbling window over a watermarked source, emitted when it closes
    assert project.source("bids").watermark.delay_us == 30_000_000
    per_minute = _aggregate(project, "bids_per_minute")
    assert per_minute.emit_on_close and per_minute.closes is not None
    assert project.table("bids_per_minute").definition.plan.mode == "append-only"
    order = [t.name for t in project.order()]
    assert order.index("auction_stats") < order.index("bid_histogram")


def test_demo_formats_events_and_tables() -> None:
    from octo_platform.demo import _event_line, _grid, _sample

    events = [{"op": "c", "before": None, "after": {"bids": n, "auctions": 1}} for n in (32, 4)]
    events.append({"op": "u", "before": {"bids": 1, "auctions": 5},
                   "after": {"bids": 1, "auctions": 13}})
    sample = _sample(events)
    assert [op for op, _, _ in sample] == ["u", "c", "c"]  # updates first, then by key
    assert [(a or {}).get("bids") for _, _, a in sample] == [1, 4, 32]
    assert _event_line(*sample[0]) == "u  {bids: 1, auctions: 5} -> {bids: 1, auctions: 13}"
    assert _grid(["channel", "bids"], [("apple", 47), ("baidu", None)]).splitlines() == [
        "  channel  bids", "  -------  ----", "  apple      47", "  baidu    null"]

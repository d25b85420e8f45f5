"""The Dagster code location: the example project's asset graph, and catch-up runs of a chain
of streaming tables materialized in process against a real Spark session and Delta tables."""
from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster_pyspark import PySparkResource

from octo_platform.project import load_project
from orchestration.definitions import REPO_ROOT, build_definitions, defs, resources_from_env
from orchestration.resources import SparkResource, WarehouseResource
from orchestration.translator import OctoTranslator
from tests.oracle import RandomInput, batch_result, replay, write_lines

TABLES = {"auction_stats", "bid_histogram", "hot_auctions", "channel_stats", "whale_bids",
          "daily_volume", "bids_per_minute", "auction_count", "category_prices", "category_reserve",
          "local_sellers"}
SOURCES = {"bids", "auctions", "persons", "auctions_cdc"}


def spec_of(definitions: dg.Definitions, key: str) -> dg.AssetSpec:
    return next(s for s in definitions.resolve_all_asset_specs() if s.key == dg.AssetKey(key))


def lineage_of(definitions: dg.Definitions, key: str) -> dict[str, set[tuple[str, str]]]:
    meta = spec_of(definitions, key).metadata["dagster/column_lineage"]
    return {c: {(d.asset_key.to_user_string(), d.column_name) for d in deps}
            for c, deps in meta.deps_by_column.items()}


# -- the example project's definitions ---------------------------------------------------------
def test_example_definitions_load():
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == TABLES | SOURCES
    materializable = {k.to_user_string() for k in graph.materializable_asset_keys}
    assert materializable == TABLES  # sources are external assets
    groups = {k: graph.get(dg.AssetKey(k)).group_name for k in keys}
    assert groups == {
        **{t: "auctions" for t in ("auction_stats", "bid_histogram", "hot_auctions",
                                   "category_prices")},
        **{t: "bids" for t in ("channel_stats", "whale_bids", "daily_volume",
                               "bids_per_minute")},
        **{t: "cdc" for t in ("auction_count", "category_reserve", "local_sellers")},
        **{s: "default" for s in SOURCES},  # sql/sources.sql is not in a sub-folder
    }

    def parents(key: str) -> set[str]:
        return {p.to_user_string() for p in graph.get(dg.AssetKey(key)).parent_keys}

    assert parents("bid_histogram") == {"auction_stats"}
    assert parents("hot_auctions") == {"auction_stats"}
    assert parents("whale_bids") == {"bids"}  # through the view big_bids
    assert parents("category_prices") == {"bids", "auctions"}
    assert parents("local_sellers") == {"persons", "auctions_cdc"}
    daily = graph.get(dg.AssetKey("daily_volume"))  # WITH (partition_by = 'day', ...)
    assert isinstance(daily.partitions_def, dg.DailyPartitionsDefinition)
    assert daily.partitions_def.get_first_partition_key() == "2024-01-01"
    assert graph.get(dg.AssetKey("channel_stats")).partitions_def is None
    assert set(defs.resources) == {"spark", "warehouse"}


def test_example_asset_metadata_and_column_lineage():
    project = load_project(REPO_ROOT)
    assert lineage_of(defs, "local_sellers") == {
        "name": {("persons", "name")}, "city": {("persons", "city")},
        "state": {("persons", "state")}, "auction": {("auctions_cdc", "id")},
        "item_name": {("auctions_cdc", "item_name")}}
    prices = lineage_of(defs, "category_prices")
    assert prices == {"category": {("auctions", "category")},
                      "avg_final": {("bids", "price")}, "auctions": set()}
    assert lineage_of(defs, "whale_bids")["at"] == {("bids", "date_time")}  # view inlined
    assert lineage_of(defs, "channel_stats")["big_pct"] == {("bids", "price")}  # CTE inlined
    assert lineage_of(defs, "bid_histogram")["best_top_price"] == {
        ("auction_stats", "top_price")}

    spec = spec_of(defs, "category_prices")
    table = project.table("category_prices")
    assert spec.code_version == table.physical.fingerprint
    schema = spec.metadata["dagster/column_schema"]
    assert [(c.name, c.type) for c in schema.columns] == [
        ("category", "BIGINT"), ("avg_final", "DOUBLE"), ("auctions", "BIGINT")]
    assert spec.metadata["primary_key"] == "category"
    assert spec.metadata["sql_file"] == "sql/auctions/category_prices.sql"
    assert spec.description.startswith("Nexmark q4 (average price per category)")
    assert "CREATE STREAMING TABLE category_prices AS\nSELECT category" in spec.description
    # downstream of another streaming table, types come from the upstream plan
    hot = spec_of(defs, "hot_auctions").metadata["dagster/column_schema"]
    assert [(c.name, c.type) for c in hot.columns] == [
        ("auction", "BIGINT"), ("bids", "BIGINT"), ("top_price", "BIGINT")]

    src = spec_of(defs, "auctions_cdc")
    assert src.metadata["format"] == "debezium-json"
    assert src.metadata["connector"] == "files"
    assert src.metadata["path"].value == str(REPO_ROOT / "data" / "auctions_cdc")
    assert [c.name for c in src.metadata["dagster/column_schema"].columns][:2] == [
        "id", "item_name"]


def test_code_version_ignores_formatting_and_follows_the_query(tmp_path):
    def version(sql: str) -> str:
        (tmp_path / "sql").mkdir(exist_ok=True)
        (tmp_path / "sql" / "all.sql").write_text(CHAIN_SOURCE + sql)
        return spec_of(build_definitions(tmp_path), "t").code_version

    base = version("CREATE STREAMING TABLE t AS SELECT k, COUNT(*) AS n FROM events GROUP BY k;")
    assert base == version("-- a comment\nCREATE STREAMING TABLE t AS\n  select k,\n"
                           "    count(*) as n\n  from events group by k;")
    assert base != version("CREATE STREAMING TABLE t AS SELECT k, SUM(v) AS n FROM events "
                           "GROUP BY k;")


def test_a_translator_subclass_names_every_asset_check_and_job(tmp_path):
    class Prefixed(OctoTranslator):
        def get_asset_key(self, name: str) -> dg.AssetKey:
            return dg.AssetKey(["streaming", name])

        def get_group_name(self, folder: str) -> str:
            return f"octo_{super().get_group_name(folder)}"

    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "all.sql").write_text(CHAIN_SOURCE + PER_KEY)
    definitions = build_definitions(tmp_path, translator=Prefixed())
    dg.Definitions.validate_loadable(definitions)
    graph = definitions.resolve_asset_graph()
    key = dg.AssetKey(["streaming", "per_key"])
    assert graph.get_all_asset_keys() == {key, dg.AssetKey(["streaming", "events"])}
    assert graph.get(key).group_name == "octo_default"
    assert graph.get(key).parent_keys == {dg.AssetKey(["streaming", "events"])}
    assert {c.asset_key for c in graph.asset_check_keys} == {key}
    job = definitions.resolve_job_def("catch_up_octo_default")
    assert job.asset_layer.executable_asset_keys == {key}


def test_resources_are_chosen_from_the_environment(tmp_path):
    got = resources_from_env(tmp_path, {})
    assert got["warehouse"].path == str(tmp_path.resolve() / "warehouse")
    # a local master's runs are short: its driver JVM starts quickly (octo defaults, not conf)
    assert got["spark"].master == "local[2]" and got["spark"].quick_start
    assert got["spark"].conf == {}
    got = resources_from_env(tmp_path, {"OCTO_WAREHOUSE": "s3://bucket/wh",
                                        "OCTO_SPARK_MASTER": "spark://h:7077"})
    assert got["warehouse"].location(tmp_path) == "s3://bucket/wh"
    assert got["spark"].master == "spark://h:7077" and not got["spark"].quick_start
    assert got["spark"].reads == ["s3://bucket/wh"]  # its session gets S3A
    assert WarehouseResource().location(tmp_path) == str(tmp_path.resolve() / "warehouse")
    # a file: URI is the local path it names (delta-rs makes no table at a missing one)
    assert WarehouseResource(path=f"file://{tmp_path}/my%20wh").location(tmp_path) == str(
        tmp_path.resolve() / "my wh")
    # dagster-pyspark's resource, its spark_config beaten by conf
    spark = SparkResource(spark_config={"spark.a": 1, "spark.b": "x"}, conf={"spark.b": "y"})
    assert isinstance(spark, PySparkResource)
    assert spark.settings() == {"spark.a": "1", "spark.b": "y"}
    from octo_platform.runtime.driver import DEFAULT_DRIVER_ROWS, DEFAULT_DRIVER_STATE_ROWS

    assert WarehouseResource().options(tmp_path).driver_rows == DEFAULT_DRIVER_ROWS
    assert WarehouseResource(driver_rows=0).options(tmp_path).driver_rows == 0
    assert WarehouseResource().options(tmp_path).driver_state_rows == DEFAULT_DRIVER_STATE_ROWS
    assert WarehouseResource(driver_state_rows=5).options(tmp_path).driver_state_rows == 5


# -- materialization: a chain of two streaming tables, twice --------------------------------
CHAIN_SOURCE = """\
CREATE SOURCE events (id BIGINT, k BIGINT, g STRING, v BIGINT, d DOUBLE)
WITH (connector = 'files', path = 'data/events', format = 'json');
"""
PER_KEY = """\
-- Per-key totals.
CREATE STREAMING TABLE per_key AS
SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k;
"""
BY_COUNT = """\
-- How many keys have n events: an aggregate over per_key's changelog.
CREATE STREAMING TABLE by_count AS
SELECT n, COUNT(*) AS keys, MAX(total) AS top FROM per_key GROUP BY n;
"""


@pytest.fixture
def chain(tmp_path: Path) -> Path:
    sql = tmp_path / "sql"
    (sql / "stats").mkdir(parents=True)
    (sql / "sources.sql").write_text(CHAIN_SOURCE)
    (sql / "stats" / "per_key.sql").write_text(PER_KEY)
    (sql / "stats" / "by_count.sql").write_text(BY_COUNT)
    return tmp_path


def materialize(definitions: dg.Definitions, resources: dict, instance: dg.DagsterInstance):
    result = dg.materialize(list(definitions.assets), resources=resources, instance=instance,
                            selection=["per_key", "by_count"])
    assert result.success
    meta = {}
    for key in ("per_key", "by_count"):
        (mat,) = result.asset_materializations_for_node(key)
        meta[key] = {k: v.value for k, v in mat.metadata.items()}
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    return meta, logs


def test_materialize_chain_twice_processes_only_new_input(spark, chain: Path):
    definitions = build_definitions(chain)
    graph = definitions.resolve_asset_graph()
    assert graph.get(dg.AssetKey("by_count")).parent_keys == {dg.AssetKey("per_key")}
    assert graph.get(dg.AssetKey("per_key")).group_name == "stats"
    warehouse = chain / "wh"
    resources = {"spark": SparkResource(),  # joins the test's session
                 "warehouse": WarehouseResource(path=str(warehouse))}
    assert resources["spark"].get_session() is spark
    assert resources["spark"].spark_session is spark  # PySparkResource's own API
    instance = dg.DagsterInstance.ephemeral()
    data = RandomInput(seed=4, debezium=False)
    sql_text = CHAIN_SOURCE + PER_KEY + BY_COUNT

    def check_oracle() -> None:
        for table in ("per_key", "by_count"):
            want = batch_result(spark, sql_text, {"events": data.relation()}, table)
            assert replay(warehouse, table) == want, table

    write_lines(chain / "data" / "events", "f1.json", data.lines(30))
    write_lines(chain / "data" / "events", "f2.json", data.lines(10))
    first, logs = materialize(definitions, resources, instance)
    pk = first["per_key"]
    assert pk["batches"] == 1 and pk["rows_in"] == 40 and pk["dead_letters"] == 0
    assert pk["events_c"] == pk["dagster/row_count"] == len({r["k"] for r in data.appended})
    assert pk["events_u"] == pk["events_d"] == 0
    assert pk["backlog"] == 0 and pk["backlog_by_input"] == {"source:events": 0}
    assert pk["last_batch"] == 0 and pk["changelog_version"] == 0
    assert pk["state_rows"] > 0
    bc = first["by_count"]
    assert bc["batches"] == 1 and bc["rows_in"] == pk["events_c"]
    assert bc["backlog_by_input"] == {"table:per_key": 0}
    assert any(line.startswith("[per_key] batch 0: 40 rows in") for line in logs)
    assert any(line.startswith("[by_count] batch 0:") for line in logs)
    check_oracle()

    write_lines(chain / "data" / "events", "f3.json", data.lines(25, bad=2))
    second, logs = materialize(definitions, resources, instance)
    pk, bc = second["per_key"], second["by_count"]
    assert pk["batches"] == 1 and pk["rows_in"] == 25 and pk["dead_letters"] == 2
    assert pk["last_batch"] == 1 and pk["backlog"] == 0
    assert pk["events_u"] > 0  # keys seen in the first run are updated
    assert bc["batches"] == 1 and bc["last_batch"] == 1
    # the changes of per_key's second batch, decoded: u = a retraction plus an insertion
    assert bc["rows_in"] == pk["events_c"] + 2 * pk["events_u"] + pk["events_d"]
    assert any(line.startswith("[per_key] batch 1: 25 rows in") for line in logs)
    assert not any("batch 0:" in line for line in logs)
    check_oracle()

    # input waiting for a table shows as its backlog until a run processes it
    from octo_platform.runtime.status import table_status
    from octo_platform.wiring import default_options

    write_lines(chain / "data" / "events", "f4.json", data.lines(5))
    status = table_status(load_project(chain), "per_key",
                          options=default_options(warehouse=str(warehouse)))
    assert status.backlog == {"source:events": 1} and status.last_batch == 1

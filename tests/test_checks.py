"""Data-quality asset checks: built-in replay / delete / primary-key checks and declared
great-expectations expectations, run in process after a materialization and on their own."""
from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable, write_deltalake

from octo_platform.errors import OctoError
from octo_platform.project import load_project
from orchestration.checks import (
    EXCESS_DELETES,
    EXPECTATIONS,
    PK_UNIQUE,
    REPLAY,
    load_expectations,
    replay_changelog,
)
from orchestration.definitions import REPO_ROOT, build_definitions, defs
from orchestration.resources import SparkResource, WarehouseResource
from tests.oracle import RandomInput, write_lines

SOURCE = """\
CREATE SOURCE events (id BIGINT, k BIGINT, g STRING, v BIGINT, d DOUBLE)
WITH (connector = 'files', path = 'data/events', format = 'json');
"""
PER_KEY = """\
CREATE STREAMING TABLE per_key AS
SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k;
"""
BY_COUNT = """\
CREATE STREAMING TABLE by_count AS
SELECT n, COUNT(*) AS keys FROM per_key GROUP BY n;
"""
PASSING = [
    {"expectation_type": "expect_column_values_to_not_be_null", "kwargs": {"column": "k"}},
    {"expectation_type": "expect_column_values_to_be_between",
     "kwargs": {"column": "n", "min_value": 1}},
]


def evaluations(result: dg.ExecuteInProcessResult,
                ) -> dict[tuple[str, str], dg.AssetCheckEvaluation]:
    return {(e.asset_key.to_user_string(), e.check_name): e
            for e in result.get_asset_check_evaluations()}


def meta(evaluation: dg.AssetCheckEvaluation) -> dict:
    return {k: v.value for k, v in evaluation.metadata.items()}


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    sql = tmp_path / "sql"
    (sql / "stats").mkdir(parents=True)
    (sql / "sources.sql").write_text(SOURCE)
    (sql / "stats" / "per_key.sql").write_text(PER_KEY)
    (sql / "stats" / "by_count.sql").write_text(BY_COUNT)
    (sql / "stats" / "per_key.expectations.json").write_text(json.dumps(PASSING))
    data = RandomInput(seed=7, debezium=False)
    write_lines(tmp_path / "data" / "events", "f1.json", data.lines(25))
    return tmp_path


def test_checks_pass_then_fail_and_block_downstream(spark, project: Path):
    resources = {"spark": SparkResource(), "warehouse": WarehouseResource(path=str(project / "wh"))}
    instance = dg.DagsterInstance.ephemeral()

    def run(definitions: dg.Definitions, selection) -> dg.ExecuteInProcessResult:
        return dg.materialize([*definitions.assets, *definitions.asset_checks],
                              resources=resources, instance=instance, selection=selection,
                              raise_on_error=False)

    # 1. materialized with their checks, all pass
    definitions = build_definitions(project)
    result = run(definitions, ["per_key", "by_count"])
    assert result.success
    assert materialized(result) == {"per_key", "by_count"}
    got = evaluations(result)
    assert set(got) == {("per_key", REPLAY), ("per_key", EXCESS_DELETES), ("per_key", PK_UNIQUE),
                        ("per_key", EXPECTATIONS), ("by_count", REPLAY),
                        ("by_count", EXCESS_DELETES), ("by_count", PK_UNIQUE)}
    assert all(e.passed for e in got.values()), {k: e.passed for k, e in got.items()}
    assert all(e.severity == dg.AssetCheckSeverity.ERROR and e.blocking for e in got.values())
    replayed = meta(got[("per_key", REPLAY)])
    assert replayed["replayed_rows"] == replayed["current_rows"] > 0
    assert replayed["missing_from_current"] == replayed["extra_in_current"] == 0
    ge = meta(got[("per_key", EXPECTATIONS)])
    assert ge["failed"] == 0 and [r["success"] for r in ge["results"]] == [True, True]

    # 2. a failing expectation, the checks of one asset executed on their own
    (project / "sql" / "stats" / "by_count.expectations.json").write_text(json.dumps({
        "expectations": [{"expectation_type": "expect_column_max_to_be_between",
                          "kwargs": {"column": "keys", "max_value": 0}}]}))
    definitions = build_definitions(project)
    result = run(definitions, dg.AssetSelection.checks_for_assets(dg.AssetKey("by_count")))
    assert not result.success and materialized(result) == set()
    got = evaluations(result)
    assert {k: e.passed for k, e in got.items()} == {
        ("by_count", REPLAY): True, ("by_count", EXCESS_DELETES): True,
        ("by_count", PK_UNIQUE): True, ("by_count", EXPECTATIONS): False}
    (ge,) = meta(got[("by_count", EXPECTATIONS)])["results"]
    assert ge["expectation_type"] == "expect_column_max_to_be_between"
    assert ge["success"] is False and ge["observed_value"] >= 1
    (project / "sql" / "stats" / "by_count.expectations.json").unlink()
    definitions = build_definitions(project)

    # 3. a corrupted snapshot: a duplicated row fails the blocking checks, by_count is skipped
    current = str(project / "wh" / "_current" / "per_key")
    dup = DeltaTable(current).to_pyarrow_table().slice(0, 1)
    write_deltalake(current, dup, mode="append")
    result = run(definitions, ["per_key", "by_count"])
    assert not result.success
    assert materialized(result) == {"per_key"}  # the catch-up ran; by_count did not
    got = evaluations(result)
    assert {k: e.passed for k, e in got.items()} == {
        ("per_key", REPLAY): False, ("per_key", EXCESS_DELETES): True,
        ("per_key", PK_UNIQUE): False, ("per_key", EXPECTATIONS): True}
    replayed = meta(got[("per_key", REPLAY)])
    assert replayed["extra_in_current"] == 1 and replayed["missing_from_current"] == 0
    assert replayed["current_rows"] == replayed["replayed_rows"] + 1
    (extra,) = replayed["first_extra_in_current"]
    assert extra["k"] == dup.column("k")[0].as_py() and extra["_count"] == 1
    pk = meta(got[("per_key", PK_UNIQUE)])
    assert pk["duplicate_keys"] == 1
    assert pk["first_duplicate_keys"] == [{"k": dup.column("k")[0].as_py(), "rows": 2}]
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert "Dependencies for step by_count failed: ['per_key_builtin_checks']. " \
        "Not executing." in logs
    assert "by_count" not in {e.step_key for e in result.all_events if e.is_step_start}


def _event(batch: int, op: str, before, after) -> dict:
    return {"op": op, "before": before, "after": after,
            "source": {"table": "t", "batch_id": batch, "connector": "octo"}}


def test_replay_applies_batches_in_order_and_reports_excess_deletes():
    columns = ["k", "n"]
    events = [_event(1, "u", {"k": 1, "n": 1}, {"k": 1, "n": 2}),
              _event(0, "c", None, {"k": 1, "n": 1}),
              _event(0, "c", None, {"k": 2, "n": 1})]
    got = replay_changelog(events, columns)
    assert dict(got.rows) == {(1, 2): 1, (2, 1): 1}
    assert got.events == 3 and got.batches == 2 and got.excess_deletes == []
    got = replay_changelog(events + [_event(2, "d", {"k": 3, "n": 1}, None)], columns)
    assert got.excess_deletes == [{"batch_id": 2, "op": "d", "row": {"k": 3, "n": 1}}]


def test_malformed_expectations_file_names_the_file(tmp_path: Path):
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "all.sql").write_text(SOURCE + PER_KEY)
    (tmp_path / "sql" / "per_key.expectations.json").write_text('[{"kwargs": {}}]')
    project = load_project(tmp_path)
    with pytest.raises(OctoError, match=r"sql/per_key.expectations.json: expectation 0"):
        load_expectations(project, project.table("per_key"))


def test_example_definitions_include_the_checks():
    graph = defs.resolve_asset_graph()
    keys = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    project = load_project(REPO_ROOT)
    for table in project.tables.values():
        assert (table.name, REPLAY) in keys and (table.name, EXCESS_DELETES) in keys
        assert ((table.name, PK_UNIQUE) in keys) == bool(table.definition.pk)
    assert {a for a, name in keys if name == EXPECTATIONS} == {"auction_stats"}
    assert ("auction_stats", PK_UNIQUE) in keys
    spec = next(s for c in defs.asset_checks for s in c.check_specs
                if s.key == dg.AssetCheckKey(dg.AssetKey("auction_stats"), EXPECTATIONS))
    assert spec.blocking
    assert spec.metadata["expectations_file"] == "sql/auctions/auction_stats.expectations.json"
    assert all(s.blocking for c in defs.asset_checks for s in c.check_specs)

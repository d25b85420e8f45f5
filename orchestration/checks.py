"""Data-quality asset checks on every streaming table.

Built in, for every table (one multi-check per table, reading the changelog and the current
snapshot once):

- ``replay_matches_current``: replaying the changelog in ``source.batch_id`` order (remove
  ``before``, add ``after``) gives exactly the rows of ``_current/<table>``, as multisets;
- ``no_excess_deletes``: no row is removed more often than it was inserted during the replay;
- ``primary_key_unique`` (tables with a primary key): no key occurs twice in the snapshot.

Declared next to the table: ``<folder of its SQL file>/<table>.expectations.json`` lists
great-expectations expectations (``{"expectation_type": ..., "kwargs": {...}}``), run by the
``expectations`` check on the current snapshot. great_expectations is imported inside that
check only, so loading the code location stays fast.

All checks are blocking with severity ERROR: a failure stops the downstream materializations
of the same run. They read the latest Delta versions through the warehouse resource's store.
"""
# No ``from __future__ import annotations``: Dagster reads the check functions' annotations.
import json
import math
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable, Iterator

import dagster as dg

from octo_platform.columns import BUCKET
from octo_platform.errors import OctoError
from octo_platform.project import CompiledTable, Project
from orchestration.resources import WarehouseResource
from orchestration.translator import OctoTranslator

__all__ = ["project_checks", "table_checks", "expectations_check", "load_expectations",
           "expectations_path", "replay_changelog", "Replay", "REPLAY", "EXCESS_DELETES",
           "PK_UNIQUE", "EXPECTATIONS"]

REPLAY = "replay_matches_current"
EXCESS_DELETES = "no_excess_deletes"
PK_UNIQUE = "primary_key_unique"
EXPECTATIONS = "expectations"
SHOW = 5  # offending rows shown in a check's metadata


def project_checks(project: Project,
                   translator: OctoTranslator) -> list[dg.AssetChecksDefinition]:
    """The built-in checks of every streaming table, plus an ``expectations`` check for each
    table that declares expectations."""
    checks: list[dg.AssetChecksDefinition] = []
    for table in project.order():
        checks.append(table_checks(project, table, translator))
        expectations = load_expectations(project, table)
        if expectations:
            checks.append(expectations_check(project, table, expectations, translator))
    return checks


# -- built-in checks ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Replay:
    """The changelog applied in batch order: the surviving rows and the excess deletions."""

    rows: Counter  # normalized row -> multiplicity (> 0)
    events: int
    batches: int
    excess_deletes: list[dict[str, Any]]  # batch, op and row of each delete of a missing row


def replay_changelog(events: Iterable[dict[str, Any]], columns: list[str]) -> Replay:
    """Apply change events (``op``, ``before``, ``after``, ``source.batch_id``) in batch order."""
    ordered = sorted(events, key=lambda e: e["source"]["batch_id"])  # stable within a batch
    state: Counter = Counter()
    excess: list[dict[str, Any]] = []
    for e in ordered:
        if e["before"] is not None:
            key = _row_key(e["before"], columns)
            if state[key] <= 0:
                excess.append({"batch_id": e["source"]["batch_id"], "op": e["op"],
                               "row": _show(e["before"], columns)})
            else:
                state[key] -= 1
        if e["after"] is not None:
            state[_row_key(e["after"], columns)] += 1
    return Replay(rows=+state, events=len(ordered),
                  batches=len({e["source"]["batch_id"] for e in ordered}), excess_deletes=excess)


def table_checks(project: Project, table: CompiledTable,
                 translator: OctoTranslator) -> dg.AssetChecksDefinition:
    """Replay, excess-delete and (with a primary key) key-uniqueness checks of one table."""
    name, columns = table.name, list(table.definition.columns)
    pk = list(table.definition.pk or ())
    key = translator.get_asset_key(name)
    specs = [
        dg.AssetCheckSpec(REPLAY, asset=key, blocking=True, description=(
            "Replaying the changelog in batch order (remove `before`, add `after`) gives "
            f"exactly the rows of `_current/{name}`.")),
        dg.AssetCheckSpec(EXCESS_DELETES, asset=key, blocking=True, description=(
            "No row is deleted (or updated away) more often than it was inserted.")),
    ]
    if pk:
        specs.append(dg.AssetCheckSpec(PK_UNIQUE, asset=key, blocking=True, description=(
            f"The primary key ({', '.join(pk)}) is unique in `_current/{name}`.")))

    @dg.multi_asset_check(specs=specs, name=f"{name}_builtin_checks", can_subset=True)
    def _checks(context: dg.AssetCheckExecutionContext,
                warehouse: WarehouseResource) -> Iterator[dg.AssetCheckResult]:
        selected = {k.name for k in context.selected_asset_check_keys}
        options = warehouse.options(project.root)
        store, layout = options.env.store, options.layout(project.root)
        changelog = store.read(layout.changelog(name))
        current = store.read(layout.current(name))
        if changelog is None and current is None:
            for spec in specs:
                if spec.name in selected:
                    yield dg.AssetCheckResult(
                        check_name=spec.name, passed=True, severity=dg.AssetCheckSeverity.ERROR,
                        description="not written yet: nothing to check")
            return
        snapshot = _snapshot_rows(current)
        if REPLAY in selected or EXCESS_DELETES in selected:
            replay = replay_changelog(changelog.to_pylist() if changelog is not None else [],
                                      columns)
        if REPLAY in selected:
            yield _replay_result(replay, snapshot, columns)
        if EXCESS_DELETES in selected:
            yield dg.AssetCheckResult(
                check_name=EXCESS_DELETES, passed=not replay.excess_deletes,
                severity=dg.AssetCheckSeverity.ERROR,
                metadata={"changelog_events": replay.events, "batches": replay.batches,
                          "excess_deletes": len(replay.excess_deletes),
                          "first_excess_deletes": dg.MetadataValue.json(
                              replay.excess_deletes[:SHOW])})
        if pk and PK_UNIQUE in selected:
            yield _pk_result(snapshot, pk)

    return _checks


def _replay_result(replay: Replay, snapshot: list[dict[str, Any]],
                   columns: list[str]) -> dg.AssetCheckResult:
    current = Counter(_row_key(r, columns) for r in snapshot)
    missing = replay.rows - current  # replayed, not in the snapshot
    extra = current - replay.rows  # in the snapshot, not replayed
    return dg.AssetCheckResult(
        check_name=REPLAY, passed=not missing and not extra,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "changelog_events": replay.events, "batches": replay.batches,
            "replayed_rows": sum(replay.rows.values()), "current_rows": len(snapshot),
            "missing_from_current": sum(missing.values()),
            "extra_in_current": sum(extra.values()),
            "first_missing_from_current": dg.MetadataValue.json(_first(missing, columns)),
            "first_extra_in_current": dg.MetadataValue.json(_first(extra, columns)),
        })


def _pk_result(snapshot: list[dict[str, Any]], pk: list[str]) -> dg.AssetCheckResult:
    counts = Counter(tuple(_norm(r.get(c)) for c in pk) for r in snapshot)
    dups = [(k, n) for k, n in counts.items() if n > 1]
    return dg.AssetCheckResult(
        check_name=PK_UNIQUE, passed=not dups, severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "primary_key": ", ".join(pk), "current_rows": len(snapshot),
            "duplicate_keys": len(dups),
            "first_duplicate_keys": dg.MetadataValue.json(
                [{**{c: _jsonable(v) for c, v in zip(pk, k)}, "rows": n} for k, n in dups[:SHOW]]),
        })


# -- great-expectations -------------------------------------------------------------------------
def expectations_path(project: Project, table: CompiledTable) -> Path:
    """``<folder of the table's SQL file>/<table>.expectations.json``."""
    return (project.root / table.definition.file).parent / f"{table.name}.expectations.json"


def load_expectations(project: Project, table: CompiledTable) -> list[dict[str, Any]]:
    """The table's declared expectations (none when it has no expectations file).

    The file holds a JSON list of ``{"expectation_type": "expect_...", "kwargs": {...}}``, or an
    object with such a list under ``"expectations"`` (a GE suite's shape). A malformed file
    fails loading the definitions, naming the file."""
    path = expectations_path(project, table)
    if not path.is_file():
        return []
    rel = path.relative_to(project.root)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise OctoError(f"{rel}: not valid JSON: {e}") from e
    items = doc.get("expectations") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise OctoError(f"{rel}: expected a list of expectations (or {{\"expectations\": [...]}})")
    out = []
    for i, item in enumerate(items):
        kind = item.get("expectation_type", item.get("type")) if isinstance(item, dict) else None
        kwargs = item.get("kwargs", {}) if isinstance(item, dict) else None
        if not isinstance(kind, str) or not kind.startswith("expect_") \
                or not isinstance(kwargs, dict):
            raise OctoError(f"{rel}: expectation {i} needs \"expectation_type\": \"expect_...\" "
                            f"and a \"kwargs\" object, got {item!r}")
        out.append({"expectation_type": kind, "kwargs": kwargs})
    return out


def expectations_check(project: Project, table: CompiledTable,
                       expectations: list[dict[str, Any]],
                       translator: OctoTranslator) -> dg.AssetChecksDefinition:
    """One blocking check running the table's expectations on its current snapshot."""
    name = table.name
    rel = expectations_path(project, table).relative_to(project.root)
    listed = "\n".join(f"- `{e['expectation_type']}` {json.dumps(e['kwargs'])}"
                       for e in expectations)

    @dg.asset_check(asset=translator.get_asset_key(name), name=EXPECTATIONS, blocking=True,
                    description=f"great-expectations on `_current/{name}` "
                                f"(declared in `{rel}`):\n{listed}",
                    metadata={"expectations_file": str(rel)})
    def _check(warehouse: WarehouseResource) -> dg.AssetCheckResult:
        options = warehouse.options(project.root)
        current = options.env.store.read(options.layout(project.root).current(name))
        if current is None:
            return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.ERROR,
                                       description="not written yet: nothing to check")
        if BUCKET in current.column_names:
            current = current.drop_columns([BUCKET])
        results = run_expectations(current.to_pandas(), expectations, name=name)
        failed = [r for r in results if not r["success"]]
        return dg.AssetCheckResult(
            passed=not failed, severity=dg.AssetCheckSeverity.ERROR,
            metadata={"rows": current.num_rows, "expectations": len(results),
                      "failed": len(failed), "results": dg.MetadataValue.json(results)})

    return _check


def run_expectations(df, expectations: list[dict[str, Any]], *,
                     name: str) -> list[dict[str, Any]]:
    """Validate a pandas DataFrame with GE 1.x (ephemeral context, whole-dataframe batch); per
    expectation: type, kwargs, success, observed value and a few unexpected values."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )
    from great_expectations.expectations.expectation_configuration import (
        ExpectationConfiguration,
    )

    context = gx.get_context(mode="ephemeral", project_config=DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False, progress_bars=ProgressBarsConfig(globally=False)))
    batch = (context.data_sources.add_pandas(f"octo_{name}")
             .add_dataframe_asset(name=name)
             .add_batch_definition_whole_dataframe("current")
             .get_batch(batch_parameters={"dataframe": df}))
    suite = gx.ExpectationSuite(name=f"{name}_expectations")
    for e in expectations:
        suite.add_expectation(ExpectationConfiguration(
            type=e["expectation_type"], kwargs=e["kwargs"]).to_domain_obj())
    validation = batch.validate(suite)
    out = []
    for expectation, r in zip(suite.expectations, validation.results):
        result = r.result or {}
        entry = {"expectation_type": r.expectation_config.type,
                 "kwargs": {k: _jsonable(v) for k, v in r.expectation_config.kwargs.items()
                            if k != "batch_id"},
                 "success": bool(r.success),
                 "observed_value": _jsonable(result.get("observed_value"))}
        if "unexpected_count" in result:  # a column-map expectation: what was unexpected
            entry["unexpected_count"] = result["unexpected_count"]
            if entry["observed_value"] is None:
                entry["observed_value"] = (f"{result['unexpected_count']} unexpected of "
                                           f"{result.get('element_count')} rows")
            entry["partial_unexpected_list"] = _jsonable(
                (result.get("partial_unexpected_list") or [])[:SHOW])
        if r.exception_info and r.exception_info.get("raised_exception"):
            entry["exception"] = r.exception_info.get("exception_message")
        out.append(entry)
    return out


# -- row helpers ---------------------------------------------------------------------------------
def _snapshot_rows(current) -> list[dict[str, Any]]:
    if current is None:
        return []
    if BUCKET in current.column_names:
        current = current.drop_columns([BUCKET])
    return current.to_pylist()


def _row_key(row: dict[str, Any], columns: list[str]) -> tuple:
    return tuple(_norm(row.get(c)) for c in columns)


def _norm(value: Any) -> Any:
    """Hashable form of a value; floats compared to 12 significant digits (an aggregate's
    float sum may differ in the last bits between the changelog and the snapshot)."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else float(f"{value:.12g}")
    if isinstance(value, Decimal):
        return float(f"{float(value):.12g}")
    if isinstance(value, dict):
        return tuple((k, _norm(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_norm(v) for v in value)
    return value


def _show(row: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    return {c: _jsonable(row.get(c)) for c in columns}


def _first(rows: Counter, columns: list[str]) -> list[dict[str, Any]]:
    return [{**dict(zip(columns, (_jsonable(v) for v in key))), "_count": n}
            for key, n in list(rows.items())[:SHOW]]


def _jsonable(value: Any) -> Any:
    """JSON-safe form of a value for check metadata."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _jsonable(value.item())
    return str(value)

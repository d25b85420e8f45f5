"""Translate a compiled octo project into Dagster assets.

- each ``CREATE SOURCE`` becomes an external asset (``AssetSpec``): connector, path, format
  and column schema as metadata;
- each ``CREATE STREAMING TABLE`` becomes an asset whose materialization is one catch-up run
  of the table (``run_tables(..., until_idle=True)``): key = table name, group = sub-folder
  of ``sql/``, deps = the sources and tables its SQL reads, ``code_version`` = the plan
  fingerprint (changes with the meaning of the query, not with its formatting), column schema
  and column lineage derived from the compiled plan (views and CTEs inlined);
- a table declaring event-time partitions (``WITH (partition_by = ...)``) is partitioned in
  Dagster too (hourly / daily / monthly, single-run backfill policy): a partitioned run
  catches up, then recomputes its partition range from the table's history and publishes the
  difference (a backfill); a run without partitions is a plain catch-up.
"""
# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations
# (context and resource parameters) as objects.
import re
import time
import warnings
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping

import dagster as dg

from octo_platform.errors import CatalogError
from octo_platform.logical.lineage import column_lineage, column_types
from octo_platform.logical.plan import explain as explain_logical
from octo_platform.partitions import Partitioning
from octo_platform.project import CompiledTable, Project
from orchestration.resources import SparkResource, WarehouseResource

__all__ = ["project_assets", "source_spec", "table_asset", "group_name", "catch_up",
           "partitions_def", "UNKNOWN_TYPE"]

UNKNOWN_TYPE = "unknown"  # a column whose type the plan alone does not determine
DEFAULT_GROUP = "default"


def group_name(folder: str) -> str:
    """Dagster group of a sub-folder of ``sql/`` (``""`` -> ``default``, ``a/b`` -> ``a__b``)."""
    if not folder:
        return DEFAULT_GROUP
    return re.sub(r"[^A-Za-z0-9_]", "_", folder.replace("/", "__"))


def project_assets(project: Project) -> list[dg.AssetSpec | dg.AssetsDefinition]:
    """Source specs and one asset per streaming table, in dependency order."""
    specs: list[dg.AssetSpec | dg.AssetsDefinition] = [
        source_spec(project, s.name) for s in project.catalog.sources.values()]
    types: dict[str, dict[str, str | None]] = {}
    for table in project.order():
        types[table.name.lower()] = column_types(
            table.definition.plan, table_types=lambda n: types.get(n.lower(), {}))
        specs.append(table_asset(project, table, types[table.name.lower()]))
    return specs


def source_spec(project: Project, name: str) -> dg.AssetSpec:
    """The external asset of one ``CREATE SOURCE`` (grouped by the folder of its file)."""
    s = project.source(name)
    folder = "/".join(Path(s.file).parts[1:-1])  # the file is sql/<folders...>/<name>.sql
    meta: dict[str, Any] = {
        "dagster/column_schema": dg.TableSchema(columns=[
            dg.TableColumn(c, t.upper(), description="primary key" if s.pk and c in s.pk
                           else None) for c, t in zip(s.columns, s.types)]),
        "connector": s.connector,
        "path": dg.MetadataValue.path(project.source_path(s)),
        "mode": s.mode,
        "primary_key": ", ".join(s.pk) if s.pk else "none",
        "sql_file": s.file,
    }
    if s.format:
        meta["format"] = s.format
    extra = {k: v for k, v in s.options.items()
             if k not in ("connector", "path", "format", "primary_key", "mode")}
    if extra:
        meta["options"] = extra
    kinds = {"delta"} if s.connector == "delta" else {s.format.split("-")[-1]}
    return dg.AssetSpec(
        key=dg.AssetKey(s.name), group_name=group_name(folder), kinds=kinds, metadata=meta,
        description=_description(project, s.file, _source_statement(s)))


def table_asset(project: Project, table: CompiledTable,
                types: Mapping[str, str | None]) -> dg.AssetsDefinition:
    """The asset of one streaming table; materializing it is a catch-up run."""
    d = table.definition
    pk = d.pk or ()
    lineage = column_lineage(d.plan)
    meta: dict[str, Any] = {
        "dagster/column_schema": dg.TableSchema(columns=[
            dg.TableColumn(c, types.get(c) or UNKNOWN_TYPE,
                           description="primary key" if c in pk else None)
            for c in d.columns]),
        "dagster/column_lineage": dg.TableColumnLineage({
            c: [dg.TableColumnDep(dg.AssetKey(scan), col) for scan, col in sorted(lineage[c])]
            for c in d.columns}),
        "sql_file": d.file,
        "primary_key": ", ".join(pk) if pk else "none (a bag of rows: no u events)",
        "changelog_mode": d.plan.mode,
        "state_tables": ", ".join(table.physical.state_tables) or "none (stateless)",
        "plan": dg.MetadataValue.md(f"```\n{explain_logical(d.plan)}\n```"),
    }
    name = table.name
    statement = f"CREATE STREAMING TABLE {name}{_with(d.options)} AS\n{d.sql}"
    partitioned: dict[str, Any] = {}
    if d.partitioning is not None:
        upstream = [dep for dep in d.deps if dep.lower() in project.tables
                    and project.table(dep).definition.partitioning is not None]
        if upstream:
            # Dagster cannot run a partitioned asset without a partition once a partitioned
            # upstream asset has materializations (it maps the run's partitions upstream).
            raise CatalogError(
                f"{d.file}: streaming table {name!r} declares partitions and reads the "
                f"partitioned table {upstream[0]!r}; Dagster could not run its catch-ups "
                "(runs without a partition). Declare partitions on one of them only.")
        meta["partition_by"] = f"{d.partitioning.column} ({d.partitioning.granularity})"
        partitioned = {"partitions_def": partitions_def(d.partitioning),
                       "backfill_policy": dg.BackfillPolicy.single_run()}

    with warnings.catch_warnings():  # backfill_policy is "beta" in Dagster 1.13: noise for users
        warnings.simplefilter("ignore", dg.BetaWarning)

        @dg.asset(
            key=dg.AssetKey(name),
            deps=[dg.AssetKey(dep) for dep in d.deps],
            group_name=group_name(table.group),
            code_version=table.physical.fingerprint,
            description=_description(project, d.file, statement),
            metadata=meta,
            kinds={"spark", "delta"},
            **partitioned,
        )
        def _asset(context: dg.AssetExecutionContext, spark: SparkResource,
                   warehouse: WarehouseResource) -> dg.MaterializeResult:
            window = None
            if context.has_partition_key or context.has_partition_key_range:
                tw = context.partition_time_window
                window = (tw.start, tw.end)
            return catch_up(project, name, spark=spark.get_session(), warehouse=warehouse,
                            log=context.log.info, window=window)

    return _asset


def partitions_def(p: Partitioning) -> dg.TimeWindowPartitionsDefinition:
    """Dagster's partitions for a table's event-time partitions; the current (still open)
    period is a partition too."""
    cls = {"hourly": dg.HourlyPartitionsDefinition, "daily": dg.DailyPartitionsDefinition,
           "monthly": dg.MonthlyPartitionsDefinition}[p.granularity]
    return cls(start_date=p.start.strftime(p.key_format), timezone="UTC", end_offset=1)


def catch_up(project: Project, name: str, *, spark, warehouse: WarehouseResource,
             log: Callable[[str], None],
             window: tuple[datetime, datetime] | None = None) -> dg.MaterializeResult:
    """Run ``name`` until idle (exactly once: it resumes from the batch log) and describe
    what the run did and where the table stands. With ``window`` (a partitioned run: a
    backfill), first recompute the partitions in ``[start, end)`` from what the table has
    read and publish the difference (``octo_platform.runtime.recompute.backfill``; it also
    adopts a changed query), then catch up with the corrected state."""
    from octo_platform.runtime.recompute import backfill
    from octo_platform.runtime.runner import run_tables
    from octo_platform.runtime.status import current_schema, table_status

    wh = warehouse.location(project.root)
    env = warehouse.environment()
    started = time.monotonic()
    batches, recomputed = [], None
    # A table that never ran has no history to correct: its catch-up computes everything.
    if window is not None and table_status(project, name, warehouse=wh, env=env).last_batch >= 0:
        recomputed = backfill(spark, project, name, window=window, warehouse=wh, env=env,
                              storage_options=warehouse.storage_options or None, progress=log)
        batches += [recomputed.batch] if recomputed.batch is not None else []
    report = run_tables(spark, project, warehouse=wh, names=[name], until_idle=True, env=env,
                        storage_options=warehouse.storage_options or None, progress=log,
                        parallel=1)
    batches += report.for_table(name)
    seconds = time.monotonic() - started
    events: Counter[str] = Counter()
    for b in batches:
        events.update(b.events)
    status = table_status(project, name, warehouse=wh, env=env)
    log(f"[{name}] caught up: {len(batches)} batch(es) in {seconds:.1f}s; "
        f"{status.waiting} input(s) waiting")
    meta: dict[str, Any] = {
        "batches": len(batches),
        "rows_in": sum(b.rows_in for b in batches),
        "events_c": events.get("c", 0),
        "events_u": events.get("u", 0),
        "events_d": events.get("d", 0),
        "dead_letters": sum(b.dead_letters for b in batches),
        "state_rows": status.total_state_rows,
        "dagster/row_count": status.current_rows or 0,
        "changelog_version": status.changelog_version,
        "current_version": status.current_version,
        "last_batch": status.last_batch,
        "duration_s": round(seconds, 3),
        "backlog": status.waiting,
        "backlog_by_input": status.backlog,
        "changelog_path": dg.MetadataValue.path(f"{wh}/{project.table(name).name}"),
    }
    if status.state_rows:
        meta["state_rows_by_table"] = status.state_rows
    if recomputed is not None:
        meta["backfill"] = recomputed.what
        meta["backfill_rows_changed"] = recomputed.rows_changed
        meta["backfill_partitions_changed"] = ", ".join(recomputed.partitions) or "none"
        meta["backfill_batch"] = (recomputed.batch.batch if recomputed.batch is not None
                                  else dg.MetadataValue.null())
    schema = current_schema(project, name, warehouse=wh, env=env)
    if schema is not None:
        meta["dagster/column_schema"] = dg.TableSchema(columns=[
            dg.TableColumn(f.name, _spark_type(f.type)) for f in schema])
    # The committed batch identifies the table's contents: a run that found no input leaves
    # the version as it was, so downstream assets are not marked stale by it.
    return dg.MaterializeResult(metadata=meta,
                                data_version=dg.DataVersion(f"batch-{status.last_batch}"))


def _spark_type(t) -> str:
    """Spark SQL name of an Arrow type as Delta stores it."""
    import pyarrow as pa

    simple = [(pa.types.is_int64, "BIGINT"), (pa.types.is_int32, "INT"),
              (pa.types.is_int16, "SMALLINT"), (pa.types.is_int8, "TINYINT"),
              (pa.types.is_float64, "DOUBLE"), (pa.types.is_float32, "FLOAT"),
              (pa.types.is_boolean, "BOOLEAN"), (pa.types.is_string, "STRING"),
              (pa.types.is_large_string, "STRING"), (pa.types.is_string_view, "STRING"),
              (pa.types.is_timestamp, "TIMESTAMP"), (pa.types.is_date, "DATE"),
              (pa.types.is_binary, "BINARY"), (pa.types.is_large_binary, "BINARY")]
    for test, name in simple:
        if test(t):
            return name
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    return str(t).upper()


def _with(options: Mapping[str, str]) -> str:
    if not options:
        return ""
    return " WITH (" + ", ".join(f"{k} = '{v}'" for k, v in options.items()) + ")"


def _source_statement(s) -> str:
    cols = ",\n".join(f"    {c} {t}" for c, t in zip(s.columns, s.types))
    return f"CREATE SOURCE {s.name} (\n{cols}\n){_with(s.options)}"


def _description(project: Project, file: str, statement: str) -> str:
    """The SQL file's leading comment, then the statement and where it is defined."""
    comment = _leading_comment(project.root / file)
    parts = [comment] if comment else []
    parts.append(f"```sql\n{statement}\n```")
    parts.append(f"Defined in `{file}`.")
    return "\n\n".join(parts)


def _leading_comment(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    out: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("--"):
            out.append(stripped[2:].removeprefix(" "))
        elif stripped or out:
            break
    return "\n".join(out).strip()

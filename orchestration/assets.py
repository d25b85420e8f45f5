"""Translate a compiled octo project into Dagster assets (keys, groups, descriptions,
metadata and partitions come from ``translator.OctoTranslator``).

- each ``CREATE SOURCE`` becomes an external asset (``AssetSpec``): connector, path, format
  and column schema as metadata;
- each ``CREATE STREAMING TABLE`` becomes an asset whose materialization is one catch-up run
  of the table (``run_tables(..., until_idle=True)``): key = table name, group = sub-folder
  of ``sql/``, deps = the sources and tables its SQL reads, ``code_version`` = the plan
  fingerprint (changes with the meaning of the query, not with its formatting), column schema
  and column lineage derived from the compiled plan (views and CTEs inlined);
- each ``CREATE SINK`` becomes an asset downstream of its table, whose materialization
  publishes what the table committed and the sink has not (the table's runs publish after
  each batch, so it mostly confirms the sink is caught up): messages and lag as metadata;
- a table declaring event-time partitions (``WITH (partition_by = ...)``) is partitioned in
  Dagster too (hourly / daily / monthly, single-run backfill policy): a partitioned run
  catches up, then recomputes its partition range from the table's history and publishes the
  difference (a backfill); a run without partitions is a plain catch-up.
"""
# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations
# (context and resource parameters) as objects.
import time
import warnings
from datetime import datetime
from typing import Any, Callable, Mapping

import dagster as dg

from octo_platform.errors import CatalogError
from octo_platform.frontend.definitions import SinkDef
from octo_platform.logical.lineage import column_types
from octo_platform.project import CompiledTable, Project
from orchestration.resources import SparkResource, WarehouseResource
from orchestration.runs import column_schema, run_metadata
from orchestration.translator import OctoTranslator

__all__ = ["project_assets", "source_spec", "table_asset", "sink_asset", "catch_up"]


def project_assets(project: Project, translator: OctoTranslator
                   ) -> list[dg.AssetSpec | dg.AssetsDefinition]:
    """Source specs, one asset per streaming table (in dependency order) and per sink."""
    specs: list[dg.AssetSpec | dg.AssetsDefinition] = [
        source_spec(project, s.name, translator) for s in project.catalog.sources.values()]
    types: dict[str, dict[str, str | None]] = {}
    for table in project.order():
        types[table.name.lower()] = column_types(
            table.definition.plan, table_types=lambda n: types.get(n.lower(), {}))
        specs.append(table_asset(project, table, types[table.name.lower()], translator))
    specs += [sink_asset(project, sink, translator) for sink in project.sinks.values()]
    return specs


def source_spec(project: Project, name: str, translator: OctoTranslator) -> dg.AssetSpec:
    """The external asset of one ``CREATE SOURCE`` (grouped by the folder of its file)."""
    s = project.source(name)
    kinds = {s.connector} if s.connector in ("delta", "kafka") else {s.format.split("-")[-1]}
    return dg.AssetSpec(
        key=translator.get_asset_key(s.name),
        group_name=translator.get_source_group_name(project, s.name),
        kinds=kinds, metadata=translator.get_source_metadata(project, s.name),
        description=translator.get_source_description(project, s.name))


def table_asset(project: Project, table: CompiledTable, types: Mapping[str, str | None],
                translator: OctoTranslator) -> dg.AssetsDefinition:
    """The asset of one streaming table; materializing it is a catch-up run."""
    d = table.definition
    name = table.name
    partitioned: dict[str, Any] = {}
    partitions = translator.get_partitions_def(table)
    if partitions is not None:
        upstream = [dep for dep in d.deps if dep.lower() in project.tables
                    and project.table(dep).definition.partitioning is not None]
        if upstream:
            # Dagster cannot run a partitioned asset without a partition once a partitioned
            # upstream asset has materializations (it maps the run's partitions upstream).
            raise CatalogError(
                f"{d.file}: streaming table {name!r} declares partitions and reads the "
                f"partitioned table {upstream[0]!r}; Dagster could not run its catch-ups "
                "(runs without a partition). Declare partitions on one of them only.")
        partitioned = {"partitions_def": partitions,
                       "backfill_policy": dg.BackfillPolicy.single_run()}

    with warnings.catch_warnings():  # backfill_policy is "beta" in Dagster 1.13: noise for users
        warnings.simplefilter("ignore", dg.BetaWarning)

        @dg.asset(
            key=translator.get_asset_key(name),
            deps=translator.get_deps(table),
            group_name=translator.get_table_group_name(table),
            code_version=translator.get_code_version(table),
            description=translator.get_table_description(project, table),
            metadata=translator.get_table_metadata(table, types),
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


def sink_asset(project: Project, sink: SinkDef, translator: OctoTranslator
               ) -> dg.AssetsDefinition:
    """The asset of one sink, downstream of its table; materializing it publishes what the
    sink has not published yet."""

    @dg.asset(key=translator.get_asset_key(sink.name),
              deps=[translator.get_asset_key(sink.table)],
              group_name=translator.get_sink_group_name(project, sink),
              description=translator.get_sink_description(project, sink),
              metadata=translator.get_sink_metadata(sink), kinds={"kafka"})
    def _asset(context: dg.AssetExecutionContext, spark: SparkResource,
               warehouse: WarehouseResource) -> dg.MaterializeResult:
        from octo_platform.runtime.runner import publish_sink

        started = time.monotonic()
        published, lag = publish_sink(spark.get_session(), project, sink.name,
                                      options=warehouse.options(project.root,
                                                                progress=context.log.info))
        counts: dict[str, int] = {}
        for s in published:
            for k, v in s.counts.items():
                counts[k] = counts.get(k, 0) + v
        return dg.MaterializeResult(metadata={
            "sink_batches": len(published), "messages": counts.get("published", 0),
            **{f"events_{op}": counts.get(op, 0) for op in ("c", "u", "d")},
            "changelog_versions_waiting": lag if lag is not None else dg.MetadataValue.null(),
            "target": sink.target, "duration_s": round(time.monotonic() - started, 3)})

    return _asset


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

    options = warehouse.options(project.root, progress=log)
    started = time.monotonic()
    batches, recomputed = [], None
    # A table that never ran has no history to correct: its catch-up computes everything.
    if window is not None and table_status(project, name, options=options).last_batch >= 0:
        recomputed = backfill(spark, project, name, options=options, window=window)
        batches += [recomputed.batch] if recomputed.batch is not None else []
    report = run_tables(spark, project, options=options, names=[name], until_idle=True,
                        parallel=1)
    batches += report.for_table(name)
    seconds = time.monotonic() - started
    status = table_status(project, name, options=options)
    log(f"[{name}] caught up: {len(batches)} batch(es) in {seconds:.1f}s; "
        f"{status.waiting} input(s) waiting")
    meta: dict[str, Any] = {
        **run_metadata(batches, status, seconds),
        "state_rows": status.total_state_rows,
        "current_version": status.current_version,
        "changelog_path": dg.MetadataValue.path(
            options.layout(project.root).changelog(project.table(name).name)),
    }
    if status.state_rows:
        meta["state_rows_by_table"] = status.state_rows
    if recomputed is not None:
        meta["backfill"] = recomputed.what
        meta["backfill_rows_changed"] = recomputed.rows_changed
        meta["backfill_partitions_changed"] = ", ".join(recomputed.partitions) or "none"
        meta["backfill_batch"] = (recomputed.batch.batch if recomputed.batch is not None
                                  else dg.MetadataValue.null())
    schema = current_schema(project, name, options=options)
    if schema is not None:
        meta["dagster/column_schema"] = column_schema(schema)
    # The committed batch identifies the table's contents: a run that found no input leaves
    # the version as it was, so downstream assets are not marked stale by it.
    return dg.MaterializeResult(metadata=meta,
                                data_version=dg.DataVersion(f"batch-{status.last_batch}"))

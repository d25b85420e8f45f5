"""Scheduled restarts, catch-up schedules and a backlog sensor for an octo project.

Per group of streaming tables (a sub-folder of ``sql/``):

- ``continuous_<group>``: a job that runs the group's tables continuously
  (``run_tables(until_idle=False, deadline=...)``) for ``minutes`` and stops cleanly after
  the batches in flight; it logs a line per micro-batch and, at the end, a materialization
  per table that committed batches plus a summary;
- ``restart_<group>`` (schedule, hourly): starts that job with a deadline just under the
  interval (55 minutes), so runs do not overlap and a crashed run is replaced within the hour;
- ``catch_up_<group>`` (a job materializing the group's tables) and its schedule
  ``catch_up_<group>_schedule`` (every 15 minutes).

Per streaming table:

- ``full_refresh_<table>``: a job that deletes the table and everything downstream of it and
  rebuilds them from all input (``octo_platform.runtime.recompute.refresh``);
- ``rescale_<table>``: a job that moves the table's state to the number of buckets its run
  config names (``ops: {rescale_<table>_op: {config: {buckets: N}}}``;
  ``octo_platform.runtime.recompute.rescale``).

For the whole project:

- ``octo_backlog_sensor``: requests catch-up runs (``catch_up_<group>``, one per group) of the
  tables whose inputs have new data (``table_status(...).backlog``) and of the tables
  downstream of them; its cursor remembers
  each table's (last batch, backlog), so the same backlog never triggers twice. Each tick
  also records an ``AssetObservation`` per table whose backlog or last batch changed (and at
  least every ``OBSERVE_EVERY_S``): input waiting and age of the last commit, the lag view.

Schedules and the sensor are created STOPPED: a group should be driven by one of them
(continuous restarts, or catch-up schedule / sensor), and the choice is the user's.
"""
# No ``from __future__ import annotations``: Dagster reads the op's annotations as objects.
import json
import time
from typing import Any

import dagster as dg

from octo_platform.errors import CatalogError
from octo_platform.project import Project
from orchestration.resources import SparkResource, WarehouseResource
from orchestration.runs import backlog_metadata, run_metadata, watermark_metadata
from orchestration.translator import OctoTranslator

__all__ = ["project_automation", "ContinuousConfig", "RESTART_CRON", "CATCH_UP_CRON",
           "CONTINUOUS_MINUTES", "SENSOR_NAME", "OBSERVE_EVERY_S"]

RESTART_CRON = "0 * * * *"  # restart continuous jobs hourly ...
CONTINUOUS_MINUTES = 55.0  # ... each running just under the interval, so runs never overlap
CATCH_UP_CRON = "*/15 * * * *"
SENSOR_NAME = "octo_backlog_sensor"
SENSOR_INTERVAL_S = 60
OBSERVE_EVERY_S = 600  # an unchanged table is observed again after this long
_ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
           dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


class ContinuousConfig(dg.Config):
    minutes: float = CONTINUOUS_MINUTES
    interval: str = "1 second"


class RescaleConfig(dg.Config):
    buckets: int  # the table's new number of buckets (1 to 4096)


def project_automation(project: Project, translator: OctoTranslator, *,
                       restart_cron: str = RESTART_CRON,
                       catch_up_cron: str = CATCH_UP_CRON,
                       default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
                       sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
                       ) -> dict[str, list]:
    """``jobs``, ``schedules`` and ``sensors`` for ``dg.Definitions(**...)``."""
    groups: dict[str, list[str]] = {}
    for t in project.order():
        groups.setdefault(translator.get_table_group_name(t), []).append(t.name)
    for group, tables in groups.items():
        declared = {project.table(t).definition.partitioning: t for t in tables}
        declared.pop(None, None)
        if len(declared) > 1:
            raise CatalogError(
                f"group {group!r}: tables {' and '.join(declared.values())} declare different "
                "partitions; a group's catch-up job needs a single partitions definition (put "
                "them in different sub-folders of sql/)")
    jobs: list = []
    schedules: list = []
    catch_ups: dict[str, dg.UnresolvedAssetJobDefinition] = {}
    for group, tables in groups.items():
        continuous = continuous_job(project, group, tables, translator)
        catch_ups[group] = dg.define_asset_job(
            f"catch_up_{group}",
            selection=dg.AssetSelection.assets(*map(translator.get_asset_key, tables)),
            description=f"Catch-up run of the streaming tables of group {group!r}.")
        jobs += [continuous, catch_ups[group]]
        schedules += [_restart_schedule(continuous, group, restart_cron, default_status),
                      _catch_up_schedule(catch_ups[group], continuous.name, group,
                                         catch_up_cron, default_status)]
    jobs += [job(project, t.name, translator) for t in project.order()
             for job in (full_refresh_job, rescale_job)]
    sensors = [backlog_sensor(project, catch_ups, translator, sensor_status)] if groups else []
    return {"jobs": jobs, "schedules": schedules, "sensors": sensors}


# -- continuous mode --------------------------------------------------------------------------
def continuous_job(project: Project, group: str, tables: list[str],
                   translator: OctoTranslator) -> dg.JobDefinition:
    """Run ``tables`` continuously until ``minutes`` have passed, then stop cleanly."""

    @dg.op(name=f"run_continuously_{group}",
           description=f"Runs {', '.join(tables)} continuously until the configured deadline.")
    def _op(context: dg.OpExecutionContext, config: ContinuousConfig, spark: SparkResource,
            warehouse: WarehouseResource) -> dg.Output:
        return run_continuously(project, tables, config=config, spark=spark.get_session(),
                                warehouse=warehouse, context=context, translator=translator)

    @dg.job(name=f"continuous_{group}", executor_def=dg.in_process_executor,
            description=f"Streaming tables of group {group!r} running continuously until a "
                        f"deadline (default {CONTINUOUS_MINUTES:g} minutes); restarted by "
                        f"restart_{group}.",
            tags={"octo/mode": "continuous", "octo/group": group})
    def _job():
        _op()

    return _job


def run_continuously(project: Project, tables: list[str], *, config: ContinuousConfig, spark,
                     warehouse: WarehouseResource, context,
                     translator: OctoTranslator) -> dg.Output:
    from octo_platform.runtime.runner import run_tables
    from octo_platform.runtime.status import table_status

    log = context.log.info
    options = warehouse.options(project.root, progress=log)
    started = time.monotonic()
    log(f"running {', '.join(tables)} continuously for {config.minutes:g} minute(s)")
    report = run_tables(spark, project, options=options, names=tables, until_idle=False,
                        deadline=time.time() + config.minutes * 60, interval=config.interval)
    seconds = time.monotonic() - started
    summary: dict[str, Any] = {}
    for name in tables:
        batches = report.for_table(name)
        status = table_status(project, name, options=options)
        meta = {**run_metadata(batches, status, seconds), "mode": "continuous"}
        summary[name] = {k: v for k, v in meta.items() if k != "backlog_by_input"}
        log(f"[{name}] stopped at the deadline: {meta['batches']} batch(es), "
            f"{meta['rows_in']} rows in, last batch {status.last_batch}, "
            f"{status.waiting} input(s) waiting")
        if batches:
            context.log_event(dg.AssetMaterialization(
                asset_key=translator.get_asset_key(name), metadata=meta,
                description="continuous run (stopped at its deadline)"))
    return dg.Output(None, metadata={
        "batches": len(report.batches), "rows_in": sum(b.rows_in for b in report.batches),
        "duration_s": round(seconds, 3), "tables": summary})


def _running(instance: dg.DagsterInstance, job_name: str) -> bool:
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=_ACTIVE), limit=1)
    return bool(runs)


def _restart_schedule(job: dg.JobDefinition, group: str, cron: str,
                      status: dg.DefaultScheduleStatus) -> dg.ScheduleDefinition:
    @dg.schedule(name=f"restart_{group}", cron_schedule=cron, job=job, default_status=status,
                 description=f"Restarts {job.name}: each run stops after "
                             f"{CONTINUOUS_MINUTES:g} minutes, before the next tick.")
    def _schedule(context: dg.ScheduleEvaluationContext):
        if _running(context.instance, job.name):
            return dg.SkipReason(f"{job.name} is still running")
        return dg.RunRequest(
            run_key=None,
            run_config={"ops": {f"run_continuously_{group}": {
                "config": {"minutes": CONTINUOUS_MINUTES}}}},
            tags={"octo/trigger": "restart"})

    return _schedule


def _catch_up_schedule(job, continuous_job_name: str, group: str, cron: str,
                       status: dg.DefaultScheduleStatus) -> dg.ScheduleDefinition:
    @dg.schedule(name=f"catch_up_{group}_schedule", cron_schedule=cron, job=job,
                 default_status=status,
                 description=f"Catch-up run of group {group!r} (skipped while "
                             f"{continuous_job_name} runs: it holds the tables).")
    def _schedule(context: dg.ScheduleEvaluationContext):
        if _running(context.instance, continuous_job_name):
            return dg.SkipReason(f"{continuous_job_name} is running the group's tables")
        return dg.RunRequest(tags={"octo/trigger": "schedule"})

    return _schedule


# -- full refresh -----------------------------------------------------------------------------
def full_refresh_job(project: Project, name: str,
                     translator: OctoTranslator) -> dg.JobDefinition:
    """Reset ``name`` and the tables downstream of it, then rebuild them from all input."""
    from octo_platform.runtime.recompute import downstream_of

    affected = downstream_of(project, [name])

    @dg.op(name=f"full_refresh_{name}_op",
           description=f"Resets {', '.join(affected)} and runs them until idle.")
    def _op(context: dg.OpExecutionContext, spark: SparkResource,
            warehouse: WarehouseResource) -> dg.Output:
        from octo_platform.runtime.recompute import refresh

        started = time.monotonic()
        report = refresh(spark.get_session(), project, [name],
                         options=warehouse.options(project.root, progress=context.log.info))
        for table in affected:
            batches = report.for_table(table)
            context.log_event(dg.AssetMaterialization(
                asset_key=translator.get_asset_key(table),
                description="full refresh: rebuilt from all input",
                metadata={"batches": len(batches), "rows_in": sum(b.rows_in for b in batches),
                          "dead_letters": sum(b.dead_letters for b in batches),
                          "mode": "full refresh"}))
        return dg.Output(None, metadata={"tables": ", ".join(affected),
                                         "batches": len(report.batches),
                                         "duration_s": round(time.monotonic() - started, 3)})

    @dg.job(name=f"full_refresh_{name}", executor_def=dg.in_process_executor,
            description=f"Full refresh of {name}: deletes its changelog, current snapshot and "
                        f"state (and those of {', '.join(affected[1:]) or 'no other table'}, "
                        "downstream of it) and rebuilds them from all input.",
            tags={"octo/mode": "full-refresh"})
    def _job():
        _op()

    return _job


def rescale_job(project: Project, name: str, translator: OctoTranslator) -> dg.JobDefinition:
    """Move ``name``'s operator state and current state to ``config.buckets`` buckets."""

    @dg.op(name=f"rescale_{name}_op",
           description=f"Moves the state of {name} to the configured number of buckets.")
    def _op(context: dg.OpExecutionContext, config: RescaleConfig, spark: SparkResource,
            warehouse: WarehouseResource) -> dg.Output:
        from octo_platform.runtime.recompute import rescale

        started = time.monotonic()
        stats = rescale(spark.get_session(), project, name, config.buckets,
                        options=warehouse.options(project.root, progress=context.log.info))
        if stats is not None:
            context.log_event(dg.AssetObservation(
                asset_key=translator.get_asset_key(name),
                description=f"rescaled to {config.buckets} buckets",
                metadata={"batch": stats.batch, "buckets": config.buckets}))
        return dg.Output(None, metadata={"buckets": config.buckets,
                                         "rescaled": stats is not None,
                                         "duration_s": round(time.monotonic() - started, 3)})

    @dg.job(name=f"rescale_{name}", executor_def=dg.in_process_executor,
            description=f"Rescale of {name}: its operator state and current state moved to "
                        "the number of buckets the run config names (ops.rescale_"
                        f"{name}_op.config.buckets), as one batch that changes no row.",
            tags={"octo/mode": "rescale"})
    def _job():
        _op()

    return _job


# -- the backlog sensor and the lag view -------------------------------------------------------
def backlog_sensor(project: Project, jobs: dict[str, Any], translator: OctoTranslator,
                   status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    """A catch-up run for tables whose inputs have new data, plus lag observations."""
    group_of = {t.name: translator.get_table_group_name(t) for t in project.order()}

    @dg.sensor(name=SENSOR_NAME, jobs=list(jobs.values()),
               minimum_interval_seconds=SENSOR_INTERVAL_S,
               default_status=status,
               description="Starts a catch-up run of the streaming tables whose inputs have "
                           "new data (and of the tables downstream of them); records the "
                           "input waiting per table as asset observations.")
    def _sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource):
        busy = {g for g in set(group_of.values())
                if _running(context.instance, f"continuous_{g}")}
        return evaluate_backlog(project, context, warehouse, translator,
                                busy={t for t, g in group_of.items() if g in busy})

    return _sensor


def evaluate_backlog(project: Project, context: dg.SensorEvaluationContext,
                     warehouse: WarehouseResource, translator: OctoTranslator,
                     busy: set[str] = frozenset()) -> dg.SensorResult:
    """``busy``: tables a continuous run is running (they pick up their input themselves;
    the sensor looks at them again once that run has stopped). One run request per group
    (its ``catch_up_<group>`` job), upstream groups first."""
    from octo_platform.runtime.recompute import downstream_of
    from octo_platform.runtime.status import table_status

    options = warehouse.options(project.root)
    cursor = json.loads(context.cursor) if context.cursor else {}
    seen: dict[str, str] = cursor.get("seen", {})  # signatures last observed
    requested: dict[str, str] = cursor.get("requested", {})  # signatures a run was asked for
    observed: dict[str, float] = cursor.get("observed", {})
    now = time.time()
    new, events, waiting = [], [], {}
    for t in project.order():
        status = table_status(project, t.name, options=options)
        signature = json.dumps([status.last_batch, sorted(status.backlog.items())])
        if t.name in busy:
            requested.pop(t.name, None)  # looked at again once the continuous run stops
        else:
            if status.waiting:
                waiting[t.name] = status.waiting
                if requested.get(t.name) != signature:
                    new.append(t.name)
            requested[t.name] = signature
        changed, seen[t.name] = seen.get(t.name) != signature, signature
        if changed or now - observed.get(t.name, 0) >= OBSERVE_EVERY_S:
            observed[t.name] = now
            events.append(observation(translator.get_asset_key(t.name), status, now))
    cursor_out = json.dumps({"seen": seen, "requested": requested, "observed": observed},
                            sort_keys=True)
    if not new:
        reason = (f"input waiting for {', '.join(sorted(waiting))}, already requested"
                  if waiting else "no input waiting")
        if busy:
            reason += f"; running continuously: {', '.join(sorted(busy))}"
        return dg.SensorResult(skip_reason=reason, cursor=cursor_out, asset_events=events)
    by_group: dict[str, list[str]] = {}
    for name in downstream_of(project, new, skip=busy):
        group = translator.get_table_group_name(project.table(name))
        by_group.setdefault(group, []).append(name)
    key = ";".join(f"{n}={seen[n]}" for n in new)
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"{group}:{key}", job_name=f"catch_up_{group}",
                                    asset_selection=[translator.get_asset_key(n) for n in names],
                                    tags={"octo/trigger": "backlog",
                                          "octo/waiting": ",".join(new)})
                      for group, names in by_group.items()],
        cursor=cursor_out, asset_events=events)


def observation(key: dg.AssetKey, status, now: float) -> dg.AssetObservation:
    """The lag of one table: input waiting, batches, age of the last commit."""
    age = None if status.last_commit_ms is None else round(now - status.last_commit_ms / 1000, 1)
    meta: dict[str, Any] = {
        **backlog_metadata(status),
        **watermark_metadata(status),
        "last_batch": status.last_batch,
        "last_commit_age_s": age if age is not None else dg.MetadataValue.null(),
        "pending_batch": status.pending_batch if status.pending_batch is not None
        else dg.MetadataValue.null(),
    }
    if status.last_commit_ms is not None:
        meta["last_commit"] = dg.MetadataValue.timestamp(status.last_commit_ms / 1000)
    return dg.AssetObservation(asset_key=key, metadata=meta)

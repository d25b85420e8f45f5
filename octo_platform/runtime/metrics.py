"""How a batch measures itself without extra Spark jobs: observed metrics (they arrive with
the job that reads the observed rows) and a count of the Spark jobs it ran."""
from __future__ import annotations

import functools
import threading
import uuid
from typing import TYPE_CHECKING, Any

from octo_platform.sqltext import sql_expr

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["JobCounter", "observe", "metrics", "observed_metrics", "unread", "read_observed"]


class JobCounter:
    """Counts the Spark jobs this thread starts (through a job group) until ``stop``."""

    def __init__(self, spark: SparkSession, what: str) -> None:
        self.sc = spark.sparkContext
        self.group = f"{what} {uuid.uuid4().hex[:8]}"
        self.sc.setJobGroup(self.group, what)

    def stop(self) -> int:
        jobs = len(self.sc.statusTracker().getJobIdsForGroup(self.group))
        self.sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
        return jobs


def observe(df: DataFrame, *exprs: str) -> tuple[DataFrame, Any]:
    from pyspark.sql import Observation

    obs = Observation()
    return df.observe(obs, *[sql_expr(e) for e in exprs]), obs


def metrics(observation: Any, known: dict[str, dict[str, Any]] | None = None,
            timeout: float = 5.0) -> dict[str, Any] | None:
    """An observation's metrics: from ``known`` (``observed_metrics`` of the job that read
    it), else as Spark's listener delivers them, or None if no job has produced them within
    ``timeout`` (``Observation.get`` itself would wait forever)."""
    got = (known or {}).get(observation._jo.name()) if observation._jo is not None else None
    if got is not None:
        return got
    got = {}
    waiter = threading.Thread(target=lambda: got.update(observation.get), daemon=True)
    waiter.start()
    waiter.join(timeout)
    return got or None


def observed_metrics(df: DataFrame) -> dict[str, dict[str, Any]]:
    """After an action on ``df``: the metrics of the observations its plan computed, by
    name, read from the finished query. ``Observation.get`` has them once Spark's listener
    bus delivers them, which on a busy machine lags the job by tens of milliseconds."""
    out = {}
    found = df._jdf.queryExecution().observedMetrics().iterator()
    while found.hasNext():
        pair = found.next()
        row = pair._2()
        out[pair._1()] = {f: row.get(i) for i, f in enumerate(row.schema().fieldNames())}
    return out


def unread(df: DataFrame) -> DataFrame:
    """``df`` read to its end, no row kept: a leg of a job that must read an observed frame
    (so that it reports its metrics). Spark can neither fold the condition away nor push
    it below the observation."""
    return df.where("spark_partition_id() < 0")


def read_observed(frames: list[DataFrame]) -> dict[str, dict[str, Any]]:
    """One job that reads ``frames`` (observed ones): their metrics (``observed_metrics``)."""
    if not frames:
        return {}
    job = functools.reduce(lambda a, b: a.unionByName(b),
                           [unread(f).selectExpr("1 AS x") for f in frames])
    job.collect()
    return observed_metrics(job)

"""Typed, lazy Dagster resources: where Spark runs and where the warehouse lives.

Both are plain configuration until used: ``SparkResource`` (dagster-pyspark's resource)
starts (or joins) a SparkSession on first use, so loading the code location never starts a
JVM.
Environments pick their values once, in ``orchestration/definitions.py``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import dagster as dg
from dagster_pyspark import PySparkResource
from pydantic import Field

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from octo_platform.runtime.options import RunOptions

__all__ = ["SparkResource", "WarehouseResource"]


class SparkResource(PySparkResource):
    """dagster-pyspark's ``PySparkResource``, its session built on first use through
    ``octo_platform.runtime.session`` (octo's defaults, Delta Lake included).

    Settings, weakest first: octo's defaults (the driver JVM's options among them:
    ``class_archive.driver_defaults``), ``$SPARK_CONF_DIR/spark-defaults.conf`` of the
    process that builds the session (the run worker), then ``spark_config`` (the parent
    resource's field), ``conf`` and ``master`` — the same order as ``octo run --conf``. The
    session is started lazily (``get_session()``, or the parent's ``spark_session`` and
    ``spark_context``), not when a run sets its resources up, so a step that needs no Spark
    starts no JVM. If a session already runs in this process (a test's, a notebook's), it
    is the one used: Spark has one session per JVM, and ``spark_session`` gets or creates it.
    """

    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Spark settings as PySparkResource takes them; beaten by conf")
    master: Optional[str] = Field(
        default=None, description="Spark master URL (default: spark.master of "
        "spark-defaults.conf, else local[2])")
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Spark settings; they beat spark-defaults.conf, which beats octo's "
        "defaults (e.g. spark.driver.memory)")
    reads: list[str] = Field(
        default_factory=list,
        description="where the session reads: the warehouse and the sources when they are "
        "URIs (one in S3, s3://..., adds Hadoop's S3A connector, set up from the AWS_* "
        "environment variables as delta-rs is)")
    quick_start: bool = Field(
        default=False,
        description="the driver's JVM tuned for runs of seconds to minutes (the JIT's first "
        "tier, the serial collector; octo defaults, so spark.driver.extraJavaOptions in "
        "spark-defaults.conf or conf replaces them). The driver maps octo's class archive "
        "either way, unless those options are set")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        pass  # lazy: the JVM starts on first use

    def settings(self) -> dict[str, str]:
        """The resource's Spark settings: ``spark_config``, then ``conf`` over it."""
        return {**{k: str(v) for k, v in self.spark_config.items()}, **self.conf}

    def get_session(self) -> SparkSession:
        if self._spark_session is None:
            from octo_platform.runtime.class_archive import driver_defaults
            from octo_platform.runtime.session import spark_session

            conf = self.settings()
            self._spark_session = spark_session(
                master=self.master, conf=conf, uris=self.reads,
                defaults=driver_defaults(conf, quick=self.quick_start))
        return self._spark_session

    @property
    def spark_session(self) -> SparkSession:
        return self.get_session()

    @property
    def spark_context(self) -> Any:
        return self.get_session().sparkContext


class WarehouseResource(dg.ConfigurableResource):
    """Where the changelogs, current state and operator state of a project live."""

    path: Optional[str] = Field(
        default=None,
        description="warehouse directory or URI (s3://...); default <project>/warehouse")
    storage_options: dict[str, str] = Field(
        default_factory=dict, description="delta-rs storage options (object-store credentials)")
    driver_rows: Optional[int] = Field(
        default=None,
        description="batches of at most this many input rows run in the driver with no Spark "
                    "job (0: never); default the runtime's (1,000,000), as "
                    "`octo run --driver-rows`")
    driver_state_rows: Optional[int] = Field(
        default=None,
        description="a table's batches run in the driver (driver_rows) only while the state "
                    "they would hold there (operator state and current-state rows) is at most "
                    "this many rows; default the runtime's (an eighth of the machine's "
                    "memory at 150 bytes a row), as "
                    "`octo run --driver-state-rows`")

    def location(self, project_root: str | Path) -> str:
        """The resolved warehouse for a project: absolute path or URI."""
        from octo_platform.runtime.options import resolve_warehouse

        return resolve_warehouse(Path(project_root), self.path)

    def options(self, project_root: str | Path,
                progress: Callable[[str], None] | None = None) -> RunOptions:
        """The runtime's options for a project: this warehouse, on the default edges
        (delta-rs with ``storage_options``, the built-in connectors)."""
        from octo_platform.wiring import default_options

        extra = {k: v for k, v in (("driver_rows", self.driver_rows),
                                   ("driver_state_rows", self.driver_state_rows))
                 if v is not None}
        return default_options(warehouse=self.location(project_root),
                               storage_options=self.storage_options or None, progress=progress,
                               **extra)

"""The one place that builds a SparkSession."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark_session", "DEFAULT_CONF", "QUICK_START_CONF"]

DEFAULT_CONF = {
    # Small local machines: 200 shuffle partitions made stateful batches ~16x slower.
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # A bad value in one row must not fail the whole pipeline: casts yield NULL, not errors.
    "spark.sql.ansi.enabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Stopping a query waits this long for its thread, then fails instead of hanging.
    "spark.sql.streaming.stopTimeout": "60s",
}

# For short runs (demo, tests): the JIT's second tier costs more CPU than it saves when a run
# lasts seconds; measured on the demo, CPU time fell from ~224 s to ~124 s. Long-running
# streaming jobs should keep the default JIT.
QUICK_START_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def spark_session(*, master: str | None = None, conf: dict[str, str] | None = None,
                  app_name: str = "octo") -> SparkSession:
    """Get or create the session: ``local[2]`` unless ``master`` says otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master or "local[2]")
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")  # octo reports failures itself
    return spark

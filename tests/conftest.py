"""One local SparkSession for the whole test run (a cold start costs ~7 s)."""
from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    from octo_platform.runtime.session import QUICK_START_CONF, spark_session

    session = spark_session(conf={**QUICK_START_CONF, "spark.driver.memory": "2g"})
    yield session
    session.stop()

"""One local SparkSession for the whole test run (a cold start costs ~7 s)."""
from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    from octo_platform.runtime.session import spark_session

    session = spark_session(conf={"spark.driver.memory": "2g"})
    yield session
    session.stop()

"""One local SparkSession for the whole test run (a cold start costs ~7 s)."""
from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    from octo_platform.runtime.session import spark_session

    # Not QUICK_START_CONF (C1 only, serial GC: a faster start for a short demo): the suite
    # runs some 1,000 batches in this session, where C2's code wins (test_oracle_joins alone:
    # 305 s with it, 249 s without).
    session = spark_session(conf={"spark.driver.memory": "2g"})
    yield session
    session.stop()

"""One local SparkSession for the whole test run (a cold start costs ~7 s)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def pytest_sessionstart(session):
    """Fetch Delta's jars once, before any test: pytest-xdist's workers would otherwise each
    start a session that resolves them through Spark's Ivy cache at the same time."""
    from octo_platform.runtime.session import delta_jars

    if hasattr(session.config, "workerinput") or "spark.jars" in delta_jars():
        return
    subprocess.run([sys.executable, "-c", "from octo_platform.runtime.session import "
                    "spark_session; spark_session().stop()"], check=True)


@pytest.fixture(scope="session")
def spark():
    from octo_platform.runtime.session import spark_session

    # Not QUICK_START_CONF (C1 only, serial GC: a faster start for a short demo): the suite
    # runs some 1,000 batches in this session, where C2's code wins (test_oracle_joins alone:
    # 305 s with it, 249 s without).
    session = spark_session(conf={"spark.driver.memory": "2g"})
    yield session
    session.stop()

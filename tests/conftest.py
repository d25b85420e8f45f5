"""One local SparkSession for the whole test run (a cold start costs ~7 s)."""
from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


# The tests' session (benchmarks/spark_fixed_costs.py measures Spark's floor in it too).
# Not QUICK_START_CONF (C1 only, serial GC: a faster start for a short demo): the suite
# runs some 1,000 batches in this session, where C2's code wins (test_oracle_joins alone:
# 305 s with it, 249 s without).
# Code generation off: the oracles force batches of a dozen rows onto the Spark path,
# and each new plan's Java code (Janino) and its JIT cost more than it saves on a dozen
# rows (`test_oracle_joins`' Spark-path project: 158.9 s with, 129.7 s without). Runs
# in their own process (`octo run`, the cluster test, the other benchmarks) keep Spark's
# default, as a production run's Spark path, which takes the large batches, does.
# The JIT compiles a method after 10x Java's default number of calls: on the suite's
# small Spark-path batches its compiler threads took 63.7 of the JVM's 110 CPU-s (one
# profile), compiling Spark's planning code, which runs a few times per plan
# (`test_oracle_joins[spark]` alone: 319 CPU-s with, 360-383 without; `test_oracle.py`
# and `test_windows.py`: 601 against 638; benchmarks/README).
# The parallel collector, not G1: this JVM only does throughput work, and G1's concurrent
# threads and write barriers cost it CPU (`test_oracle_joins[spark]` alone, in turn, 4
# runs each: the JVM's CPU 145.0, 145.0, 168.3, 160.0 s against 152.1, 177.5, 164.0,
# 163.6 s with G1; benchmarks/README).
SESSION_CONF = {"spark.driver.memory": "2g",
                "spark.driver.extraJavaOptions":
                    "-XX:CompileThresholdScaling=10 -XX:+UseParallelGC",
                "spark.sql.codegen.wholeStage": "false",
                "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


@pytest.fixture(scope="session")
def spark():
    from octo_platform.runtime.session import spark_session

    session = spark_session(conf=SESSION_CONF)
    yield session
    session.stop()

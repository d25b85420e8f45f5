"""The class archive short-lived JVMs share (``runtime/class_archive.py``): made once, in
place only when complete, used by a real ``octo run``."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from octo_platform.runtime import class_archive
from octo_platform.runtime.class_archive import (
    archive_path,
    driver_defaults,
    java_options,
    quick_start_conf,
)
from octo_platform.runtime.session import QUICK_START_CONF
from tests.oracle import write_lines
from tests.processes import archived_options, octo_run

BASE = QUICK_START_CONF["spark.driver.extraJavaOptions"]


def test_a_failed_training_leaves_no_archive(tmp_path):
    """A trainer whose JVM cannot start leaves neither an archive (a partial one would stop
    every later JVM) nor its lock; the JVM options stay as given."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    fails = "-Xshare:on -XX:SharedArchiveFile=/nonexistent.jsa"  # no JVM starts with these
    assert java_options(fails, env) == fails
    assert list((tmp_path / "octo").iterdir()) == []


def test_a_held_lock_means_another_process_is_training(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    path = archive_path(env)
    path.parent.mkdir(parents=True)
    path.with_name(f"{path.name}.lock").touch()
    assert java_options(BASE, env) == BASE  # not waited for, not trained twice
    assert not path.exists()


def test_short_runs_start_with_the_archive(tmp_path):
    """``quick_start_conf`` names this environment's archive (made now, or by the process
    making it), and an ``octo run`` whose JVM maps it runs its batch."""
    conf = archived_options(BASE)
    assert conf == quick_start_conf()["spark.driver.extraJavaOptions"]
    path = archive_path()
    assert f"-XX:SharedArchiveFile={path}" in conf and path.stat().st_size > 0
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(
        "CREATE SOURCE ev (k BIGINT, v BIGINT) WITH (connector = 'files', path = 'data/ev', "
        "format = 'json');\nCREATE STREAMING TABLE t AS SELECT k, SUM(v) AS s FROM ev "
        "GROUP BY k;\n")
    write_lines(tmp_path / "data" / "ev", "a.json", [json.dumps({"k": 1, "v": 2})])
    cmd = octo_run(tmp_path)
    assert conf in cmd[-1]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[t] batch 0: 1 rows in" in done.stdout


def test_driver_defaults_yield_to_the_options_a_user_sets(tmp_path, monkeypatch):
    """The driver's JVM options octo adds (the archive; with ``quick``, the first JIT tier
    and serial collector, else a JIT that compiles later) are its defaults: options from
    ``conf`` or ``spark-defaults.conf`` replace them, no archive is made for nothing, and a
    session already running keeps its JVM's. (The archive itself: the tests above.)"""
    from pyspark import SparkContext

    key = "spark.driver.extraJavaOptions"
    made = []
    monkeypatch.setattr(class_archive, "java_options",
                        lambda base: made.append(base) or f"{base} -XX:SharedArchiveFile=a.jsa")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    assert driver_defaults({}, quick=True) == {key: f"{BASE} -XX:SharedArchiveFile=a.jsa"}
    assert driver_defaults({"spark.driver.memory": "1g"}) == {
        key: "-XX:CompileThresholdScaling=10 -XX:SharedArchiveFile=a.jsa"}
    assert len(made) == 2
    assert driver_defaults({key: "-Da=1"}, quick=True) == {}
    (tmp_path / "spark-defaults.conf").write_text(f"{key} -Db=2\n")
    assert driver_defaults({}, quick=True) == {}
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.memory 1g\n")
    assert driver_defaults({}) != {}
    monkeypatch.setattr(SparkContext, "_active_spark_context", object())
    assert driver_defaults({}, quick=True) == {}
    assert len(made) == 3


@pytest.mark.parametrize("quick", [True, False])
def test_the_dagster_resource_passes_its_defaults_to_the_session(monkeypatch, quick):
    """``SparkResource``'s session gets ``driver_defaults`` of its settings as octo's
    defaults (beaten by spark-defaults.conf and the resource's conf), not as its conf."""
    from orchestration.resources import SparkResource

    seen = {}
    monkeypatch.setattr(class_archive, "driver_defaults",
                        lambda conf, quick: {"asked": (dict(conf), quick)})
    monkeypatch.setattr("octo_platform.runtime.session.spark_session",
                        lambda **kw: seen.update(kw) or "session")
    resource = SparkResource(master="local[1]", conf={"spark.a": "1"}, quick_start=quick)
    assert resource.get_session() == "session"
    assert seen == {"master": "local[1]", "conf": {"spark.a": "1"}, "uris": [],
                    "defaults": {"asked": ({"spark.a": "1"}, quick)}}

"""The class archive short-lived JVMs share (``runtime/class_archive.py``): made once, in
place only when complete, used by a real ``octo run``."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from octo_platform.runtime.class_archive import archive_path, java_options, quick_start_conf
from octo_platform.runtime.session import QUICK_START_CONF
from tests.oracle import write_lines
from tests.processes import octo_run

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
    """``quick_start_conf`` names this environment's archive (made now if the suite has not
    yet), and an ``octo run`` whose JVM maps it runs its batch."""
    conf = quick_start_conf()["spark.driver.extraJavaOptions"]
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

"""The `octo` command: exit codes, errors before any write, progress lines, clean Ctrl-C, and
Spark settings from ``--conf`` and ``$SPARK_CONF_DIR/spark-defaults.conf``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octo_platform.cli import main
from octo_platform.runtime.session import session_conf, spark_defaults_file, spark_defaults_keys
from tests.processes import archived_options

# Waits on other processes most of the time: runs beside the rest (tests/suite.py).
pytestmark = pytest.mark.processes

SQL = """CREATE SOURCE bids (auction BIGINT, price BIGINT)
WITH (connector = 'files', path = 'data/bids', format = 'json');
CREATE STREAMING TABLE stats AS SELECT auction, COUNT(*) AS n, MAX(price) AS top
FROM bids GROUP BY auction;
"""


def octo(*args: str, cwd: Path, env_extra: dict[str, str] | None = None,
         **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "octo_platform.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, **kw)


def project(tmp_path: Path, sql: str = SQL) -> Path:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "p.sql").write_text(sql)
    data = tmp_path / "data" / "bids"
    data.mkdir(parents=True)
    rows = [{"auction": i % 3, "price": i} for i in range(10)]
    (data / "a.json").write_text("\n".join(map(json.dumps, rows)) + "\n{broken\n")
    return tmp_path


def test_bad_sql_fails_before_anything_is_written(tmp_path):
    root = project(tmp_path, SQL.replace("MAX(price)", "MAX(prize)"))
    res = octo("run", "--all", "--until-idle", cwd=root)
    assert res.returncode == 2
    assert "sql/p.sql:3:" in res.stderr and "unknown column 'prize'" in res.stderr
    assert not (root / "warehouse").exists()


def test_check_checks_every_table_and_runs_nothing(spark, tmp_path, capsys, monkeypatch):
    """``octo check`` (in this process, on the tests' session: a JVM of its own took ~30 s
    beside the suite): ``ok`` and exit 0 for a right project; a type error fails it (exit
    2) at the call, with Spark's message and no plan; nothing is written either way."""
    from octo_platform import cli

    monkeypatch.setattr(cli, "_session", lambda args, project: spark)
    root = project(tmp_path)
    assert main(["check", "--project", str(root)]) == 0
    assert capsys.readouterr().out.strip() == "ok: 1 streaming table(s), 1 source(s), 0 sink(s)"
    sql = SQL.replace("MAX(price)", "MAX(size(price))")
    (root / "sql" / "p.sql").write_text(sql)
    assert main(["check", "--project", str(root)]) == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("octo: error:"))
    col = sql.splitlines()[2].index("size(") + 1
    assert line.startswith(f"octo: error: sql/p.sql:3:{col}: streaming table stats: "
                           "[DATATYPE_MISMATCH"), err
    assert '"size(price)"' in line and "\n'Project" not in err
    assert not (root / "warehouse").exists()


def test_a_batch_too_large_for_the_driver_to_collect_runs_on_the_spark_path(tmp_path):
    """A batch under ``--driver-rows`` whose parsed rows outgrow
    ``spark.driver.maxResultSize`` is run by the Spark path at once: no failed attempt."""
    root = project(tmp_path)
    rows = [{"auction": i % 7, "price": i, "note": "x" * 500} for i in range(4000)]
    (root / "data" / "bids" / "b.json").write_text("\n".join(map(json.dumps, rows)) + "\n")
    res = octo("run", "--all", "--until-idle", "--conf", "spark.driver.maxResultSize=1m",
               cwd=root)
    assert res.returncode == 0, res.stderr
    assert "failed" not in res.stdout + res.stderr, res.stdout + res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("[stats] batch 0"))
    assert "4010 rows in" in line and "c=7" in line and line.endswith("spark path"), line


def test_unknown_table_and_usage(tmp_path):
    root = project(tmp_path)
    res = octo("run", "nope", "--until-idle", cwd=root)
    assert res.returncode == 2 and "unknown streaming table 'nope'" in res.stderr
    assert octo("run", "--until-idle", cwd=root).returncode == 2
    res = octo("explain", "stats", cwd=root)
    assert res.returncode == 0 and "HashAggregate" in res.stdout
    res = octo("run", "--all", "--until-idle", "--conf", "spark.sql.shuffle.partitions",
               cwd=root)
    assert res.returncode == 2 and "argument --conf: expected KEY=VALUE" in res.stderr
    assert "got 'spark.sql.shuffle.partitions'" in res.stderr
    assert not (root / "warehouse").exists()
    for argv in (["backfill", "stats"], ["refresh", "stats"]):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--conf", "=1"])  # fails while parsing, before Spark starts
        assert exit_.value.code == 2


def test_spark_defaults_keys_are_left_to_the_file(tmp_path):
    """Octo passes a default only for keys spark-defaults.conf does not set (anything given to
    the session builder would beat the file); explicit settings beat both."""
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\n! comment\nspark.master  spark://10.0.0.1:7077\n"
        "spark.sql.shuffle.partitions=16\nspark.driver.memory:8g\n"
        "spark.executor.extraJavaOptions -Da=1 \\\n  spark.ui.enabled false\n")
    environ = {"SPARK_CONF_DIR": str(tmp_path)}
    assert spark_defaults_file(environ) == tmp_path / "spark-defaults.conf"
    assert spark_defaults_keys(tmp_path / "spark-defaults.conf") == {
        "spark.master", "spark.sql.shuffle.partitions", "spark.driver.memory",
        "spark.executor.extraJavaOptions"}  # the continued line is part of a value
    conf = session_conf(environ=environ, conf={"spark.driver.memory": "2g"})
    assert "spark.master" not in conf and "spark.sql.shuffle.partitions" not in conf
    assert conf["spark.driver.memory"] == "2g" and conf["spark.ui.enabled"] == "false"
    assert session_conf(master="spark://h:1", environ=environ)["spark.master"] == "spark://h:1"
    # a caller's defaults are octo's: the file and ``conf`` beat them
    ours = {"spark.driver.memory": "8g", "spark.driver.extraJavaOptions": "-Da=2"}
    assert session_conf(environ=environ, defaults=ours) == {
        **session_conf(environ=environ), "spark.driver.extraJavaOptions": "-Da=2"}
    assert session_conf(environ=environ, defaults=ours, conf={
        "spark.driver.extraJavaOptions": "-Db=3"})["spark.driver.extraJavaOptions"] == "-Db=3"
    assert session_conf(environ={"SPARK_CONF_DIR": str(tmp_path / "none")})["spark.master"] \
        == "local[2]"


def spark_properties(events: Path) -> tuple[dict[str, str], list[int]]:
    """From a Spark event log: the conf the running SparkContext reported, and the partition
    count of every shuffle a stage read (one per shuffle partition; a stage may coalesce
    them into fewer tasks, as the batch's write job does)."""
    logs = list(events.iterdir())
    assert len(logs) == 1, logs
    props, tasks = {}, []
    for line in logs[0].read_text().splitlines():
        event = json.loads(line)
        if event["Event"] == "SparkListenerEnvironmentUpdate":
            props = dict(event["Spark Properties"])
        elif event["Event"] == "SparkListenerStageCompleted":
            tasks += [rdd["Number of Partitions"] for rdd in event["Stage Info"]["RDD Info"]
                      if rdd["Name"] == "ShuffledRowRDD"]
    return props, tasks


def test_run_until_idle_with_spark_conf_then_continuous_with_ctrl_c(tmp_path):
    root = project(tmp_path)
    # Spark settings, weakest first: octo's defaults < spark-defaults.conf < --conf. The proof
    # is what the session's SparkContext itself wrote: an event log (which exists only if the
    # file reached the JVM) with its properties and how many tasks its shuffles ran.
    conf_dir, events = tmp_path / "spark-conf", tmp_path / "events"
    conf_dir.mkdir()
    events.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"# read by Spark's launcher\nspark.eventLog.enabled  true\n"
        f"spark.eventLog.dir  {events.as_uri()}\n"
        "spark.eventLog.rolling.enabled false\nspark.eventLog.compress false\n"
        "spark.sql.shuffle.partitions=3\nspark.driver.maxResultSize 5m\n")
    # --driver-rows 0: the batch runs as Spark jobs (a small one would run in the driver,
    # with no shuffle to show the setting). The driver's JVM maps the class archive (made
    # now if the suite has not made it yet): no --conf or file sets its options.
    archive = archived_options()
    res = octo("run", "--all", "--until-idle", "--project", str(root), "--driver-rows", "0",
               "--conf", "spark.driver.maxResultSize=1m", "--conf", "spark.octo.probe=a=b",
               cwd=tmp_path.parent, env_extra={"SPARK_CONF_DIR": str(conf_dir)})
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("[stats] batch 0"))
    assert "10 rows in" in line and "c=3" in line and "1 dead letters" in line
    assert "done: 1 batch(es), 1 dead letter(s)" in res.stdout
    props, tasks = spark_properties(events)
    assert props["spark.sql.shuffle.partitions"] == "3"  # the file beats octo's default 2
    assert props["spark.driver.maxResultSize"] == "1m"  # --conf beats the file
    assert props["spark.octo.probe"] == "a=b"
    assert props["spark.ui.enabled"] == "false"  # octo's defaults fill in the rest
    assert props["spark.master"] == "local[2]"
    assert "-XX:SharedArchiveFile=" in archive
    assert props["spark.driver.extraJavaOptions"].endswith(archive.strip())  # after Spark's
    # and the shuffles follow spark.sql.shuffle.partitions: 3 partitions, none octo's 2
    assert 3 in tasks and 2 not in tasks, tasks

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    # --driver-state-rows 5: batch 0's state (3 keys, 3 current rows) is more than the
    # driver may hold, so the one-row batch 1 runs as Spark jobs, and the run says why once
    proc = subprocess.Popen([sys.executable, "-m", "octo_platform.cli", "run", "stats",
                             "--driver-state-rows", "5"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 240  # a bound, not a timing (a busy machine is slow)
        seen = ""
        while time.monotonic() < deadline and "[stats] streaming: " not in seen:
            seen += proc.stdout.readline()  # the session is up and its query polls
        assert "[stats] streaming: new input is looked for every 1 second" in seen, seen
        (root / "data" / "bids" / "b.json").write_text('{"auction": 7, "price": 1}\n')
        while time.monotonic() < deadline:
            seen += proc.stdout.readline()
            if "[stats] batch 1" in seen:
                break
        assert "[stats] batch 1: 1 rows in, events c=1" in seen, seen[-3000:]
        batch_1 = next(ln for ln in seen.splitlines() if ln.startswith("[stats] batch 1"))
        assert batch_1.endswith("spark path"), batch_1
        assert seen.count("more than the driver holds (driver_state_rows 5): its batches "
                          "run as Spark jobs") == 1, seen
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, seen + out
    assert "interrupted: stopping" in out


def test_the_cli_leaves_a_spark_error_to_its_own_line(spark, tmp_path, capfd):
    """PySpark logs each error of a SQL expression it raises as a JSON line with the Java
    stack trace (~10 KB) before octo's one line naming the table: the CLI's commands that
    run Spark turn those logs off."""
    from pyspark.errors import AnalysisException
    from pyspark.logger import PySparkLogger

    names = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
    for name in names:  # as in a fresh process
        PySparkLogger.getLogger(name).disabled = False
    assert main(["run", "--all", "--project", str(tmp_path)]) == 2  # no sql/: before Spark
    capfd.readouterr()
    with pytest.raises(AnalysisException):
        spark.sql("SELECT octo_no_such_function(1)").collect()
    assert "QueryContextLogger" not in capfd.readouterr().err
    assert all(PySparkLogger.getLogger(name).disabled for name in names)

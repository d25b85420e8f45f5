"""The `octo` command: exit codes, errors before any write, progress lines, clean Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SQL = """CREATE SOURCE bids (auction BIGINT, price BIGINT)
WITH (connector = 'files', path = 'data/bids', format = 'json');
CREATE STREAMING TABLE stats AS SELECT auction, COUNT(*) AS n, MAX(price) AS top
FROM bids GROUP BY auction;
"""


def octo(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
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


def test_unknown_table_and_usage(tmp_path):
    root = project(tmp_path)
    res = octo("run", "nope", "--until-idle", cwd=root)
    assert res.returncode == 2 and "unknown streaming table 'nope'" in res.stderr
    assert octo("run", "--until-idle", cwd=root).returncode == 2
    res = octo("explain", "stats", cwd=root)
    assert res.returncode == 0 and "HashAggregate" in res.stdout


def test_run_until_idle_then_continuous_with_ctrl_c(tmp_path):
    root = project(tmp_path)
    res = octo("run", "--all", "--until-idle", "--project", str(root), cwd=tmp_path.parent)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("[stats] batch 0"))
    assert "10 rows in" in line and "c=3" in line and "1 dead letters" in line
    assert "done: 1 batch(es), 1 dead letter(s)" in res.stdout

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen([sys.executable, "-m", "octo_platform.cli", "run", "stats"],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        time.sleep(12)  # session up and polling
        (root / "data" / "bids" / "b.json").write_text('{"auction": 7, "price": 1}\n')
        deadline = time.monotonic() + 90
        seen = ""
        while time.monotonic() < deadline:
            seen += proc.stdout.readline()
            if "[stats] batch 1" in seen:
                break
        assert "[stats] batch 1: 1 rows in, events c=1" in seen
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, seen + out
    assert "interrupted: stopping" in out

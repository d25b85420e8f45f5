"""The files connector: every format, bad records to dead letters, good rows go on."""
from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from octo_platform.runtime import inputs
from octo_platform.runtime.metrics import metrics
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import current

SQL = """
CREATE SOURCE j (id BIGINT, name STRING, amount DOUBLE)
  WITH (connector = 'files', path = 'data/j', format = 'json');
CREATE SOURCE c (id BIGINT, name STRING, amount DOUBLE)
  WITH (connector = 'files', path = 'data/c', format = 'csv');
CREATE SOURCE p (id BIGINT, name STRING, amount DOUBLE)
  WITH (connector = 'files', path = 'data/p', format = 'parquet');
CREATE SOURCE d (id BIGINT, name STRING, amount DOUBLE)
  WITH (connector = 'files', path = 'data/d', format = 'debezium-json', primary_key = 'id');
CREATE STREAMING TABLE all_rows AS
  SELECT 'j' AS src, id, name, amount FROM j
  UNION ALL SELECT 'c', id, name, amount FROM c
  UNION ALL SELECT 'p', id, name, amount FROM p
  UNION ALL SELECT 'd', id, name, amount FROM d;
CREATE STREAMING TABLE cdc_rows AS SELECT id, name, amount FROM d;
"""


@pytest.mark.parametrize("driver_rows", [None, 0], ids=["default", "spark"])
def test_formats_and_dead_letters(spark, tmp_path, monkeypatch, driver_rows):
    # Each input's counts come with the job that reads it (observed, and read from that
    # job's query, not waited for from Spark's listener), never from a job of their own
    # after waiting for metrics that do not come: on the Spark path, and where the driver
    # path reads CSV with Spark.
    missed = []

    def observed(observation, known=None, timeout: float = 5.0):
        if observation._jo.name() not in (known or {}):
            missed.append(observation)
        return metrics(observation, known, timeout)
    monkeypatch.setattr(inputs, "metrics", observed)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "s.sql").write_text(SQL)
    for sub in "jcpd":
        (tmp_path / "data" / sub).mkdir(parents=True)
    (tmp_path / "data/j/1.json").write_text(
        '{"id": 1, "name": "a", "amount": 1.5}\n'
        '{"id": "x", "name": "b", "amount": 2}\n'      # wrong type
        '{"id": 3, "name": "c"\n'                      # malformed
        '\n'                                           # blank lines are skipped
        '{"id": 4, "name": null, "amount": null}\n')
    (tmp_path / "data/c/1.csv").write_text("id,name,amount\n1,a,1.5\nzz,b,2\n3,c\n4,d,4.0\n")
    pq.write_table(pa.table({"id": ["1", "oops", "3"], "name": ["a", "b", "c"],
                             "amount": [1.0, 2.0, 3.0]}), tmp_path / "data/p/1.parquet")
    events = [
        {"before": None, "after": {"id": 1, "name": "a", "amount": 1.0}, "op": "r"},
        {"payload": {"before": None, "after": {"id": 2, "name": "b", "amount": 2.0},
                     "op": "c"}},
        {"before": {"id": 1, "name": "a", "amount": 1.0},
         "after": {"id": 1, "name": "a2", "amount": 1.5}, "op": "u"},
        {"before": {"id": 2, "name": "b", "amount": 2.0}, "after": None, "op": "d"},
        {"before": None, "after": {"id": 5, "name": "e", "amount": 5.0}, "op": "u"},
        {"before": None, "after": None, "op": "d"},
        {"before": None, "after": {"id": 6}, "op": "t"},
        {"payload": {"before": None, "after": {"id": "x", "name": "f", "amount": 6.0},
                     "op": "c"}},
    ]
    (tmp_path / "data/d/1.json").write_text("\n".join(json.dumps(e) for e in events) + "\n")

    options = default_options(progress=None, **({} if driver_rows is None else
                                                {"driver_rows": driver_rows}))
    report = run_tables(spark, tmp_path, options=options, until_idle=True)
    assert report.dead_letters == 2 + 2 + 1 + 4 + 4  # j, c, p, d; d feeds two tables
    assert not missed, f"{len(missed)} inputs' counts did not come with their job"

    got = current(tmp_path / "warehouse", "all_rows")
    assert got == Counter({("j", 1, "a", 1.5): 1, ("j", 4, None, None): 1,
                           ("c", 1, "a", 1.5): 1, ("c", 4, "d", 4.0): 1,
                           ("p", 1, "a", 1.0): 1, ("p", 3, "c", 3.0): 1,
                           ("d", 1, "a2", 1.5): 1})
    dead = DeltaTable(str(tmp_path / "warehouse/_dead_letters/all_rows")).to_pyarrow_table()
    reasons = Counter(zip(dead.column("source").to_pylist(), dead.column("reason").to_pylist()))
    assert reasons[("j", "malformed JSON")] == 1
    assert reasons[("j", "column id: value does not match BIGINT")] == 1
    assert reasons[("c", "column id: value does not match BIGINT")] == 1
    assert reasons[("c", "malformed CSV line or a value of the wrong type")] == 1  # too few
    assert reasons[("p", "column id: value does not fit BIGINT")] == 1
    assert reasons[("d", "missing before image for op=u")] == 1
    assert reasons[("d", "missing before image for op=d")] == 1
    assert reasons[("d", "unsupported op t")] == 1
    assert reasons[("d", "column after.id: value does not match BIGINT")] == 1, reasons
    assert all(f.startswith("file:") for f in dead.column("source_file").to_pylist())
    assert set(dead.column("batch_id").to_pylist()) == {0}

    # the Debezium source's key makes its update a `u` event downstream
    log = DeltaTable(str(tmp_path / "warehouse/cdc_rows")).to_pyarrow_table().to_pylist()
    assert sorted(e["op"] for e in log) == ["c"]  # r, c, u, d consolidate to one row
    assert log[0]["after"] == {"id": 1, "name": "a2", "amount": 1.5}


PARQUET_SQL = """
CREATE SOURCE p (id BIGINT, name STRING, amount DOUBLE, ts TIMESTAMP)
  WITH (connector = 'files', path = 'data/p', format = 'parquet', max_files_per_batch = '1');
CREATE STREAMING TABLE per_name AS SELECT name, COUNT(*) AS n, SUM(amount) AS total,
  MAX(ts) AS last FROM p GROUP BY name;
CREATE STREAMING TABLE pairs AS SELECT a.id, b.id AS other FROM p a JOIN p b
  ON a.id = b.id + 1;
"""


def test_parquet_on_the_driver_path_equals_the_spark_path(spark, tmp_path):
    """Parquet files whose columns have their declared types are taken as they are on the
    driver path (no cast can change them), and counted from their footers on the Spark path
    (no record can be bad); a file with other types (id as INT, a name that is a number, a
    naive timestamp) is parsed by Spark's casts there: both runs leave the same tables,
    record counts and dead letters as the Spark path."""
    from datetime import datetime, timezone

    utc = pa.timestamp("us", tz="UTC")
    files = [
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "a"],
                  "amount": [1.0, 2.5, None], "ts": pa.array([1, 2, 3], utc)}),
        pa.table({"id": pa.array([4, 5], pa.int32()), "name": pa.array([7, 8], pa.int64()),
                  "amount": pa.array([4, 5], pa.int64()),
                  "ts": pa.array([datetime(2026, 1, 1), None], pa.timestamp("us"))}),
        pa.table({"id": pa.array([6, None], pa.int64()), "name": ["b", None],
                  "amount": [6.0, 7.0],
                  "ts": pa.array([datetime(2026, 2, 1, tzinfo=timezone.utc), None], utc)}),
    ]
    results = {}
    for path, rows in (("spark", 0), ("driver", 10**9)):
        root = tmp_path / path
        (root / "sql").mkdir(parents=True)
        (root / "sql" / "p.sql").write_text(PARQUET_SQL)
        (root / "data/p").mkdir(parents=True)
        for i, t in enumerate(files):
            pq.write_table(t, root / f"data/p/{i}.parquet")
        report = run_tables(spark, root, options=default_options(progress=None,
                                                                  driver_rows=rows),
                            until_idle=True)
        assert {b.path for b in report.batches} == {path}
        results[path] = {t: current(root / "warehouse", t) for t in ("per_name", "pairs")}
        # counted from the footers where no record can be bad (the Spark path), or read
        results[path]["rows_in"] = [(b.rows_in, b.dead_letters) for b in report.batches]
    assert results["driver"] == results["spark"]
    assert results["driver"]["pairs"] == Counter({(2, 1): 1, (3, 2): 1, (4, 3): 1,
                                                  (5, 4): 1, (6, 5): 1})


def test_a_batch_over_the_driver_bytes_runs_on_the_spark_path(spark, tmp_path, monkeypatch):
    """Under ``driver_rows`` but over ``DRIVER_BYTES`` of input (here lowered to 2 KB: a
    JSON file's size, a Parquet file's uncompressed row groups), a batch runs on the Spark
    path; the next small one on the driver path again."""
    import octo_platform.runtime.driver as driver

    monkeypatch.setattr(driver, "DRIVER_BYTES", 2000)
    root = tmp_path
    (root / "sql").mkdir()
    (root / "sql" / "t.sql").write_text(
        "CREATE SOURCE j (id BIGINT, name STRING) WITH (connector = 'files', path = 'data/j',"
        " format = 'json', max_files_per_batch = '1');\n"
        "CREATE SOURCE p (id BIGINT, name STRING) WITH (connector = 'files', path = 'data/p',"
        " format = 'parquet', max_files_per_batch = '1');\n"
        "CREATE STREAMING TABLE per_name AS SELECT name, COUNT(*) AS n FROM\n"
        "  (SELECT id, name FROM j UNION ALL SELECT id, name FROM p) GROUP BY name;\n")
    (root / "data/j").mkdir(parents=True)
    (root / "data/p").mkdir(parents=True)
    sizes = (3, 60, 2)  # rows a file: ~100 bytes, ~3 KB (JSON) / ~2.3 KB (Parquet), ~70
    for i, n in enumerate(sizes):
        rows = [{"id": k, "name": f"name-{k % 3}-" + "x" * 30} for k in range(n)]
        (root / f"data/j/{i}.json").write_text("\n".join(map(json.dumps, rows)) + "\n")
        pq.write_table(pa.Table.from_pylist(rows), root / f"data/p/{i}.parquet",
                       compression="zstd")
    assert (root / "data/j/1.json").stat().st_size > 2000
    said: list[str] = []
    report = run_tables(spark, root, options=default_options(progress=said.append),
                        until_idle=True)
    assert [b.path for b in report.batches] == ["driver", "spark", "driver"]
    # a long batch is announced before it runs (its line comes when it is committed)
    assert [m.split(":")[0] for m in said if m.startswith("[per_name] ")][:3] == [
        "[per_name] batch 0", "[per_name] running batch 1 as Spark jobs", "[per_name] batch 1"]
    assert sorted(n for _, n in current(root / "warehouse", "per_name")) == [42, 44, 44]


def test_a_source_whose_path_does_not_exist_is_named_and_read_once_it_does(spark, tmp_path):
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(
        "CREATE SOURCE j (id BIGINT) WITH (connector = 'files', path = 'data/j', "
        "format = 'json');\nCREATE STREAMING TABLE ids AS SELECT id FROM j;\n")
    said: list[str] = []
    report = run_tables(spark, tmp_path, options=default_options(progress=said.append))
    missing = f"source j: {tmp_path.resolve() / 'data' / 'j'} does not exist (yet)"
    assert [m for m in said if m.startswith(missing)] and not report.batches
    (tmp_path / "data" / "j").mkdir(parents=True)
    (tmp_path / "data" / "j" / "f.json").write_text('{"id": 1}\n')
    said.clear()
    report = run_tables(spark, tmp_path, options=default_options(progress=said.append))
    assert not [m for m in said if "does not exist" in m] and len(report.batches) == 1

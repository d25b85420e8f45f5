"""The Spark path's state kept on the machine that computed it (``operators/bucket_cache.py``):
a later run's tasks find the buckets an earlier run's tasks kept (GROUP BY state and the
current state), a bucket whose entry is gone is read from Delta, and the tables equal the
query run as a batch after every round either way. The GROUP BY's tasks write the table
themselves here (``runtime/colocated.py``): one Spark job, no exchange but the input's."""
from __future__ import annotations

import shutil

from octo_platform.runtime.operators import bucket_cache
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import RandomInput, check_tables, write_lines

SQL = """
CREATE SOURCE src ({ddl}) WITH (connector = 'files', path = 'data/src', format = 'debezium-json',
    primary_key = 'id');
CREATE STREAMING TABLE per_k AS SELECT k, COUNT(*) AS n, SUM(v) AS s, AVG(d) AS a
    FROM src GROUP BY k;
"""
BUCKETS = 4


def project(root, sql: str):
    """A project at ``root`` of ``sql``; the SQL and the project's warehouse."""
    (root / "sql").mkdir()
    (root / "sql" / "t.sql").write_text(sql)
    return sql, root / "warehouse"


def test_later_runs_map_the_buckets_earlier_runs_kept(spark, tmp_path):
    src = RandomInput(17, debezium=True)
    sql, warehouse = project(tmp_path, SQL.format(ddl=src.ddl()))
    seen = []
    for round_no in range(4):
        write_lines(tmp_path / "data" / "src", f"f{round_no}.json", src.lines(40))
        if round_no == 3:  # the machine lost its entries: the buckets are read from Delta
            state = sorted((warehouse / "_octo" / "per_k" / "state").iterdir())
            assert len(state) == 1  # the GROUP BY's (no value multiset)
            for path in [str(state[0]), str(warehouse / "_current" / "per_k")]:
                for b in range(BUCKETS):
                    where = bucket_cache._bucket_dir(path, b)
                    shutil.rmtree(where, ignore_errors=True)
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=BUCKETS, progress=None, driver_rows=0), until_idle=True)
        (batch,) = report.batches
        assert batch.path == "spark" and batch.spark_jobs == 1
        seen.append(batch.cached_buckets)
        check_tables(spark, warehouse, sql, {"src": src.relation()}, {"per_k": True}, round_no)
    assert seen[0] == (0, 0)  # nothing stored yet
    hits, lookups = seen[1]
    assert lookups > 0 and hits == lookups, seen  # every bucket the first run kept
    assert seen[2][0] == seen[2][1] > 0, seen
    assert seen[3][0] == 0 < seen[3][1], seen


def test_the_driver_paths_next_run_maps_what_the_last_run_held(spark, tmp_path, monkeypatch):
    """A run on the driver path keeps what it held at its end (each state table whole, each
    current-state bucket); the next run's first batch on the machine maps them instead of
    reading the state's files, and the tables still equal the batch query. An entry of
    other files (the machine lost its newest) is not taken: Delta is read."""
    from octo_platform.runtime import driver
    from octo_platform.runtime.operators import kernels

    src = RandomInput(18, debezium=True)
    sql, warehouse = project(tmp_path, SQL.format(ddl=src.ddl()))
    monkeypatch.setenv(bucket_cache.CACHE_ENV, str(tmp_path / "cache"))
    reads = []
    for name, module in (("_latest", kernels), ("read_bucket", driver)):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k:
                            reads.append(_name) or _real(*a, **k))
    for round_no in range(3):
        write_lines(tmp_path / "data" / "src", f"f{round_no}.json", src.lines(40))
        if round_no == 2:  # lost: the next run reads the state from Delta
            shutil.rmtree(tmp_path / "cache")
        reads.clear()
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=BUCKETS, progress=None), until_idle=True)
        assert [b.path for b in report.batches] == ["driver"]
        check_tables(spark, warehouse, sql, {"src": src.relation()}, {"per_k": True}, round_no)
        if round_no == 1:
            assert not reads, reads  # the state and every touched bucket were mapped
        elif round_no == 2:
            assert "_latest" in reads and "read_bucket" in reads, reads


JOIN_SQL = """
CREATE SOURCE a ({ddl}) WITH (connector = 'files', path = 'data/a', format = 'debezium-json',
    primary_key = 'id');
CREATE SOURCE b ({ddl}) WITH (connector = 'files', path = 'data/b', format = 'json');
CREATE STREAMING TABLE j AS SELECT a.id AS aid, b.id AS bid, a.v, b.g
    FROM a JOIN b ON a.k = b.k AND a.g = b.g;
CREATE STREAMING TABLE l AS SELECT a.id AS aid, b.id AS bid FROM a LEFT JOIN b ON a.k = b.k;
"""


def test_a_joins_tasks_find_their_keys_in_the_files_the_machine_kept(spark, tmp_path):
    """A join's Spark-path tasks keep each state file they read as an entry sorted by key
    hash, and later batches find their keys' rows there; lost entries are read again, and
    the tables equal the batch query after every round."""
    a, b = RandomInput(21, debezium=True), RandomInput(22, debezium=False)
    sql, warehouse = project(tmp_path, JOIN_SQL.format(ddl=a.ddl()))
    seen = []
    for round_no in range(4):
        write_lines(tmp_path / "data" / "a", f"f{round_no}.json", a.lines(40))
        write_lines(tmp_path / "data" / "b", f"f{round_no}.json", b.lines(40))
        if round_no == 3:  # the machine lost its entries (the tasks' processes keep the
            for table in "jl":  # environment they started with: the default directory)
                for path in [*(warehouse / "_octo" / table / "state").iterdir(),
                             warehouse / "_current" / table]:
                    for bucket in range(BUCKETS):
                        shutil.rmtree(bucket_cache._bucket_dir(str(path), bucket),
                                      ignore_errors=True)
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=BUCKETS, progress=None, driver_rows=0), until_idle=True)
        seen.append([batch.cached_buckets for batch in report.batches])
        check_tables(spark, warehouse, sql, {"a": a.relation(), "b": b.relation()},
                     {"j": False, "l": False}, round_no)
    for hits, lookups in seen[1] + seen[2]:
        assert 0 < hits == lookups, seen  # every file of every bucket kept on this machine
    for hits, lookups in seen[3]:
        assert hits == 0 < lookups, seen


def test_file_entries_find_the_rows_of_the_hashes_asked(tmp_path, monkeypatch):
    import numpy as np
    import pyarrow as pa

    from octo_platform.runtime.operators.keyed_rows import key_hash

    monkeypatch.setenv(bucket_cache.CACHE_ENV, str(tmp_path))
    rows = pa.table({"k": [3, 1, None, 3, 7, 1, 9], "s": ["x", "y", None, "x", "z", "w", "v"],
                     "n": list(range(7))})
    reads = []

    def read():
        reads.append(1)
        return rows
    got, hit = bucket_cache.file_rows("t", 0, "delta-1.parquet", read, ["k", "s"])
    assert not hit and reads == [1]
    again, hit = bucket_cache.file_rows("t", 0, "delta-1.parquet", read, ["k", "s"])
    assert hit and reads == [1] and again.equals(got)
    asked = pa.table({"k": [3, None, 5], "s": ["x", None, "x"]})
    hashes = np.unique(key_hash(asked, ["k", "s"]))
    found = bucket_cache.find(again, hashes)
    assert sorted(found.column("n").to_pylist()) == [0, 2, 3]
    assert found.column_names == rows.column_names
    assert bucket_cache.find(again, hashes[:0]).num_rows == 0
    bucket_cache.forget_files("t", 0, ["delta-2.parquet"])
    _, hit = bucket_cache.file_rows("t", 0, "delta-1.parquet", read, ["k", "s"])
    assert not hit and reads == [1, 1]


def test_a_joins_tasks_merge_its_delta_files_without_rewriting_its_base(spark, tmp_path,
                                                                       monkeypatch):
    """Once a join side's bucket has more delta writes than ``MERGE_DELTAS`` (2 here), its
    task merges those deltas alone into one delta file: the base files stay as the first
    batch wrote them, older deltas go, and the tables equal the batch query throughout."""
    from deltalake import DeltaTable

    from octo_platform.runtime import state_log

    monkeypatch.setattr(state_log, "MERGE_DELTAS", 2)
    a, b = RandomInput(23, debezium=True), RandomInput(24, debezium=False)
    sql, warehouse = project(tmp_path, JOIN_SQL.format(ddl=a.ddl()))
    sides = [str(p) for p in sorted((warehouse / "_octo" / "j" / "state").glob("*"))]
    bases, merged, earlier = None, False, set()
    for round_no in range(7):
        n = 400 if round_no == 0 else 3
        write_lines(tmp_path / "data" / "a", f"f{round_no}.json", a.lines(n))
        write_lines(tmp_path / "data" / "b", f"f{round_no}.json", b.lines(n))
        run_tables(spark, tmp_path, options=default_options(
            buckets=BUCKETS, progress=None, driver_rows=0), until_idle=True)
        sides = sides or [str(p) for p in sorted((warehouse / "_octo" / "j" / "state")
                                                 .glob("*"))]
        files = sorted(f for side in sides for f in DeltaTable(side).file_uris())
        base = [f for f in files if "/base-" in f]
        generations: dict[str, set[str]] = {}  # per side's bucket, its delta writes
        for f in files:
            where, name = f.rsplit("/", 1)
            if name.startswith("delta-"):
                generations.setdefault(where, set()).add(name.split("-")[1])
        if bases is None:
            bases = base
        assert base == bases  # never rewritten: the deltas are far fewer rows
        assert all(len(g) <= 3 for g in generations.values()), generations
        deltas = {f for f in files if "/delta-" in f}
        merged |= bool(earlier - deltas)  # merged away, the base kept
        earlier = deltas
        if round_no in (0, 3, 6):
            check_tables(spark, warehouse, sql, {"a": a.relation(), "b": b.relation()},
                         {"j": False, "l": False}, round_no)
    assert len(sides) == 2 and bases and merged

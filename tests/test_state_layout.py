"""Operator state as change logs: compaction keeps results exact and the log short; a
warehouse written with another state layout is refused with what to do."""
from __future__ import annotations

import posixpath

import pytest
from deltalake import DeltaTable

from octo_platform.errors import RunError
from octo_platform.project import load_project
from octo_platform.runtime import state_log
from octo_platform.runtime.offsets import BatchLog
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_environment, default_options
from tests.oracle import RandomInput, check_tables, driver_rows, write_lines

SQL = """
CREATE SOURCE src ({ddl}) WITH (connector = 'files', path = 'data/src',
    format = 'debezium-json', primary_key = 'id', max_files_per_batch = '1');
CREATE STREAMING TABLE per_g AS
    SELECT g, COUNT(*) AS n, MIN(v) AS mn, COUNT(DISTINCT k) AS dk FROM src GROUP BY g;
CREATE STREAMING TABLE pairs AS
    SELECT a.id, b.id AS other, a.k FROM src a JOIN src b ON a.k = b.k AND a.id < b.id;
"""


def state_files(root, table: str, operator: str) -> list[str]:
    path = root / "warehouse" / "_octo" / table / "state" / operator
    return [posixpath.basename(p) for p in DeltaTable(str(path)).file_uris()]


@pytest.mark.parametrize("path", ["spark", "driver"])
def test_compaction_keeps_results_exact(spark, tmp_path, monkeypatch, path):
    """Full and partial compactions of aggregate, value-multiset and join-side logs, on
    either path (the driver path merges delta files with Arrow), in a project whose path
    has a space (Delta's file URIs percent-encode it)."""
    tmp_path = tmp_path / "a project"
    monkeypatch.setattr(state_log, "MERGE_DELTAS", 2)  # merge delta writes every few batches
    src = RandomInput(7, debezium=True)
    sql = SQL.format(ddl=src.ddl())
    (tmp_path / "sql").mkdir(parents=True)
    (tmp_path / "sql" / "t.sql").write_text(sql)
    project = load_project(tmp_path)
    keyed = {n: project.table(n).physical.pk is not None for n in ("per_g", "pairs")}
    for round_no in range(2):
        for f in range(4):  # a large first batch, then small ones: partial merges too
            lines = src.lines(120 if round_no == f == 0 else 4)
            write_lines(tmp_path / "data" / "src", f"r{round_no}-{f}.json", lines)
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=2, progress=None, driver_rows=driver_rows(path, round_no)))
        assert len(report.for_table("per_g")) == 4, "one batch per file"
        assert {b.path for b in report.batches} == {path}
        check_tables(spark, tmp_path / "warehouse", sql, {"src": src.relation()}, keyed,
                     round_no)
    for table, operator in (("per_g", "agg3"), ("per_g", "agg3_values1"),
                            ("pairs", "join5_left")):
        files = state_files(tmp_path, table, operator)
        assert any(f.startswith("base-") for f in files), (table, operator, files)
        deltas = {"-".join(f.split("-")[:3]) for f in files if f.startswith("delta-")}
        assert len(deltas) <= 2 * 2, f"{operator}: compaction keeps the log short: {files}"


def test_a_keyed_logs_merge_keeps_each_keys_newest_row_whole():
    """The newest row wins as a whole: a NULL value in it is not filled from an older row
    (Arrow's ``first`` skips NULLs by default; a MAX whose values all went away read back
    as the old maximum)."""
    import pyarrow as pa

    from octo_platform.runtime.operators.aggregate import newest

    log = pa.table({"g": [0, 0, 1, 1], "m": [12, None, None, 5], "_batch": [1, 3, 2, 4]})
    merged = newest(["g"])(log).sort_by("g")
    assert merged.to_pylist() == [{"g": 0, "m": None, "_batch": 3},
                                  {"g": 1, "m": 5, "_batch": 4}]


def test_state_is_partitioned_by_the_bucket_of_its_key(spark, tmp_path):
    """Each GROUP BY log file holds one bucket of groups, each join side's log one bucket of
    join keys (so a task reads its bucket only), and the bucket is Spark's
    ``pmod(hash(key), buckets)`` on both paths."""
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(
        "CREATE SOURCE s (k BIGINT, v BIGINT) WITH (connector = 'files', path = 'data', "
        "format = 'json');"
        "CREATE STREAMING TABLE c AS SELECT k, COUNT(*) AS n, MAX(v) AS top FROM s GROUP BY k;"
        "CREATE STREAMING TABLE j AS SELECT a.k, b.v FROM s a JOIN s b ON a.k = b.v + 1;")
    for run, path in enumerate(("driver", "spark")):
        write_lines(tmp_path / "data", f"{run}.json",
                    [f'{{"k": {k}, "v": {k * run}}}' for k in range(40)])
        run_tables(spark, tmp_path, options=default_options(
            progress=None, buckets=4, driver_rows=driver_rows(path, 0)))
    log = tmp_path / "warehouse" / "_octo" / "c" / "state"
    (operator,) = [p for p in log.iterdir()]
    rows = spark.read.format("parquet").load(str(operator)).selectExpr(
        "_bucket", "pmod(hash(_g0), 4) AS want").collect()
    assert len(rows) >= 80 and all(r[0] == r[1] for r in rows)
    sides = sorted((tmp_path / "warehouse" / "_octo" / "j" / "state").iterdir())
    assert [p.name.split("_")[-1] for p in sides] == ["left", "right"]
    for side, key in zip(sides, ("c0", "c0 + 1")):  # k0: the join key (a.k; b.v + 1)
        rows = spark.read.format("parquet").load(str(side)).selectExpr(
            "_bucket", "pmod(hash(k0), 4) AS want", f"k0 = {key}").collect()
        assert len(rows) > 40 and all(r[0] == r[1] and r[2] for r in rows), side
    for log in (operator, *sides):  # a batch's files of a log are one write on either path,
        writes: dict[str, set[str]] = {}  # as compaction counts writes, not files
        for f in log.glob("_bucket=*/*.parquet"):
            prefix, batch = f.name.split("-")[:2]  # a compaction's base or delta, the batch's
            writes.setdefault(f"{prefix}-{batch}", set()).add(
                state_log.generation({"path": f.name}))
        assert all(len(w) == 1 for w in writes.values()), (log, writes)


def test_state_of_another_layout_is_refused(spark, tmp_path):
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(
        "CREATE SOURCE s (k BIGINT) WITH (connector = 'files', path = 'data', format = 'json');"
        "CREATE STREAMING TABLE c AS SELECT k, COUNT(*) AS n FROM s GROUP BY k;")
    write_lines(tmp_path / "data", "a.json", ['{"k": 1}'])
    run_tables(spark, tmp_path, options=default_options(progress=None))
    # A batch committed by an octo whose commit records carry no state format (layout 1).
    log = BatchLog(default_environment().store, str(tmp_path / "warehouse/_octo/c/log"))
    old = dict(log.commit_payload(0))
    old.pop("state_format")
    log.append(1, "commit", old, 0)
    write_lines(tmp_path / "data", "b.json", ['{"k": 2}'])
    with pytest.raises(RunError, match=r"state format 1.*octo reset c"):
        run_tables(spark, tmp_path, options=default_options(progress=None))


def test_a_table_keeps_the_buckets_it_was_created_with(spark, tmp_path):
    """A new table takes ``--buckets``, else its ``buckets`` option, else twice the
    session's cores (at least 8); later runs keep them whatever they ask, and the Spark
    path's tasks and the current state follow them."""
    src = RandomInput(3, debezium=False)
    (tmp_path / "sql").mkdir()
    sql = (f"CREATE SOURCE src ({src.ddl()}) WITH (connector = 'files', path = 'data/src', "
           "format = 'json');\n"
           "CREATE STREAMING TABLE by_opt WITH (buckets = '3') AS "
           "SELECT k, COUNT(*) AS n FROM src GROUP BY k;\n"
           "CREATE STREAMING TABLE by_default AS SELECT k, SUM(v) AS s FROM src GROUP BY k;\n")
    (tmp_path / "sql" / "t.sql").write_text(sql)
    log = lambda t: BatchLog(default_environment().store,  # noqa: E731
                             str(tmp_path / "warehouse" / "_octo" / t / "log"))
    for round_no, asked in enumerate((None, 5)):
        write_lines(tmp_path / "data" / "src", f"f{round_no}.json", src.lines(60))
        run_tables(spark, tmp_path, options=default_options(
            progress=None, driver_rows=0, buckets=asked), until_idle=True)
        for table, want in (("by_opt", 3), ("by_default", 8)):
            last = log(table).commit_payload(log(table).last_committed)
            assert last["fingerprint"].endswith(f"-b{want}"), (round_no, table)
            current = tmp_path / "warehouse" / "_current" / table
            assert {p.name for p in current.glob("_bucket=*")} <= \
                {f"_bucket={b}" for b in range(want)}
        check_tables(spark, tmp_path / "warehouse", sql, {"src": src.relation()},
                     {"by_opt": True, "by_default": True}, round_no)

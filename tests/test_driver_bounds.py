"""The driver path holds a table's state in the driver only up to ``driver_state_rows``:
above it the table's batches run as Spark jobs, what the run held is dropped, the run
says so once, and the results stay those of the batch SQL. An append-only table whose
batches only append to its current state holds nothing there, whatever its size."""
from __future__ import annotations

from octo_platform.project import load_project
from octo_platform.runtime import sink
from octo_platform.runtime.driver import held_rows
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import RandomInput, check_tables, write_lines

SQL = """
CREATE SOURCE src ({ddl}) WITH (connector = 'files', path = 'data/src', format = 'json');
CREATE STREAMING TABLE per_k AS SELECT k, COUNT(*) AS n, SUM(v) AS s FROM src GROUP BY k;
CREATE STREAMING TABLE kept AS SELECT id, k, v FROM src WHERE v > 10;
"""


def test_state_above_driver_state_rows_runs_on_the_spark_path(spark, tmp_path):
    src = RandomInput(20261129, False)
    sql = SQL.format(ddl=src.ddl())
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    project = load_project(tmp_path)
    keyed = {n: project.table(n).physical.pk is not None for n in ("per_k", "kept")}
    lines: list[str] = []
    # rows of state per_k's driver path would hold once the first round is in: its GROUP BY
    # state and current rows, one per key at most (13 keys); ``kept`` appends and holds none
    limits = (10**9, 20, 10**9)
    for round_no, limit in enumerate(limits):
        write_lines(tmp_path / "data" / "src", f"r{round_no}.json", src.lines(40))
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=4, progress=lines.append, driver_state_rows=limit), until_idle=True)
        paths = {b.table: b.path for b in report.batches}
        if round_no == 1:  # per_k holds more than 20 rows; kept only appends
            assert paths == {"per_k": "spark", "kept": "driver"}, paths
            said = [ln for ln in lines if "more than the driver holds" in ln]
            assert len(said) == 1 and said[0].startswith("[per_k] state of ") \
                and "(driver_state_rows 20)" in said[0], said
        else:
            assert paths == {"per_k": "driver", "kept": "driver"}, paths
        check_tables(spark, tmp_path / "warehouse", sql, {"src": src.relation()}, keyed,
                     round_no)


def test_the_default_bound_is_an_eighth_of_the_memory_at_150_bytes_a_row():
    """``driver_state_rows``'s default follows the machine (or container) it runs on."""
    from octo_platform.runtime.driver import DEFAULT_DRIVER_STATE_ROWS, \
        default_driver_state_rows, memory_bytes

    assert default_driver_state_rows(24 << 30) == (24 << 30) // 8 // 150  # 21,474,836
    assert default_driver_state_rows(1 << 30) == 1_000_000  # at least 1M rows
    assert default_driver_state_rows(0) == 10_000_000  # memory unknown
    assert memory_bytes() and DEFAULT_DRIVER_STATE_ROWS == default_driver_state_rows()


def test_held_rows_counts_state_and_current_rows_from_the_delta_logs(spark, tmp_path):
    """``held_rows`` of a GROUP BY table: its state log's rows (one per key written, before
    compaction) plus its current-state rows (one per live key), read from the Delta logs."""
    from octo_platform.runtime.runner import open_project
    from octo_platform.runtime.pipeline import Pipeline

    src = RandomInput(7, False)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(SQL.format(ddl=src.ddl()))
    write_lines(tmp_path / "data" / "src", "r0.json", src.lines(30))
    options = default_options(buckets=4, progress=None)
    run_tables(spark, tmp_path, options=options, until_idle=True)
    proj, layout = open_project(tmp_path, options)
    pipe = Pipeline(spark, proj, proj.table("per_k"), layout, options.env, buckets=4,
                    progress=None)
    pinned = pipe.log.commit_payload(pipe.log.last_committed)["versions"]
    store = options.env.store
    keys = len({r["k"] for r in src.relation()})
    state = sum(store.num_rows(layout.state("per_k", t), pinned.get(f"state/{t}"))
                for t in proj.table("per_k").physical.state_tables)
    assert state >= keys
    assert held_rows(pipe, lambda t: store.data_files(
        layout.state("per_k", t), pinned.get(f"state/{t}")), pinned, {}) == state + keys


def test_an_append_only_table_appends_and_rewrites_in_one_run(spark, tmp_path, monkeypatch):
    """In one run on the driver path, an append-only table's batches append to its current
    state until each bucket holds ``APPENDS_PER_BUCKET`` files, then rewrite the buckets they
    touch, then append again: the rows a rewrite kept for the run are out of date once a
    batch appends (dropped), and every batch's result is the batch SQL's."""
    monkeypatch.setattr(sink, "APPENDS_PER_BUCKET", 2)
    src = RandomInput(11, False)
    sql = SQL.format(ddl=src.ddl()).replace("format = 'json')",
                                            "format = 'json', max_files_per_batch = '1')")
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    for f in range(6):
        write_lines(tmp_path / "data" / "src", f"r{f}.json", src.lines(20))
    report = run_tables(spark, tmp_path, options=default_options(buckets=2, progress=None),
                        names=["kept"], until_idle=True)
    assert [b.path for b in report.batches] == ["driver"] * 6
    check_tables(spark, tmp_path / "warehouse", sql, {"src": src.relation()}, {"kept": False},
                 0)

"""The TPC-H oracle (issue 63): the 22 queries as streaming tables of one project over
Debezium feeds of TPC-H's tables (scale factor 0.01, made by DuckDB's generator at test
time, ``tests/tpch.py``), fed an initial load and refresh batches (new and deleted orders
with their line items, updated dimension rows and line items); after every run each table's
replayed changelog equals Spark's batch answer of the same SQL over all input so far. The
runs alternate between the driver path and the Spark path.
"""
from __future__ import annotations

import pytest

from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import check_paths, check_tables, driver_rows, write_lines
from tests.tpch import Tpch

ROUNDS = 3


@pytest.mark.parametrize("money", ["DECIMAL(15,2)"])
def test_tpch_queries_match_batch_sql_over_refreshes(spark, tmp_path, money):
    tpch = Tpch(sf=0.01, seed=7, money=money)
    sql = tpch.sources_sql() + "\n" + "\n".join(
        f"CREATE STREAMING TABLE {name} AS {q};" for name, q in tpch.queries.items())
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tpch.sql").write_text(sql)
    project = load_project(tmp_path)
    keyed = {n: project.table(n).physical.pk is not None for n in tpch.queries}
    for round_no in range(ROUNDS):
        feeds = tpch.load() if round_no == 0 else tpch.refresh()
        for table, lines in feeds.items():
            if lines:
                write_lines(tmp_path / "data" / table, f"r{round_no}.json", lines)
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=2, progress=None, driver_rows=driver_rows("mixed", round_no)),
            until_idle=True)
        check_paths(report, project, "mixed", round_no)
        inputs = {t: tpch.relation(t) for t in tpch.types}
        check_tables(spark, tmp_path / "warehouse", sql, inputs, keyed, round_no)

"""Delta Lake in octo's SparkSession: a user's code in the same session (a notebook, a Dagster
asset of theirs) reads octo's changelogs and current-state tables with Spark's own Delta
reader, in batch and as a stream; a session whose Delta jars cannot be fetched fails with a
message that says how to give Spark the jars instead."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from octo_platform.errors import RunError
from octo_platform.runtime.runner import run_tables
from octo_platform.runtime.session import delta_package
from octo_platform.wiring import default_options
from tests.oracle import RandomInput, changelog_events, current, event_identity, norm, \
    write_lines
from tests.processes import octo_run

SQL = """CREATE SOURCE src ({ddl}) WITH (connector = 'files', path = 'data/src',
    format = 'debezium-json', primary_key = 'id');
CREATE STREAMING TABLE per_k AS SELECT k, COUNT(*) AS n, SUM(v) AS total FROM src GROUP BY k;
"""


def test_spark_reads_octos_tables_as_delta(spark, tmp_path):
    src = RandomInput(3, debezium=True)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(SQL.format(ddl=src.ddl()))
    warehouse = tmp_path / "warehouse"
    changelog = str(warehouse / "per_k")
    seen: Counter = Counter()
    for run in range(2):
        write_lines(tmp_path / "data" / "src", f"f{run}.json", src.lines(30))
        run_tables(spark, tmp_path, options=default_options(progress=None), until_idle=True)

        # batch reads: Spark's Delta reader sees what delta-rs wrote
        got = Counter(event_identity(r.asDict(recursive=True))
                      for r in spark.read.format("delta").load(changelog).collect())
        assert got == Counter(event_identity(e) for e in changelog_events(warehouse, "per_k"))
        rows = spark.read.format("delta").load(str(warehouse / "_current" / "per_k"))
        assert Counter(norm(tuple(r)) for r in rows.drop("_bucket").collect()) == \
            current(warehouse, "per_k")

        # a stream over the changelog, restarted from its checkpoint: each event once
        query = (spark.readStream.format("delta").load(changelog).writeStream
                 .foreachBatch(lambda df, _: seen.update(
                     event_identity(r.asDict(recursive=True)) for r in df.collect()))
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        assert seen == got, f"run {run}: the stream's events differ from the table's"


def test_a_session_that_cannot_fetch_delta_says_how_to_give_it_the_jars(tmp_path):
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(SQL.format(ddl=RandomInput(0, True).ddl()))
    settings = tmp_path / "ivysettings.xml"  # a resolver with nothing in it: Maven is "down"
    settings.write_text(
        '<ivysettings><settings defaultResolver="nowhere"/><resolvers>'
        '<filesystem name="nowhere"><artifact pattern="'
        f'{tmp_path}/repo/[organisation]/[module]/[revision]/[artifact]-[revision].[ext]"/>'
        '</filesystem></resolvers></ivysettings>')
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "XDG_CACHE_HOME": str(tmp_path / "cache")}  # no jars noted by an earlier session
    res = subprocess.run(
        [*octo_run(tmp_path), "--conf", f"spark.jars.ivySettings={settings}",
         "--conf", f"spark.jars.ivy={tmp_path / 'ivy'}"],
        env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert f"could not resolve {delta_package()}" in res.stderr, res.stderr[-3000:]
    assert "--conf spark.jars=" in res.stderr


def test_a_table_another_writer_gave_deletion_vectors_is_refused(spark, tmp_path):
    """octo's tables have one writer (delta-rs): a table another writer turned deletion
    vectors on for, and deleted from, fails the next batch with what to do, instead of
    being read without them."""
    src = RandomInput(5, debezium=True)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(SQL.format(ddl=src.ddl()))
    options = default_options(progress=None)
    write_lines(tmp_path / "data" / "src", "f0.json", src.lines(20))
    run_tables(spark, tmp_path, options=options, until_idle=True)
    table = f"delta.`{tmp_path / 'warehouse' / '_current' / 'per_k'}`"
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    spark.sql(f"DELETE FROM {table} WHERE k % 2 = 0")
    write_lines(tmp_path / "data" / "src", "f1.json", src.lines(20))
    with pytest.raises(RunError, match="deletion vectors or column mapping turned on"):
        run_tables(spark, tmp_path, options=options, until_idle=True)

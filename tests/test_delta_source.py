"""The delta connector: a Delta table maintained by someone else (a slowly changing dimension)
as an updating source. After every run, each table's replayed changelog must equal the same
SELECT run by Spark as a batch query over the dimension's current rows and all facts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from connectors.delta_table import DeltaSource
from octo_platform.cli import main as octo
from octo_platform.errors import RunError, SqlError
from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import batch_results, check_changelog, current, replay, write_lines

TABLES = {
    "enriched": """SELECT f.id, f.k, d.name, f.amount * d.tier AS score
        FROM facts f JOIN dim d ON f.k = d.k""",
    "enriched_left": "SELECT f.id, f.k, d.name FROM facts f LEFT JOIN dim d ON f.k = d.k",
    "gold": "SELECT k, upper(name) AS name FROM dim WHERE tier >= 2",
}


def project_sql(dim_options: str, tables: dict[str, str] = TABLES) -> str:
    return "\n".join([
        "CREATE SOURCE facts (id BIGINT, k BIGINT, amount BIGINT) WITH (connector = 'files', "
        "path = 'data/facts', format = 'json', max_files_per_batch = 1);",
        # declared names in lower case, tier wider than in the table, `note` not declared
        f"CREATE SOURCE dim (k BIGINT, name STRING, tier BIGINT) WITH ({dim_options});",
        *[f"CREATE STREAMING TABLE {n} AS {q};" for n, q in tables.items()]])


def dim_rows(keys, names: str = "abcdefghij", tier: int = 2) -> pa.Table:
    keys = list(keys)
    return pa.table({"K": pa.array(keys, pa.int64()),
                     "Name": [names[k % len(names)] for k in keys],
                     "tier": pa.array([tier + k % 2 for k in keys], pa.int32()),
                     "note": ["x"] * len(keys)})


def dim_relation(path: Path) -> list[dict]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return [{"k": r["K"], "name": r["Name"], "tier": r["tier"]} for r in rows]


class Facts:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows: list[dict] = []

    def add(self, keys) -> None:
        new = [{"id": len(self.rows) + i, "k": k, "amount": 10 + k} for i, k in enumerate(keys)]
        self.rows += new
        write_lines(self.root / "data" / "facts", f"f{len(self.rows)}.json",
                    [json.dumps(r) for r in new])


def make_project(root: Path, sql: str) -> None:
    (root / "sql").mkdir(exist_ok=True)
    (root / "sql" / "p.sql").write_text(sql)


def check_tables(spark, root: Path, sql: str, inputs: dict, tables, label: str) -> None:
    project = load_project(root)
    expected = batch_results(spark, sql, inputs, tables)
    for name in tables:
        got = replay(root / "warehouse", name)
        assert got == expected[name], f"{label}, {name}: replay != batch SQL"
        assert current(root / "warehouse", name) == got, f"{label}, {name}: current != replay"
        check_changelog(root / "warehouse", name, pk=project.table(name).physical.pk is not None)


@pytest.mark.parametrize("cdf", [False, True], ids=["files-diff", "change-data-feed"])
def test_join_and_read_follow_dimension_changes(spark, tmp_path, cdf):
    dim = tmp_path / "dim"
    config = {"delta.enableChangeDataFeed": "true"} if cdf else None
    write_deltalake(dim, dim_rows(range(1, 6)), configuration=config)
    # with the change data feed, declare a key (u events); without, allow duplicate rows
    sql = project_sql("connector = 'delta', path = 'dim'" + (", primary_key = 'k'" if cdf else ""))
    make_project(tmp_path, sql)
    facts = Facts(tmp_path)

    def run(label: str) -> None:
        assert run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                          until_idle=True).batches
        check_tables(spark, tmp_path, sql, {"facts": facts.rows, "dim": dim_relation(dim)},
                     TABLES, label)

    # 1. the snapshot and the first facts
    facts.add([0, 1, 2, 2, 3, 4, 5, 7])
    run("snapshot")
    assert first_rows_in(tmp_path, "gold") == 5, "the first batch reads the whole snapshot"

    # 2. several commits, no new facts: update, delete, appends, a rewrite (compaction)
    dt = DeltaTable(str(dim))
    dt.update(updates={"Name": "'bee'"}, predicate="K = 2")
    dt.delete("K = 3")
    DeltaTable(str(dim)).update(updates={"tier": "1"}, predicate="K = 4")
    write_deltalake(dim, dim_rows([6, 7]), mode="append")
    write_deltalake(dim, dim_rows([8] if cdf else [5, 8]), mode="append")  # a bag: 5 twice
    DeltaTable(str(dim)).optimize.compact()
    run("update, delete, append and compact")

    # 3. an overwrite with new facts, then (one file per batch) a batch of facts only
    write_deltalake(dim, dim_rows([1, 2, 9], names="zyxwvutsrq", tier=1), mode="overwrite")
    facts.add([1, 2, 3, 6, 9])
    facts.add([2, 9, 9, 10])
    run("overwrite")
    assert [sorted(i) for i in batch_log(tmp_path, "enriched", "intent")[-2:]] == [
        ["source:dim", "source:facts"], ["source:facts"]]


def batch_log(root: Path, table: str, kind: str) -> list[dict]:
    """Payloads of the table's batch log records of one kind, in batch order."""
    rows = DeltaTable(str(root / "warehouse/_octo" / table / "log")).to_pyarrow_table()
    return [json.loads(r["payload"]) for r in sorted(rows.to_pylist(),
                                                     key=lambda r: r["batch_id"])
            if r["kind"] == kind]


def first_rows_in(root: Path, table: str) -> int:
    return batch_log(root, table, "commit")[0]["stats"]["rows_in"]


def test_vacuumed_history_asks_for_a_reset(spark, tmp_path):
    dim = tmp_path / "dim"
    write_deltalake(dim, dim_rows(range(1, 4)))
    tables = {"gold": TABLES["gold"]}
    sql = project_sql("connector = 'delta', path = 'dim'", tables)
    make_project(tmp_path, sql)
    run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None), until_idle=True)
    dt = DeltaTable(str(dim))
    dt.update(updates={"Name": "'new'"}, predicate="K = 2")
    DeltaTable(str(dim)).vacuum(retention_hours=0, enforce_retention_duration=False,
                                dry_run=False)
    with pytest.raises(RunError, match=r"vacuumed.*octo reset gold"):
        run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                   until_idle=True)
    assert octo(["reset", "gold", "--project", str(tmp_path)]) == 0
    run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None), until_idle=True)
    check_tables(spark, tmp_path, sql, {"facts": [], "dim": dim_relation(dim)}, tables,
                 "after reset")
    shutil.rmtree(dim)  # a new table at the same path: its versions start again
    write_deltalake(dim, dim_rows([1]))
    with pytest.raises(RunError, match=r"table was replaced.*octo reset gold"):
        run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                   until_idle=True)


def test_append_only_declaration_is_checked(spark, tmp_path):
    dim = tmp_path / "dim"
    write_deltalake(dim, dim_rows([1, 2]), partition_by=["tier"])  # tier only in paths
    tables = {"gold": TABLES["gold"]}
    sql = project_sql("connector = 'delta', path = 'dim', mode = 'append-only'", tables)
    make_project(tmp_path, sql)
    assert load_project(tmp_path).table("gold").definition.plan.mode == "append-only"
    run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None), until_idle=True)
    write_deltalake(dim, dim_rows([3, 4]), mode="append")
    DeltaTable(str(dim)).optimize.compact()
    run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None), until_idle=True)
    check_tables(spark, tmp_path, sql, {"facts": [], "dim": dim_relation(dim)}, tables,
                 "appends")
    DeltaTable(str(dim)).delete("K = 1")
    with pytest.raises(RunError, match="declared mode = 'append-only'.*octo reset gold"):
        run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                   until_idle=True)


def test_missing_table_and_missing_column_are_clear(spark, tmp_path):
    write_deltalake(tmp_path / "dim", dim_rows([1]))
    make_project(tmp_path, project_sql("connector = 'delta', path = 'nope'"))
    with pytest.raises(RunError, match=r"source 'dim': no Delta table at .*nope"):
        run_tables(spark, tmp_path, options=default_options(progress=None), until_idle=True)
    sql = project_sql("connector = 'delta', path = 'dim'").replace("tier BIGINT",
                                                                   "tier BIGINT, colour STRING")
    make_project(tmp_path, sql)
    with pytest.raises(RunError) as err:
        run_tables(spark, tmp_path, options=default_options(progress=None), until_idle=True)
    msg = str(err.value)
    assert "source 'dim'" in msg and "colour" in msg and str(tmp_path / "dim") in msg
    assert "available: K, Name, tier, note" in msg


@pytest.mark.parametrize("options, message", [
    ("connector = 'delta'", "option 'path' is required"),
    ("connector = 'delta', path = 'dim', format = 'parquet'",
     "option 'format' does not apply to connector 'delta'"),
    ("connector = 'delta', path = 'dim', mode = 'sometimes'",
     "option 'mode' must be one of updating, append-only"),
    ("connector = 'delta', path = 'dim', primary_key = 'nope'", "primary_key column 'nope'"),
])
def test_source_options_are_checked(tmp_path, options, message):
    make_project(tmp_path, project_sql(options))
    with pytest.raises(SqlError, match=message):
        load_project(tmp_path)


def test_delta_source_is_updating_and_keyed(tmp_path):
    make_project(tmp_path, project_sql("connector = 'delta', path = 'dim', primary_key = 'k'"))
    source = load_project(tmp_path).source("dim")
    assert (source.mode, source.pk) == ("updating", ("k",))


@pytest.mark.parametrize("cdf", [False, True], ids=["versions-diff", "change-data-feed"])
def test_deletion_vectors_and_column_mapping_are_read_by_spark(spark, tmp_path, cdf,
                                                               monkeypatch):
    """A dimension written by delta-spark itself, with deletion vectors and column mapping on:
    DELETE, UPDATE and MERGE leave deletion vectors, a column is renamed and one dropped (the
    change data feed cannot be read across those, so that batch diffs the versions); after
    every run (a restart) each table equals the SELECT over Spark's own read of the table,
    and the run's three tables read the dimension's changes once."""
    reads: list[dict] = []
    read = DeltaSource.changes

    def counted(self, spark, got, **kw):
        reads.append(got)
        return read(self, spark, got, **kw)

    monkeypatch.setattr(DeltaSource, "changes", counted)
    dim = tmp_path / "dim"
    props = ("'delta.enableDeletionVectors' = 'true', 'delta.columnMapping.mode' = 'name'"
             + (", 'delta.enableChangeDataFeed' = 'true'" if cdf else ""))
    spark.sql(f"CREATE TABLE delta.`{dim}` (K BIGINT, Name STRING, tier INT, note STRING, "
              f"junk STRING) USING delta TBLPROPERTIES ({props})")

    def dml(sql: str) -> None:
        spark.sql(sql.replace("DIM", f"delta.`{dim}`"))

    dml("INSERT INTO DIM VALUES " + ", ".join(
        f"({k}, '{'abcdefghij'[k % 10]}', {2 + k % 2}, 'x', 'j')" for k in range(1, 9)))
    sql = project_sql("connector = 'delta', path = 'dim'")
    make_project(tmp_path, sql)
    facts = Facts(tmp_path)

    def run(label: str) -> None:
        assert run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                          until_idle=True).batches
        rows = [{"k": r["K"], "name": r["Name"], "tier": r["tier"]}
                for r in spark.read.format("delta").load(str(dim)).collect()]
        check_tables(spark, tmp_path, sql, {"facts": facts.rows, "dim": rows}, TABLES, label)
        assert len(reads) == 1, f"{label}: {reads}"  # one read, whatever the number of tables
        reads.clear()

    facts.add([0, 1, 2, 3, 5, 8])
    run("snapshot")
    dml("DELETE FROM DIM WHERE K = 3")
    dml("UPDATE DIM SET Name = 'bee' WHERE K = 2")
    run("delete and update")
    dvs = spark.sql(f"DESCRIBE HISTORY delta.`{dim}`").filter("operation = 'DELETE'") \
        .select("operationMetrics").first()[0]
    assert int(dvs["numDeletionVectorsAdded"]) > 0, dvs  # the rows were not rewritten
    spark.createDataFrame([(4, "dee", 1), (9, "nine", 3)], "K BIGINT, Name STRING, tier INT") \
        .createOrReplaceTempView("changes")
    dml("MERGE INTO DIM d USING changes c ON d.K = c.K WHEN MATCHED THEN UPDATE SET "
        "d.tier = c.tier, d.Name = c.Name WHEN NOT MATCHED THEN INSERT (K, Name, tier) "
        "VALUES (c.K, c.Name, c.tier)")
    facts.add([4, 9, 9])
    run("merge")
    dml("ALTER TABLE DIM RENAME COLUMN note TO remark")
    dml("ALTER TABLE DIM DROP COLUMN junk")
    dml("UPDATE DIM SET tier = 5 WHERE K = 1")
    run("rename and drop")


def test_a_spark_read_table_whose_log_was_cleaned_asks_for_a_reset(spark, tmp_path):
    """The Spark-read path checks the version it resumes from: once the log of that version
    is gone (cleaned up after a checkpoint), the run asks for `octo reset`."""
    dim = tmp_path / "dim"
    spark.sql(f"CREATE TABLE delta.`{dim}` (K BIGINT, Name STRING, tier INT) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', "
              "'delta.checkpointInterval' = '2')")
    spark.sql(f"INSERT INTO delta.`{dim}` VALUES (1, 'a', 2), (2, 'b', 3)")
    tables = {"gold": TABLES["gold"]}
    make_project(tmp_path, project_sql("connector = 'delta', path = 'dim'", tables))
    run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None), until_idle=True)
    for k in (3, 4, 5):
        spark.sql(f"INSERT INTO delta.`{dim}` VALUES ({k}, 'c', 2)")
    spark.sql(f"DELETE FROM delta.`{dim}` WHERE K = 1")
    log = dim / "_delta_log"
    assert list(log.glob("*.checkpoint.parquet"))
    for version in (0, 1):  # the versions the first run read, gone from the log
        (log / f"{version:020d}.json").unlink()
    with pytest.raises(RunError, match=r"vacuumed.*octo reset gold"):
        run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                   until_idle=True)


def test_a_version_read_by_spark_is_kept_per_table_made(spark, tmp_path):
    """``version_frame`` keeps Spark's read of a version for the session, by the table's id:
    the same version is the same frame; a table made anew at the same path (same version
    numbers) is read anew."""
    from connectors.delta_table import version_frame
    from state.delta import DeltaStore

    dim, store = str(tmp_path / "dim"), DeltaStore()

    def made(rows: str) -> tuple[str, list[int]]:
        shutil.rmtree(dim, ignore_errors=True)
        spark.sql(f"CREATE TABLE delta.`{dim}` (K BIGINT) USING delta "
                  "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        spark.sql(f"INSERT INTO delta.`{dim}` VALUES {rows}")
        table_id = store.table_info(dim, 1)["id"]
        frame = version_frame(spark, dim, table_id, 1)
        assert version_frame(spark, dim, table_id, 1) is frame
        return table_id, sorted(r.K for r in frame.collect())

    first, second = made("(1), (2)"), made("(3)")
    assert first[0] != second[0]
    assert (first[1], second[1]) == ([1, 2], [3])


def test_a_spark_read_table_whose_files_were_vacuumed_asks_for_a_reset(spark, tmp_path):
    """Spark reads lazily, so the Spark-read path checks the files of the version it resumes
    from before it reads: once VACUUM removed them, the run asks for `octo reset` (not Spark's
    own missing-file error); after the reset the table is rebuilt from the snapshot."""
    dim = tmp_path / "dim"
    spark.sql(f"CREATE TABLE delta.`{dim}` (K BIGINT, Name STRING, tier INT) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"INSERT INTO delta.`{dim}` VALUES (1, 'a', 2), (2, 'b', 3)")
    tables = {"gold": TABLES["gold"]}
    sql = project_sql("connector = 'delta', path = 'dim'", tables)
    make_project(tmp_path, sql)
    run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None), until_idle=True)
    spark.sql(f"DELETE FROM delta.`{dim}` WHERE K IN (1, 2)")  # the whole file goes
    spark.sql(f"INSERT INTO delta.`{dim}` VALUES (3, 'c', 2)")
    # no retention, and the file listing in 2 tasks (Delta's VACUUM asks for 10,000: 33 s)
    settings = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
                "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2"}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        spark.sql(f"VACUUM delta.`{dim}` RETAIN 0 HOURS")
    finally:
        for key in settings:
            spark.conf.unset(key)
    with pytest.raises(RunError, match=r"version 1 .*vacuumed.*octo reset gold"):
        run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                   until_idle=True)
    assert octo(["reset", "gold", "--project", str(tmp_path)]) == 0
    run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None), until_idle=True)
    rows = [{"k": r["K"], "name": r["Name"], "tier": r["tier"]}
            for r in spark.read.format("delta").load(str(dim)).collect()]
    check_tables(spark, tmp_path, sql, {"facts": [], "dim": rows}, tables, "after reset")

"""The warehouse and the sources in an S3 object store (moto's server on loopback,
``tests/object_store.py``), run by the driver path in this process: Parquet and Debezium
JSON sources listed and read with pyarrow's S3 file system, the tables written and
committed with delta-rs, rounds of input against the batch oracle, a run's state handles
kept across batches. (The Spark path reads S3 through S3A, which the tests' shared session
does not load: ``test_cluster.py`` runs it on a cluster.)"""
from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.object_store import object_store, put_text
from tests.oracle import RandomInput, check_tables

SQL = """CREATE SOURCE bids ({ddl}) WITH (connector = 'files', path = '{data}/bids',
    format = 'parquet');
CREATE SOURCE items ({ddl}) WITH (connector = 'files', path = '{data}/items',
    format = 'debezium-json', primary_key = 'id');
CREATE STREAMING TABLE per_k AS SELECT b.k, COUNT(*) AS n, SUM(b.v + i.v) AS total
    FROM bids b JOIN items i ON b.k = i.k GROUP BY b.k;
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with object_store(tmp_path_factory.mktemp("moto") / "moto.log") as got, \
            pytest.MonkeyPatch.context() as mp:
        for key, value in got.env.items():
            mp.setenv(key, value)
        yield got


def _put_parquet(uri: str, rows: list[dict]) -> None:
    from pyarrow import fs

    s3, key = fs.FileSystem.from_uri(uri)
    schema = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("g", pa.string()),
                        ("v", pa.int64()), ("d", pa.float64())])
    with s3.open_output_stream(key) as out:
        pq.write_table(pa.Table.from_pylist(rows, schema), out)


def test_driver_path_reads_and_writes_the_object_store(spark, tmp_path, store):
    seed = 20261204
    rng = random.Random(seed)
    bids, items = RandomInput(seed, debezium=False), RandomInput(seed + 1, debezium=True)
    data, warehouse = store.uri("t1", "data"), store.uri("t1", "warehouse")
    sql = SQL.format(ddl=bids.ddl(), data=data)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "p.sql").write_text(sql)
    keyed = {"per_k": load_project(tmp_path).table("per_k").physical.pk is not None}
    for round_no in range(3):
        lines = bids.lines(rng.randint(10, 30))
        _put_parquet(f"{data}/bids/r{round_no}.parquet", [json.loads(x) for x in lines])
        put_text(f"{data}/items/r{round_no}.json",
                 "".join(x + "\n" for x in items.lines(rng.randint(10, 30), bad=1)))
        report = run_tables(spark, tmp_path, options=default_options(
            warehouse=warehouse, progress=None))
        assert [b.path for b in report.batches] == ["driver"], report.batches
        assert report.batches[0].dead_letters == 1
        check_tables(spark, warehouse, sql, {"bids": bids.relation(),
                                             "items": items.relation()}, keyed, round_no)

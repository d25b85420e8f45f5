"""Top-N's ranking in Arrow (``top_n.TopNStep.ranked``, the driver path's and the
Spark tasks') numbers rows as Spark's ``row_number()`` does: ORDER BY's directions and NULL
placement, NaN above every number, -0.0 equal to 0.0, NULL and NaN partition keys, rows of
multiplicity above one."""
from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa

from octo_platform.columns import WEIGHT
from octo_platform.logical.plan import SortKey
from octo_platform.physical.plan import PSource, PTopN
from octo_platform.runtime.operators.top_n import TopNStep
from tests.oracle import norm

COLUMNS = ("p", "x", "y", "s")
SCHEMA = pa.schema([("p", pa.string()), ("x", pa.float64()), ("y", pa.int64()),
                    ("s", pa.string()), (WEIGHT, pa.int64())])
ORDERS = [
    (SortKey("x"),),
    (SortKey("x", desc=True, nulls_first=False),),
    (SortKey("y", desc=True), SortKey("x", nulls_first=False)),
    (SortKey("s", nulls_first=False), SortKey("x", desc=True, nulls_first=True)),
]


def random_rows(rng: random.Random, n: int) -> pa.Table:
    def x():
        return rng.choice([None, float("nan"), -0.0, 0.0, 1.5, -2.0, rng.uniform(-3, 3)])
    rows = [(rng.choice(["a", "b", None]), x(), rng.choice([None, 1, 2, 3]),
             rng.choice([None, "", "q", "qq", "é"]), rng.randint(1, 3)) for _ in range(n)]
    return pa.table(list(zip(*rows)), schema=SCHEMA)


PARTITIONS = [(), ("p",), ("x",), ("p", "y")]


def test_top_n_ranks_as_spark_row_number(spark):
    """Each partition key with two ORDER BYs (each ORDER BY twice): Spark numbers them all
    in one query."""
    rows = random_rows(random.Random(7), 80)
    units = [tuple(r[c] for c in COLUMNS) for r in rows.to_pylist() for _ in range(r[WEIGHT])]
    source = PSource("src", COLUMNS, "append-only", name="src")
    nodes = [PTopN("topn", (*COLUMNS, "rn"), "append-only", input=source, partition=p,
                   order=ORDERS[(i + j) % len(ORDERS)], n=3, rank="rn")
             for i, p in enumerate(PARTITIONS) for j in range(2)]
    ranks = []
    for node in nodes:
        part = f"PARTITION BY {', '.join(node.partition)} " if node.partition else ""
        order = [k.render() for k in node.order] + [f"{c} ASC NULLS FIRST" for c in COLUMNS]
        ranks.append(f"row_number() OVER ({part}ORDER BY {', '.join(order)})")
    ranked = spark.createDataFrame(units, "p STRING, x DOUBLE, y BIGINT, s STRING") \
        .selectExpr(*COLUMNS, *ranks).collect()
    for i, node in enumerate(nodes):
        want = Counter(norm((*r[:4], r[4 + i])) for r in ranked if r[4 + i] <= node.n)
        got = TopNStep.of(node).ranked(rows)
        assert Counter(norm(tuple(r.values())) for r in got.to_pylist()) == want, node


REMOTE_TABLES = {
    "top": """SELECT * FROM (SELECT g, id, v, ROW_NUMBER() OVER (PARTITION BY g
        ORDER BY v DESC, id) AS r FROM a_cdc) t WHERE r <= 2""",
    "top_app": "SELECT id, d FROM a_app ORDER BY d, id LIMIT 3",
    "agg": "SELECT g, COUNT(*) AS n, SUM(v) AS s FROM a_cdc GROUP BY g",
    "joined": "SELECT a.id, b.id AS bid FROM a_cdc a JOIN a_app b ON a.k = b.k",
}


def test_state_of_a_remote_warehouse_is_loaded_by_spark(spark, tmp_path, monkeypatch):
    """Where the state files are not local (object storage), the driver path's caches load
    them with Spark: every run starts with a cold cache, so each loads that way."""
    from octo_platform.project import load_project
    from octo_platform.runtime.operators import kernels, partition_kernel
    from tests.oracle import RandomInput, check_rounds

    for module in (kernels, partition_kernel):
        monkeypatch.setattr(module, "local_path", lambda uri: None)
    ddl = RandomInput(0, False).ddl()
    sql = "\n".join(
        [f"CREATE SOURCE a_{kind} ({ddl}) WITH (connector = 'files', path = 'data/a_{kind}', "
         f"format = '{fmt}'{pk});" for kind, fmt, pk in (
             ("app", "json", ""), ("cdc", "debezium-json", ", primary_key = 'id'"))]
        + [f"CREATE STREAMING TABLE {n} AS {q};" for n, q in REMOTE_TABLES.items()])
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    feeds = {"a_app": RandomInput(1, False), "a_cdc": RandomInput(2, True)}
    check_rounds(spark, tmp_path, sql, load_project(tmp_path), REMOTE_TABLES, feeds,
                 random.Random(3), "driver", 3, lines=(3, 12))

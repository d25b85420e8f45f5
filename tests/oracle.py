"""Test oracle: replay a changelog and compare it with the same SQL run as a batch query.

The batch side is Spark itself: every CREATE SOURCE becomes a temp view over all input rows
(for Debezium input: the rows alive after all events), every CREATE VIEW / CREATE STREAMING
TABLE a temp view of its query, so the SELECT runs unchanged over all input seen so far.
"""
from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlglot
from deltalake import DeltaTable
from sqlglot import exp

from octo_platform.frontend.parser import SourceStmt, TableStmt, ViewStmt, parse_sql

__all__ = ["norm", "event_identity", "replay", "batch_result", "batch_results",
           "check_changelog", "check_tables", "check_sink", "check_rounds",
           "RandomInput", "write_lines", "PATHS", "driver_rows"]

# Where batches run (``runtime/driver.py``): every batch as Spark jobs, every batch the
# driver path covers in the driver, or the two taking turns run by run (state written by
# one path read by the other).
PATHS = ("spark", "driver", "mixed")


def driver_rows(path: str, run: int) -> int:
    """The ``driver_rows`` option of a test's ``run``-th run on ``path``."""
    driver = path == "driver" or (path == "mixed" and run % 2 == 0)
    return 10**9 if driver else 0


def check_rounds(spark: Any, root: Path, sql: str, project: Any, tables: Any,
                 feeds: dict[str, Any], rng: random.Random, path: str, rounds: int,
                 lines: tuple[int, int]) -> None:
    """``rounds`` runs on ``path``, each after 1-2 new files of ``lines`` random records per
    feed; after each, where every batch ran (``check_paths``) and each of ``tables``' replay
    equals its batch SQL (``check_tables``)."""
    from octo_platform.runtime.runner import run_tables
    from octo_platform.wiring import default_options

    keyed = {n: project.table(n).physical.pk is not None for n in tables}
    for round_no in range(rounds):
        for name, feed in feeds.items():
            for f in range(rng.randint(1, 2)):
                write_lines(root / "data" / name, f"r{round_no}-{f}.json",
                            feed.lines(rng.randint(*lines)))
        report = run_tables(spark, root, options=default_options(
            buckets=4, progress=None, driver_rows=driver_rows(path, round_no)), until_idle=True)
        assert report.batches
        check_paths(report, project, path, round_no)
        inputs = {name: feed.relation() for name, feed in feeds.items()}
        check_tables(spark, root / "warehouse", sql, inputs, keyed, round_no)


def check_paths(report: Any, project: Any, path: str, run: int) -> None:
    """Each batch of the run ran where ``path`` sends it: in the driver when the run allows
    it and the driver path covers the table's plan, else as Spark jobs."""
    from octo_platform.runtime.driver import plan_runs_in_driver

    for b in report.batches:
        local = driver_rows(path, run) > 0 and plan_runs_in_driver(project.table(b.table).physical)
        assert b.path == ("driver" if local else "spark"), (b.table, b.batch, b.path)


def norm(value: Any) -> Any:
    """Hashable, float-tolerant form of a value (structs become tuples, timestamps naive
    UTC)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return tuple(norm(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return tuple(norm(v) for v in value)
    if hasattr(value, "asDict"):
        return tuple(norm(v) for v in value.asDict().values())
    if isinstance(value, Decimal):
        return float(f"{float(value):.9g}")
    if isinstance(value, datetime) and value.tzinfo is not None:
        # Delta (via Arrow) gives UTC-aware timestamps, Spark's collect() naive ones (UTC).
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def event_identity(e: dict[str, Any]) -> tuple:
    """A change event as (batch, op, before, after), values normalized (``norm``)."""
    return (e["source"]["batch_id"], e["op"], norm(e["before"]), norm(e["after"]))


def changelog_events(warehouse: str | Path, table: str) -> list[dict[str, Any]]:
    path = f"{warehouse}/{table}"  # a directory or a URI (delta-rs reads AWS_* for s3://)
    if not DeltaTable.is_deltatable(path):
        return []
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: r["source"]["batch_id"])


def replay(warehouse: str | Path, table: str) -> Counter:
    """The multiset of rows obtained by applying every change event in batch order."""
    state: Counter = Counter()
    for e in changelog_events(warehouse, table):
        if e["before"] is not None:
            key = norm(e["before"])
            state[key] -= 1
            assert state[key] >= 0, f"{table}: {e['op']} removes a row that is not there: {key}"
        if e["after"] is not None:
            state[norm(e["after"])] += 1
    return +state


def current(warehouse: str | Path, table: str) -> Counter:
    rows = DeltaTable(f"{warehouse}/_current/{table}").to_pyarrow_table()
    rows = rows.drop_columns(["_bucket"]).to_pylist()
    return Counter(norm(r) for r in rows)


def check_changelog(warehouse: str | Path, table: str, pk: bool) -> None:
    """Contract checks: consolidated per batch, u only with a key, ops well-formed."""
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for e in changelog_events(warehouse, table):
        by_batch.setdefault(e["source"]["batch_id"], []).append(e)
        assert e["source"]["table"] == table
        assert e["op"] in ("c", "u", "d")
        assert (e["before"] is None) == (e["op"] == "c")
        assert (e["after"] is None) == (e["op"] == "d")
        if e["op"] == "u":
            assert pk, f"{table}: u event without a primary key"
            assert norm(e["before"]) != norm(e["after"]), f"{table}: no-op u event {e}"
    for batch, events in by_batch.items():
        ins = Counter(norm(e["after"]) for e in events if e["after"] is not None)
        dels = Counter(norm(e["before"]) for e in events if e["before"] is not None)
        both = set(ins) & set(dels)
        assert not both, f"{table} batch {batch}: inserted and deleted in one batch: {both}"


def spark_sql(query: exp.Expression) -> str:
    """``query`` as Spark SQL: each ``TUMBLE``/``HOP`` in FROM becomes a subquery over
    Spark's own ``window()`` function (an independent implementation of the windows)."""
    from octo_platform.frontend.intervals import interval_micros

    def spark_window(node: exp.Expression) -> exp.Expression:
        call = node.this if isinstance(node, exp.Table) else None
        if not isinstance(call, exp.Anonymous) or call.name.upper() not in ("TUMBLE", "HOP"):
            return node
        rel, time, *spans = call.expressions
        micros = [f"'{interval_micros(s)} microseconds'" for s in spans]
        durations = micros[0] if len(micros) == 1 else f"{micros[1]}, {micros[0]}"
        alias = node.alias or rel.name
        return sqlglot.parse_one(
            f"(SELECT *, _w.start AS window_start, _w.end AS window_end FROM (SELECT *, "
            f"window({time.sql('spark')}, {durations}) AS _w FROM {rel.name}) _x) AS {alias}",
            dialect="spark")

    return _sessions(query.copy()).transform(spark_window).transform(_quantified).sql("spark")


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


def _quantified(node: exp.Expression) -> exp.Expression:
    """``x <op> ANY / ALL (subquery)``, which Spark does not parse, by the SQL standard's
    definition over the subquery's rows (an implementation independent of octo's): ANY is
    TRUE if ``x <op> y`` is TRUE for some row, else NULL if it is NULL for some, else
    FALSE; ALL is FALSE if it is FALSE for some row, else NULL if NULL for some, else TRUE."""
    q = node.args.get("expression") if isinstance(node, _COMPARISONS) else None
    if not isinstance(q, (exp.Any, exp.All)):
        return node
    sub = q.this.this if isinstance(q.this, exp.Subquery) else q.this
    x = node.this.sql("spark")
    test = type(node)(this=sqlglot.parse_one(x, read="spark"),
                      expression=exp.column("_y", table="_q")).sql("spark")

    # a plain SELECT whose FROM cannot capture x's columns: read in place (a correlated
    # one's outer columns then stay in reach), else as a derived table
    plain = isinstance(sub, exp.Select) and len(sub.expressions) == 1 and not any(
        sub.args.get(a) for a in ("group", "having", "limit", "distinct")) and not any(
        isinstance(n, exp.AggFunc) for n in sub.expressions[0].walk())
    names = {t.alias_or_name.lower() for t in sub.find_all(exp.Table)} if plain else set()
    plain = plain and all(c.table and c.table.lower() not in names
                          for c in node.this.find_all(exp.Column))

    def some(cond: str) -> str:
        if not plain:
            return f"EXISTS (SELECT 1 FROM ({sub.sql('spark')}) AS _q(_y) WHERE {cond})"
        # its own FROM and WHERE (a correlated subquery's outer columns stay in reach)
        y = sub.expressions[0].unalias().sql("spark")
        rows = sub.copy()
        rows.set("expressions", [exp.Literal.number(1)])
        where = sub.args.get("where")
        cond = cond.replace("_q._y", f"({y})")
        rows.set("where", exp.Where(this=sqlglot.parse_one(
            f"({where.this.sql('spark')}) AND ({cond})" if where is not None else cond,
            read="spark")))
        return f"EXISTS ({rows.sql('spark')})"
    if isinstance(q, exp.Any):
        text = (f"CASE WHEN {some(test)} THEN TRUE WHEN {some(f'({test}) IS NULL')} "
                "THEN NULL ELSE FALSE END")
    else:
        text = (f"CASE WHEN {some(f'NOT ({test})')} THEN FALSE WHEN "
                f"{some(f'({test}) IS NULL')} THEN NULL ELSE TRUE END")
    return exp.paren(sqlglot.parse_one(text, read="spark"))


def _sessions(query: exp.Expression) -> exp.Expression:
    """Each SELECT over ``SESSION(rel, ts, gap)`` as Spark's ``session_window``: FROM the
    relation, GROUP BY ``session_window(ts, gap)`` in place of the window columns, which
    become ``session_window.start`` / ``.end``. Spark merges rows exactly one gap apart,
    octo does not (a session is ``[first, last + gap)``): Spark gets the gap minus 1 µs,
    and the end it reports is moved 1 µs on."""
    from octo_platform.frontend.intervals import interval_micros
    from octo_platform.frontend.parser import SESSION_CALL

    for select in list(query.find_all(exp.Select)):
        from_ = select.args.get("from_")
        call = from_.this.this if from_ is not None and isinstance(from_.this, exp.Table) \
            else None
        if not isinstance(call, exp.Anonymous) or call.name.upper() != SESSION_CALL:
            continue
        rel, time, gap = call.expressions
        alias = from_.this.alias
        from_.set("this", exp.to_table(rel.name, alias=alias) if alias
                  else exp.to_table(rel.name))
        fn = sqlglot.parse_one(f"session_window({time.sql('spark')}, "
                               f"'{interval_micros(gap) - 1} microseconds')", dialect="spark")
        group = select.args["group"]
        keys = [k for k in group.expressions
                if not (isinstance(k, exp.Column) and k.name in ("window_start", "window_end"))]
        group.set("expressions", [fn, *keys])
        for col in list(select.find_all(exp.Column)):
            if col.name in ("window_start", "window_end") and col.find_ancestor(exp.Group) \
                    is None:
                bound = ("session_window.start" if col.name == "window_start" else
                         "session_window.end + INTERVAL 1 MICROSECOND")
                replacement = sqlglot.parse_one(bound, dialect="spark")
                if col.parent is not None and isinstance(col.parent, exp.Select):
                    replacement = exp.alias_(replacement, col.name)
                col.replace(replacement)
    return query


# Batch SQL results by (SQL, inputs, tables): a test run on each path (``PATHS``) feeds the
# same random input, so the batch query over it needs to run only once.
_RESULTS: dict[str, dict[str, Counter]] = {}


def batch_results(spark, sql_text: str, inputs: dict[str, list[dict[str, Any]]],
                  tables: Any) -> dict[str, Counter]:
    """Run each of ``tables``' SELECTs as a Spark batch query over ``inputs`` (rows per
    source); the views are built once for all of them. The same question asked again is
    answered from the first answer."""
    key = repr((sql_text, sorted(inputs.items()), list(tables)))
    if key not in _RESULTS:
        _RESULTS[key] = _batch_results(spark, sql_text, inputs, tables)
    return _RESULTS[key]


def _batch_results(spark, sql_text: str, inputs: dict[str, list[dict[str, Any]]],
                   tables: Any) -> dict[str, Counter]:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from octo_platform.local_frames import arrow_schema, local_frame

    for stmt in parse_sql(sql_text):
        if isinstance(stmt, SourceStmt):
            ddl = ", ".join(f"`{c}` {t}" for c, t in stmt.columns)
            schema = StructType.fromDDL(ddl)
            try:  # as Arrow: Python rows made large inputs slow (TPC-H's line items)
                frame = local_frame(spark, pa.Table.from_pylist(
                    [{c: r.get(c) for c, _ in stmt.columns} for r in inputs[stmt.name]],
                    arrow_schema(schema)))
            except (pa.ArrowException, TypeError, ValueError):  # values Arrow does not take
                rows = [tuple(r.get(c) for c, _ in stmt.columns) for r in inputs[stmt.name]]
                frame = spark.createDataFrame(rows, schema)
            frame.createOrReplaceTempView(stmt.name)
        elif isinstance(stmt, (ViewStmt, TableStmt)):
            spark.sql(spark_sql(stmt.query)).createOrReplaceTempView(stmt.name)
    return {t: Counter(norm(tuple(r)) for r in spark.table(t).collect()) for t in tables}


def same_rows(got: Counter, want: Counter) -> bool:
    """The same multiset of rows, but for sums of doubles added in another order (Spark's
    own result moves with its partitions): rows that differ are paired if their doubles
    agree to a relative 1e-8 (``norm`` keeps 9 digits: 661061.142 and 661061.141 are
    one sum, rounded on either side of a digit)."""
    if got == want:
        return True
    extra, missing = list((got - want).elements()), list((want - got).elements())
    if len(extra) != len(missing):
        return False
    for row in extra:
        match = next((i for i, m in enumerate(missing) if _close(row, m)), None)
        if match is None:
            return False
        missing.pop(match)
    return True


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-8, abs_tol=1e-12)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def batch_result(spark, sql_text: str, inputs: dict[str, list[dict[str, Any]]],
                 table: str) -> Counter:
    """Run ``table``'s SELECT as a Spark batch query over ``inputs`` (rows per source)."""
    return batch_results(spark, sql_text, inputs, (table,))[table]


def check_tables(spark, warehouse: str | Path, sql_text: str,
                 inputs: dict[str, list[dict[str, Any]]], keyed: dict[str, bool],
                 round_no: int) -> None:
    """Every table's replayed changelog equals its SELECT run as a batch query over
    ``inputs``, its current-state table equals the replay, and its changelog keeps the
    contract (``keyed``: table name -> has a primary key)."""
    results = batch_results(spark, sql_text, inputs, keyed)
    for name, pk in keyed.items():
        got = replay(warehouse, name)
        assert same_rows(got, results[name]), f"round {round_no}, {name}: replay != batch SQL"
        assert current(warehouse, name) == got, f"{name}: current != replay"
        check_changelog(warehouse, name, pk=pk)


def check_sink(messages: list[dict], warehouse: Path, table: str, key: tuple[str, ...],
               tombstones: bool) -> None:
    """The topic holds every change event of ``table`` exactly once (by its identity: batch,
    seq, tombstone), each key's events in batch order, and replayed by key it equals the
    table's replayed changelog."""
    ids = Counter((m["headers"]["octo.batch"], m["headers"]["octo.seq"],
                   "octo.tombstone" in m["headers"]) for m in messages)
    twice = [i for i, n in ids.items() if n > 1]
    assert not twice, f"{table}: published more than once: {twice[:5]}"
    events = [m for m in messages if m["value"] is not None]
    got = Counter(event_identity(json.loads(m["value"])) for m in events)
    want = Counter(event_identity(e) for e in changelog_events(warehouse, table))
    assert got == want, f"{table}: the topic's events differ from the changelog"
    last: dict = {}  # per key (and partition): the last (batch, seq) seen
    alive: dict = {}  # replay by key
    rows: Counter = Counter()  # replay of a keyless table
    for m in messages:
        value = json.loads(m["value"]) if m["value"] is not None else None
        at = (int(m["headers"]["octo.batch"]), int(m["headers"]["octo.seq"]),
              m["value"] is None)
        if key:
            assert m["key"] is not None
            k = (m["partition"], m["key"])
            assert last.get(k, (-1, -1, True)) < at, f"{table}: key {m['key']} out of order"
            last[k] = at
            if value is None:
                assert tombstones and alive.get(m["key"], "gone") is None, \
                    f"{table}: a tombstone that does not follow a delete"
                alive.pop(m["key"])
                continue
            assert json.loads(m["key"]) == {c: (value["after"] or value["before"])[c]
                                            for c in key}
            assert value["source"]["table"] == table and value["ts_ms"] > 0
            alive[m["key"]] = value["after"]
        else:
            assert m["key"] is None and value is not None
            if value["before"] is not None:
                rows[norm(value["before"])] -= 1
            if value["after"] is not None:
                rows[norm(value["after"])] += 1
    if key:
        deletes_left = [k for k, v in alive.items() if v is None]
        assert not tombstones or not deletes_left, f"{table}: a delete without its tombstone"
        rows = Counter(norm(v) for v in alive.values() if v is not None)
    assert +rows == replay(warehouse, table), f"{table}: the topic replayed != the table"


def write_lines(directory: Path, name: str, lines: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    final = directory / name
    tmp.rename(final)
    return final


def _json(value: Any) -> str:
    """A record as JSON; decimals as JSON numbers (exact: their text)."""
    return json.dumps(value, default=lambda d: float(d) if isinstance(d, Decimal) else d)


@dataclass
class RandomInput:
    """Random rows ``(id, k, g, v, d)`` as appends or as a consistent Debezium feed."""

    seed: int
    debezium: bool
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # alive rows by id
    appended: list[dict[str, Any]] = field(default_factory=list)
    next_id: int = 0
    DDL = (("id", "BIGINT"), ("k", "BIGINT"), ("g", "STRING"), ("v", "BIGINT"),
           ("d", "DOUBLE"))

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def row(self) -> dict[str, Any]:
        r = self.rng
        self.next_id += 1
        return {"id": self.next_id, "k": r.randint(0, 12), "g": r.choice(["a", "b", "c", None]),
                "v": None if r.random() < 0.1 else r.randint(-5, 100),
                "d": round(r.uniform(0, 10), 2)}

    def lines(self, n: int, bad: int = 0) -> list[str]:
        """``n`` records (events) as JSON lines, plus ``bad`` malformed ones."""
        out = []
        for _ in range(n):
            if not self.debezium:
                row = self.row()
                self.appended.append(row)
                out.append(_json(row))
                continue
            op = self.rng.choice("ccuud") if self.rows else "c"
            if op == "c":
                row = self.row()
                self.rows[row["id"]] = row
                out.append(_json({"before": None, "after": row, "op": "c"}))
            elif op == "u":
                rid = self.rng.choice(sorted(self.rows))
                old = self.rows[rid]
                new = {**self.row(), "id": rid}
                self.rows[rid] = new
                event = {"before": old, "after": new, "op": "u"}
                out.append(_json({"payload": event} if self.rng.random() < 0.3 else event))
            else:
                rid = self.rng.choice(sorted(self.rows))
                out.append(_json({"before": self.rows.pop(rid), "after": None, "op": "d"}))
        bad_lines = ['{"id": 1, "k": "not a number"}', "{oops"]
        if self.debezium:
            bad_lines.append('{"before": null, "after": null, "op": "u"}')
        out.extend(self.rng.choice(bad_lines) for _ in range(bad))
        self.rng.shuffle(out) if not self.debezium else None
        return out

    def relation(self) -> list[dict[str, Any]]:
        return list(self.rows.values()) if self.debezium else list(self.appended)

    def ddl(self) -> str:
        return ", ".join(f"{c} {t}" for c, t in self.DDL)

"""Watermarks on sources: late records become dead letters, the rest are maintained exactly.

A generator plays the source: it knows how ``max_files_per_batch`` splits each round of
files into batches, so it tracks the watermark the way the definition says (the largest
event time read minus the delay, as it stood when the batch began) and knows which of its
records are late. After every run (a restart), each table's replayed changelog must equal
the same SELECT run as a batch query over the records that were not late, and the dead
letters must hold exactly the late records, once per table.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from octo_platform.errors import SqlError
from octo_platform.frontend.binder import build_catalog
from octo_platform.frontend.parser import parse_sql
from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import check_tables, write_lines

DELAY = timedelta(seconds=30)
START = datetime(2026, 1, 1, 10, 0, 0)
TABLES = {
    "per_user": """SELECT user_id, COUNT(*) AS n, SUM(amount) AS s, MIN(ts) AS first_ts,
        MAX(amount) AS top FROM clicks GROUP BY user_id""",
    "big_clicks": "SELECT id, user_id, ts FROM clicks WHERE amount > 3",
}


def project_sql(debezium: bool, max_files: int) -> str:
    fmt = "debezium-json', primary_key = 'id" if debezium else "json"
    source = (f"CREATE SOURCE clicks (id BIGINT, user_id BIGINT, amount BIGINT, ts TIMESTAMP,\n"
              f"    WATERMARK FOR ts AS ts - INTERVAL '{DELAY.seconds}' SECOND)\n"
              f"WITH (connector = 'files', path = 'data/clicks', format = '{fmt}', "
              f"max_files_per_batch = '{max_files}');")
    return "\n".join([source, *(f"CREATE STREAMING TABLE {n} AS {q};"
                                for n, q in TABLES.items())])


class TimedSource:
    """Random clicks with event times out of order, some later than the watermark allows;
    as appends or as a Debezium feed (creates, updates, deletes) keyed by ``id``."""

    def __init__(self, seed: int, debezium: bool) -> None:
        self.rng = random.Random(seed)
        self.debezium = debezium
        self.clock = START
        self.next_id = 0
        self.watermark: datetime | None = None
        self.alive: dict[int, dict[str, Any]] = {}  # rows as the table should see them
        self.appended: list[dict[str, Any]] = []
        self.late: Counter = Counter()  # (op, id) of every late record

    def time(self) -> datetime:
        """An event time around the clock: mostly a little behind it, sometimes far
        behind (maybe late), sometimes exactly at the watermark or just below it."""
        r = self.rng
        self.clock += timedelta(seconds=r.randint(1, 8))
        if self.watermark is not None and r.random() < 0.08:
            return self.watermark - timedelta(microseconds=r.choice([0, 1]))
        if r.random() < 0.2:
            return self.clock - timedelta(seconds=r.randint(0, 3 * DELAY.seconds))
        return self.clock - timedelta(seconds=r.randint(0, DELAY.seconds // 3))

    def row(self, rid: int | None = None) -> dict[str, Any]:
        if rid is None:
            self.next_id += 1
            rid = self.next_id
        return {"id": rid, "user_id": self.rng.randint(0, 5),
                "amount": self.rng.randint(0, 9), "ts": self.time()}

    def batch(self, files: int) -> list[list[str]]:
        """The lines of ``files`` files that form one batch; afterwards the watermark is
        where the batch leaves it."""
        times: list[datetime] = []
        out: list[list[str]] = []
        for _ in range(files):
            lines = []
            for _ in range(self.rng.randint(3, 12)):
                op, image, line = self.event()
                when = image["ts"]
                if self.watermark is not None and when < self.watermark:
                    self.late[(op, image["id"])] += 1
                else:
                    times.append(when)
                    self.apply(op, image)
                lines.append(line)
            if self.rng.random() < 0.3:  # no event time: a dead letter, never late
                self.next_id += 1
                lines.append(json.dumps({"id": self.next_id, "user_id": 1, "amount": 1}))
            out.append(lines)
        if times:
            mark = max(times) - DELAY
            self.watermark = mark if self.watermark is None else max(self.watermark, mark)
        return out

    def event(self) -> tuple[str, dict[str, Any], str]:
        """(op, the image whose time decides lateness, the JSON line)."""
        if not self.debezium:
            row = self.row()
            return "c", row, json.dumps(_jsonable(row))
        op = self.rng.choice("ccud") if self.alive else "c"
        if op == "c":
            row = self.row()
            return "c", row, json.dumps({"before": None, "after": _jsonable(row), "op": "c"})
        rid = self.rng.choice(sorted(self.alive))
        old = self.alive[rid]
        if op == "u":
            new = self.row(rid)
            return "u", new, json.dumps({"before": _jsonable(old), "after": _jsonable(new),
                                         "op": "u"})
        return "d", old, json.dumps({"before": _jsonable(old), "after": None, "op": "d"})

    def apply(self, op: str, image: dict[str, Any]) -> None:
        if not self.debezium:
            self.appended.append(image)
        elif op == "d":
            del self.alive[image["id"]]
        else:
            self.alive[image["id"]] = image

    def relation(self) -> list[dict[str, Any]]:
        return list(self.alive.values()) if self.debezium else list(self.appended)


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "ts": row["ts"].isoformat()}


def late_dead_letters(warehouse: Path, table: str) -> tuple[Counter, int]:
    """(op, id) of the table's dead letters whose reason says late, and the others' count."""
    path = warehouse / "_dead_letters" / table
    if not path.exists():
        return Counter(), 0
    late: Counter = Counter()
    other = 0
    for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist():
        if not r["reason"].startswith("late: ts "):
            other += 1
            continue
        assert "is below the watermark" in r["reason"]
        raw = json.loads(r["raw"])
        image = raw["after"] or raw["before"] if "op" in raw else raw
        late[(raw.get("op", "c"), image["id"])] += 1
    return late, other


@pytest.mark.parametrize("debezium", [False, True], ids=["append-only", "debezium"])
def test_late_records_are_dead_letters_and_the_rest_matches_batch_sql(spark, tmp_path,
                                                                       debezium):
    seed = 20261125 + int(debezium)
    rng = random.Random(seed)
    max_files = rng.randint(1, 2)
    sql = project_sql(debezium, max_files)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "clicks.sql").write_text(sql)
    project = load_project(tmp_path)
    keyed = {n: project.table(n).physical.pk is not None for n in TABLES}
    src = TimedSource(seed, debezium)
    no_time = 0
    for round_no in range(4):
        files = rng.randint(1, 4)
        written = 0
        while written < files:  # the batches this run will make, in file-name order
            chunk = src.batch(min(max_files, files - written))
            for lines in chunk:
                no_time += sum(1 for line in lines if '"ts"' not in line)
                write_lines(tmp_path / "data" / "clicks", f"r{round_no}-{written}.json", lines)
                written += 1
        report = run_tables(spark, tmp_path, options=default_options(buckets=4, progress=None),
                            until_idle=True)
        assert report.batches
        check_tables(spark, tmp_path / "warehouse", sql, {"clicks": src.relation()}, keyed,
                     round_no)
        for table in TABLES:
            late, other = late_dead_letters(tmp_path / "warehouse", table)
            assert late == src.late, f"round {round_no}, {table}: late dead letters differ"
            assert other == no_time
    assert sum(src.late.values()) > 3, "the generator made late records"
    last = max(report.batches, key=lambda b: b.batch)
    assert last.watermark is not None
    assert last.to_json()["watermark"] == str(src.watermark)


def test_watermark_boundaries_and_resume(spark, tmp_path):
    """A record exactly at the watermark is on time, one microsecond below is late; the
    watermark never goes back and a new run resumes from the one committed."""
    sql = project_sql(False, 1)
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "clicks.sql").write_text(sql)
    data = tmp_path / "data" / "clicks"

    def click(i: int, ts: str) -> str:
        return json.dumps({"id": i, "user_id": 1, "amount": 5, "ts": ts})

    write_lines(data, "a.json", [click(1, "2026-01-01T10:10:00")])  # watermark 10:09:30
    run = run_tables(spark, tmp_path, options=default_options(buckets=2, progress=None),
                     until_idle=True)
    assert [b.to_json()["watermark"] for b in run.batches if b.table == "big_clicks"] == [
        "2026-01-01 10:09:30"]
    write_lines(data, "b.json", [click(2, "2026-01-01T10:09:30"),
                                 click(3, "2026-01-01T10:09:29.999999"),
                                 click(4, "2026-01-01T09:00:00")])  # none moves it forward
    write_lines(data, "c.json", [click(5, "2026-01-01T10:09:29.999999")])
    run = run_tables(spark, tmp_path, options=default_options(buckets=2, progress=None),
                     until_idle=True)
    assert [(b.rows_in, b.late_rows, b.to_json()["watermark"]) for b in run.batches
            if b.table == "big_clicks"] == [
        (1, 2, "2026-01-01 10:09:30"), (0, 1, "2026-01-01 10:09:30")]
    late, _ = late_dead_letters(tmp_path / "warehouse", "big_clicks")
    assert late == Counter({("c", 3): 1, ("c", 4): 1, ("c", 5): 1})
    rows = DeltaTable(str(tmp_path / "warehouse" / "_dead_letters" / "big_clicks"))
    reasons = {json.loads(r["raw"])["id"]: r["reason"] for r in rows.to_pyarrow_table()
               .to_pylist()}
    assert reasons[3] == ("late: ts 2026-01-01 10:09:29.999999 is below the watermark "
                          "2026-01-01 10:09:30")


@pytest.mark.parametrize("column_list, message", [
    ("ts TIMESTAMP, WATERMARK FOR tx AS tx", "WATERMARK FOR tx: no such column"),
    ("ts STRING, WATERMARK FOR ts AS ts", "must be a TIMESTAMP (it is STRING)"),
    ("ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' MONTH", "must be ts or ts - INTERVAL"),
    ("ts TIMESTAMP, WATERMARK FOR ts AS ts + INTERVAL '1' SECOND", "must be ts or ts - INTERVAL"),
    ("ts TIMESTAMP, WATERMARK FOR ts ts", "expected AS <expression> after WATERMARK FOR ts"),
    ("ts TIMESTAMP, WATERMARK FOR ts AS ts, WATERMARK FOR ts AS ts", "at most one WATERMARK"),
])
def test_watermark_errors_point_at_the_clause(column_list, message):
    text = (f"CREATE SOURCE s (id BIGINT,\n  {column_list})\n"
            "WITH (connector = 'files', path = 'd', format = 'json');")
    with pytest.raises(SqlError) as err:
        build_catalog(parse_sql(text, path="s.sql"))
    assert message in str(err.value)
    assert str(err.value).startswith("s.sql:2:")


def test_watermark_is_declared_with_the_columns():
    text = ("CREATE SOURCE s (WATERMARK FOR `ts` AS ts - INTERVAL '1.5' SECONDS, id BIGINT, "
            "ts TIMESTAMP) WITH (connector = 'files', path = 'd', format = 'json');")
    source = build_catalog(parse_sql(text)).sources["s"]
    assert source.columns == ("id", "ts")
    assert (source.watermark.column, source.watermark.delay_us) == ("ts", 1_500_000)
    delta = text.replace("'files', path = 'd', format = 'json'", "'delta', path = 'd'")
    with pytest.raises(SqlError, match="a WATERMARK needs connector 'files' or 'kafka'"):
        build_catalog(parse_sql(delta))

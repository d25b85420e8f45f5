"""Timed test input: a source whose records carry event times out of order, some late.

``TimedSource`` knows how ``max_files_per_batch`` splits each round of files into batches,
so it tracks the watermark the way the definition says (the largest event time read minus
the delay, as it stood when the batch began) and knows which of its records are late.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from tests.oracle import write_lines

DELAY = timedelta(seconds=30)
START = datetime(2026, 1, 1, 10, 0, 0)


PLAIN_SQL = ("CREATE SOURCE plain (id BIGINT, ts TIMESTAMP) WITH (connector = 'files', "
             "path = 'p', format = 'json');")  # a source without a watermark


def assert_error_at(statements: list[str], marker: str, message: str) -> None:
    """Binding ``statements`` (after the timed ``clicks``, a Debezium ``cdc`` and ``plain``
    sources) fails with ``message``, pointing at the first ``marker`` in the text."""
    from octo_platform.errors import SqlError
    from octo_platform.frontend.binder import build_catalog
    from octo_platform.frontend.parser import parse_sql

    text = "\n".join([source_sql(False, 1), source_sql(True, 1).replace("clicks", "cdc"),
                      PLAIN_SQL, *statements])
    at = text.index(marker)
    line, col = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
    try:
        build_catalog(parse_sql(text, path="e.sql"))
    except SqlError as e:
        assert message in str(e), str(e)
        assert str(e).startswith(f"e.sql:{line}:{col}:"), str(e)
    else:
        raise AssertionError(f"no error: {message}")


def source_sql(debezium: bool, max_files: int) -> str:
    fmt = "debezium-json', primary_key = 'id" if debezium else "json"
    return (f"CREATE SOURCE clicks (id BIGINT, user_id BIGINT, amount BIGINT, ts TIMESTAMP,\n"
            f"    WATERMARK FOR ts AS ts - INTERVAL '{DELAY.seconds}' SECOND)\n"
            f"WITH (connector = 'files', path = 'data/clicks', format = '{fmt}', "
            f"max_files_per_batch = '{max_files}');")


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


def write_round(source: TimedSource, rng: random.Random, directory: Path, round_no: int,
                max_files: int) -> int:
    """Write a round of 1-4 files, generated batch by batch as the next run will read
    them (file-name order, ``max_files`` a batch); the count of records without a time."""
    files, written, no_time = rng.randint(1, 4), 0, 0
    while written < files:
        for lines in source.batch(min(max_files, files - written)):
            no_time += sum(1 for line in lines if '"ts"' not in line)
            write_lines(directory, f"r{round_no}-{written}.json", lines)
            written += 1
    return no_time


def timed_oracle(spark, root: Path, tables: dict[str, str], seed: int, debezium: bool, *,
                 rounds: int = 3, each_round=None, check=None, path: str = "mixed"
                 ) -> TimedSource:
    """The timed ``clicks`` source and ``tables`` (name -> SELECT) in a project under
    ``root``; ``rounds`` rounds of input, each a separate run, after each of which every
    table's replayed changelog equals its SELECT as a batch query over the records that
    were not late (or, given ``check(source, sql, project, round_no)``, what that checks).
    ``each_round(source, round_no, report, records_without_time)`` checks more. ``path``:
    where batches run (``oracle.PATHS``; by default the driver and Spark by turns)."""
    from octo_platform.project import load_project
    from octo_platform.runtime.runner import run_tables
    from octo_platform.wiring import default_options
    from tests.oracle import check_tables, driver_rows

    rng = random.Random(seed)
    max_files = rng.randint(1, 2)
    sql = "\n".join([source_sql(debezium, max_files),
                     *(f"CREATE STREAMING TABLE {n} AS {q};" for n, q in tables.items())])
    (root / "sql").mkdir()
    (root / "sql" / "tables.sql").write_text(sql)
    project = load_project(root)
    keyed = {n: project.table(n).physical.pk is not None for n in tables}
    src = TimedSource(seed, debezium)
    for round_no in range(rounds):
        no_time = write_round(src, rng, root / "data" / "clicks", round_no, max_files)
        report = run_tables(spark, root, options=default_options(
            buckets=4, progress=None, driver_rows=driver_rows(path, round_no)), until_idle=True)
        if check is None:
            check_tables(spark, root / "warehouse", sql, {"clicks": src.relation()}, keyed,
                         round_no)
        else:
            check(src, sql, project, round_no)
        if each_round is not None:
            each_round(src, round_no, report, no_time)
    return src

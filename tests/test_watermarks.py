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

import pytest
from deltalake import DeltaTable

from octo_platform.errors import SqlError
from octo_platform.frontend.binder import build_catalog
from octo_platform.frontend.parser import parse_sql
from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.wiring import default_options
from tests.oracle import write_lines
from tests.timed import (
    TimedSource,
    assert_error_at,
    late_dead_letters,
    source_sql,
    timed_oracle,
)

TABLES = {
    "per_user": """SELECT user_id, COUNT(*) AS n, SUM(amount) AS s, MIN(ts) AS first_ts,
        MAX(amount) AS top FROM clicks GROUP BY user_id""",
    "big_clicks": "SELECT id, user_id, ts FROM clicks WHERE amount > 3",
}


def project_sql(debezium: bool, max_files: int) -> str:
    return "\n".join([source_sql(debezium, max_files),
                      *(f"CREATE STREAMING TABLE {n} AS {q};" for n, q in TABLES.items())])


@pytest.mark.parametrize("debezium", [False, True], ids=["append-only", "debezium"])
def test_late_records_are_dead_letters_and_the_rest_matches_batch_sql(spark, tmp_path,
                                                                       debezium):
    dead = {"no_time": 0}

    def dead_letters(src, round_no, report, no_time) -> None:
        assert report.batches
        dead["no_time"] += no_time
        for table in TABLES:
            late, other = late_dead_letters(tmp_path / "warehouse", table)
            assert late == src.late, f"round {round_no}, {table}: late dead letters differ"
            assert other == dead["no_time"]
        dead["last"] = max(report.batches, key=lambda b: b.batch)

    src = timed_oracle(spark, tmp_path, TABLES, 20261125 + int(debezium), debezium,
                       rounds=4, each_round=dead_letters)
    assert sum(src.late.values()) > 3, "the generator made late records"
    last = dead["last"]
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

    # Dagster's materialization and the backlog sensor's observation carry them too.
    import time

    import dagster as dg

    from orchestration.automation import observation
    from orchestration.runs import run_metadata
    from octo_platform.runtime.status import table_status

    options = default_options(buckets=2, progress=None)
    status = table_status(load_project(tmp_path), "big_clicks", options=options)
    meta = run_metadata(run.for_table("big_clicks"), status, 1.0)
    assert (meta["watermark"], meta["late_rows"], meta["dead_letters"]) == (
        "2026-01-01 10:09:30", 3, 3)
    seen = observation(dg.AssetKey("big_clicks"), status, time.time()).metadata
    assert (seen["watermark"].value, seen["late_rows"].value) == ("2026-01-01 10:09:30", 3)


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


def test_a_kafka_source_with_a_watermark(spark, tmp_path):
    """Late Kafka records become dead letters naming their partition and offset."""
    from tests.kafka_broker import Producer, create_topic, tansu

    with tansu() as address:
        create_topic(address, "clicks", 2)
        (tmp_path / "sql").mkdir()
        (tmp_path / "sql" / "k.sql").write_text(
            "CREATE SOURCE clicks (id BIGINT, user_id BIGINT, amount BIGINT, ts TIMESTAMP,\n"
            "  WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE)\n"
            f"WITH (connector = 'kafka', bootstrap_servers = '{address}', topic = 'clicks', "
            "format = 'json');\n"
            "CREATE STREAMING TABLE per_user AS SELECT user_id, COUNT(*) AS n FROM clicks "
            "GROUP BY user_id;")
        producer = Producer(address)

        def send(partition: int, i: int, ts: str) -> None:
            producer.send("clicks", partition, json.dumps(
                {"id": i, "user_id": i % 2, "amount": 1, "ts": ts}))

        send(0, 1, "2026-01-01T10:00:00")
        send(1, 2, "2026-01-01T10:05:00")  # watermark 10:04:00
        options = default_options(buckets=2, progress=None)
        run_tables(spark, tmp_path, options=options, until_idle=True)
        send(0, 3, "2026-01-01T10:03:59")  # late
        send(1, 4, "2026-01-01T10:04:00")  # on time
        run = run_tables(spark, tmp_path, options=options, until_idle=True)
        assert [(b.rows_in, b.late_rows) for b in run.batches] == [(1, 1)]
    dead = DeltaTable(str(tmp_path / "warehouse" / "_dead_letters" / "per_user"))
    (row,) = dead.to_pyarrow_table().to_pylist()
    assert row["reason"].startswith("late: ts 2026-01-01 10:03:59 is below the watermark "
                                    "2026-01-01 10:04:00")
    assert row["source_file"] == "clicks/0@1" and json.loads(row["raw"])["id"] == 3
    rows = DeltaTable(str(tmp_path / "warehouse" / "_current" / "per_user")).to_pyarrow_table()
    assert sorted(zip(rows.column("user_id").to_pylist(), rows.column("n").to_pylist())) == [
        (0, 2), (1, 1)]


@pytest.mark.parametrize("path", ["spark", "driver"])
def test_state_ttl_forgets_state_and_keeps_the_changelog_consistent(spark, tmp_path, path):
    """With ``state_ttl``, a GROUP BY forgets a group once the watermark passes its last
    change plus the TTL, and an inner join forgets a stored row once the watermark passes
    the batch that stored it plus the TTL. A user's next change starts its group afresh and
    the changelog replaces the old row with a ``u`` (never a second row), its distinct values
    forgotten too; a later click no longer pairs with forgotten join rows, and pairs already
    made stay. The generator
    replays both rules batch by batch. Every batch runs as Spark jobs, or in the driver."""
    from tests.oracle import changelog_events, check_changelog, check_paths, driver_rows, \
        replay, write_lines

    seed, ttl = 20261131, timedelta(seconds=20)
    rng = random.Random(seed)
    pairs_sql = "FROM clicks a JOIN clicks b ON a.user_id = b.user_id AND a.id < b.id"
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "ttl.sql").write_text("\n".join([
        source_sql(False, 1),
        "CREATE STREAMING TABLE per_user WITH (state_ttl = '20 seconds') AS "
        "SELECT user_id, COUNT(*) AS n, SUM(amount) AS s, COUNT(DISTINCT amount % 3) AS d "
        "FROM clicks GROUP BY user_id;",
        "CREATE STREAMING TABLE pairs WITH (state_ttl = '20 seconds') AS "
        f"SELECT a.id AS first_id, b.id AS second_id {pairs_sql};",
        "CREATE STREAMING TABLE pair_counts WITH (state_ttl = '20 seconds') AS "
        f"SELECT a.user_id, COUNT(*) AS n, SUM(b.amount) AS s {pairs_sql} GROUP BY a.user_id;"]))
    project = load_project(tmp_path)
    explained = project.explain("pair_counts")
    assert explained.count("state_ttl=20 SECOND") == 4, explained  # join, GROUP BY; twice
    src = TimedSource(seed, False)
    stored: list[tuple[dict, datetime]] = []  # the join's rows, with their batch's watermark
    pairs: Counter = Counter()
    # per table, per user: [count, sum, the watermark the batch of its last change commits,
    # the distinct values of amount % 3]
    groups: dict[str, dict[int, list]] = {"per_user": {}, "pair_counts": {}}
    forgotten = Counter()

    def add(table: str, user: int, n: int, amount: int, expired) -> None:
        group = groups[table].get(user)
        if group is None or expired(group[2]):
            forgotten[table] += group is not None
            group = groups[table][user] = [0, 0, None, set()]
        group[0] += n
        group[1] += amount
        group[2] = src.watermark
        group[3].add(amount % 3)

    for round_no in range(3):
        for f in range(rng.randint(3, 5)):
            before, seen = src.watermark, len(src.appended)
            (lines,) = src.batch(1)
            write_lines(tmp_path / "data" / "clicks", f"r{round_no}-{f}.json", lines)
            rows = src.appended[seen:]

            def expired(mark: datetime | None, before=before) -> bool:
                return before is not None and mark is not None and mark + ttl <= before

            alive = [r for r, mark in stored if not expired(mark)]
            forgotten["join rows"] += len(stored) - len(alive)
            for b in rows:
                add("per_user", b["user_id"], 1, b["amount"], expired)
                made = [a for a in alive + rows if a["user_id"] == b["user_id"]
                        and a["id"] < b["id"]]
                pairs.update((a["id"], b["id"]) for a in made)
                if made:
                    add("pair_counts", b["user_id"], len(made), b["amount"] * len(made), expired)
            stored = [(r, mark) for r, mark in stored if not expired(mark)] + [
                (r, src.watermark) for r in rows]  # the watermark this batch commits
        report = run_tables(spark, tmp_path, options=default_options(
            buckets=2, progress=None, driver_rows=driver_rows(path, round_no)), until_idle=True)
        check_paths(report, project, path, round_no)
        assert replay(tmp_path / "warehouse", "pairs") == pairs, round_no
        for table in groups:
            assert replay(tmp_path / "warehouse", table) == Counter(
                {(u, n, s, *([len(d)] if table == "per_user" else [])): 1
                 for u, (n, s, _, d) in groups[table].items()}), (table, round_no)
            check_changelog(tmp_path / "warehouse", table, pk=True)
    assert all(forgotten[k] for k in ("per_user", "pair_counts", "join rows")), forgotten
    for table in groups:  # one row per user, ever
        ops = Counter(e["op"] for e in changelog_events(tmp_path / "warehouse", table))
        assert ops["c"] == len(groups[table]) and not ops["d"], (table, ops)
    ops = Counter(e["op"] for e in changelog_events(tmp_path / "warehouse", "pairs"))
    assert set(ops) == {"c"}  # pairs already made are never retracted


@pytest.mark.parametrize("ttl, query, message", [
    ("soon", "SELECT user_id, COUNT(*) AS n FROM clicks GROUP BY user_id",
     "state_ttl must be '<n> <unit>'"),
    ("1 hour", "SELECT c.user_id, COUNT(*) AS n FROM clicks c LEFT JOIN plain p ON c.id = p.id "
     "GROUP BY c.user_id", "no outer joins, SESSION windows, top-N or other GROUP BYs below"),
    ("1 hour", "SELECT id, user_id FROM clicks", "applies to the state of a GROUP BY"),
    ("1 hour", "SELECT id, COUNT(*) AS n FROM plain GROUP BY id", "needs a watermark"),
])
def test_state_ttl_errors_point_at_the_option(ttl, query, message):
    assert_error_at([f"CREATE STREAMING TABLE t WITH (state_ttl = '{ttl}') AS {query};"],
                    "state_ttl =", message)

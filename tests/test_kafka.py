"""Kafka sources against a real broker (tansu on a loopback port): Debezium and JSON topics
over 3 partitions, in rounds (each a separate run, restarting from the batch log), checked
against the batch oracle; malformed messages as dead letters with partition and offset;
offsets from the batch log, not the consumer group; clear errors for a missing topic."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from octo_platform.errors import OctoError
from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.runtime.status import table_status
from octo_platform.wiring import default_options
from state.delta import DeltaStore
from tests.kafka_broker import Producer, create_topic, fails_naming, tansu

# Waits on other processes most of the time: runs beside the rest (tests/suite.py).
pytestmark = pytest.mark.processes
from tests.oracle import RandomInput, check_tables

TABLES = {
    "per_group": "SELECT g, COUNT(*) AS n, SUM(v) AS total FROM accounts GROUP BY g",
    "joined": """SELECT a.id, a.g, c.id AS cid FROM accounts a JOIN clicks c
        ON a.k = c.k AND c.v > a.v""",
    "copied": "SELECT id, k, v FROM clicks WHERE g IS NOT NULL",
}


def _project(tmp_path, address: str) -> str:
    ddl = RandomInput(0, False).ddl()
    sql = "\n".join([
        f"CREATE SOURCE accounts ({ddl}) WITH (connector = 'kafka', "
        f"bootstrap_servers = '{address}', topic = 'dbserver.public.accounts', "
        "format = 'debezium-json', primary_key = 'id', max_records_per_batch = '7');",
        f"CREATE SOURCE clicks ({ddl}) WITH (connector = 'kafka', bootstrap_servers = "
        f"'{address}', topic = 'clicks', format = 'json', kafka.client.id = 'octo-test');",
        *(f"CREATE STREAMING TABLE {name} AS {sql};" for name, sql in TABLES.items()),
    ])
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    return sql


def _row_id(line: str) -> int | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    event = event.get("payload", event) if isinstance(event, dict) else {}
    image = (event.get("after") or event.get("before") or {}) if isinstance(event, dict) else {}
    return image.get("id") if isinstance(image, dict) else None


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_kafka_sources_match_batch_sql(spark, tmp_path, path):
    """Each path fetches the ranges its batches logged (the driver path in the driver, the
    Spark path by executors) and parses them alike. The Spark path's variant runs one round
    of input (still several batches): its batches cost seconds each."""
    rng = random.Random(20261125)
    with tansu() as address:
        create_topic(address, "dbserver.public.accounts", 3)
        create_topic(address, "clicks", 3)
        sql = _project(tmp_path, address)
        producer = Producer(address)
        accounts, clicks = RandomInput(1, True), RandomInput(2, False)
        options = default_options(buckets=4, progress=None,
                                  driver_rows=0 if path == "spark" else 10**6)
        bad = 0
        for round_no in range(3 if path == "driver" else 1):
            for line in accounts.lines(rng.randint(8, 20), bad=1):
                rid = _row_id(line)  # one key's events stay in order: partition by key
                bad += rid is None
                producer.send("dbserver.public.accounts",
                              rid % 3 if rid is not None else rng.randrange(3), line,
                              key=None if rid is None else str(rid))
            producer.send("dbserver.public.accounts", 1, None, key="1")  # a tombstone
            producer.send("dbserver.public.accounts", 2, json.dumps(  # an unknown op
                {"before": None, "after": {"id": 2, "k": 1}, "op": "x"}))
            bad += 1
            for line in clicks.lines(rng.randint(5, 15)):
                producer.send("clicks", rng.randrange(3), line)
            report = run_tables(spark, tmp_path, options=options, until_idle=True)
            assert report.batches and {b.path for b in report.batches} == {path}
            project = load_project(tmp_path)
            for name in TABLES:
                assert table_status(project, name, options=options).waiting == 0
            check_tables(spark, tmp_path / "warehouse", sql,
                         {"accounts": accounts.relation(), "clicks": clicks.relation()},
                         {n: load_project(tmp_path).table(n).physical.pk is not None
                          for n in TABLES}, round_no)
        # max_records_per_batch = 7 split the accounts topic into several batches per round
        assert max(b.batch for b in report.for_table("per_group")) >= (5 if path == "driver" else 1)
        dead = DeltaStore().read(str(tmp_path / "warehouse" / "_dead_letters" / "per_group"))
        assert dead is not None and dead.num_rows == bad
        assert "unsupported op x" in dead.column("reason").to_pylist()
        for where in dead.column("source_file").to_pylist():
            topic, _, at = where.rpartition("/")
            partition, _, offset = at.partition("@")
            assert topic == "dbserver.public.accounts" and int(partition) in range(3)
            assert int(offset) >= 0

        # Lag tools see each table's progress as its consumer group's offsets.
        admin = AdminClient({"bootstrap.servers": address})
        asked = ConsumerGroupTopicPartitions("octo.per_group", [
            TopicPartition("dbserver.public.accounts", p) for p in range(3)])
        got = admin.list_consumer_group_offsets([asked])["octo.per_group"].result(timeout=30)
        ends = {tp.partition: tp.offset for tp in got.topic_partitions}
        probe = Consumer({"bootstrap.servers": address, "group.id": "probe"})
        highs = {p: probe.get_watermark_offsets(
            TopicPartition("dbserver.public.accounts", p), timeout=10)[1] for p in range(3)}
        probe.close()
        # a partition with nothing to read yet has no offset committed (librdkafka: -1001)
        assert all(ends[p] == high or high == 0 and ends[p] < 0
                   for p, high in highs.items()), (ends, highs)

        # A rerun with nothing new makes no batch: offsets come from the batch log.
        assert not run_tables(spark, tmp_path, options=options, until_idle=True).batches


def test_missing_topic_fails_with_the_source_named(spark, tmp_path):
    with tansu() as address:
        (tmp_path / "sql").mkdir()
        (tmp_path / "sql" / "t.sql").write_text(
            f"CREATE SOURCE s (id BIGINT) WITH (connector = 'kafka', bootstrap_servers = "
            f"'{address}', topic = 'nope', format = 'json', kafka.sasl.password = 'hunter2', "
            "broker_timeout = '2 seconds');\n"
            "CREATE STREAMING TABLE t AS SELECT id FROM s;")
        options = default_options(progress=None)
        with pytest.raises(OctoError) as got:
            table_status(load_project(tmp_path), "t", options=options)
        assert "source 's'" in str(got.value) and "nope" in str(got.value)
        assert "hunter2" not in str(got.value)
        with pytest.raises(OctoError) as got:  # a run plans its batches in Spark's source runner
            run_tables(spark, tmp_path, options=options, until_idle=True)
        assert "source 's'" in str(got.value) and "topic not found" in str(got.value)
        assert "hunter2" not in str(got.value)
        # ... nor where Dagster shows the source
        from orchestration.assets import source_spec
        from orchestration.translator import OctoTranslator

        spec = source_spec(load_project(tmp_path), "s", OctoTranslator())
        shown = f"{spec.description} {spec.metadata}"
        assert "kafka.sasl.password" in shown and "hunter2" not in shown
        assert spec.kinds == {"kafka"}


def test_an_unreachable_broker_fails_naming_the_source(tmp_path):
    from connectors.tansu import free_port

    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "t.sql").write_text(
        f"CREATE SOURCE s (id BIGINT) WITH (connector = 'kafka', bootstrap_servers = "
        f"'127.0.0.1:{free_port()}', topic = 't', format = 'json', "
        "broker_timeout = '2 seconds');\n"
        "CREATE STREAMING TABLE t AS SELECT id FROM s;")
    with pytest.raises(OctoError, match=r"source 's' \(topic 't' at 127\.0\.0\.1:\d+\): "
                       r"broker not reachable: metadata request: no answer within 2s \(.+\)"):
        table_status(load_project(tmp_path), "t", options=default_options(progress=None))


def test_each_call_to_a_broker_that_went_away_names_the_source(spark, tmp_path, monkeypatch):
    """Whichever call the broker stops answering (metadata, watermarks, the fetch by
    executors or in the driver, the consumer group's offset commit), the error names the
    source, its topic and brokers, and the call, once the source's broker_timeout has
    passed; with the broker back, the next run reads the batch it had logged, each message
    once."""
    from dataclasses import replace

    import connectors.kafka as kafka
    from tests.kafka_broker import pause, pause_at_watermarks, paused, resume
    from tests.oracle import norm, replay

    with tansu() as address:
        create_topic(address, "cdc", 3)
        producer = Producer(address)
        for i in range(6):
            producer.send("cdc", i % 3, json.dumps({"id": i}))
        (tmp_path / "sql").mkdir()
        source_sql = (f"CREATE SOURCE s (id BIGINT) WITH (connector = 'kafka', "
                      f"bootstrap_servers = '{address}', topic = 'cdc', format = 'json'")
        table_sql = "CREATE STREAMING TABLE t AS SELECT id FROM s;"
        (tmp_path / "sql" / "t.sql").write_text(
            f"{source_sql}, broker_timeout = '2 seconds');\n{table_sql}")
        source = kafka.KafkaSource.from_options("s", load_project(tmp_path).source("s").options)
        assert source.timeout_s == 2.0
        where = f"source 's' (topic 'cdc' at {address}): broker not reachable: "

        def fails(call: str, action) -> None:
            fails_naming(where, call, action)

        with paused(address):
            fails("metadata request: no answer", lambda: kafka.watermarks(source))
            fails("offset commit of consumer group 'octo.t': no answer",
                  lambda: kafka.commit_offsets(source, "t", {"0": [0, 2]}))
        with monkeypatch.context() as patched:
            pause_at_watermarks(patched, address, "cdc")
            try:
                fails("watermark offsets of partition 0: no answer",
                      lambda: kafka.watermarks(source))
            finally:
                resume(address)

        # The broker goes away once the batch's ranges are planned and logged: the fetch,
        # in the driver (the driver path), then by executors (the Spark path, which also
        # runs a batch resumed, as the batch logged by the first attempt is).
        options = default_options(progress=None)
        for path, read, driver_rows in (("read_kafka_local", kafka.read_local, 10**6),
                                        ("read_kafka", kafka.read, 0)):
            def read_then_pause(spark, src, ranges, read=read):
                pause(address)
                return read(spark, src, ranges)

            gone = replace(options, driver_rows=driver_rows,
                           env=replace(options.env, **{path: read_then_pause}))
            try:
                fails("fetch of partition ", lambda: run_tables(spark, tmp_path, options=gone,
                                                                 until_idle=True))
            finally:
                resume(address)
        (tmp_path / "sql" / "t.sql").write_text(f"{source_sql});\n{table_sql}")
        report = run_tables(spark, tmp_path, options=options, until_idle=True)
        assert [b.batch for b in report.for_table("t")] == [0]
        assert replay(tmp_path / "warehouse", "t") == Counter(norm({"id": i}) for i in range(6))


def _planned(tmp_path, options: dict[str, str], marks: dict[str, list[int]],
             batches: list[dict[str, list[int]]] = ()):
    """Plan the next batch of a Kafka input whose batch log holds ``batches`` (their
    ranges), with the partitions at watermarks ``marks``."""
    from octo_platform.runtime.offsets import BatchLog, InputSpec, kafka_ranges

    spec = InputSpec("source:s", "kafka", "kafka://h:9092/t",
                     options=tuple(sorted(options.items())))
    log = BatchLog(DeltaStore(), str(tmp_path / "log"))
    for i, ranges in enumerate(batches):
        log.append(i, "intent", {spec.key: {"ranges": ranges}}, 0)
    return kafka_ranges(spec, log, marks)


def test_kafka_ranges_are_planned_from_the_batch_log(tmp_path):
    marks = {"0": [0, 10], "1": [0, 4], "2": [3, 3]}
    assert _planned(tmp_path / "a", {}, marks) == {"ranges": {"0": [0, 10], "1": [0, 4]}}
    # max_records_per_batch caps the batch, shared by the partitions (a partition with less
    # waiting leaves the rest of its share to the others)
    assert _planned(tmp_path / "b", {"max_records_per_batch": "12"}, marks) == \
        {"ranges": {"0": [0, 8], "1": [0, 4]}}
    assert _planned(tmp_path / "b2", {"max_records_per_batch": "6"}, marks) == \
        {"ranges": {"0": [0, 3], "1": [0, 3]}}
    # the next batch starts where the logged ones stopped; a new partition at its start
    assert _planned(tmp_path / "c", {}, {**marks, "3": [0, 2]},
                    [{"0": [0, 10], "1": [0, 2]}]) == {"ranges": {"1": [2, 4], "3": [0, 2]}}
    assert _planned(tmp_path / "d", {}, marks, [{"0": [0, 10], "1": [0, 4]}]) is None
    # startup = 'latest': the first batch is empty and logs the high watermarks
    first = _planned(tmp_path / "e", {"startup": "latest"}, marks)
    assert first == {"ranges": {"0": [10, 10], "1": [4, 4], "2": [3, 3]}}
    assert _planned(tmp_path / "e2", {"startup": "latest"}, {"0": [0, 11], "1": [0, 4]},
                    [first["ranges"]]) == {"ranges": {"0": [10, 11]}}


def test_offsets_deleted_before_they_were_read_fail_or_are_skipped(tmp_path):
    read = [{"0": [0, 5]}]
    with pytest.raises(OctoError, match=r"offsets 5\.\.7 of partition 0 .* on_data_loss"):
        _planned(tmp_path / "a", {}, {"0": [8, 20]}, read)
    assert _planned(tmp_path / "b", {"on_data_loss": "skip"}, {"0": [8, 20]}, read) == \
        {"ranges": {"0": [8, 20]}, "lost": 3}


def test_runs_killed_mid_way_read_each_offset_once(spark, tmp_path):
    """SIGKILLed runs (some while a sink publishes) resume from the logged offset ranges:
    the replayed changelog equals the batch query over every message, so nothing was lost
    or read twice; the sink's topic holds each change event once, in order per key."""
    from tests.kafka_broker import read_topic
    from tests.oracle import batch_result, check_changelog, check_sink, current, replay
    from tests.processes import mid_run, octo_run, run_killing

    rng = random.Random(11)
    with tansu() as address:
        create_topic(address, "cdc", 3)
        create_topic(address, "per_k", 3)
        src = RandomInput(5, True)
        sql = (f"CREATE SOURCE src ({src.ddl()}) WITH (connector = 'kafka', bootstrap_servers "
               f"= '{address}', topic = 'cdc', format = 'debezium-json', primary_key = 'id', "
               "max_records_per_batch = '20');\n"
               "CREATE STREAMING TABLE per_k AS SELECT k, COUNT(*) AS n, SUM(v) AS s "
               "FROM src GROUP BY k;\n"
               "CREATE STREAMING TABLE rows AS SELECT id, k, v FROM src WHERE v > 10;\n"
               f"CREATE SINK per_k_out FROM per_k WITH (connector = 'kafka', bootstrap_servers "
               f"= '{address}', topic = 'per_k', tombstones = 'true');")
        (tmp_path / "sql").mkdir()
        (tmp_path / "sql" / "t.sql").write_text(sql)
        producer = Producer(address)
        for line in src.lines(200):
            rid = _row_id(line)
            producer.send("cdc", rid % 3, line, key=str(rid))
        cmd = octo_run(tmp_path)
        log = tmp_path / "runs.log"
        # a random moment after the run's first committed batch (its sinks publish right after it)
        until = mid_run(log, rng)
        kills = run_killing(cmd, log, until=until, kills=2, attempts=4)
        assert kills == 2, "the test must actually kill runs mid-way"
        warehouse = tmp_path / "warehouse"
        for table in ("per_k", "rows"):
            got = replay(warehouse, table)
            assert got == batch_result(spark, sql, {"src": src.relation()}, table), table
            assert current(warehouse, table) == got
            check_changelog(warehouse, table, pk=True)
        check_sink(read_topic(address, "per_k"), warehouse, "per_k", ("k",), tombstones=True)

"""Kafka sinks against a real broker (tansu on a loopback port): a streaming table's
changelog published to a topic exactly once, in batch order per key; a publish interrupted
half-way is finished without doubling anything; the topic replayed by key equals the table."""
from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import pytest

from octo_platform.errors import OctoError
from octo_platform.local_frames import local_frame
from octo_platform.project import load_project
from octo_platform.runtime.runner import run_tables
from octo_platform.runtime.sinks import SinkRunner
from octo_platform.runtime.status import table_status
from octo_platform.wiring import default_options
from tests.kafka_broker import Producer, create_topic, fails_naming, read_topic, tansu
from tests.oracle import RandomInput, check_sink, check_tables

# Waits on other processes most of the time: runs beside the rest (tests/suite.py).
pytestmark = pytest.mark.processes

TABLES = {
    "per_g": "SELECT g, COUNT(*) AS n, SUM(v) AS total FROM accounts GROUP BY g",
    "big_v": "SELECT k, v FROM accounts WHERE v > 50",  # no primary key
}


def _project(tmp_path: Path, address: str, *, sinks: bool = True,
             timeout: str | None = None) -> str:
    """The project's files (``sinks``: with its two sinks; ``timeout``: per_g_out's
    ``broker_timeout``); the tables' SQL."""
    ddl = RandomInput(0, False).ddl()
    sql = "\n".join([
        f"CREATE SOURCE accounts ({ddl}) WITH (connector = 'kafka', bootstrap_servers = "
        f"'{address}', topic = 'cdc', format = 'debezium-json', primary_key = 'id');",
        *(f"CREATE STREAMING TABLE {name} AS {sql};" for name, sql in TABLES.items())])
    (tmp_path / "sql").mkdir(exist_ok=True)
    (tmp_path / "sql" / "tables.sql").write_text(sql)
    sink_sql = (
        f"CREATE SINK per_g_out FROM per_g WITH (connector = 'kafka', bootstrap_servers = "
        f"'{address}', topic = 'per_g', tombstones = 'true'"
        f"{f', broker_timeout = {timeout!r}' if timeout else ''});\n"
        f"CREATE SINK big_v_out FROM big_v WITH (connector = 'kafka', bootstrap_servers = "
        f"'{address}', topic = 'big_v', format = 'debezium-json', kafka.linger.ms = '0');")
    sinks_file = tmp_path / "sql" / "sinks.sql"
    sinks_file.write_text(sink_sql) if sinks else sinks_file.unlink(missing_ok=True)
    return sql


def _send(producer: Producer, source: RandomInput, n: int) -> None:
    for line in source.lines(n):
        event = json.loads(line)
        event = event.get("payload", event)
        rid = (event["after"] or event["before"])["id"]
        producer.send("cdc", rid % 3, line, key=str(rid))


def _check_sinks(address: str, warehouse: Path) -> None:
    check_sink(read_topic(address, "per_g"), warehouse, "per_g", ("g",), tombstones=True)
    check_sink(read_topic(address, "big_v"), warehouse, "big_v", (), tombstones=False)


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_sinks_publish_each_change_once_in_order(spark, tmp_path, path):
    """Sink batches published in the driver (small ones) and by executors, each event
    once and in order, a publish interrupted half-way included."""
    with tansu() as address:
        for topic, parts in (("cdc", 3), ("per_g", 3), ("big_v", 2)):
            create_topic(address, topic, parts)
        sql = _project(tmp_path, address)
        producer, accounts = Producer(address), RandomInput(7, True)
        options = default_options(buckets=4, progress=None,
                                  driver_rows=0 if path == "spark" else 10**6)
        warehouse = tmp_path / "warehouse"
        for round_no in range(3):
            _send(producer, accounts, random.Random(round_no).randint(15, 30))
            report = run_tables(spark, tmp_path, options=options, until_idle=True)
            assert {s.sink for s in report.published} == {"per_g_out", "big_v_out"}
            check_tables(spark, warehouse, sql, {"accounts": accounts.relation()},
                         {"per_g": True, "big_v": False}, round_no)
            _check_sinks(address, warehouse)
        assert any(s.counts.get("d") for s in report.published)  # tombstones were tested
        assert load_project(tmp_path).explain("per_g").endswith(
            f"per_g_out: kafka://{address}/per_g (debezium-json, tombstones), published "
            "after each batch")

        # A run killed half-way through publishing: its intent is logged and some of the
        # events are in the topic. The next run finds them and publishes only the others.
        _project(tmp_path, address, sinks=False)
        _send(producer, accounts, 40)
        run_tables(spark, tmp_path, options=options, until_idle=True)
        _project(tmp_path, address)
        project = load_project(tmp_path)
        runner = SinkRunner(spark, project, project.sink("per_g_out"),
                            options.layout(project.root), options.env, progress=None,
                            driver_rows=options.driver_rows)
        batch, spec, _, resumed = runner.plan()
        assert not resumed
        local = runner.local_events(spec["from"], spec["to"])
        assert (local is None) == (path == "spark")
        events = runner.events(spec["from"], spec["to"]) if local is None \
            else local_frame(spark, local)
        part = events.filter("_seq % 2 = 0")
        sent = options.env.publish_kafka(
            runner.target, part, starts=runner.starts(spec), resume=False,
            local_rows=None if local is None else local.num_rows)["published"]
        assert sent > 0
        report = run_tables(spark, tmp_path, options=options, until_idle=True)
        resumed_batch = [s for s in report.published if s.sink == "per_g_out"][0]
        assert resumed_batch.batch == batch and resumed_batch.resumed
        assert resumed_batch.counts["present"] == sent
        _check_sinks(address, warehouse)
        # Nothing new: a rerun publishes nothing.
        assert not run_tables(spark, tmp_path, options=options, until_idle=True).published


def test_sink_errors_name_the_sink(spark, tmp_path):
    """A sink whose topic does not exist fails the run after its broker_timeout, naming the
    sink and the topic; its table's batch stays committed, and once the topic exists the
    next run publishes it."""
    with tansu() as address:
        create_topic(address, "cdc", 3)
        _project(tmp_path, address)
        sink_sql = (f"CREATE SINK per_g_out FROM per_g WITH (connector = 'kafka', "
                    f"bootstrap_servers = '{address}', topic = 'per_g'")
        (tmp_path / "sql" / "sinks.sql").write_text(f"{sink_sql}, broker_timeout = '2 seconds');")
        _send(Producer(address), RandomInput(3, True), 10)
        options = default_options(buckets=4, progress=None)
        with pytest.raises(OctoError) as got:
            run_tables(spark, tmp_path, options=options, until_idle=True)
        assert "sink 'per_g_out' (topic 'per_g'" in str(got.value)
        assert "topic not found" in str(got.value) and "after 2s" in str(got.value)
        create_topic(address, "per_g", 2)
        (tmp_path / "sql" / "sinks.sql").write_text(f"{sink_sql});")  # the default wait
        report = run_tables(spark, tmp_path, options=options, until_idle=True)
        assert [s.sink for s in report.published] == ["per_g_out"]
        check_sink(read_topic(address, "per_g"), tmp_path / "warehouse", "per_g", ("g",),
                   tombstones=False)


def test_sinks_are_dagster_assets_downstream_of_their_table(spark, tmp_path):
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.resources import SparkResource, WarehouseResource

    with tansu() as address:
        for topic, parts in (("cdc", 3), ("per_g", 3), ("big_v", 1)):
            create_topic(address, topic, parts)
        _project(tmp_path, address)
        (tmp_path / "sql" / "sinks.sql").write_text(
            (tmp_path / "sql" / "sinks.sql").read_text().replace(
                "kafka.linger.ms = '0'", "kafka.sasl.password = 'hunter2'"))
        definitions = build_definitions(tmp_path)
        graph = definitions.resolve_asset_graph()
        node = graph.get(dg.AssetKey("per_g_out"))
        assert node.parent_keys == {dg.AssetKey("per_g")} and node.kinds == {"kafka"}
        spec = {s.key: s for s in definitions.resolve_all_asset_specs()}
        big = spec[dg.AssetKey("big_v_out")]
        assert "hunter2" not in big.description and "hunter2" not in str(big.metadata)
        assert big.metadata["target"] == f"kafka://{address}/big_v"

        _send(Producer(address), RandomInput(9, True), 25)
        result = dg.materialize(
            list(definitions.assets), instance=dg.DagsterInstance.ephemeral(),
            resources={"spark": SparkResource(),
                       "warehouse": WarehouseResource(path=str(tmp_path / "warehouse"))},
            selection=["per_g", "per_g_out"])
        assert result.success
        (mat,) = result.asset_materializations_for_node("per_g_out")
        meta = {k: v.value for k, v in mat.metadata.items()}
        # the table's run published the sink already; its asset confirms it is caught up
        assert meta["changelog_versions_waiting"] == 0 and meta["sink_batches"] == 0
        messages = read_topic(address, "per_g")
        assert messages
        check_sink(messages, tmp_path / "warehouse", "per_g", ("g",), tombstones=True)


def test_a_broker_that_goes_away_fails_the_run_and_the_next_run_resumes(spark, tmp_path):
    """The broker stops answering right after a batch committed, before its sink published:
    the run fails with a message naming the sink; once the broker is back, the next run
    publishes that batch's events, once. Only the run the broker leaves has a short
    broker_timeout (per_g_out's, whose first call comes after the broker left): every call
    to a broker that answers waits as long as in a user's run, however loaded the machine."""
    from tests.kafka_broker import pause, resume

    with tansu() as address:
        for topic, parts in (("cdc", 3), ("per_g", 3), ("big_v", 2)):
            create_topic(address, topic, parts)
        _project(tmp_path, address)
        producer, accounts = Producer(address), RandomInput(21, True)
        warehouse = tmp_path / "warehouse"
        _send(producer, accounts, 20)
        run_tables(spark, tmp_path, options=default_options(progress=None), until_idle=True)
        _send(producer, accounts, 20)

        def progress(line: str) -> None:
            if line.startswith("[per_g] batch 1:"):
                pause(address)

        _project(tmp_path, address, timeout="3 seconds")
        try:
            run_tables(spark, tmp_path, options=default_options(progress=progress),
                       until_idle=True, parallel=1)
            raise AssertionError("the run should fail")
        except OctoError as e:
            assert f"sink 'per_g_out' (topic 'per_g' at {address}): broker not reachable: " \
                "metadata request: no answer within 3s" in str(e), e
        finally:
            resume(address)
        _project(tmp_path, address)
        # the batch committed, its sink did not publish it: a backlog the sensor acts on
        status = table_status(load_project(tmp_path), "per_g",
                              options=default_options(progress=None))
        assert status.last_batch == 1 and status.backlog["sink:per_g_out"] == 1
        report = run_tables(spark, tmp_path, options=default_options(progress=None),
                            until_idle=True)
        assert "per_g_out" in {s.sink for s in report.published}
        _check_sinks(address, warehouse)


def test_each_call_to_a_broker_that_went_away_names_the_sink(spark, tmp_path, monkeypatch):
    """Whichever call the broker stops answering (metadata, watermarks, deliveries, a
    resumed publish's tail read), the error names the sink, its topic and brokers, and the
    call, once the sink's broker_timeout has passed; with the broker back, the next run
    finishes the logged sink batch and the topic holds each event once."""
    from tests.kafka_broker import pause_at_watermarks, paused, resume

    with tansu() as address:
        for topic, parts in (("cdc", 3), ("per_g", 3), ("big_v", 2)):
            create_topic(address, topic, parts)
        _project(tmp_path, address, sinks=False)
        _send(Producer(address), RandomInput(8, True), 20)
        options = default_options(buckets=4, progress=None)
        run_tables(spark, tmp_path, options=options, until_idle=True)

        def runner() -> SinkRunner:
            project = load_project(tmp_path)
            return SinkRunner(spark, project, project.sink("per_g_out"),
                              options.layout(project.root), options.env, progress=None,
                              driver_rows=options.driver_rows)

        _project(tmp_path, address, timeout="2 seconds")
        short = runner()
        assert short.target.timeout_s == 2.0
        where = f"sink 'per_g_out' (topic 'per_g' at {address}): broker not reachable: "

        def fails(call: str, action) -> None:
            fails_naming(where, call, action)

        with paused(address):
            fails("metadata request: no answer", short.plan)
        with monkeypatch.context() as patched:
            pause_at_watermarks(patched, address, "per_g")
            try:
                fails("watermark offsets of partition 0: no answer", short.plan)
            finally:
                resume(address)
        assert short.log.pending() is None  # neither logged an intent
        _project(tmp_path, address)
        batch, spec, _, _ = runner().plan()  # logs the intent, with the default wait
        local = short.local_events(spec["from"], spec["to"])
        publish = options.env.publish_kafka
        # by executors, then in the driver (a small batch)
        for events, rows in ((short.events(spec["from"], spec["to"]), None),
                             (local_frame(spark, local), local.num_rows)):
            with paused(address):
                fails("delivery of ", lambda: publish(short.target, events, local_rows=rows,
                                                      starts=short.starts(spec), resume=False))
                fails("read of partition ", lambda: publish(
                    short.target, events, local_rows=rows, starts=short.starts(spec),
                    resume=True))
        report = run_tables(spark, tmp_path, options=options, until_idle=True)
        finished = [s for s in report.published if s.sink == "per_g_out"]
        assert finished[0].batch == batch and finished[0].resumed
        _check_sinks(address, tmp_path / "warehouse")


def test_kafka_demo_publishes_the_table_to_its_sink_topic(spark, tmp_path, capsys):
    from octo_platform.kafka_demo import run_kafka_demo

    run_kafka_demo(directory=str(tmp_path / "demo"), rounds=2)
    out = capsys.readouterr().out
    assert "[accounts_by_region] batch 1:" in out
    assert "[accounts_by_region_out] sink batch 1:" in out
    assert '"op":"u"' in out and '"batch_id":1' in out  # a message of the second round


def test_a_producer_is_closed_once_idle_not_while_a_task_uses_it(monkeypatch):
    """A sink's producer is kept for the process's next tasks, one per configuration, and
    closed once no task has used it for ``_IDLE_S`` (here its broker is gone: it would
    retry and log each refusal for as long as the process lives)."""
    from connectors import kafka_sink

    monkeypatch.setattr(kafka_sink, "_IDLE_S", 0.3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True,
              "log_level": 0}  # its refusals are expected here
    producer = kafka_sink._producer(config)
    assert kafka_sink._producer(config) is producer  # a second task shares it
    kafka_sink._release(config, producer)
    time.sleep(1.0)
    producer.flush(0)  # still open: one task uses it
    kafka_sink._release(config, producer)
    deadline = time.monotonic() + 10
    while any(kept[0] is producer for kept in kafka_sink._PRODUCERS.values()):
        assert time.monotonic() < deadline, "an idle producer was not closed"
        time.sleep(0.05)
    with pytest.raises(RuntimeError, match="closed"):
        producer.flush(0)
    # A task whose producer was dropped (a failed publish) while it still used it does not
    # count as a user of the one made after it.
    first = kafka_sink._producer(config)
    kafka_sink._drop_producers()
    second = kafka_sink._producer(config)
    kafka_sink._release(config, first)
    time.sleep(1.0)
    second.flush(0)  # still open: its task has not released it
    kafka_sink._release(config, second)

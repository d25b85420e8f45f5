"""The ``kafka`` sink: a streaming table's change events published to a topic by executors
(a small batch's by the driver, with no Spark job).

Message key: the table's primary key as JSON (``{"id": 7}``; null without a key). Value: the
Debezium envelope ``{"before", "after", "op", "ts_ms", "source": {"table", "batch_id",
"seq", "connector"}}`` (null fields written as ``null``), where ``seq`` numbers the events of
a batch from 0. With ``tombstones = 'true'`` each ``d`` is followed by a message with the
same key and a null value. Every message carries the headers ``octo.batch`` and
``octo.seq`` (and ``octo.tombstone`` on a tombstone): its identity.

Partition: ``pmod(xxhash64(key JSON), partitions)`` (a keyless event: of its batch and seq),
so one key's events stay in one partition. Each partition's events are published by one
Spark task (or the driver), in ``(batch_id, seq)`` order, with an idempotent producer
(``acks=all``), so retries neither reorder nor double them.

Exactly once on any broker (``runtime/sinks.py`` drives it): a publish that may have been
interrupted is redone with ``resume=True`` (and a task Spark retries behaves the same); each
task first reads its partitions from the offsets logged before the first attempt
(``starts``) and skips the events whose identity is already there. This needs no
transactions and no ``read_committed``; it needs ``spark.speculation`` off (checked).

A broker that does not answer fails the run with a message naming the sink and the call:
the driver's watermark request, a task's deliveries (``message.timeout.ms``, by default the
sink's ``broker_timeout`` when it has one) or its tail read (``broker_timeout``).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from connectors.kafka import (KafkaTopic, broker_timeout, failure, properties, to_end,
                              worker_error)
from octo_platform.errors import RunError
from octo_platform.sqltext import quote
from octo_platform.workers import task_started

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["KafkaSink", "publish", "SEQ"]

SEQ = "_seq"  # the events' column holding each event's sequence number within its batch
# Defaults a sink's kafka.<name> options may override.
_DEFAULTS = {"linger.ms": 5, "message.timeout.ms": 60_000, "compression.type": "lz4"}


@dataclass(frozen=True)
class KafkaSink(KafkaTopic):
    """What publishing needs to know about a ``CREATE SINK ... WITH (connector='kafka')``."""

    what: ClassVar[str] = "sink"
    table: str = ""
    key: tuple[str, ...] = ()  # the table's primary key (empty: messages have no key)
    tombstones: bool = False

    @classmethod
    def from_options(cls, name: str, options: dict[str, str], *, table: str,
                     key: tuple[str, ...] | None) -> KafkaSink:
        return cls(name, options["topic"], options["bootstrap_servers"], properties(options),
                   broker_timeout(options), table, tuple(key or ()),
                   options.get("tombstones", "false") == "true")

    def producer_config(self) -> dict[str, Any]:
        """The defaults (``message.timeout.ms``: ``broker_timeout`` when given), then the
        ``kafka.`` properties, then what octo relies on."""
        waits = {} if self.timeout_s is None else \
            {"message.timeout.ms": max(1, int(self.timeout_s * 1000))}
        return {**_DEFAULTS, **waits,
                **self.config(**{"enable.idempotence": True, "acks": "all"})}


def publish(sink: KafkaSink, events: DataFrame, *, starts: dict[int, int],
            resume: bool, local_rows: int | None = None) -> dict[str, int]:
    """Publish ``events`` (the changelog's columns plus ``_seq``) to the sink's topic, whose
    partitions and their offsets before the first attempt are ``starts``. Counts of messages
    per op (and ``tombstone``), and of those ``published`` now and ``present`` (published by
    an interrupted attempt) in all. ``local_rows``: ``events`` is a local relation of that
    many rows (a small batch), whose messages are made by the same Spark SQL in the driver
    and published from there, with no Spark job."""
    spark = events.sparkSession
    if local_rows is None and spark.conf.get("spark.speculation", "false").lower() == "true":
        raise RunError(f"{sink.where()}: spark.speculation is on; two attempts of a publishing "
                       "task could both send their events. Turn it off for octo runs.")
    partitions = len(starts)
    key = ", ".join(f"'{k}', coalesce(after.{quote(k)}, before.{quote(k)})" for k in sink.key)
    nulls = "map('ignoreNullFields', 'false')"  # a NULL field is written as null
    key_sql = f"to_json(named_struct({key}), {nulls})" if sink.key else "CAST(NULL AS STRING)"
    value_sql = ("to_json(named_struct('before', before, 'after', after, 'op', op, "
                 "'ts_ms', ts_ms, 'source', named_struct('table', source.table, 'batch_id', "
                 f"source.batch_id, 'seq', {SEQ}, 'connector', 'octo')), {nulls})")
    spread = "_key" if sink.key else "batch_id, seq"
    rows = events.selectExpr(f"{key_sql} AS _key", f"{value_sql} AS value", "op",
                             "source.batch_id AS batch_id", f"{SEQ} AS seq", "ts_ms")
    rows = rows.selectExpr("*", f"CAST(pmod(xxhash64({spread}), {partitions}) AS INT) AS part")
    run = _publisher(sink, starts, resume)
    if local_rows is not None:
        from octo_platform.local_frames import collect_arrow

        ordered = collect_arrow(rows, local_rows).sort_by(
            [(c, "ascending") for c in ("part", "batch_id", "seq")])
        got = [r for rb in run(iter(ordered.to_batches())) for r in rb.to_pylist()]
    else:
        tasks = min(partitions, spark.sparkContext.defaultParallelism * 2)
        ordered_df = rows.repartition(tasks, "part").sortWithinPartitions("part", "batch_id",
                                                                          "seq")
        try:
            got = [r.asDict() for r in ordered_df.mapInArrow(
                run, "op STRING, published BIGINT, present BIGINT").collect()]
        except Exception as e:  # a task's RunError, wrapped by Spark: raised as itself
            message = worker_error(e)
            if message is None:
                raise
            raise RunError(message) from e
    counts: dict[str, int] = {"published": 0, "present": 0}
    for r in got:
        counts[r["op"]] = counts.get(r["op"], 0) + r["published"] + r["present"]
        counts["published"] += r["published"]
        counts["present"] += r["present"]
    return counts


def _publisher(sink: KafkaSink, starts: dict[int, int], resume: bool):
    """The ``mapInArrow`` function publishing its rows (sorted by partition, batch, seq)
    and yielding counts per op. Runs on executors (or in the driver: ``local_rows``)."""
    config, topic, where = sink.producer_config(), sink.topic, sink.where()
    reader = sink.config(**{"group.id": f"octo-sink-{sink.name}", "enable.auto.commit": False,
                            "enable.partition.eof": True, "auto.offset.reset": "earliest",
                            "fetch.wait.max.ms": 10})  # the end is what it waits for
    tombstones, tail_s = sink.tombstones, sink.wait_s(executor=True)
    flush_s = int(config["message.timeout.ms"]) / 1000 + 30

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import KafkaException
        from pyspark import TaskContext

        task_started()
        # Spark retries a failed task (on a cluster): its earlier attempt may have sent some.
        task = TaskContext.get()  # None in the driver
        again = resume or task is not None and task.attemptNumber() > 0
        failures: list[Any] = []  # KafkaErrors of messages not delivered

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(err)

        try:
            producer = _producer(config)
        except KafkaException as e:
            raise failure(where, "client configuration", e) from None
        try:
            yield from publish(producer, batches, again, failures, delivered)
        finally:
            _release(config, producer)

    def publish(producer: Any, batches: Iterator[pa.RecordBatch], again: bool,
                failures: list[Any], delivered: Any) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from confluent_kafka import KafkaException

        present: dict[int, set[tuple[int, int, bool]]] = {}
        counts: dict[str, list[int]] = {}
        try:
            for rb in batches:
                cols = [rb.column(n).to_pylist() for n in
                        ("_key", "value", "op", "batch_id", "seq", "ts_ms", "part")]
                for key, value, op, batch, seq, ts, part in zip(*cols):
                    if again and part not in present:
                        present[part] = _published(reader, topic, part, starts[part], where,
                                                   tail_s)
                    done = present.get(part, ())
                    messages = [(value, False)]
                    if tombstones and op == "d":
                        messages.append((None, True))
                    for payload, tomb in messages:
                        count = counts.setdefault("tombstone" if tomb else op, [0, 0])
                        if (batch, seq, tomb) in done:
                            count[1] += 1
                            continue
                        headers = [("octo.batch", str(batch)), ("octo.seq", str(seq))]
                        if tomb:
                            headers.append(("octo.tombstone", "1"))
                        _produce(producer, topic, key, payload, part, headers, ts, delivered)
                        count[0] += 1
                    if failures:
                        break
                if failures:
                    break
            left = producer.flush(flush_s)
        except KafkaException as e:
            _drop_producers()
            raise failure(where, "produce", e) from None
        if failures or left:
            _drop_producers()  # the next attempt starts afresh
        if failures:
            raise failure(where, f"delivery of {len(failures)} message(s)", failures[0],
                          waited=int(config["message.timeout.ms"]) / 1000)
        if left:
            raise failure(where, f"delivery of {left} message(s)", waited=flush_s)
        ops = sorted(counts)
        yield pa.RecordBatch.from_pydict({"op": ops,
                                          "published": [counts[o][0] for o in ops],
                                          "present": [counts[o][1] for o in ops]})

    return run


# Per process (a Python worker, which Spark reuses, or the driver): config -> [producer,
# tasks using it, when last released]. Only module-level functions touch it: Spark pickles
# the publishing function by value, with the globals it names, and a producer cannot be
# pickled. A producer no task used for ``_IDLE_S`` is closed (``_close_idle``): it holds
# connections to the brokers, and retries them, logging each refusal, once they go away.
_PRODUCERS: dict[str, list[Any]] = {}
_LOCK = threading.Lock()
_IDLE_S = 120.0
_closer: threading.Thread | None = None


def _drop_producers() -> None:
    with _LOCK:
        _PRODUCERS.clear()


def _producer(config: dict[str, Any]) -> Any:
    """A producer for ``config``, kept for the worker's next tasks (an idempotent producer
    spends ~0.5 s getting its producer id, which a small batch should not pay each time)
    until it has been idle for ``_IDLE_S``; ``_release`` it once done."""
    from confluent_kafka import Producer

    global _closer
    key = _key(config)
    with _LOCK:
        if key not in _PRODUCERS:
            _PRODUCERS[key] = [Producer(config), 0, 0.0]
        kept = _PRODUCERS[key]
        kept[1] += 1
        if _closer is None or not _closer.is_alive():
            _closer = threading.Thread(target=_close_idle, name="octo-kafka-idle",
                                       daemon=True)
            _closer.start()
        return kept[0]


def _key(config: dict[str, Any]) -> str:
    return repr(sorted(config.items()))


def _release(config: dict[str, Any], producer: Any) -> None:
    """A task is done with ``producer`` (from ``_producer``; dropped since, it is not
    kept)."""
    with _LOCK:
        kept = _PRODUCERS.get(_key(config))
        if kept is not None and kept[0] is producer:
            kept[1], kept[2] = kept[1] - 1, time.monotonic()


def _close_idle() -> None:
    """Close the producers no task has used for ``_IDLE_S``; end once none is kept."""
    while True:
        time.sleep(min(_IDLE_S / 4, 1.0))
        with _LOCK:
            now = time.monotonic()
            idle = [k for k, (_, users, last) in _PRODUCERS.items()
                    if not users and now - last >= _IDLE_S]
            closing = [_PRODUCERS.pop(k)[0] for k in idle]
            left = bool(_PRODUCERS)
        for producer in closing:
            producer.close()  # nothing is waiting: each task flushed what it sent
        if not left:
            return


def _produce(producer: Any, topic: str, key: str | None, value: str | None, partition: int,
             headers: list, ts: int, delivered: Any) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition,
                             headers=headers, timestamp=ts, on_delivery=delivered)
            producer.poll(0)
            return
        except BufferError:  # the local queue is full: wait for deliveries
            producer.poll(0.5)


def _published(config: dict[str, Any], topic: str, partition: int, start: int, where: str,
               wait_s: float) -> set[tuple[int, int, bool]]:
    """Identities ``(batch, seq, tombstone)`` of the messages of ``partition`` from offset
    ``start`` to its end."""
    found: set[tuple[int, int, bool]] = set()
    for msg in to_end(config, topic, partition, start, where, wait_s=wait_s):
        h = dict(msg.headers() or ())
        if "octo.batch" in h and "octo.seq" in h:
            found.add((int(h["octo.batch"]), int(h["octo.seq"]), "octo.tombstone" in h))
    return found

"""The ``kafka`` connector: a topic's messages as weighted rows plus dead letters.

The driver only asks the broker for each partition's watermarks (``watermarks``); what a
batch reads is a set of per-partition offset ranges, planned and logged in the batch's
intent before any work (``runtime/offsets.py``). Executors fetch the ranges (``read``: one
Spark partition per Kafka partition range, through confluent-kafka) and the values are
parsed like lines of a file (``json`` or ``debezium-json``, plain or Kafka Connect
``{"schema", "payload"}``); a null value (a Debezium tombstone) is skipped. A message that
does not parse becomes a dead letter whose ``source_file`` is ``topic/partition@offset``.

Options: ``bootstrap_servers``, ``topic``, ``format``, ``primary_key``, ``startup``
(``earliest``, the default, or ``latest``: where the first batch starts),
``max_records_per_batch`` and any librdkafka property as ``kafka.<name>`` (security
settings included; their values are never printed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from connectors.files import FileSource, Parsed, parse_json
from octo_platform.errors import RunError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["KafkaTopic", "KafkaSource", "properties", "watermarks", "read", "commit_offsets",
           "group_id", "to_end", "WAIT_S"]

WAIT_S = 20.0  # how long the driver waits for a broker or a topic before failing the run
_FETCH_TIMEOUT_S = 60.0  # an executor's wait for the records of a logged range


@dataclass(frozen=True)
class KafkaTopic:
    """A topic on a cluster, and the librdkafka properties to reach it."""

    what: ClassVar[str] = "topic"
    name: str  # the source or sink it belongs to
    topic: str
    bootstrap_servers: str
    properties: tuple[tuple[str, str], ...] = ()  # the kafka.<name> options, prefix removed

    def config(self, **extra: Any) -> dict[str, Any]:
        """The librdkafka configuration: the ``kafka.`` properties, then ``extra`` (what octo
        relies on, which they cannot override)."""
        return {"bootstrap.servers": self.bootstrap_servers, **dict(self.properties), **extra}

    def where(self) -> str:
        """The source or sink, topic and brokers, for messages (never a property's value)."""
        return f"{self.what} {self.name!r} (topic {self.topic!r} at {self.bootstrap_servers})"


def properties(options: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The ``kafka.<name>`` options as librdkafka properties."""
    return tuple(sorted((k[len("kafka."):], v) for k, v in options.items()
                        if k.startswith("kafka.")))


@dataclass(frozen=True)
class KafkaSource(KafkaTopic):
    """What the reader needs to know about a ``CREATE SOURCE ... WITH (connector='kafka')``."""

    what: ClassVar[str] = "source"
    columns: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    format: str = "json"

    @classmethod
    def from_options(cls, name: str, options: dict[str, str], *,
                     columns: tuple[str, ...] = (), types: tuple[str, ...] = ()
                     ) -> KafkaSource:
        return cls(name, options["topic"], options["bootstrap_servers"], properties(options),
                   columns, types, options.get("format", "json"))


def watermarks(source: KafkaTopic, *, wait_s: float | None = None
               ) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` of the topic right now; partitions added later show up
    on a later call. Fails with a message naming the source when the broker cannot be
    reached or the topic does not exist within ``wait_s``."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    wait_s = WAIT_S if wait_s is None else wait_s
    consumer = Consumer(source.config(**{"group.id": f"octo-{source.name}",
                                         "enable.auto.commit": False}))
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                meta = consumer.list_topics(source.topic, timeout=max(1.0, wait_s / 4))
                topic = meta.topics.get(source.topic)
                if topic is not None and topic.error is None and topic.partitions:
                    break
                problem = f"topic not found ({topic.error})" if topic is not None and \
                    topic.error is not None else "topic not found"
            except KafkaException as e:
                problem = f"broker not reachable ({e.args[0].str() if e.args else e})"
            if time.monotonic() >= deadline:
                raise RunError(f"{source.where()}: {problem} after {wait_s:g}s")
            time.sleep(0.5)
        out = {}
        for p in sorted(topic.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(source.topic, p),
                                                       timeout=wait_s, cached=False)
            out[p] = (int(low), int(high))
        return out
    finally:
        consumer.close()


def group_id(table: str) -> str:
    """The consumer group whose offsets show a streaming table's progress to lag tools."""
    return f"octo.{table}"


def commit_offsets(source: KafkaSource, table: str, ranges: dict[str, list[int]]) -> None:
    """Commit the ends of a committed batch's ranges as ``table``'s consumer group offsets,
    for lag tools to see (octo itself resumes from its batch log, never from these)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(source.config(**{"group.id": group_id(table),
                                         "enable.auto.commit": False}))
    try:
        consumer.commit(offsets=[TopicPartition(source.topic, int(p), int(stop))
                                 for p, (_, stop) in ranges.items()], asynchronous=False)
    finally:
        consumer.close()


def read(spark: SparkSession, source: KafkaSource, ranges: dict[str, list[int]]) -> Parsed:
    """The records of the messages of ``ranges`` (``{partition: [from, to)}``), fetched by
    executors (one Spark partition per range) and parsed in the source's format."""
    return parse_json(messages(spark, source, ranges),
                      FileSource(source.name, source.columns, source.types, source.topic,
                                 source.format))


def messages(spark: SparkSession, source: KafkaSource,
             ranges: dict[str, list[int]]) -> DataFrame:
    """``value`` (a message's value as text) and ``file`` (``topic/partition@offset``) of
    the messages of ``ranges``."""
    todo = sorted((int(p), int(a), int(b)) for p, (a, b) in ranges.items() if b > a)
    if not todo:
        return spark.createDataFrame([], "value STRING, file STRING")
    plan = spark.createDataFrame(spark.sparkContext.parallelize(todo, len(todo)),
                                 "partition INT, start BIGINT, stop BIGINT")
    return plan.mapInArrow(_fetcher(source), "value STRING, file STRING")


def _fetcher(source: KafkaSource):
    """The ``mapInArrow`` function fetching each range of its input rows. Runs on executors."""
    config = source.config(**{"group.id": f"octo-{source.name}", "enable.auto.commit": False,
                              "enable.partition.eof": True, "auto.offset.reset": "error"})
    topic, where = source.topic, source.where()

    def fetch(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(config)
        try:
            for rb in batches:
                for p, start, stop in zip(*(rb.column(i).to_pylist() for i in range(3))):
                    values, files = [], []
                    for offset, value in _range(consumer, TopicPartition(topic, p, start),
                                                stop, where):
                        if value is None:  # a tombstone: nothing to read
                            continue
                        values.append(value.decode("utf-8", errors="replace"))
                        files.append(f"{topic}/{p}@{offset}")
                    yield pa.RecordBatch.from_pydict({"value": values, "file": files})
        finally:
            consumer.close()

    return fetch


def _range(consumer: Any, start: Any, stop: int, where: str) -> Iterator[tuple[int, Any]]:
    """(offset, value) of the messages of ``[start.offset, stop)`` of one partition."""
    from confluent_kafka import KafkaError

    consumer.assign([start])
    nxt, deadline = start.offset, time.monotonic() + _FETCH_TIMEOUT_S
    while nxt < stop:
        msg = consumer.poll(1.0)
        if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
            if time.monotonic() > deadline:
                raise RunError(f"{where}: partition {start.partition} offsets {nxt}..{stop} "
                               f"not readable within {_FETCH_TIMEOUT_S:g}s")
            continue
        if msg.error():
            raise RunError(f"{where}: partition {start.partition}: {msg.error().str()}")
        if msg.offset() < start.offset:
            continue
        nxt = msg.offset() + 1  # offsets may skip (transaction markers, compaction)
        deadline = time.monotonic() + _FETCH_TIMEOUT_S
        if msg.offset() < stop:
            yield msg.offset(), msg.value()
    consumer.unassign()


def to_end(config: dict[str, Any], topic: str, partition: int, start: int, where: str, *,
           wait_s: float = _FETCH_TIMEOUT_S) -> Iterator[Any]:
    """The messages of ``partition`` from offset ``start`` to its end: read until the
    broker says end-of-partition, not to the high watermark (a broker may report that short
    of its last record batch). ``config`` needs ``enable.partition.eof``; fails naming
    ``where`` when nothing arrives for ``wait_s``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + wait_s
        while True:
            msg = consumer.poll(1.0)
            if msg is None:
                if time.monotonic() > deadline:
                    raise RunError(f"{where}: partition {partition} from offset {start} not "
                                   f"readable within {wait_s:g}s")
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return
                raise RunError(f"{where}: partition {partition}: {msg.error().str()}")
            deadline = time.monotonic() + wait_s
            yield msg
    finally:
        consumer.close()

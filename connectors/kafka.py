"""The ``kafka`` connector: a topic's messages as weighted rows plus dead letters.

To plan a batch, the driver only asks the broker for each partition's watermarks
(``watermarks``); what a batch reads is a set of per-partition offset ranges, planned and
logged in the batch's intent before any work (``runtime/offsets.py``). Executors fetch the
ranges (``read``: one Spark partition per Kafka partition range, through confluent-kafka),
or for a small batch the driver does (``read_local``: one consumer), and the values are
parsed like lines of a file (``json`` or ``debezium-json``, plain or Kafka Connect
``{"schema", "payload"}``); a null value (a Debezium tombstone) is skipped. A message that
does not parse becomes a dead letter whose ``source_file`` is ``topic/partition@offset``.

Options: ``bootstrap_servers``, ``topic``, ``format``, ``primary_key``, ``startup``
(``earliest``, the default, or ``latest``: where the first batch starts),
``max_records_per_batch``, ``broker_timeout`` and any librdkafka property as
``kafka.<name>`` (security settings included; their values are never printed).

Every call to a broker that fails (metadata, watermarks, a fetch, an offset commit; and a
sink's deliveries, ``kafka_sink.py``) raises a ``RunError`` naming the source or sink, its
topic and brokers, and the call, with Kafka's own message (``failure``). A broker that does
not answer is waited for ``broker_timeout`` (``KafkaTopic.wait_s``), calls retried within it.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from connectors.files import FileSource, Parsed, parse_json, parse_lines
from octo_platform.errors import RunError
from octo_platform.timeunits import parse_span
from octo_platform.workers import task_started

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["KafkaTopic", "KafkaSource", "properties", "broker_timeout", "watermarks", "read",
           "read_local", "commit_offsets", "group_id", "to_end", "failure", "worker_error",
           "WAIT_S", "EXECUTOR_WAIT_S"]

# broker_timeout's defaults: how long the driver waits for a broker or a topic (metadata,
# watermarks, offset commits) before failing the run, and how long an executor waits for a
# fetch or a sink's tail read that makes no progress, or for a sink's deliveries.
WAIT_S = 20.0
EXECUTOR_WAIT_S = 60.0
_FETCH_MESSAGES = 10_000  # messages a fetch loop takes from the client per call
# Error codes of a broker that does not answer (or cannot be reached).
_UNANSWERED = ("_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_MSG_TIMED_OUT",
               "_WAIT_COORD", "_RESOLVE", "_TIMED_OUT_QUEUE")


@dataclass(frozen=True)
class KafkaTopic:
    """A topic on a cluster, and the librdkafka properties to reach it."""

    what: ClassVar[str] = "topic"
    name: str  # the source or sink it belongs to
    topic: str
    bootstrap_servers: str
    properties: tuple[tuple[str, str], ...] = ()  # the kafka.<name> options, prefix removed
    timeout_s: float | None = None  # the broker_timeout option (None: the defaults)

    def config(self, **extra: Any) -> dict[str, Any]:
        """The librdkafka configuration: the ``kafka.`` properties, then ``extra`` (what octo
        relies on, which they cannot override)."""
        return {"bootstrap.servers": self.bootstrap_servers, **dict(self.properties), **extra}

    def where(self) -> str:
        """The source or sink, topic and brokers, for messages (never a property's value)."""
        return f"{self.what} {self.name!r} (topic {self.topic!r} at {self.bootstrap_servers})"

    def wait_s(self, *, executor: bool = False) -> float:
        """How long a call waits for a broker that does not answer (``broker_timeout``)."""
        if self.timeout_s is not None:
            return self.timeout_s
        return EXECUTOR_WAIT_S if executor else WAIT_S


def properties(options: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The ``kafka.<name>`` options as librdkafka properties."""
    return tuple(sorted((k[len("kafka."):], v) for k, v in options.items()
                        if k.startswith("kafka.")))


def broker_timeout(options: dict[str, str]) -> float | None:
    """Seconds of the ``broker_timeout`` option (``'<n> <unit>'``), None when not given."""
    text = options.get("broker_timeout")
    if text is None:
        return None
    micros = parse_span(text)
    if micros is None:
        raise RunError(f"option broker_timeout: {text!r} is not '<n> <unit>'")
    return micros / 1e6


def failure(where: str, call: str, error: Any = None, *,
            waited: float | None = None) -> RunError:
    """The error of a call to a broker that failed: names the source or sink and its topic
    and brokers (``where``), the call, and Kafka's message (``error``: a ``KafkaError`` or
    ``KafkaException``; None when nothing came back). A broker that did not answer (within
    ``waited`` seconds) is said to be unreachable."""
    from confluent_kafka import KafkaException

    err = error.args[0] if isinstance(error, KafkaException) and error.args else error
    if hasattr(err, "str") and hasattr(err, "name"):
        text, code = err.str(), err.name()
    else:
        text, code = ("" if err is None else str(err)), ""
    detail = f" ({text} [{code}])" if code else f" ({text})" if text else ""
    if err is None or code in _UNANSWERED:
        within = f" within {waited:g}s" if waited is not None else ""
        return RunError(f"{where}: broker not reachable: {call}: no answer{within}{detail}")
    return RunError(f"{where}: {call} failed{detail}")


_WORKER_ERROR = re.compile(r"octo_platform\.errors\.RunError: (.+)")


def worker_error(error: BaseException) -> str | None:
    """The message of the ``RunError`` an executor's task raised (a failed fetch or
    delivery, naming its source or sink), out of the error Spark wraps it in; None if
    ``error`` carries none."""
    found = _WORKER_ERROR.findall(str(error))
    return found[-1].strip() if found else None


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
                   broker_timeout(options), columns, types, options.get("format", "json"))


def watermarks(source: KafkaTopic, *, wait_s: float | None = None
               ) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` of the topic right now; partitions added later show up
    on a later call. A metadata or watermark request that fails is retried for ``wait_s``
    (the source's or sink's ``broker_timeout``); then the run fails with a message naming
    the source or sink and the request, when the broker cannot be reached or the topic
    does not exist."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    wait_s = source.wait_s() if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    try:
        consumer = Consumer(source.config(**{"group.id": f"octo-{source.name}",
                                             "enable.auto.commit": False}))
    except KafkaException as e:  # e.g. a kafka.<property> librdkafka does not know
        raise failure(source.where(), "client configuration", e) from None
    partitions: list[int] | None = None  # once the metadata came
    out: dict[int, tuple[int, int]] = {}  # partitions read so far (a retry goes on from them)
    try:
        while True:
            # each request waits a part of what is left, so a lost one is sent again
            timeout = max(0.1, min(deadline - time.monotonic(), max(1.0, wait_s / 4)))
            problem = None
            try:
                if partitions is None:
                    call = "metadata request"
                    topic = consumer.list_topics(source.topic, timeout=timeout).topics.get(
                        source.topic)
                    if topic is not None and topic.error is None and topic.partitions:
                        partitions = sorted(topic.partitions)
                    else:
                        call = f"topic not found ({topic.error})" if topic is not None and \
                            topic.error is not None else "topic not found"
                for p in partitions or ():
                    if p not in out:
                        call = f"watermark offsets of partition {p}"
                        low, high = consumer.get_watermark_offsets(
                            TopicPartition(source.topic, p), timeout=timeout, cached=False)
                        out[p] = (int(low), int(high))
                if partitions is not None:
                    return out
            except KafkaException as e:
                problem = e
            if time.monotonic() >= deadline:
                if problem is None:
                    raise RunError(f"{source.where()}: {call} after {wait_s:g}s")
                raise failure(source.where(), call, problem, waited=wait_s)
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    finally:
        consumer.close()


def group_id(table: str) -> str:
    """The consumer group whose offsets show a streaming table's progress to lag tools."""
    return f"octo.{table}"


def commit_offsets(source: KafkaSource, table: str, ranges: dict[str, list[int]], *,
                   wait_s: float | None = None) -> None:
    """Commit the ends of a committed batch's ranges as ``table``'s consumer group offsets,
    for lag tools to see (octo itself resumes from its batch log, never from these). Waits
    ``wait_s`` at most (the source's ``broker_timeout``): a synchronous commit waits for the
    group's coordinator up to ``session.timeout.ms`` (45 s by default) and for the broker's
    answer up to ``socket.timeout.ms``. (Not an ``AdminClient``: one whose request timed out
    aborts the process when the broker answers later, in librdkafka 2.16.0.)"""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    wait_ms = max(1000, int((source.wait_s() if wait_s is None else wait_s) * 1000))
    group = group_id(table)
    call = f"offset commit of consumer group {group!r}"
    try:
        consumer = Consumer(source.config(**{
            "group.id": group, "enable.auto.commit": False, "session.timeout.ms": wait_ms,
            "socket.timeout.ms": wait_ms}))
    except KafkaException as e:
        raise failure(source.where(), call, e) from None
    try:
        done = consumer.commit(offsets=[TopicPartition(source.topic, int(p), int(stop))
                                        for p, (_, stop) in ranges.items()],
                               asynchronous=False)
        for tp in done or ():
            if tp.error is not None:
                raise failure(source.where(), f"{call} (partition {tp.partition})", tp.error)
    except KafkaException as e:
        raise failure(source.where(), call, e, waited=wait_ms / 1000) from None
    finally:
        consumer.close()


def read(spark: SparkSession, source: KafkaSource, ranges: dict[str, list[int]]) -> Parsed:
    """The records of the messages of ``ranges`` (``{partition: [from, to)}``), fetched by
    executors (one Spark partition per range) and parsed in the source's format."""
    return parse_json(messages(spark, source, ranges), _as_file_source(source))


def read_local(spark: SparkSession, source: KafkaSource,
               ranges: dict[str, list[int]]) -> Parsed:
    """``read`` for a small batch in the driver: the ranges fetched here, by one consumer,
    and parsed as a small batch of files is (``files.parse_lines``: no Spark job)."""
    import pyarrow as pa

    todo = pa.RecordBatch.from_pylist([{"partition": p, "start": a, "stop": b}
                                       for p, a, b in _todo(ranges)])
    fetched = _fetcher(source, executor=False)(iter([todo])) if todo.num_rows else iter([])
    lines = pa.Table.from_batches(list(fetched), schema=_messages_schema())
    return parse_lines(spark, lines, _as_file_source(source))


def _messages_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("value", pa.string()), ("file", pa.string())])


def _as_file_source(source: KafkaSource) -> FileSource:
    return FileSource(source.name, source.columns, source.types, source.topic, source.format)


def _todo(ranges: dict[str, list[int]]) -> list[tuple[int, int, int]]:
    """(partition, from, to) of the ranges that hold messages, by partition."""
    return sorted((int(p), int(a), int(b)) for p, (a, b) in ranges.items() if b > a)


def messages(spark: SparkSession, source: KafkaSource,
             ranges: dict[str, list[int]]) -> DataFrame:
    """``value`` (a message's value as text) and ``file`` (``topic/partition@offset``) of
    the messages of ``ranges``."""
    todo = _todo(ranges)
    if not todo:
        return spark.createDataFrame([], "value STRING, file STRING")
    plan = spark.createDataFrame(spark.sparkContext.parallelize(todo, len(todo)),
                                 "partition INT, start BIGINT, stop BIGINT")
    return plan.mapInArrow(_fetcher(source), "value STRING, file STRING")


def _fetcher(source: KafkaSource, *, executor: bool = True):
    """The ``mapInArrow`` function fetching the ranges of its input rows (on executors, or
    in the driver for ``read_local``): one batch of messages per input batch, its ranges
    fetched together."""
    config = source.config(**{"group.id": f"octo-{source.name}", "enable.auto.commit": False,
                              "enable.partition.eof": True, "auto.offset.reset": "error"})
    topic, where, wait_s = source.topic, source.where(), source.wait_s(executor=executor)

    def fetch(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from confluent_kafka import Consumer, KafkaException

        task_started()
        try:
            consumer = Consumer(config)
        except KafkaException as e:
            raise failure(where, "client configuration", e) from None
        try:
            for rb in batches:
                todo = list(zip(*(rb.column(i).to_pylist() for i in range(3))))
                values, files = [], []
                for p, offset, value in _ranges(consumer, topic, todo, where, wait_s):
                    if value is None:  # a tombstone: nothing to read
                        continue
                    values.append(value.decode("utf-8", errors="replace"))
                    files.append(f"{topic}/{p}@{offset}")
                yield pa.RecordBatch.from_pydict({"value": values, "file": files},
                                                 schema=_messages_schema())
        finally:
            consumer.close()

    return fetch


def _ranges(consumer: Any, topic: str, todo: list[tuple[int, int, int]], where: str,
            wait_s: float) -> Iterator[tuple[int, int, Any]]:
    """(partition, offset, value) of the messages of the ranges ``todo`` (partition,
    from, to), all assigned at once (one partition after the other would wait each time
    for the fetch the broker holds at the end of the last); per partition in offset order.
    Fails naming ``where`` when nothing arrives for ``wait_s``."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    nxt = {p: a for p, a, _ in todo}  # each partition's next offset
    stops = {p: b for p, _, b in todo}
    unanswered = None

    def call() -> str:
        return ", ".join(f"fetch of partition {p} offsets {nxt[p]}..{stops[p]}"
                         for p in sorted(nxt) if nxt[p] < stops[p])

    try:
        consumer.assign([TopicPartition(topic, p, a) for p, a, _ in todo])
        deadline = time.monotonic() + wait_s
        while any(nxt[p] < stops[p] for p in nxt):
            # many messages a call (59K batched messages: 0.18 s polled one at a time, 0.10 s)
            got = consumer.consume(_FETCH_MESSAGES, min(1.0, wait_s))
            moved = False
            for msg in got:
                err = msg.error()
                if err is not None and (err.code() == KafkaError._PARTITION_EOF
                                        or err.name() in _UNANSWERED):
                    if err.name() in _UNANSWERED:
                        unanswered = err  # the client retries: wait on, up to the deadline
                    continue
                if err is not None:
                    raise failure(where, call(), err)
                p, offset = msg.partition(), msg.offset()
                if p not in nxt or offset < nxt[p] or nxt[p] >= stops[p]:
                    continue  # before the range (a compacted topic's fetch), or past its end
                nxt[p] = offset + 1  # offsets may skip (transaction markers, compaction)
                moved = True
                if offset < stops[p]:
                    yield p, offset, msg.value()
            if moved:
                deadline = time.monotonic() + wait_s
            elif time.monotonic() > deadline:
                raise failure(where, call(), unanswered, waited=wait_s)
        consumer.unassign()
    except KafkaException as e:
        raise failure(where, call(), e, waited=wait_s) from None


def to_end(config: dict[str, Any], topic: str, partition: int, start: int, where: str, *,
           wait_s: float = EXECUTOR_WAIT_S) -> Iterator[Any]:
    """The messages of ``partition`` from offset ``start`` to its end: read until the
    broker says end-of-partition, not to the high watermark (a broker may report that short
    of its last record batch). ``config`` needs ``enable.partition.eof``; fails naming
    ``where`` when nothing arrives for ``wait_s``."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    call, unanswered = f"read of partition {partition} from offset {start} to its end", None
    try:
        consumer = Consumer(config)
    except KafkaException as e:
        raise failure(where, "client configuration", e) from None
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + wait_s
        while True:
            msg = consumer.poll(min(1.0, wait_s))
            err = msg.error() if msg is not None else None
            if msg is None or err is not None and err.name() in _UNANSWERED:
                unanswered = err or unanswered  # the client retries: wait on, up to the deadline
                if time.monotonic() > deadline:
                    raise failure(where, call, unanswered, waited=wait_s)
                continue
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return
                raise failure(where, call, err)
            deadline = time.monotonic() + wait_s
            yield msg
    except KafkaException as e:
        raise failure(where, call, e, waited=wait_s) from None
    finally:
        consumer.close()

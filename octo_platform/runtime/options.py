"""What every entry point of the runtime is told: the environment, the warehouse, the state
buckets and where progress lines go (``run_tables``, ``backfill``, ``refresh``,
``table_status``).

Build one with ``octo_platform.wiring.default_options`` (the default edges) or directly from
an ``Environment`` of your own.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlparse

from octo_platform.project import DEFAULT_WAREHOUSE
from octo_platform.runtime.environment import Environment
from octo_platform.runtime.layout import Layout
from octo_platform.runtime.driver import DEFAULT_DRIVER_ROWS, DEFAULT_DRIVER_STATE_ROWS

__all__ = ["RunOptions", "resolve_warehouse"]


@dataclass(frozen=True)
class RunOptions:
    """The environment and settings shared by the runtime's entry points.

    ``warehouse``: directory or URI (default ``<project>/warehouse``); ``buckets``: state
    partitions of a new table; ``progress``: receives one line per batch (None: quiet);
    ``driver_rows``: batches of at most this many input rows (and at most
    ``operators.arrow.DRIVER_BYTES`` of input) run in the driver, with no Spark job but
    reading the input (0: every batch runs as Spark jobs), and only while the state they
    would hold there (state tables, current-state rows) is at most ``driver_state_rows``.
    """

    env: Environment
    warehouse: str | None = None
    buckets: int | None = None
    progress: Callable[[str], None] | None = print
    driver_rows: int = DEFAULT_DRIVER_ROWS
    driver_state_rows: int = DEFAULT_DRIVER_STATE_ROWS

    def layout(self, project_root: Path) -> Layout:
        """Where the tables of the project at ``project_root`` live."""
        return Layout(resolve_warehouse(project_root, self.warehouse))


def resolve_warehouse(project_root: Path, warehouse: str | None) -> str:
    """The warehouse as an absolute path or a URI (default ``<project>/warehouse``); a
    ``file:`` URI as the path it names, so that it is read and written as local files
    (delta-rs refuses to make a table at a ``file:`` URI whose directory is missing)."""
    if warehouse is None:
        return str(project_root / DEFAULT_WAREHOUSE)
    parsed = urlparse(warehouse)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return str(Path(unquote(parsed.path)).resolve())
    if "://" in warehouse:
        return warehouse.rstrip("/")
    return str(Path(warehouse).resolve())

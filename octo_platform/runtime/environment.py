"""The runtime's ports: the edges (Delta IO, connectors) it is handed, never picks.

``octo_platform.wiring`` builds an ``Environment``; the CLI, the demo, ``orchestration/`` and
the benchmarks pass it in (inside ``RunOptions``, ``runtime/options.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from octo_platform.runtime.offsets import Store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Environment"]


@dataclass(frozen=True)
class Environment:
    """The pluggable edges: Delta IO and connectors (wired in ``octo_platform.wiring``).

    ``rebuild`` builds the same environment again in another process: Spark's Python source
    runner gets it pickled (``runtime/batches.py``), so it must be picklable (a module-level
    function, or a ``functools.partial`` of one).
    """

    store: Store
    list_files: Callable[[str], list[str]]
    read_files: Callable[..., Any]
    # (spark, source, files) -> records over a local relation, read in the driver (small
    # batches); LookupError for what only Spark reads
    read_files_local: Callable[..., Any]
    file_source: Callable[..., Any]
    delta_source: Callable[..., Any]
    decode_changelog: Callable[[DataFrame, tuple[str, ...]], DataFrame]
    decode_changelog_arrow: Callable[[Any, tuple[str, ...]], Any]  # the same over Arrow
    encode_changelog: Callable[..., DataFrame]
    encode_keyed: Callable[..., DataFrame]
    kafka_source: Callable[..., Any]  # (name, WITH options, columns=, types=) -> a source
    kafka_watermarks: Callable[[Any], dict[int, tuple[int, int]]]  # {partition: (low, high)}
    read_kafka: Callable[..., Any]  # (spark, source, ranges) -> records, like read_files
    commit_kafka: Callable[..., None]  # (source, table, ranges): consumer-group offsets
    kafka_sink: Callable[..., Any]  # (name, WITH options, table=, key=) -> a sink's topic
    publish_kafka: Callable[..., dict[str, int]]  # (sink, events, starts=, resume=) -> counts
    rebuild: Callable[[], Environment]

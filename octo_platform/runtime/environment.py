"""The runtime's ports: the edges (Delta IO, connectors) it is handed, never picks.

``octo_platform.wiring`` builds an ``Environment``; the CLI, the demo, ``orchestration/`` and
the benchmarks pass it in (inside ``RunOptions``, ``runtime/options.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["Environment", "Store"]


class Store(Protocol):
    """What the runtime needs from Delta (implemented by ``state.delta.DeltaStore``)."""

    def version(self, path: str) -> int | None: ...
    def files(self, path: str, version: int | None,
              partitions: set[int] | None = None) -> list[str]: ...
    def added_files(self, path: str, from_version: int | None, to_version: int) -> list[str]: ...
    def read(self, path: str, version: int | None = None) -> pa.Table | None: ...
    def num_rows(self, path: str, version: int | None = None) -> int | None: ...
    def arrow_schema(self, path: str) -> pa.Schema | None: ...
    def table_info(self, path: str, version: int | None = None) -> dict[str, Any] | None: ...
    def snapshot(self, path: str, version: int) -> tuple[list[str], pa.Table] | None: ...
    def missing_files(self, path: str, uris: list[str]) -> list[str]: ...
    def change_data(self, path: str, from_version: int,
                    to_version: int) -> pa.Table | None: ...
    def compact(self, path: str, *, rewrite: bool) -> None: ...
    def write(self, path: str, data: pa.Table, *, app_id: str, batch: int) -> int | None: ...
    def data_files(self, path: str, version: int | None) -> list[dict[str, Any]]: ...
    def done(self, path: str, *, app_id: str, batch: int) -> bool: ...
    def opener(self) -> Callable[[str, str], Any]: ...
    def reader(self) -> Callable[[str, str], Any]: ...
    def commit(self, path: str, files: list[dict[str, Any]], *, schema: pa.Schema, app_id: str,
               batch: int, partition_by: list[str] | None = None,
               replace: set[int] | str | None = None,
               remove: tuple[str, ...] = ()) -> int | None: ...


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
    read_kafka_local: Callable[..., Any]  # the same fetched in the driver (small batches)
    commit_kafka: Callable[..., None]  # (source, table, ranges): consumer-group offsets
    kafka_sink: Callable[..., Any]  # (name, WITH options, table=, key=) -> a sink's topic
    # (sink, events, starts=, resume=, local_rows=) -> counts; local_rows: events is a local
    # relation of that many rows, published from the driver
    publish_kafka: Callable[..., dict[str, int]]
    rebuild: Callable[[], Environment]

"""What a batch's stages see of the pipeline running them (``pipeline.Pipeline``): reading
inputs (``inputs``, ``driver_inputs``), the driver path (``driver``), the changelog sink
(``sink``) and publishing a recomputation (``publish``) take a ``TableRun``, so that none of
them imports the pipeline that calls it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from octo_platform.project import CompiledTable, Project
    from octo_platform.runtime.environment import Environment
    from octo_platform.runtime.layout import Layout
    from octo_platform.runtime.offsets import BatchLog, InputSpec

__all__ = ["TableRun"]


class TableRun(Protocol):
    spark: SparkSession
    project: Project
    table: CompiledTable
    layout: Layout
    env: Environment
    name: str  # the streaming table's
    buckets: int  # of its current-state table and partitioned state
    fingerprint: str  # of its plan and buckets, kept in every commit record
    memo: dict[str, Any]  # lives for the run: shapes, the driver path's state cache
    inputs: tuple[InputSpec, ...]
    delta_sources: dict[str, Any]  # its ``delta`` sources by name
    log: BatchLog
    watermarked: int  # how many of its inputs have a watermark
    progress: Callable[[str], None] | None
    cache_counts: Any  # Spark-path tasks' (buckets found in their machine's cache, looked up)

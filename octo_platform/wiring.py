"""Wire the runtime to its edges: delta-rs for storage, the files and delta connectors.

The only module that picks implementations: the CLI, the demo, ``orchestration/`` and the
benchmarks call it and pass the result to the runtime's entry points.
"""
from __future__ import annotations

import functools
from typing import Callable

from octo_platform.runtime.environment import Environment
from octo_platform.runtime.driver import DEFAULT_DRIVER_ROWS, DEFAULT_DRIVER_STATE_ROWS
from octo_platform.runtime.options import RunOptions

__all__ = ["default_environment", "default_options"]


def default_environment(storage_options: dict[str, str] | None = None) -> Environment:
    """delta-rs (with ``storage_options`` for object stores) and the built-in connectors."""
    from connectors import debezium, delta_table, files, kafka, kafka_sink
    from state.delta import DeltaStore

    store = DeltaStore(storage_options)

    def file_source(sdef, path: str) -> files.FileSource:
        return files.FileSource(sdef.name, sdef.columns, sdef.types, path, sdef.format,
                                tuple(sorted(sdef.options.items())))

    def delta_source(sdef, path: str) -> delta_table.DeltaSource:
        return delta_table.DeltaSource(sdef.name, sdef.columns, sdef.types, path, store,
                                       append_only=sdef.mode == "append-only")

    return Environment(
        store=store,
        list_files=files.list_files,
        read_files=files.read_files,
        read_files_local=files.read_files_local,
        file_source=file_source,
        delta_source=delta_source,
        decode_changelog=debezium.decode,
        decode_changelog_arrow=debezium.decode_arrow,
        encode_changelog=debezium.encode,
        encode_keyed=debezium.encode_keyed,
        kafka_source=kafka.KafkaSource.from_options,
        kafka_watermarks=kafka.watermarks,
        read_kafka=kafka.read,
        read_kafka_local=kafka.read_local,
        commit_kafka=kafka.commit_offsets,
        kafka_sink=kafka_sink.KafkaSink.from_options,
        publish_kafka=kafka_sink.publish,
        rebuild=functools.partial(default_environment, storage_options),
    )


def default_options(*, warehouse: str | None = None,
                    storage_options: dict[str, str] | None = None,
                    buckets: int | None = None,
                    progress: Callable[[str], None] | None = print,
                    driver_rows: int = DEFAULT_DRIVER_ROWS,
                    driver_state_rows: int = DEFAULT_DRIVER_STATE_ROWS) -> RunOptions:
    """``RunOptions`` on the default environment, e.g.
    ``run_tables(spark, "my_project", options=default_options(warehouse="s3://b/wh"))``."""
    return RunOptions(default_environment(storage_options), warehouse=warehouse,
                      buckets=buckets, progress=progress, driver_rows=driver_rows,
                      driver_state_rows=driver_state_rows)

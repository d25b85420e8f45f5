"""Wire the runtime to its edges: delta-rs for storage, the files and delta connectors.

With the CLI and ``orchestration/``, the only place that picks implementations.
"""
from __future__ import annotations

from octo_platform.runtime.pipeline import Environment

__all__ = ["default_environment"]


def default_environment(storage_options: dict[str, str] | None = None) -> Environment:
    from connectors import debezium, delta_table, files
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
        file_source=file_source,
        delta_source=delta_source,
        decode_changelog=debezium.decode,
        encode_changelog=debezium.encode,
        encode_keyed=debezium.encode_keyed,
    )

"""Wire the runtime to its edges: delta-rs for storage, the files connector for input.

With the CLI and ``orchestration/``, the only place that picks implementations.
"""
from __future__ import annotations

from octo_platform.runtime.pipeline import Environment

__all__ = ["default_environment"]


def default_environment(storage_options: dict[str, str] | None = None) -> Environment:
    from connectors import debezium, files
    from state.delta import DeltaStore

    def file_source(sdef, path: str) -> files.FileSource:
        return files.FileSource(sdef.name, sdef.columns, sdef.types, path, sdef.format,
                                tuple(sorted(sdef.options.items())))

    return Environment(
        store=DeltaStore(storage_options),
        list_files=files.list_files,
        read_files=files.read_files,
        file_source=file_source,
        decode_changelog=debezium.decode,
        encode_changelog=debezium.encode,
        encode_keyed=debezium.encode_keyed,
    )

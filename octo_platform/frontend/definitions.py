"""What binding produces: the definitions of a project's sources, streaming tables and sinks.

Pure data: the catalog (``binder``) builds them, the compiler and the orchestration read them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from octo_platform.logical.plan import Mode, Node
from octo_platform.partitions import Partitioning
from octo_platform.sqltext import quote

__all__ = ["SourceDef", "TableDef", "SinkDef", "Watermark"]


class _Connected:
    """A source or sink: ``options`` (its ``WITH``) name its connector."""

    options: dict[str, str]

    @property
    def connector(self) -> str:
        return self.options.get("connector", "")

    @property
    def shown_options(self) -> dict[str, str]:
        """The options as they may be shown: a secret's value (a ``kafka.`` property named
        like a password, secret, key, token or JAAS config) replaced by ``***``."""
        return {k: "***" if k.startswith("kafka.") and any(w in k for w in _SECRET_WORDS)
                else v for k, v in self.options.items()}


_SECRET_WORDS = ("password", "secret", "key", "token", "jaas", "credential")


@dataclass(frozen=True)
class Watermark:
    """A source's ``WATERMARK FOR column AS column - delay``: the source's watermark is the
    largest ``column - delay`` of the rows it has read; rows below it are late."""

    column: str
    delay_us: int  # microseconds
    sql: str  # the expression as written

    def time_sql(self, debezium: bool) -> str:
        """SQL of a parsed record's event time (a change event's: its ``after`` image's,
        a delete's ``before``'s)."""
        col = quote(self.column)
        return (f"CASE WHEN op = 'd' THEN before.{col} ELSE after.{col} END" if debezium
                else col)


@dataclass(frozen=True)
class SourceDef(_Connected):
    """A bound ``CREATE SOURCE``."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    options: dict[str, str]
    mode: Mode
    pk: tuple[str, ...] | None
    file: str = ""
    watermark: Watermark | None = None

    @property
    def format(self) -> str:
        return self.options.get("format", "")


@dataclass(frozen=True)
class TableDef:
    """A bound ``CREATE STREAMING TABLE`` with its logical plan."""

    name: str
    plan: Node
    options: dict[str, str]
    sql: str
    file: str
    pk: tuple[str, ...] | None
    deps: tuple[str, ...] = field(default=())
    partitioning: Partitioning | None = None
    # The column that carries the table's watermark to tables that read it (its
    # window_end, when its windows close by a watermark), if any.
    event_time: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return self.plan.columns


@dataclass(frozen=True)
class SinkDef(_Connected):
    """A bound ``CREATE SINK``: where a streaming table's changelog is published."""

    name: str
    table: str  # the streaming table, as its definition spells it
    options: dict[str, str]
    file: str = ""

    @property
    def tombstones(self) -> bool:
        return self.options.get("tombstones", "false") == "true"

    @property
    def target(self) -> str:
        """Where it publishes: ``kafka://<bootstrap servers>/<topic>``."""
        return f"kafka://{self.options['bootstrap_servers']}/{self.options['topic']}"

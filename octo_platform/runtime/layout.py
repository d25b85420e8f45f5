"""Where each table of a streaming table lives under the warehouse (documented in README.md,
"The warehouse")."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Layout", "ScratchLayout"]


@dataclass(frozen=True)
class Layout:
    """Where each table lives under the warehouse (documented in README.md, "The warehouse")."""

    warehouse: str

    def changelog(self, table: str) -> str:
        return f"{self.warehouse}/{table}"

    def current(self, table: str) -> str:
        return f"{self.warehouse}/_current/{table}"

    def dead_letters(self, table: str) -> str:
        return f"{self.warehouse}/_dead_letters/{table}"

    def internal(self, table: str) -> str:
        return f"{self.warehouse}/_octo/{table}"

    def log(self, table: str) -> str:
        return f"{self.internal(table)}/log"

    def state(self, table: str, operator: str) -> str:
        return f"{self.internal(table)}/state/{operator}"


@dataclass(frozen=True)
class ScratchLayout(Layout):
    """Where a recomputation of ``table`` writes (a scratch warehouse under the live table's
    internal folder); every other table is read where ``live`` keeps it."""

    live: Layout = Layout("")
    table: str = ""

    @classmethod
    def for_batch(cls, live: Layout, table: str, batch: int) -> ScratchLayout:
        return cls(f"{live.internal(table)}/recompute/{batch}", live, table)

    def changelog(self, table: str) -> str:
        if table.lower() == self.table.lower():
            return super().changelog(table)
        return self.live.changelog(table)

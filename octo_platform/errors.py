"""One exception hierarchy for the whole package: catch ``OctoError`` to catch ours."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

__all__ = ["OctoError", "Location", "SqlError", "PlanError", "CatalogError", "RunError",
           "SessionError", "TooManyPairs", "OPERATOR", "in_operator", "notes"]

OPERATOR = "in operator "  # the start of the note ``in_operator`` adds


class OctoError(Exception):
    """Root of every error octo raises on purpose."""


@dataclass(frozen=True)
class Location:
    """A place in a SQL file: 1-based line and column plus the text of that line."""

    file: str
    line: int
    col: int
    line_text: str = ""

    def render(self) -> str:
        caret = " " * max(self.col - 1, 0) + "^"
        if not self.line_text:
            return f"{self.file}:{self.line}:{self.col}"
        return f"{self.file}:{self.line}:{self.col}\n    {self.line_text}\n    {caret}"


class SqlError(OctoError):
    """A SQL file that cannot be parsed or bound; names the file, line and column."""

    def __init__(self, message: str, location: Location | None = None) -> None:
        self.message = message
        self.location = location
        where = f"{location.render()}\n" if location else ""
        first, _, rest = where.partition("\n")
        text = f"{first}: {message}" + (f"\n{rest}" if rest else "") if location else message
        super().__init__(text.rstrip())


class PlanError(SqlError):
    """A query we cannot maintain incrementally (rejected at plan time)."""


class CatalogError(OctoError):
    """An unknown or duplicate source, view or streaming table."""


class RunError(OctoError):
    """A failure while running a streaming table (IO, state mismatch, lock held, ...)."""


class TooManyPairs(RunError):
    """A cross join's batch would pair more rows than its bound (``JoinStep.bound``)."""


class SessionError(OctoError):
    """Spark's JVM did not start (e.g. Delta's jars could not be fetched)."""


@contextmanager
def in_operator(what: str) -> Iterator[None]:
    """An error raised in the block (an operator's work: ``what`` is its ``describe()``)
    gets a note naming the operator, unless an operator inside it named one already (the
    innermost one did the work). The error itself is unchanged: its type still decides
    whether the batch is retried."""
    try:
        yield
    except Exception as e:
        if what and not any(str(n).startswith(OPERATOR) for n in getattr(e, "__notes__", ())):
            e.add_note(OPERATOR + what)
        raise


def notes(error: BaseException) -> str:
    """An error's notes (``in_operator``'s, Python's ``add_note``) as text to append to its
    message: `` (note; note)``, or nothing."""
    found = [str(n) for n in getattr(error, "__notes__", ())]
    return f" ({'; '.join(found)})" if found else ""

"""Time spans in microseconds: the units octo's SQL accepts and how plans show a span."""
from __future__ import annotations

__all__ = ["UNITS", "span_text"]

UNITS = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000,
         "MINUTE": 60_000_000, "HOUR": 3_600_000_000, "DAY": 86_400_000_000,
         "WEEK": 7 * 86_400_000_000}


def span_text(micros: int) -> str:
    """``micros`` in the largest unit that divides it: ``'1 MINUTE'``, ``'90 SECOND'``."""
    for unit, size in sorted(UNITS.items(), key=lambda u: -u[1]):
        if micros % size == 0:
            return f"{micros // size} {unit}"
    return f"{micros} MICROSECOND"

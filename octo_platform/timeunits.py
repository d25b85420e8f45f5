"""Time spans in microseconds: the units octo's SQL accepts and how plans show a span."""
from __future__ import annotations

__all__ = ["UNITS", "span_text", "parse_span"]

UNITS = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000,
         "MINUTE": 60_000_000, "HOUR": 3_600_000_000, "DAY": 86_400_000_000,
         "WEEK": 7 * 86_400_000_000}


def span_text(micros: int) -> str:
    """``micros`` in the largest unit that divides it: ``'1 MINUTE'``, ``'90 SECOND'``."""
    for unit, size in sorted(UNITS.items(), key=lambda u: -u[1]):
        if micros % size == 0:
            return f"{micros // size} {unit}"
    return f"{micros} MICROSECOND"


def parse_span(text: str) -> int | None:
    """Microseconds of ``'<n> <unit>'`` (``'1 hour'``, ``'30 minutes'``; ``n`` a positive
    whole number), None if it is not that."""
    parts = text.strip().split()
    if len(parts) != 2 or not parts[0].isdigit() or int(parts[0]) <= 0:
        return None
    unit = parts[1].upper().removesuffix("S")
    return int(parts[0]) * UNITS[unit] if unit in UNITS else None

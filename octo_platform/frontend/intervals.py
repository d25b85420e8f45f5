"""Interval literals (``INTERVAL '10' MINUTE``) as microseconds, for watermark delays and,
later, window sizes."""
from __future__ import annotations

from decimal import Decimal, InvalidOperation

from sqlglot import exp

__all__ = ["UNITS", "interval_micros"]

UNITS = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000,
         "MINUTE": 60_000_000, "HOUR": 3_600_000_000, "DAY": 86_400_000_000,
         "WEEK": 7 * 86_400_000_000}


def interval_micros(node: exp.Expression) -> int | None:
    """Microseconds of ``INTERVAL 'n' UNIT`` (also ``INTERVAL n UNITS`` and
    ``INTERVAL 'n units'``, ``n`` possibly fractional); None if ``node`` is not such a
    literal with a positive length."""
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        return None
    unit = node.text("unit").upper().removesuffix("S")
    if unit not in UNITS:
        return None
    try:
        amount = Decimal(node.this.name)
    except InvalidOperation:
        return None
    micros = amount * UNITS[unit]
    return int(micros) if micros > 0 and micros == int(micros) else None

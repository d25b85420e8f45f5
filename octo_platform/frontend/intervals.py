"""Interval literals (``INTERVAL '10' MINUTE``) as microseconds: watermark delays, window
sizes and slides."""
from __future__ import annotations

from decimal import Decimal, InvalidOperation

from sqlglot import exp

from octo_platform.timeunits import UNITS

__all__ = ["interval_micros"]


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

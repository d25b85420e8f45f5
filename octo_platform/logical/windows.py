"""Which columns of a plan are window bounds, so an aggregate grouped by a window knows
when a group is final: once the query's watermark reaches the window's end."""
from __future__ import annotations

from dataclasses import dataclass

from octo_platform.logical.plan import (
    WINDOW_COLUMNS,
    Aggregate,
    Filter,
    Node,
    Project,
    Scan,
    Window,
)
from octo_platform.sqltext import unquote

__all__ = ["Closing", "window_bound", "closing_key", "final_when_closed"]


@dataclass(frozen=True)
class Closing:
    """A group key that is a window's start or end: the group is final when the
    watermark is at least ``key + offset_us`` (the window's end)."""

    key: str
    offset_us: int
    window: Window | None  # None: an upstream table's window_end, read through a scan


def window_bound(node: Node, column: str) -> tuple[Window | None, int] | None:
    """When ``column`` of ``node`` is a window's start or end passed on unchanged (through
    filters, bare projections and group keys): the window (None for an upstream table's
    ``window_end``, read through a scan), and the microseconds to add to the column's value
    to reach the window's end."""
    if isinstance(node, Scan):
        return (None, 0) if column == node.event_time else None
    if isinstance(node, Window):
        if column == WINDOW_COLUMNS[1]:
            return node, 0
        if column == WINDOW_COLUMNS[0]:  # a session has no fixed length
            return None if node.kind == "session" else (node, node.size_us)
        return window_bound(node.input, column)
    if isinstance(node, Filter):
        return window_bound(node.input, column)
    if isinstance(node, Project):
        source = unquote(node.exprs[node.columns.index(column)])
        return None if source is None else window_bound(node.input, source)
    if isinstance(node, Aggregate):
        out = node.columns.index(column)
        return window_bound(node.input, node.keys[out]) if out < len(node.keys) else None
    return None


def closing_key(agg: Aggregate) -> Closing | None:
    """The first group key of ``agg`` that is a window bound, if any."""
    for key in agg.keys:
        found = window_bound(agg.input, key)
        if found is not None:
            return Closing(key, found[1], found[0])
    return None


def final_when_closed(agg: Aggregate, closing: Closing) -> bool:
    """Whether a group of ``agg`` never changes once its window closed: its input only
    appends, or it is a session window over input that only appends, read through filters
    and projections (sessions merge and move rows, but only while they are open), or the
    window's time is an upstream table's ``window_end``."""
    window = closing.window
    if agg.input.mode == "append-only" or window is None:
        return True  # an upstream table only changes windows its watermark left open
    node = agg.input
    while isinstance(node, (Filter, Project)):
        node = node.input
    if node is window and window.kind == "session" and window.input.mode == "append-only":
        return True
    # A window over an upstream table's window_end (read through filters and projections):
    # the table changes only rows whose window_end is above its watermark.
    below = window.input
    while isinstance(below, (Filter, Project)):
        below = below.input
    return node is window and isinstance(below, Scan) and \
        window_bound(window.input, window.time) == (None, 0)

"""JSON lines read in Python where Spark's reading of them is certain: the driver path's
small batches of ``json`` and ``debezium-json`` files, without Spark's ``from_json``.

``files.parse_json`` is the definition: Spark's ``from_json`` (PERMISSIVE) over each line
that is not blank. Through Spark a small batch's parse costs four DataFrame calls that Spark
analyses in its JVM and one evaluation, ~80 ms on a quiet JVM here and ~0.2 s with three
tables' batches side by side, for a dozen lines. ``exact_json`` gives the same records
(the columns of ``parse_json``'s, as Spark's Arrow types them) only when every line is
certain to be read alike: a JSON object (keys unique, none differing from a declared
column's name in case alone) whose every declared field is null or a JSON value of exactly
the kind Spark reads into that column's type with no conversion (an integer in range for
BIGINT and INT, a number for DOUBLE, a string for STRING, true or false for BOOLEAN; a
nested object for Debezium's images), and, for Debezium, every event valid (no
``debezium.validate`` reason). A TIMESTAMP is read here only in a session whose time zone
is UTC, and only as a string ``yyyy-MM-dd HH:mm:ss`` (or with ``T`` between), up to six
digits of a second and an optional ``Z``, naming a valid date and time: Spark reads such a
string, in its default format or its fallback parse, as that wall-clock time in the
session's zone (``tests/test_json_lines.py`` compares both readings). A DATE is read here
only as a string ``yyyy-MM-dd`` naming a valid date, in any zone. Neither is read here under
Spark's lenient legacy parser (``local_frames.session_times``). Any other line, and
any other column type, returns None: Spark parses the batch, so its text for a value of
another kind (``12`` for a STRING is ``"12"``), its dead letters and their reasons stay its
own.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable

from connectors.debezium import CHANGELOG_OPS
from octo_platform.local_frames import arrow_type

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["exact_json", "EXACT_LINES", "UTC_ZONES"]

# Up to this many lines. Python's parse took 12-23 us a line here (1,000 lines in 12-23 ms,
# against ~80 ms for Spark's calls), 10,000 lines 0.2-0.7 s: about what Spark's job over
# Arrow batches costs them, on every core (``local_frames.COLLECT_ROWS``).
EXACT_LINES = 2_000


# Zones whose wall clock is UTC's: a TIMESTAMP string Spark reads in one is read here.
UTC_ZONES = frozenset({"UTC", "Etc/UTC", "GMT", "Etc/GMT", "Z"})
_TIMESTAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?Z?")
_DATE = re.compile(r"(\d{4})-(\d\d)-(\d\d)")
_EPOCH = datetime(1970, 1, 1)
_MICRO = timedelta(microseconds=1)


class _Unsure(Exception):
    """A line Spark might read otherwise: Spark parses the batch."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Unsure("a key given twice")
    return out


def _constant(name: str) -> Any:
    raise _Unsure(f"{name} is not JSON")


def _scalar(kind: str) -> Callable[[Any], Any]:
    if kind in ("int64", "int32"):
        bound = 2 ** (63 if kind == "int64" else 31)

        def integer(v: Any) -> Any:
            if type(v) is not int or not -bound <= v < bound:
                raise _Unsure("not an integer in range")
            return v
        return integer
    if kind == "double":
        def number(v: Any) -> Any:
            if type(v) is int:
                return float(v)  # as exactly rounded as Spark's (an OverflowError: unsure)
            if type(v) is not float:
                raise _Unsure("not a number")
            return v
        return number
    if kind == "timestamp":
        def instant(v: Any) -> Any:
            *parts, fraction = _plain(_TIMESTAMP, v, "timestamp")
            at = _real(*map(int, parts), int((fraction or "0").ljust(6, "0")))
            return (at - _EPOCH) // _MICRO
        return instant
    if kind == "date":
        def day(v: Any) -> Any:
            return (_real(*map(int, _plain(_DATE, v, "date"))) - _EPOCH).days
        return day
    wanted = {"string": str, "bool": bool}[kind]

    def same(v: Any) -> Any:
        if type(v) is not wanted:
            raise _Unsure(f"not a {kind}")
        return v
    return same


def _plain(pattern: re.Pattern[str], v: Any, what: str) -> tuple[str, ...]:
    """The groups of ``pattern`` matching all of the string ``v``."""
    found = pattern.fullmatch(v) if type(v) is str else None
    if found is None:
        raise _Unsure(f"not a {what} string of the plain form")
    return found.groups()


def _real(*parts: int) -> datetime:
    """The date and time of ``parts``, if there is one."""
    try:
        return datetime(*parts)
    except ValueError as e:  # no such date or time: Spark gives its reason
        raise _Unsure("not a valid date and time") from e


def _struct(fields: dict[str, Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """A checker of a JSON object read as a struct of ``fields``: the object with each
    field's value checked (unknown keys dropped, as Spark ignores them)."""
    lower = {name.lower() for name in fields}

    def check(obj: Any) -> Any:
        if obj is None:
            return None
        if type(obj) is not dict:
            raise _Unsure("not an object")
        for key in obj:
            if key not in fields and key.lower() in lower:
                raise _Unsure("a key differing from a column's name in case alone")
        return {name: None if obj.get(name) is None else check_value(obj[name])
                for name, check_value in fields.items()}
    return check


def _row_checker(columns: tuple[str, ...], types: tuple[str, ...], timestamps: bool = False,
                 dates: bool = False) -> tuple[Callable[[Any], Any], pa.StructType] | None:
    import pyarrow as pa

    kinds = {pa.int64(): "int64", pa.int32(): "int32", pa.float64(): "double",
             pa.string(): "string", pa.bool_(): "bool"}
    if timestamps:
        kinds[arrow_type("TIMESTAMP")] = "timestamp"
    if dates:
        kinds[arrow_type("DATE")] = "date"
    fields, arrow = {}, []
    for column, spark_type in zip(columns, types):
        t = arrow_type(spark_type)
        kind = None if t is None else kinds.get(t)
        if kind is None:
            return None
        fields[column] = _scalar(kind)
        arrow.append(pa.field(column, t))
    return _struct(fields), pa.struct(arrow)


def exact_json(lines: pa.Table, fmt: str, columns: tuple[str, ...], types: tuple[str, ...],
               zone: str | None = None, dates: bool = False) -> pa.Table | None:
    """``parse_json``'s records of ``lines`` (``value``: a line, ``file``: its file) in
    ``fmt``, computed here when Spark's reading of every line is certain (module docstring);
    None otherwise, or above ``EXACT_LINES`` lines (never made Python objects). ``zone``,
    ``dates``: how the session reads time strings (``local_frames.session_times``; None and
    False: unknown, TIMESTAMP and DATE columns are left to Spark)."""
    import pyarrow as pa

    made = _row_checker(columns, types, timestamps=zone in UTC_ZONES, dates=dates) \
        if lines.num_rows <= EXACT_LINES else None
    if made is None:
        return None
    values, files = lines["value"].to_pylist(), lines["file"].to_pylist()
    row, row_type = made
    if fmt == "debezium-json":
        image = _struct({"before": row, "after": row, "op": _scalar("string")})
        event = _struct({"before": row, "after": row, "op": _scalar("string"),
                         "payload": image})
    else:
        event = row
    parsed, raw, where = [], [], []
    try:
        for value, file in zip(values, files):
            if value is None or not value.strip(" "):  # NULL (Kafka), or blank: trim's spaces
                continue
            obj = json.loads(value, object_pairs_hook=_unique, parse_constant=_constant)
            if type(obj) is not dict or "_corrupt" in obj:  # parse_json's own column
                raise _Unsure("not an object")
            parsed.append(event(obj))
            raw.append(value)
            where.append(file)
        return _table(parsed, raw, where, fmt, columns, row_type)
    except (_Unsure, ValueError, RecursionError, OverflowError, pa.ArrowException):
        return None  # (a string no Arrow array holds, e.g. a lone surrogate: ValueError)


def _table(parsed: list[Any], raw: list[str], where: list[str], fmt: str,
           columns: tuple[str, ...], row_type: pa.StructType) -> pa.Table:
    import pyarrow as pa

    strings = [pa.array(raw, pa.string()), pa.array(where, pa.string()),
               pa.nulls(len(raw), pa.string())]
    tail = ["_raw", "_file", "_reason"]
    if fmt != "debezium-json":
        rows = pa.array(parsed, row_type)
        return pa.table([*rows.flatten(), *strings], names=[*columns, *tail])
    images = []
    for e in parsed:
        p = e["payload"]
        op = e["op"] if p is None or p["op"] is None else p["op"]
        before, after = (e["before"], e["after"]) if p is None else (p["before"], p["after"])
        if op not in CHANGELOG_OPS or (op != "d" and after is None) \
                or (op in ("u", "d") and before is None):
            raise _Unsure("an invalid event: Spark gives its reason")
        images.append((op, before, after))
    ops, befores, afters = zip(*images) if images else ((), (), ())
    return pa.table([pa.array(ops, pa.string()), pa.array(befores, row_type),
                     pa.array(afters, row_type), *strings],
                    names=["op", "before", "after", *tail])

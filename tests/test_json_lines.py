"""JSON lines read in Python (``connectors.json_lines``) only where Spark reads them alike:
each batch below either gives exactly Spark's records (``files.parse_json`` over a local
relation: same columns, types and values) or is left to Spark."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from connectors.files import FileSource, parse_json
from connectors.json_lines import exact_json
from octo_platform.local_frames import collect_arrow, local_frame
from tests.oracle import RandomInput

COLUMNS = ("id", "n", "g", "d", "b")
TYPES = ("BIGINT", "INT", "STRING", "DOUBLE", "BOOLEAN")
# Lines Python reads as Spark does (None: a Kafka message's NULL value, skipped as a blank
# line is), then lines Spark reads otherwise or not at all.
SAME = ['{"id": 1}', '{"d": 1}', '{"d": 1e400}', '{"g": "a\\u00e9"}', '{"id": -0}',
        '{"d": -0.0}', '{"x": [1, {"y": 2}], "id": 3}', '  {"id": 4}  ', '\t{"id": 4}\t',
        '   ', '', None, '{}', '{"d": 12345678901234567890}',
        '{"b": true, "g": "x", "n": -2147483648, "d": 0.1}']
OTHER = ['{"id": 1.0}', '{"n": 3000000000}', '{"g": 12}', '{"d": "NaN"}', '{"d": NaN}',
         '{"id": 1, "id": 2}', 'null', '[1]', '{"id": 1} x', '{"ID": 5}', '{"g": "\\ud800"}',
         '\t', '{"_corrupt": "x"}', '{oops', '{"b": 1}']
EVENTS = ['{"before": null, "after": {"id": 1, "g": "x"}, "op": "c"}',
          '{"payload": {"before": {"id": 1}, "after": {"id": 1, "d": 2}, "op": "u"}}',
          '{"payload": {"before": {"id": 1}, "after": null}, "op": "d"}',
          '{"payload": null, "before": {"id": 1}, "after": null, "op": "d"}',
          '{"after": {"id": 1}, "op": "r"}']
BAD_EVENTS = ['{"before": null, "after": null, "op": "u"}', '{"op": "x", "after": {"id": 1}}',
              '{"before": {"id": "1"}, "after": {"id": 1}, "op": "c"}',
              '{"payload": "x", "op": "c"}', '{"after": {"ID": 1}, "op": "c"}',
              '{"after": {"id": 1}}']


def table(lines: list[str | None]) -> pa.Table:
    return pa.table({"value": pa.array(lines, pa.string()),
                     "file": pa.array(["f"] * len(lines), pa.string())})


def spark_records(spark, lines: list[str], fmt: str, columns=COLUMNS, types=TYPES) -> pa.Table:
    source = FileSource("s", columns, types, "/x", fmt)
    frame = local_frame(spark, table(lines))
    return collect_arrow(parse_json(frame, source).records, rows_in=len(lines))


@pytest.mark.parametrize("fmt, same, other", [("json", SAME, OTHER),
                                               ("debezium-json", EVENTS, BAD_EVENTS)])
def test_lines_are_read_as_spark_reads_them_or_left_to_spark(spark, fmt, same, other):
    got = exact_json(table(same), fmt, COLUMNS, TYPES)
    assert got is not None and got.equals(spark_records(spark, same, fmt))
    for line in other:  # one such line leaves the whole batch to Spark
        assert exact_json(table([*same, line]), fmt, COLUMNS, TYPES) is None, line


def test_random_batches_match_spark(spark):
    """The oracle tests' random inputs (with bad records in some batches), both formats."""
    rng = random.Random(7)
    columns, types = zip(*RandomInput.DDL)
    for debezium in (False, True):
        feed, fmt = RandomInput(11, debezium), "debezium-json" if debezium else "json"
        for _ in range(4):
            lines = feed.lines(rng.randint(1, 30), bad=rng.choice([0, 0, 1]))
            got = exact_json(table(lines), fmt, columns, types)
            want = spark_records(spark, lines, fmt, columns, types)
            assert got is None if want["_reason"].null_count < want.num_rows else got.equals(want)


def test_other_column_types_are_left_to_spark():
    for spark_type in ("TIMESTAMP", "DATE", "DECIMAL(10,2)", "FLOAT", "ARRAY<INT>"):
        assert exact_json(table(['{"x": 1}']), "json", ("x",), (spark_type,)) is None


# TIMESTAMP strings Python reads as Spark does in a UTC session, then others, left to Spark.
TIMES = ['{"t": "2024-03-23 12:44:31"}', '{"t": "2024-03-23T12:44:31"}', '{"t": null}',
         '{"t": "2024-02-29 00:00:00.5"}', '{"t": "1969-12-31T23:59:59.999999Z"}',
         '{"t": "1900-01-01 00:00:00"}', '{"t": "9999-12-31 23:59:59.123Z"}', '{}']
OTHER_TIMES = ['{"t": "2023-02-29 00:00:00"}', '{"t": "2024-03-23"}', '{"t": 1700000000}',
               '{"t": "2024-03-23 12:44:31+02:00"}', '{"t": "2024-3-23 12:44:31"}',
               '{"t": " 2024-03-23 12:44:31"}', '{"t": "2024-03-23 24:00:00"}',
               '{"t": "2024-03-23 12:44:31.1234567"}', '{"t": "2024-03-23 12:44"}']


@pytest.mark.parametrize("fmt", ["json", "debezium-json"])
def test_timestamps_are_read_as_spark_reads_them_in_a_utc_session(spark, fmt):
    columns, types = ("id", "t"), ("BIGINT", "TIMESTAMP")
    zone = spark.conf.get("spark.sql.session.timeZone")
    assert zone == "UTC"
    lines = TIMES if fmt == "json" else [
        f'{{"before": null, "after": {line}, "op": "c"}}' for line in TIMES]
    got = exact_json(table(lines), fmt, columns, types, zone)
    assert got is not None and got.equals(spark_records(spark, lines, fmt, columns, types))
    assert exact_json(table(lines), fmt, columns, types, "Europe/Paris") is None
    assert exact_json(table(lines), fmt, columns, types) is None  # the zone unknown
    for line in OTHER_TIMES:
        if fmt == "debezium-json":
            line = f'{{"before": null, "after": {line}, "op": "c"}}'
        assert exact_json(table([*lines, line]), fmt, columns, types, zone) is None, line


def test_a_session_without_zones_leaves_timestamps_to_spark(spark):
    """Where a session's TIMESTAMP is TIMESTAMP_NTZ, Spark's records have no zone: no zone is
    given to ``exact_json``, which then leaves TIMESTAMP columns to Spark."""
    from octo_platform.local_frames import session_times

    assert session_times(spark) == ("UTC", True)
    other = spark.newSession()
    other.conf.set("spark.sql.timestampType", "TIMESTAMP_NTZ")
    assert session_times(other) == (None, True)


# DATE strings Python reads as Spark does (in any zone), then others, left to Spark.
DATES = ['{"day": "2024-02-29"}', '{"day": "1970-01-01"}', '{"day": "1969-12-31"}',
         '{"day": "0001-01-01"}', '{"day": "9999-12-31"}', '{"day": null}', '{}']
OTHER_DATES = ['{"day": "2023-02-29"}', '{"day": "2024-3-1"}', '{"day": "2024-03"}',
               '{"day": "2024-03-01 10:00:00"}', '{"day": "2024-03-01T10:00"}',
               '{"day": 19000}', '{"day": " 2024-03-01"}', '{"day": "0000-01-01"}',
               '{"day": "+2024-03-01"}']


@pytest.mark.parametrize("fmt", ["json", "debezium-json"])
def test_dates_are_read_as_spark_reads_them(spark, fmt):
    columns, types = ("id", "day"), ("BIGINT", "DATE")

    def lines_of(lines):
        return lines if fmt == "json" else [
            f'{{"before": null, "after": {line}, "op": "c"}}' for line in lines]
    lines = lines_of(DATES)
    got = exact_json(table(lines), fmt, columns, types, dates=True)
    assert got is not None and got.equals(spark_records(spark, lines, fmt, columns, types))
    assert exact_json(table(lines), fmt, columns, types) is None  # how unknown
    for line in lines_of(OTHER_DATES):
        assert exact_json(table([*lines, line]), fmt, columns, types, dates=True) is None, line


def test_the_legacy_parser_leaves_times_and_dates_to_spark(spark):
    """Spark's legacy parser reads ``.5`` of a second as 5 milliseconds: under it, neither
    TIMESTAMP nor DATE strings are read in Python."""
    from octo_platform.local_frames import session_times

    legacy = spark.newSession()
    legacy.conf.set("spark.sql.legacy.timeParserPolicy", "LEGACY")
    line = ['{"t": "2024-02-29T00:00:00.5Z", "day": "2024-02-29"}']
    columns, types = ("t", "day"), ("TIMESTAMP", "DATE")
    ours = spark_records(spark, line, "json", columns, types)
    theirs = spark_records(legacy, line, "json", columns, types)
    assert ours["t"] != theirs["t"]  # the reason
    assert session_times(legacy) == (None, False)
    assert exact_json(table(line), "json", columns, types, *session_times(legacy)) is None
    assert exact_json(table(line), "json", columns, types,
                      *session_times(spark)).equals(ours)

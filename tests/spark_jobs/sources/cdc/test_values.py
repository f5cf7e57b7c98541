import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from spark_jobs.sources.cdc.messages import UNCHANGED, Column, Relation
from spark_jobs.sources.cdc.values import typed, typed_row


@pytest.mark.parametrize(
    ("oid", "text", "value"),
    [
        (16, "t", True),
        (16, "f", False),
        (21, "-32768", -32768),
        (23, "42", 42),
        (20, "9223372036854775807", 9223372036854775807),
        (700, "1.5", 1.5),
        (701, "-Infinity", float("-inf")),
        (1700, "12345678901234567890.000000001", Decimal("12345678901234567890.000000001")),
        (25, "text", "text"),
        (1043, "varchar", "varchar"),
        (1042, "padded  ", "padded  "),
        (1082, "2026-11-25", date(2026, 11, 25)),
        (1114, "2026-11-25 12:34:56.789012", datetime(2026, 11, 25, 12, 34, 56, 789012)),
        (1184, "2026-11-25 12:34:56+00", datetime(2026, 11, 25, 12, 34, 56, tzinfo=UTC)),
        (1184, "2026-11-25 14:34:56.5+02", datetime(2026, 11, 25, 12, 34, 56, 500000, tzinfo=UTC)),
        (
            2950,
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ),
        (17, "\\x00ff10", b"\x00\xff\x10"),
        (114, '{"a": 1}', '{"a": 1}'),
        (3802, '{"a": 1}', '{"a": 1}'),
    ],
)
def test_text_reads_as_its_types_value(oid, text, value):
    assert typed(oid, text) == value
    assert type(typed(oid, text)) is type(value)


def test_numeric_nan_is_a_decimal_nan():
    assert typed(1700, "NaN").is_nan()


def test_a_timestamptz_comes_back_in_utc():
    value = typed(1184, "2026-11-25 14:34:56+02")
    assert value.utcoffset() == timedelta(0)
    assert value.tzinfo is UTC
    assert value != datetime(2026, 11, 25, 14, 34, 56, tzinfo=timezone(timedelta(hours=3)))


@pytest.mark.parametrize("value", [None, UNCHANGED, b"\x00\x01"])
def test_null_unchanged_and_binary_values_stay_as_they_are(value):
    assert typed(23, value) is value


def test_an_unknown_type_stays_text():
    assert typed(600, "(1,2)") == "(1,2)"  # point


@pytest.mark.parametrize(
    ("oid", "text", "message"),
    [
        (16, "true", r"cannot read 'true' as bool \(type OID 16\): expected 't' or 'f'"),
        (23, "4.5", r"cannot read '4.5' as int4 \(type OID 23\)"),
        (1700, "abc", r"cannot read 'abc' as numeric \(type OID 1700\)"),
        (1082, "infinity", r"cannot read 'infinity' as date \(type OID 1082\)"),
        (1082, "0044-03-15 BC", r"as date"),
        (17, "\\001", r"without the \\x of bytea_output = hex"),
        (2950, "not-a-uuid", r"as uuid"),
        (23, "x" * 100, r"cannot read 'x{60}\.\.\.' as int4"),
    ],
)
def test_a_value_python_cannot_hold_is_named(oid, text, message):
    with pytest.raises(ValueError, match=message):
        typed(oid, text)


def test_a_row_reads_by_its_columns_types():
    relation = Relation(1, "public", "t", "d", (Column(1, "id", 23, -1), Column(0, "at", 1082, -1)))
    assert typed_row(relation, {"id": "7", "at": None}) == {"id": 7, "at": None}
    assert typed_row(relation, {"id": "7"}) == {"id": 7}
